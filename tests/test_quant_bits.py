"""The bits calculator of thesis Thm 6.1.1 on worked examples, and the theorem's guarantee
checked on sampled inputs; the two-pass certified error against the explicit neuron DAG."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds import certified_error
from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.models import mlp, small_cnn
from pathlift.quant import lfcn_constants, quantize, sufficient_bits
from pathlift.testing.neurons import NeuronDAG


def test_worked_example_eps_quarter():
    # max(||theta||_inf, W, L) = 10; eps^-1 = 4 < 10 <= 16 = eps^-2, so k = 2;
    # m = 2kL + k + 1 + log2(ceil(D)) = 12 + 2 + 1 + 0 = 15; eta = 2^(-15 * log2 4) = 2^-30;
    # grid eta Z cap [-16, 16] has 2 * 16 * 2^30 + 1 = 2^35 + 1 points: 36 bits.
    b = sufficient_bits(0.25, theta_inf=3.0, width=10, depth=3, input_radius=1.0)
    assert (b.k, b.m, b.log2_eta, b.bound, b.bits_per_coordinate) == (2, 15, -30, 16.0, 36)
    assert b.eta == 2.0**-30 <= 0.25**b.m


def test_worked_example_eps_eighth_large_weights_and_radius():
    # max(100, 5, 2) = 100; 8^2 = 64 < 100 <= 512 = 8^3: k = 3; D = 3: ceil(log2 3) = 2;
    # m = 2*3*2 + 3 + 1 + 2 = 18; eta = 2^(-18 * 3) = 2^-54; 2 * 512 * 2^54 + 1 points: 65 bits
    b = sufficient_bits(0.125, theta_inf=100.0, width=5, depth=2, input_radius=3.0)
    assert (b.k, b.m, b.log2_eta, b.bound, b.bits_per_coordinate) == (3, 18, -54, 512.0, 65)


def test_worked_example_non_dyadic_eps():
    # eps = 0.3: log2(1/eps) = 1.74 -> ceil 2; max(0.5, 64, 4) = 64 = 2^6 needs
    # (10/3)^k >= 64: k = 4 ((10/3)^3 = 37 < 64 <= 123.5); m = 2*4*4 + 4 + 1 + 1 = 38 (D = 2)
    b = sufficient_bits(0.3, theta_inf=0.5, width=64, depth=4, input_radius=2.0)
    assert (b.k, b.m, b.log2_eta) == (4, 38, -76)
    assert b.bound == pytest.approx((1 / 0.3) ** 4)
    assert b.bits_per_coordinate == math.ceil(math.log2(2 * math.floor(b.bound * 2**76) + 1))


@settings(max_examples=50, deadline=None)
@given(eps=st.floats(0.01, 0.49), theta_inf=st.floats(0.0, 1e6), width=st.integers(1, 4096),
       depth=st.integers(2, 50), radius=st.floats(0.01, 1e3))
def test_formula_against_floating_point_evaluation(eps, theta_inf, width, depth, radius):
    b = sufficient_bits(eps, theta_inf, width, depth, radius)
    top = max(theta_inf, width, depth)
    assert eps ** -b.k >= top * (1 - 1e-12)
    assert b.k == 0 or eps ** -(b.k - 1) < top * (1 + 1e-12)
    assert b.m == math.ceil(2 * b.k * depth + b.k + 1 + math.log2(math.ceil(radius)) - 1e-12)
    assert b.log2_eta == -b.m * math.ceil(math.log2(1 / eps) - 1e-12)


def test_refuses_outside_the_theorem():
    with pytest.raises(InvalidParameterError, match="eps"):
        sufficient_bits(0.5, 1.0, 4, 3)
    with pytest.raises(InvalidParameterError, match="L >= 2"):
        sufficient_bits(0.1, 1.0, 4, 1)
    with pytest.raises(UnsupportedModelError, match=r"Thm 6\.1\.1"):
        lfcn_constants(small_cnn(), (1, 8, 8))


def test_lfcn_constants_and_the_guarantee_on_sampled_inputs():
    """Round theta to the nearest point of eta Z: sup error on [-D, D]^d stays below eps."""
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(7, 5), num_classes=3).double()
    with torch.no_grad():  # float64 weights that are not already on the grid 2^-32 Z
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64) / 3)
        model[1].weight.mul_(3.0)
    c = lfcn_constants(model, (6,))
    params = torch.cat([p.detach().abs().flatten() for p in model.parameters()])
    assert (c.width, c.depth, c.theta_inf) == (7, 3, float(params.max()))
    eps, radius = 0.25, 2.0
    b = sufficient_bits(eps, c.theta_inf, c.width, c.depth, radius)
    qm = quantize(model, (6,), step=b.eta, rounding="nearest")
    qparams = torch.cat([p.detach().abs().flatten() for p in qm.model.parameters()])
    assert float(qparams.max()) <= b.bound
    x = (torch.rand(4096, 6, dtype=torch.float64) * 2 - 1) * radius
    with torch.no_grad():
        err = (model(x) - qm.model(x)).abs().max()
    assert 0 < float(err) <= eps


def _phi(model: nn.Module, shape: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    lift = NeuronDAG.from_module(model, shape).phi()
    return dict(zip(lift.paths, lift.values.tolist(), strict=True))


class _PoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 2)
        self.fc = nn.Linear(2 * 2 * 2, 2)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2, stride=1)
        return self.fc(h.flatten(1))


@pytest.mark.parametrize("per_channel", [False, True])
def test_two_pass_metric_equals_enumeration_with_max_pooling(per_channel):
    torch.manual_seed(1)
    model, shape = _PoolNet().eval(), (1, 4, 4)
    phi = _phi(model, shape)
    for bits in (2, 3, 5, 8):
        qm = quantize(model, shape, bits=bits, per_channel=per_channel)
        phi_q = _phi(qm.model, shape)
        enumerated = sum(abs(phi.get(p, 0.0) - phi_q.get(p, 0.0)) for p in phi.keys() | phi_q)
        assert certified_error(model, qm, shape).value == pytest.approx(enumerated, rel=1e-9)
        assert np.isfinite(enumerated) and enumerated > 0
