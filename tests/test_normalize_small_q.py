"""Issue 40, "the PrecisionError names the true cause", for Alg. 3.2.1 at a small q: a
q-norm (sum |theta|^q)^(1/q) grows like (number of nonzero weights)^(1/q) as q -> 0, so
at q = 1e-300 it exceeds float64 (and at q = 0.05 the outgoing weights times it exceed
float32). ``pathlift normalize`` once blamed the model's weights ("holds NaN or inf");
now the refusal names q, the layer and the dtype, and happens exactly when the factors
computed independently here, in log space, leave the dtype's range."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from cli_runner import invoke
from pathlift.errors import PrecisionError
from pathlift.symmetry import normalize

LOG_MAX = math.log(torch.finfo(torch.float64).max)


@pytest.mark.parametrize(("q", "cause"), [
    ("1e-300", "exceeds float64's largest value"),
    ("0.001", "exceeds float64's largest value"),
    ("0.05", "exceeds torch.float32's largest value"),
])
def test_normalize_at_a_tiny_q_names_q_not_the_weights(q, cause):
    result = invoke("normalize", "mlp", "-q", q)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"at q = {float(q):g}" in lines[0] and cause in lines[0], lines[0]
    assert "use a larger q" in lines[0] and "NaN or inf" not in lines[0], lines[0]


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).double().eval()


def _log_factors(net: nn.Module, q: float) -> torch.Tensor:
    """log ||(theta^{->v}, b_v)||_q of the hidden neurons, in log space (never overflowing):
    (1/q) log sum exp(q log |x|)."""
    rows = torch.cat([net[0].weight, net[0].bias[:, None]], dim=1).abs()
    return torch.logsumexp(q * rows.log(), dim=1) / q


@settings(max_examples=40, deadline=None)
@given(q=st.floats(1e-4, 3.0), seed=st.integers(0, 5))
def test_refused_exactly_when_a_factor_leaves_float64(q, seed):
    """Two ways: the refusal happens iff a factor lambda_v (log space here), or an outgoing
    weight times it, exceeds float64; else the copy computes the same function with
    hidden norms 1 (Def. 3.2.1)."""
    net = _net(seed)
    log_lam = _log_factors(net, q)
    log_out = (net[2].weight.abs().log() + log_lam[None, :]).max()
    overflows = bool(log_lam.max() > LOG_MAX or log_out > LOG_MAX)
    if overflows:
        with pytest.raises(PrecisionError, match=f"at q = {q:g}.*use a larger q"):
            normalize(net, (5,), q)
        return
    copy = normalize(net, (5,), q)
    x = torch.randn(16, 5, dtype=torch.float64)
    assert torch.allclose(copy(x), net(x), rtol=1e-9, atol=1e-300)
    assert torch.allclose(_log_factors(copy, q), torch.zeros(4, dtype=torch.float64),
                          atol=1e-9)
    assert torch.equal(net[0].weight, _net(seed)[0].weight)  # the caller's model untouched
