"""The two checks every new piecewise-linear activation's tests make (docs/networks.md,
"Adding an operation"): the path-norms of one |theta|^q pass equal explicit path
enumeration by the neuron oracle, whose outputs are the model's; and a homogeneous
activation keeps the function and every path-norm through a random rescaling and
normalisation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from pathlift.bounds import lipschitz_input
from pathlift.graph import copy_model
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.normalize import normalize
from pathlift.lift import path_metric, path_norm
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG

PAIRS = [(1.0, 1.0), (2.0, 2.0), (1.0, math.inf), (4.0, 1.0), (0.5, 2.0)]


def randomised(net: nn.Module, seed: int) -> nn.Module:
    """``net`` in float64 and eval mode, its parameters uniform in [-1, 1] and every
    BatchNorm's running statistics random (mean in [-1, 1], variance in [0.5, 2])."""
    torch.manual_seed(seed)
    net = net.double()
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(-1, 1)
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    return net.eval()


def assert_norms_equal_enumeration(net: nn.Module, shape: tuple[int, ...]) -> None:
    """Float64 ``net``: the oracle's output on one input is the model's (1e-12), and
    path_norm at every pair of PAIRS is the enumerated one (1e-12 in log10)."""
    dag = NeuronDAG.from_module(net, shape)
    x = torch.randn(1, *shape, dtype=torch.float64)
    torch.testing.assert_close(torch.as_tensor(dag.output(x)), net(x).detach().reshape(-1),
                               rtol=0, atol=1e-12)
    for q, r in PAIRS:
        assert path_norm(net, shape, q=q, r=r).log10 == pytest.approx(
            dag.path_norm_log10(q, r), abs=1e-12)


def assert_rescaling_keeps_function_and_norms(net: nn.Module, shape: tuple[int, ...],
                                              weight: Callable[[nn.Module], Tensor]) -> None:
    """A random rescaling and the q = 2 normalisation of float64 ``net`` change
    ``weight(copy)`` but neither the outputs on 5 inputs nor any path-norm of PAIRS."""
    x = torch.randn(5, *shape, dtype=torch.float64)
    for other in (random_rescale(net, seed=3, input_shape=shape), normalize(net, shape, q=2.0)):
        assert not torch.equal(weight(other), weight(net))
        torch.testing.assert_close(other(x), net(x), rtol=0, atol=1e-12)
        for q, r in PAIRS:
            assert path_norm(other, shape, q=q, r=r).log10 == pytest.approx(
                path_norm(net, shape, q=q, r=r).log10, abs=1e-12)


def assert_bounds_and_path_metric(net: nn.Module, shape: tuple[int, ...], pruned: nn.Module
                                  ) -> None:
    """Thm 3.3.1 on 40 sampled pairs (and ||Phi||_{1,1} <= the layer-norm product, Thm
    3.3.2); the l1 path-metric to ``pruned`` (|theta'| <= |theta|, same signs) is exact
    (Lemma 3.4.1) and equals ||Phi||_1 - ||Phi'||_1 by enumeration, and bounds the change
    of every output (Cor. 3.4.1) on 40 inputs."""
    lip = lipschitz_input(net, shape)
    if lip.layer_product is not None:
        assert lip.path_norm.log10 <= lip.layer_product.log10 + 1e-12
    x = torch.randn(40, *shape, dtype=torch.float64)
    near = x + 0.01 * torch.randn_like(x)
    with torch.no_grad():
        change = (flat_outputs(net(x), 40) - flat_outputs(net(near), 40)).abs().sum(1)
    assert torch.all(change <= 10 ** lip.path_norm.log10 * (x - near).flatten(1).abs().amax(1)
                     * (1 + 1e-9))
    metric = path_metric(net, pruned, shape)
    assert metric.case == "exact"
    enumerated = (NeuronDAG.from_module(net, shape).path_norm(1.0)
                  - NeuronDAG.from_module(pruned, shape).path_norm(1.0))
    assert metric.upper_log10 == pytest.approx(math.log10(enumerated), abs=1e-12)
    with torch.no_grad():
        gap = (flat_outputs(net(x), 40) - flat_outputs(pruned(x), 40)).abs().sum(1)
    assert torch.all(gap <= 10 ** metric.upper_log10
                     * x.flatten(1).abs().amax(1).clamp_min(1) * (1 + 1e-9))


def assert_scores_equal_autograd(net: nn.Module, shape: tuple[int, ...], scores) -> None:
    """Every tensor of path-magnitude ``scores`` of ``net`` equals theta_i d||Phi||_1 /
    d theta_i from autograd of the differentiable path-norm of a copy (paper 002 eq. 11)."""
    other = copy_model(net)
    log_norm = differentiable_path_norm(other, shape, q=1.0)
    log_norm.backward()
    for key, p in other.named_parameters():
        if key in scores.tensors:
            expected = (p * p.grad).detach() * log_norm.exp() / 10 ** scores.log10_scale
            torch.testing.assert_close(scores.tensors[key], expected, rtol=1e-10, atol=1e-12)


def masks_written(pruned: nn.Module, net: nn.Module) -> nn.Module:
    """A copy of ``net`` with each torch.nn.utils.prune mask of ``pruned`` multiplied into
    its parameter: the pruned network written independently of the masks."""
    plain = copy_model(net)
    with torch.no_grad():
        for key, mask in pruned.state_dict().items():
            if key.endswith("_mask"):
                plain.get_parameter(key.removesuffix("_mask")).mul_(mask)
    return plain


def assert_path_sgd_scale_is_enumerated(net: nn.Module, shape: tuple[int, ...], p: Tensor,
                                        entries: list[tuple[int, ...]]) -> None:
    """Path-SGD's gamma_p = d||Phi||_2^2 / d(p^2) of the parameter ``p`` of ``net``, at each
    of ``entries``, against central differences of the enumerated ||Phi||_2^2 divided by
    d(p^2)/dp = 2p (rel 1e-6); ``p`` is moved and put back."""
    gammas = magnitude_gradients(net, shape, 2.0)
    gamma = gammas.mantissas[p] * math.exp(gammas.log_scale)
    eps = 1e-5
    for idx in entries:
        norms = []
        for step in (eps, -2 * eps, eps):
            with torch.no_grad():
                p[idx] += step
            norms.append(NeuronDAG.from_module(net, shape).path_norm(2.0) ** 2)
        derivative = (norms[0] - norms[1]) / (2 * eps) / (2 * float(p[idx]))
        assert float(gamma[idx]) == pytest.approx(derivative, rel=1e-6), idx
