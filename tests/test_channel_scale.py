"""A learnt or constant per-channel scale and a free per-channel bias over a module's own
tensor (``x * self.gamma``, ``x * self.gamma[:, None, None]``, ``self.gamma.view(1, -1, 1,
1) * x``, a buffer, ``x + self.beta``): identity neurons with one incoming weight (thesis
Def. 2.2.2, pathlift.graph.ops.scale). Every number is checked against path enumeration,
autograd or a rescaling done by hand; pruning, rescaling, normalisation and quantisation
reach ``s.gamma``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    assert_scores_equal_autograd,
    masks_written,
    randomised,
)
from pathlift.errors import UnsupportedModelError
from pathlift.graph import copy_model, trace
from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores, prune_model
from pathlift.quant import quantize
from pathlift.symmetry import conserved_quantities, normalize, rescale
from pathlift.testing.neurons import NeuronDAG


class LayerScale(nn.Module):
    """timm's LayerScale: ``x * self.gamma`` over features."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.s, self.b = nn.Linear(4, 6), LayerScale(6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.relu(self.s(self.a(x))))


class Block(nn.Module):
    """ConvNeXt-like: a conv, its per-channel scale read reshaped, a free bias."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.gamma = nn.Parameter(torch.ones(c))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x).mul(self.gamma.reshape(1, -1, 1, 1))


class Scaled(nn.Module):
    """timm's LayerScale2d: ``gamma.view(1, -1, 1, 1) * x`` (the tensor on the left)."""

    def __init__(self, c: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(c))

    def forward(self, x: Tensor) -> Tensor:
        gamma = self.gamma.view(1, -1, 1, 1)
        return gamma * x


class Shift(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.beta = nn.Parameter(torch.zeros(c))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.beta[:, None, None]


class Fixed(nn.Module):
    """A constant per-channel scale, a buffer, over the last dim (features)."""

    def __init__(self, c: int):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, c))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


class _Indexed(Fixed):
    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale[:, None, None]


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.scaled = nn.Conv2d(1, 2, 3, padding=1), Scaled(2)
        self.block, self.shift, self.fixed = Block(2), Shift(2), Fixed(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.shift(self.block(F.relu(self.scaled(self.stem(x))))))
        return self.head(F.relu(self.fixed(F.max_pool2d(h, 2).flatten(1))))


SHAPE = (1, 4, 4)


@pytest.fixture
def mlp() -> Mlp:
    return randomised(Mlp(), seed=0)


@pytest.fixture
def conv() -> ConvNet:
    return randomised(ConvNet(), seed=1)


def test_path_norms_equal_enumeration(mlp, conv):
    assert_norms_equal_enumeration(mlp, (4,))
    assert_norms_equal_enumeration(conv, SHAPE)
    assert [type(m).__name__ for _, m in trace(conv, SHAPE).layers()] == [
        "Conv2d", "FunctionalChannelAffine", "Conv2d", "FunctionalChannelAffine",
        "FunctionalChannelAffine", "FunctionalChannelAffine", "Linear"]


def test_a_rescaling_moves_weight_through_gamma(mlp):
    lam = torch.tensor([0.5, 2.0, 3.0, 1.5, 0.25, 4.0], dtype=torch.float64)
    # a's neurons times lam, the scale's own kept (not named, a diagonal op follows its
    # input, Appendix E.1.2): gamma divided by lam
    out = rescale(mlp, {"a": lam, "s": 1.0}, (4,))
    torch.testing.assert_close(out.a.weight, mlp.a.weight * lam[:, None], rtol=1e-15, atol=0)
    torch.testing.assert_close(out.s.gamma, mlp.s.gamma / lam, rtol=1e-15, atol=0)
    torch.testing.assert_close(out.b.weight, mlp.b.weight, rtol=0, atol=0)
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(out(x), mlp(x), rtol=0, atol=1e-12)
    assert path_norm(out, (4,), q=2).log10 == pytest.approx(
        NeuronDAG.from_module(mlp, (4,)).path_norm_log10(2.0, 2.0), abs=1e-12)
    out = rescale(mlp, {"s": lam}, (4,))  # the scale's own neurons: b's columns divided
    torch.testing.assert_close(out.s.gamma, mlp.s.gamma * lam, rtol=1e-15, atol=0)
    torch.testing.assert_close(out.b.weight, mlp.b.weight / lam, rtol=1e-15, atol=0)
    torch.testing.assert_close(out(x), mlp(x), rtol=0, atol=1e-12)


def test_random_rescaling_and_normalisation_keep_function_and_norms(mlp, conv):
    assert_rescaling_keeps_function_and_norms(mlp, (4,), lambda m: m.a.weight)
    # Alg. 3.2.1: the scale's neurons have one incoming weight each, normalised to |1|
    torch.testing.assert_close(normalize(mlp, (4,), q=1.0).s.gamma.detach().abs(),
                               torch.ones(6, dtype=torch.float64), rtol=1e-15, atol=0)
    assert_rescaling_keeps_function_and_norms(conv, SHAPE, lambda m: m.shift.beta)


def test_scores_of_gamma_equal_autograd(mlp, conv):
    for net, shape in ((mlp, (4,)), (conv, SHAPE)):
        scores = path_magnitude_scores(net, shape, include_biases=True)
        assert {"s.gamma", "block.gamma", "scaled.gamma", "shift.beta"} & set(scores.tensors)
        assert "fixed.scale" not in scores.tensors  # a buffer: a constant, no coordinate
        assert_scores_equal_autograd(net, shape, scores)


def test_pruning_reaches_gamma(mlp):
    pruned = copy_model(mlp)
    prune_model(pruned, (4,), 0.4, include_biases=True)
    assert hasattr(pruned.s, "gamma_mask") and hasattr(pruned.s, "gamma_orig")
    plain = masks_written(pruned, mlp)
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(pruned(x), plain(x), rtol=0, atol=1e-12)
    assert path_norm(pruned, (4,)).log10 == pytest.approx(
        NeuronDAG.from_module(plain, (4,)).path_norm_log10(1.0, 1.0), abs=1e-12)


def test_quantisation_rounds_gamma_and_the_callers_model_is_untouched(conv):
    before = {k: v.clone() for k, v in conv.state_dict().items()}
    quantized = quantize(conv, SHAPE, bits=4)
    normalize(conv, SHAPE)
    assert set(conv.state_dict()) == set(before)
    assert all(torch.equal(v, before[k]) for k, v in conv.state_dict().items())
    for key in ("block.gamma", "shift.beta", "fixed.scale"):
        value = quantized.model.get_parameter(key) if key != "fixed.scale" \
            else quantized.model.get_buffer(key)
        torch.testing.assert_close(value, quantized.codes[key].dequantize(), rtol=0, atol=0)


class _Square(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.ones(4, 4))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.g


class _Computed(LayerScale):
    def forward(self, x: Tensor) -> Tensor:
        return x * (2 * self.gamma)


class _Rows(nn.Module):
    """A scale along the rows of an image: dim 2."""

    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.ones(4))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.g[:, None]


class _Early(Block):
    """The scale reshaped before the conv it scales runs."""

    def forward(self, x: Tensor) -> Tensor:
        return self.gamma.view(1, -1, 1, 1) * self.conv(x)


@pytest.mark.parametrize(("layer", "shape", "words"), [
    (_Square(), (4,), "not one entry per channel"),
    (_Computed(4), (4,), "a tensor computed in forward"),
    (_Rows(), (1, 4, 4), "scales or shifts dim 2"),
    (LayerScale(2), (4,), "2 entries broadcast over 4 channels"),
    (_Indexed(2), (2, 3, 3), "torch.fx made a constant"),
    (_Early(2), (2, 3, 3), "reshaped before the activation it scales is computed"),
])
def test_refused_in_one_line(layer, shape, words):
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(nn.Sequential(layer).eval(), shape)
    assert words in str(info.value) and len(info.value.problems) == 1


_SCALES = st.lists(st.floats(-8.0, 8.0).filter(lambda v: abs(v) > 1e-3), min_size=6,
                   max_size=6)
_FACTORS = st.lists(st.floats(1 / 64, 64.0), min_size=6, max_size=6)


@settings(max_examples=15, deadline=None)
@given(gamma=_SCALES, lam=_FACTORS, seed=st.integers(0, 2**16))
def test_gamma_rescaling_invariance_and_the_lipschitz_bound(gamma, lam, seed):
    """Def. 2.4.1: moving factors lam through gamma keeps R and ||Phi||_{1,inf}; Thm
    3.3.1: |R(x) - R(x')|_inf <= ||Phi||_{1,inf} |x - x'|_inf on sampled inputs."""
    net = randomised(Mlp(), seed=seed % 7)
    with torch.no_grad():
        net.s.gamma.copy_(torch.tensor(gamma, dtype=torch.float64))
    out = rescale(net, {"a": torch.tensor(lam, dtype=torch.float64), "s": 1.0}, (4,))
    norm = path_norm(net, (4,), q=1.0, r=math.inf)
    assert path_norm(out, (4,), q=1.0, r=math.inf).log10 == pytest.approx(norm.log10,
                                                                        abs=1e-12)
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randn(8, 4, dtype=torch.float64, generator=g) for _ in range(2))
    torch.testing.assert_close(out(x), net(x), rtol=1e-12, atol=1e-12)
    gap = (net(x) - net(y)).abs().amax(dim=1)
    assert bool((gap <= norm.value * (x - y).abs().amax(dim=1) * (1 + 1e-12)).all())


def test_conserved_quantities_of_the_scales_neurons(mlp):
    """Sec. 7.1.2: ||theta^{->v}||^2 - ||theta^{v->}||^2 of the scale's neurons v is
    gamma_v^2 minus the squared column v of the next layer (a's neurons, read by a
    diagonal op, are left out as BatchNorm's inputs are)."""
    found = conserved_quantities(mlp, (4,))
    by_hand = mlp.s.gamma.detach() ** 2 - mlp.b.weight.detach().pow(2).sum(0)
    torch.testing.assert_close((found.incoming - found.outgoing).sort().values,
                               by_hand.sort().values, rtol=1e-12, atol=1e-15)
