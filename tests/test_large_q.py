"""Large exponents q (issue 21, item 5) and a batch dimension given by mistake (item 6).

The |theta|^q pass raises every weight to the power q: 0.01^64 underflows float32 and
4096^500 overflows float64. Each q in {16, 32, 64, 500, 1000}, with float32 and float64
mantissas, must agree with explicit path enumeration (``NeuronDAG``, which sums
|Phi_p|^q in log space) on random small networks, also after an adversarial rescaling with
factors up to 2^20, or be refused with a typed ``PathliftError``; never 0, -inf or NaN.

Tolerances, on the natural log of the norm: float64 1e-9 relative (the exactness suite's
1e-9, read in log space), float32 1e-5 relative (float32 mantissas are ~1e-7 relative per
operation; the README states ~1e-6 on the norm).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from pathlift.errors import PathliftError
from pathlift.graph import trace
from pathlift.lift import path_norm, path_norms
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG
from random_nets import random_network

LARGE_QS = (16.0, 32.0, 64.0, 500.0, 1000.0)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}
LN10 = math.log(10.0)
SEEDS = (0, 1, 2, 3, 5, 8, 13, 18, 21, 24)  # 18, 24: q = 1000 once refused as "NaN weights"


def _agrees_or_refuses(graph, dag: NeuronDAG, q: float, r: float, dtype: torch.dtype) -> bool:
    """True when path_norm agrees with the enumeration; False on a typed refusal."""
    expected = dag.path_norm_log10(q, r) * LN10  # natural log
    try:
        got = path_norm(graph, None, q, r, dtype=dtype)
    except PathliftError as e:  # a refusal says it is about q (not, e.g., NaN weights)
        assert f"{q:g}" in str(e), str(e)
        return False
    assert math.isfinite(got.log10), (q, dtype, got.log10)
    assert got.value > 0 or got.log10 < -300
    assert all(math.isfinite(v) for v in got.per_output_log10 if v != -math.inf)
    assert abs(got.log10 * LN10 - expected) <= TOLERANCE[dtype] * max(1.0, abs(expected)), (
        q, r, dtype, got.log10, expected / LN10)
    return True


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("seed", SEEDS)
def test_large_q_equals_enumeration_or_is_refused(seed, dtype):
    model, shape = random_network(seed)
    model = model.double()
    dag = NeuronDAG.from_module(model, shape)
    if dag.path_norm_log10(1.0) == -math.inf:
        pytest.skip("a network whose every path has weight 0")  # no norm to compare
    graph = trace(model, shape)
    for q in LARGE_QS:
        for r in (q, 1.0, math.inf):
            _agrees_or_refuses(graph, dag, q, r, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("seed", SEEDS[:5])
def test_large_q_after_adversarial_rescaling(seed, dtype):
    """Rescaling by factors up to 2^20 (exact in binary) leaves Phi unchanged (Def. 2.4.1)
    but spreads the weights over 12 orders of magnitude: |theta|^1000 spans 1e+-6000."""
    model, shape = random_network(seed)
    model = model.double()
    dag = NeuronDAG.from_module(model, shape)
    if dag.path_norm_log10(1.0) == -math.inf:
        pytest.skip("a network whose every path has weight 0")
    rescaled = random_rescale(model, factors=(1.0, 4096.0, 2.0**20), seed=seed,
                              input_shape=shape)
    graph = trace(rescaled, shape)
    for q in LARGE_QS:
        _agrees_or_refuses(graph, dag, q, q, dtype)  # the same Phi: the same norms


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("weight", [0.01, 30.0])
def test_large_q_on_a_deep_chain(weight, dtype):
    """A chain of 30 scalar layers of weight w from input 0 and a weight-1 skip from input
    1: two paths, ||Phi||_q^q = |w|^(30 q) + 1, from 1e-60000 to 1e+44000 at q = 1000."""
    layers: list[nn.Module] = [nn.Linear(1, 1, bias=False) for _ in range(30)]
    for layer in layers:
        nn.init.constant_(layer.weight, weight)

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.chain = nn.Sequential(*layers)
            self.skip = nn.Linear(1, 1, bias=False)
            nn.init.constant_(self.skip.weight, 1.0)

        def forward(self, x):
            return self.chain(x[:, :1]) + self.skip(x[:, 1:])

    model = Chain().double().eval()
    w = layers[0].weight.item()
    for q in LARGE_QS:
        log_big = 30 * q * math.log(abs(w))
        ln_sum = max(log_big, 0.0) + math.log1p(math.exp(-abs(log_big)))
        expected_ln = ln_sum / q
        try:
            got = path_norm(model, (2,), q, q, dtype=dtype)
        except PathliftError as e:
            assert f"{q:g}" in str(e), str(e)
            continue
        assert math.isfinite(got.log10)
        assert abs(got.log10 * LN10 - expected_ln) <= TOLERANCE[dtype] * max(1.0,
                                                                             abs(expected_ln))


def test_many_large_exponents_in_one_call():
    """q up to 64 is within float64's reach once normalised: one call, no refusal."""
    model, shape = random_network(4)
    model = model.double()
    dag = NeuronDAG.from_module(model, shape)
    norms = path_norms(model, shape, qs=LARGE_QS[:3])
    for q in LARGE_QS[:3]:
        expected = dag.path_norm_log10(q, q) * LN10
        assert abs(norms[q].log10 * LN10 - expected) <= 1e-9 * max(1.0, abs(expected)), q


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_a_precision_refusal_suggests_a_remedy_not_already_in_use(dtype):
    """Where a large q is refused, the message names q and does not suggest the dtype the
    caller already passed."""
    for seed in SEEDS:
        model, shape = random_network(seed)
        for q in LARGE_QS:
            try:
                path_norm(model.double(), shape, q, q, dtype=dtype)
            except PathliftError as e:
                message = str(e)
                assert f"{q:g}" in message, message
                assert f"dtype={dtype}" not in message, message


# --------------------------------------------------------------------------- batch dim
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3)).eval()


def test_a_leading_batch_dimension_on_a_linear_first_mlp_warns():
    """(4, 20) for a Linear(20, .)-first MLP: the Linear acts on the last dim, so 4 copies
    of the network are measured (4x the l1 norm). It is computed, with a UserWarning."""
    model = _mlp()
    single = path_norm(model, (20,))
    with pytest.warns(UserWarning) as record:
        batched = path_norm(model, (4, 20))
    messages = " ".join(str(w.message) for w in record if issubclass(w.category, UserWarning))
    assert "batch" in messages.lower(), messages
    assert batched.log10 == pytest.approx(single.log10 + math.log10(4), abs=1e-12)


@pytest.mark.parametrize("model, shape", [
    (lambda: nn.Sequential(nn.Linear(20, 3)), (20,)),
    (lambda: nn.Sequential(nn.Conv1d(4, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(36, 2)),
     (4, 20)),
    (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), (1, 5, 5)),
], ids=["vector", "conv1d-signal", "conv2d-image"])
def test_no_batch_warning_where_the_shape_is_right(model, shape):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        result = path_norm(model().eval(), shape)
    assert math.isfinite(result.log10)
