"""The differentiable |theta|^q pass (``pathlift.lift.differentiable``) on a network with
``KSLinear`` layers asks the op for its live magnitudes (``live_magnitudes``), never a
``weight`` it does not have: its value is ``path_norm``'s, and its gradient in the
factors is the gradient of the densified copy (each KSLinear a chain of dense Linear
layers holding the factors, run by the Linear op) mapped back through ``to_dense``'s
scatter, an independent computation. Path-SGD scales of the factors are refused, typed."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.errors import UnsupportedModelError
from pathlift.kron import KSLinear, KSPattern, to_dense
from pathlift.lift import path_norm
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.train import PathNormPenalty

CHAIN = [KSPattern(1, 8, 4, 8), KSPattern(2, 16, 8, 1)]  # 64 <- 32 <- 16, several paths


def network(scale: float = 1.0) -> nn.Sequential:
    """16 -> KSLinear(16, 64) -> ReLU -> Linear(64, 3), float64; ``scale`` multiplies the
    output factor (far from 1: the pass takes it in a unit other than 1)."""
    torch.manual_seed(0)
    net = nn.Sequential(KSLinear(CHAIN), nn.ReLU(), nn.Linear(64, 3)).double()
    with torch.no_grad():
        net[0].factors[0].mul_(scale)
    return net


def densified(net: nn.Sequential) -> nn.Sequential:
    """The same DAG with the KSLinear as one dense Linear per factor, K_L first, whose
    weights are leaves of their own."""
    ks = net[0]
    layers = []
    for k, (w, p) in enumerate(reversed(list(zip(ks.factors, ks.patterns, strict=True)))):
        last = k == len(ks.patterns) - 1
        linear = nn.Linear(p.in_features, p.out_features, bias=last, dtype=torch.float64)
        with torch.no_grad():
            linear.weight.copy_(to_dense(w.detach(), p))
            if last:
                linear.bias.copy_(ks.bias)
        layers.append(linear)
    return nn.Sequential(*layers, *net[1:])


@pytest.mark.parametrize(("q", "scale"), [(1.0, 1.0), (2.0, 1.0), (3.0, 2.0 ** 40)])
def test_the_differentiable_path_norm_of_a_kslinear_network_is_path_norm_s(q, scale):
    net = network(scale)
    ln = differentiable_path_norm(net, (16,), q=q)
    expected = path_norm(net, (16,), q=q)
    assert float(ln) / math.log(10) == pytest.approx(expected.log10, abs=1e-12)
    assert float(PathNormPenalty((16,), q=q, log=True)(net)) == pytest.approx(float(ln),
                                                                                 rel=1e-14)


@pytest.mark.parametrize("q", [1.0, 2.0])
def test_its_gradient_in_the_factors_is_the_densified_network_s(q):
    net = network()
    differentiable_path_norm(net, (16,), q=q).backward()
    dense = densified(net)
    differentiable_path_norm(dense, (16,), q=q).backward()
    ks = net[0]
    for i, (factor, pattern) in enumerate(zip(ks.factors, ks.patterns, strict=True)):
        chain_layer = dense[len(ks.patterns) - 1 - i]
        # d/dK at a stored entry is d/dW at the dense position that entry scatters to
        expected = to_dense(torch.ones_like(factor), pattern).bool()
        assert torch.equal(to_dense(factor.grad, pattern) != 0, chain_layer.weight.grad != 0)
        torch.testing.assert_close(to_dense(factor.grad, pattern),
                                   chain_layer.weight.grad * expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ks.bias.grad, dense[len(ks.patterns) - 1].bias.grad,
                               rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(net[2].weight.grad, dense[-1].weight.grad, rtol=1e-12,
                               atol=1e-14)


def test_path_sgd_scales_of_the_factors_are_refused_typed():
    with pytest.raises(UnsupportedModelError, match=r"KSLinear.*magnitude gradients"):
        magnitude_gradients(network(), (16,), q=2.0)
