"""Weight-standardised and scaled convolutions (timm's ``StdConv2d``, ``ScaledStdConv2d``,
a user's ``F.conv2d`` on a standardised ``self.weight``) are measured on their effective
weights (pathlift.graph.ops.derived), as torch.nn.utils.parametrize layers are.

Every number is computed a second way on the plain twin of the model (``plain_twin``: the
same network with each standardised layer a plain ``nn.Conv2d`` holding its effective
weight, computed by a formula written here): path-norms against explicit path enumeration
and the independent |theta|^q pass (Thm 3.1.1), scores against autograd of that pass (sec.
3.5), the differentiable pass's gradient against autograd through the written-out
standardisation. Rescaling, normalisation, pruning and quantisation, which would write
the stored weight in place of the effective one, are refused in one line saying why.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import prune

from abs_pow_oracle import (
    STANDARDISED,
    _AbsPowMode,
    _standardised,
    abs_pow_copy,
    abs_pow_outputs,
    path_magnitude_oracle,
    plain_twin,
)
from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.prune import channel_path_magnitude, path_magnitude_scores, prune_model
from pathlift.quant import quantize
from pathlift.symmetry import magnitude_prune, normalize, random_rescale, rescale
from pathlift.testing.neurons import NeuronDAG

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None,
                                reason="timm is not installed")


def _timm_layers():
    """``timm.layers``, imported when a test of this file first builds a ``Net``, not at
    collection: its ~760 nn.Module subclasses make each torch.fx trace that the worker runs
    afterwards slower (tests/test_timm.py)."""
    import timm.layers

    return timm.layers


SHAPE = (2, 6, 6)


class WSConv(nn.Module):
    """A user's weight-standardised convolution, written as the papers do."""

    def __init__(self, i: int, o: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i, 3, 3))
        self.bias = nn.Parameter(torch.randn(o))
        self.eps, self.padding = eps, 1

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / torch.sqrt(
            w.var(dim=(1, 2, 3), keepdim=True, unbiased=False) + self.eps)
        return F.conv2d(x, w, self.bias, padding=self.padding)


STANDARDISED["WSConv"] = lambda m: _standardised(m.weight, m.eps)


class Net(nn.Module):
    """Functional style: a timm StdConv2d stem with an eval BatchNorm after it (folded
    into it by the |theta|^q pass), a ScaledStdConv2d block with a user WS-conv skip, a
    max-pool, a constant scale and a Linear head."""

    def __init__(self):
        super().__init__()
        layers = _timm_layers()
        self.stem = layers.StdConv2d(2, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.conv = layers.ScaledStdConv2d(4, 5, 3, bias=True, gain_init=0.7)
        self.skip = WSConv(4, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn(self.stem(x)))
        h = F.max_pool2d(h, 2)
        h = F.relu(self.conv(h) + self.skip(h)) * 0.5
        return self.head(h.mean(dim=(2, 3)))


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = Net().double().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p))
        net.bn.running_mean.copy_(torch.randn(4))
        net.bn.running_var.copy_(torch.rand(4) + 0.5)
    return net


@pytest.mark.parametrize("q", [1.0, 2.0, 3.0])
def test_path_norms_are_those_of_the_effective_weights(q):
    net = _net()
    twin = plain_twin(net)
    x = torch.randn(4, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(twin(x), net(x), rtol=0, atol=1e-12)  # the same function
    o, _ = abs_pow_outputs(net, SHAPE, q)
    result = path_norm(net, SHAPE, q=q)
    assert result.log10 == pytest.approx(math.log10(float(o.sum())) / q, abs=1e-12)
    torch.testing.assert_close(torch.tensor(result.per_output_log10, dtype=torch.float64),
                               torch.log10(o) / q, rtol=0, atol=1e-12)
    assert result.log10 == pytest.approx(
        NeuronDAG.from_module(twin, SHAPE).path_norm_log10(q, q), abs=1e-12)


def test_scores_are_autograd_of_the_effective_pass():
    net = _net(1)
    scores = path_magnitude_scores(net, SHAPE)
    oracle = path_magnitude_oracle(net, SHAPE)
    assert set(oracle) == set(scores.tensors) == {
        "stem.weight", "conv.weight", "skip.weight", "head.weight"}
    for key, expected in oracle.items():
        torch.testing.assert_close(scores.value(key), expected, rtol=1e-12,
                                   atol=1e-12 * float(expected.abs().max()))


def test_the_differentiable_pass_reaches_the_stored_weights_through_the_standardisation():
    net = _net(2)
    log_norm = differentiable_path_norm(net, SHAPE, q=1.0)
    stored = [net.stem.weight, net.conv.weight, net.conv.gain, net.skip.weight]
    got = torch.autograd.grad(log_norm, stored)
    # the same gradient through the independent pass, the standardisation written out
    leaves = [t.detach().clone().requires_grad_() for t in stored]
    effective = {"stem": _standardised(leaves[0], net.stem.eps),
                 "conv": _standardised(leaves[1], net.conv.eps) * leaves[2] * net.conv.scale,
                 "skip": _standardised(leaves[3], net.skip.eps)}
    pass_net = abs_pow_copy(net, 1.0)  # the plain twin's |theta| copy
    for name, w in effective.items():  # its standardised layers' |W| in autograd
        del pass_net.get_submodule(name)._parameters["weight"]
        pass_net.get_submodule(name).weight = w.abs()
    with _AbsPowMode(1.0):
        o = pass_net(torch.ones((1, *SHAPE), dtype=torch.float64))
    expected = torch.autograd.grad(torch.log(o.sum()), leaves)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * float(b.abs().max()))


def test_measuring_leaves_the_model_as_it_was():
    net = _net(3)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    path_norm(net, SHAPE, q=2.0)
    path_magnitude_scores(net, SHAPE)
    after = net.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_pruned_stored_weight_is_standardised_with_its_mask():
    """torch.nn.utils.prune on the stored weight of a StdConv2d: the layer computes the
    standardisation of the masked weight, and is measured on that."""
    net = _net(4)
    mask = (torch.rand_like(net.stem.weight) > 0.4).double()
    masked = _net(4)
    with torch.no_grad():
        masked.stem.weight.mul_(mask)
    twin = plain_twin(masked)  # the effective weight of the masked stored weight
    prune.custom_from_mask(net.stem, "weight", mask)
    x = torch.randn(2, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(twin(x), net(x), rtol=0, atol=1e-12)
    assert path_norm(net, SHAPE).log10 == pytest.approx(
        NeuronDAG.from_module(twin, SHAPE).path_norm_log10(1.0, 1.0), abs=1e-12)


@pytest.mark.parametrize(("transform", "what"), [
    (lambda net: random_rescale(net, seed=1, input_shape=SHAPE), "rescale or normalise"),
    (lambda net: rescale(net, {"stem": torch.full((4,), 2.0)}, SHAPE), "rescale or normalise"),
    (lambda net: normalize(net, SHAPE), "rescale or normalise"),
    (lambda net: quantize(net, SHAPE, bits=8), "quantise"),
    (lambda net: prune_model(net, SHAPE, amount=0.3), "prune"),
    (lambda net: magnitude_prune(net, 0.3, SHAPE), "prune"),
    (lambda net: channel_path_magnitude(net, SHAPE, 0.25), "prune"),
])
def test_transformations_of_the_stored_weight_are_refused_saying_why(transform, what):
    net = _net(5)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(UnsupportedModelError) as info:
        transform(net)
    message = str(info.value)
    assert "\n" not in message and f"cannot {what}" in message
    assert "layer 'stem'" in message and "no-op on the function" in message
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
