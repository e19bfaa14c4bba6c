"""Issue 40, "misleading": ``pathlift norm mlp -q 1e308`` said the pass "came out NaN ... a
bug to report" (q * ln|w| overflowed float64: inf - inf in the log-space pass). Beyond
``LOG_SPACE_Q_MAX`` a NaN, inf or zero is now refused naming that cause and the largest q
that works; a network whose weights are all 0 or +-1 (q * ln|w| = 0) still computes there."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch
from torch import nn

from cli_runner import invoke
from pathlift.errors import PrecisionError
from pathlift.exponents import LOG_SPACE_Q_MAX
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.lift.path_norm import path_norm
from pathlift.testing.neurons import NeuronDAG

HUGE = [1e308, sys.float_info.max]
CAUSE = "is too large for float64 exponent arithmetic"


def test_the_limit_is_where_q_ln_w_leaves_float64():
    smallest = math.log(5e-324)  # the smallest subnormal: the largest |ln|w|| of a float64
    largest = math.log(sys.float_info.max)
    assert math.isfinite(LOG_SPACE_Q_MAX * smallest) and math.isfinite(LOG_SPACE_Q_MAX * largest)
    assert (2 * LOG_SPACE_Q_MAX) * smallest == -math.inf


@pytest.mark.parametrize("q", HUGE)
def test_the_cli_names_q_as_the_cause_in_one_line(q):
    result = invoke("norm", "mlp", "-q", repr(q))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: q = {q:g} {CAUSE}"), lines[0]
    assert f"use q <= {LOG_SPACE_Q_MAX:.4g}" in lines[0] and "bug" not in lines[0]
    # the bound it states is the overflow point: |ln|w|| > max/q overflows q*ln|w|
    bound = float(lines[0].split("|ln|w|| > ")[1].split(";")[0])
    assert bound == pytest.approx(sys.float_info.max / q, rel=1e-2)
    assert math.isinf(q * (bound * 1.02)) and math.isfinite(q * (bound * 0.98))


def _random_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()


@pytest.mark.parametrize("q", HUGE)
@pytest.mark.parametrize("norm", [path_norm, differentiable_path_norm])
def test_python_names_the_cause(q, norm):
    with pytest.raises(PrecisionError, match=re.escape(f"q = {q:g} {CAUSE}")):
        norm(_random_net(), (3,), q)


def test_below_the_limit_the_cause_is_the_network_s_range():
    # q * ln|w| is finite for every w here: an underflow is then the network's own range
    with pytest.raises(PrecisionError, match=r"underflows torch\.float64"):
        path_norm(_random_net(), (3,), LOG_SPACE_Q_MAX)


@pytest.mark.parametrize("q", HUGE)
def test_unit_weights_still_compute_beyond_the_limit(q):
    # weights and biases in {-1, 1}: every path has |Phi_p| = 1, so ||Phi||_q = P^(1/q) with
    # P the number of paths, counted by explicit enumeration (inputs and biases alike)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.where(torch.rand_like(p) < 0.5, -1.0, 1.0))
    phi = NeuronDAG.from_module(net, (3,)).phi().values
    assert (abs(phi) == 1).all() and len(phi) == 3 * 4 * 2 + 4 * 2 + 2
    assert path_norm(net, (3,), q).log10 == pytest.approx(math.log10(len(phi)) / q, rel=1e-12)
