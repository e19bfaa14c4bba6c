"""Eval BatchNorm folded into the rows of the layer before it in the |theta|^q pass
(``AbsPowInterpreter``, ``LayerGraph.folds``): the same path-norms as the explicit sum over
enumerated paths (pathlift.testing.neurons), on networks written as users write them, and
no fold where the premise fails (a bias, a second reader, another channel axis)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.graph import AbsPowInterpreter, graph_of
from pathlift.graph.ops import affine
from pathlift.graph.ops.affine import ConvHandler
from pathlift.lift import path_norm
from pathlift.testing.neurons import NeuronDAG


def _randomise_(model: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_var.copy_(torch.rand(m.num_features, generator=generator) * 3 + 0.1)
                m.running_mean.copy_(torch.randn(m.num_features, generator=generator))
                m.weight.copy_(torch.randn(m.num_features, generator=generator))
                m.bias.copy_(torch.randn(m.num_features, generator=generator))
    return model.eval()


class ConvBlock(nn.Module):
    """conv -> BN -> ReLU three times, a residual sum and a BN-folded classifier (Linear ->
    BN1d). The 1x1 conv has fewer weights than outputs (its rows are scaled), the others
    more (their outputs are scaled): both ways of folding run."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(3)
        self.conv3 = nn.Conv2d(3, 3, 1, bias=False)
        self.bn4 = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 16, 4, bias=False)
        self.bn3 = nn.BatchNorm1d(4)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)) + h)
        h = F.relu(self.bn4(self.conv3(h)))
        return self.bn3(self.fc(h.flatten(1)))


class NoFold(nn.Module):
    """Every reason not to fold: a conv with a bias, a conv output read twice, a transposed
    convolution, a Linear on a 3-D input whose BatchNorm1d normalises another axis."""

    def __init__(self):
        super().__init__()
        self.biased = nn.Conv2d(2, 3, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(3)
        self.shared = nn.Conv2d(3, 3, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(3)
        self.up = nn.ConvTranspose2d(3, 2, 2, stride=2, bias=False)
        self.bn3 = nn.BatchNorm2d(2)
        self.fc = nn.Linear(8, 8, bias=False)
        self.bn4 = nn.BatchNorm1d(2)

    def forward(self, x):
        h = F.relu(self.bn1(self.biased(x)))
        s = self.shared(h)
        h = F.relu(self.bn2(s) + s)
        h = F.relu(self.bn3(self.up(h)))  # (2, 8, 8)
        return self.bn4(self.fc(h[:, :, 0, :]))  # (N, 2, 8): the Linear's channels are last


def _folded(graph, q, dtype):
    walker = AbsPowInterpreter(graph, q, dtype)
    with torch.no_grad():
        walker.run_all_ones()
    return walker.folded


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("q", [0.5, 1.0, 2.0, 3.0, 6.0])
def test_folded_batchnorm_gives_the_enumerated_path_norm(seed, q):
    model = _randomise_(ConvBlock(), seed)
    shape = (2, 4, 4)
    assert len(_folded(graph_of(model, shape), q, torch.float64)) == 4  # every BN folded
    expected = NeuronDAG.from_module(model, shape).path_norm_log10(q)
    assert path_norm(model, shape, q=q).log10 == pytest.approx(expected, abs=1e-12)
    assert path_norm(model, shape, q=q, dtype=torch.float32).log10 == \
        pytest.approx(expected, abs=1e-5)


def test_float32_folds_only_where_the_product_of_two_layers_stays_in_range():
    graph = graph_of(_randomise_(ConvBlock(), 0), (2, 4, 4))
    assert len(_folded(graph, 2.0, torch.float32)) == 4
    assert not _folded(graph, 3.0, torch.float32)  # 2^(32q) would leave float32
    assert len(_folded(graph, 3.0, torch.float64)) == 4


@pytest.mark.parametrize("q", [1.0, 2.0])
def test_nothing_is_folded_where_the_premise_fails_and_the_norm_is_still_exact(q):
    model = _randomise_(NoFold(), 1)
    shape = (2, 4, 4)
    assert not _folded(graph_of(model, shape), q, torch.float64)
    expected = NeuronDAG.from_module(model, shape).path_norm_log10(q)
    assert path_norm(model, shape, q=q).log10 == pytest.approx(expected, abs=1e-12)


def test_a_batchnorm_far_from_its_layer_in_scale_is_folded_exactly():
    model = _randomise_(ConvBlock(), 2)
    with torch.no_grad():
        model.conv1.weight.mul_(2.0**-60)
        model.bn1.weight.mul_(2.0**70)
        model.bn2.running_var.mul_(2.0**-80)
    shape = (2, 4, 4)
    expected = NeuronDAG.from_module(model, shape).path_norm_log10(1.0)
    assert len(_folded(graph_of(model, shape), 1.0, torch.float32)) == 4
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        assert path_norm(model, shape, dtype=dtype).log10 == pytest.approx(expected, abs=tol)


@settings(max_examples=120, deadline=None)
@given(st.integers(-160, 160), st.sampled_from([0.5, 1.0, 2.0, 3.0]),
       st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from([torch.float32, torch.float64]), st.booleans(), st.integers(0, 9))
def test_magnitude_found_with_its_units_is_the_magnitude_in_the_units_bit_for_bit(
        exponent, q, weight_dtype, dtype, exact, seed):
    """The fold's one-read |W/u|^q (units found from the copy) equals ``units`` then
    ``magnitude``, for weights from 2^-160 to 2^160 and with a first call and a kept one."""
    conv = nn.Conv2d(3, 4, 3, bias=seed % 2 == 0).to(weight_dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64)
                    * 2.0**exponent)
    handler = ConvHandler("Conv2d")
    expected_units = handler.units(conv, exact)
    expected = handler.magnitude(conv, q, dtype, unit=expected_units[0]).clone()
    affine._UNITS.pop(conv, None)  # a first pass: nothing kept
    for _ in range(2):  # found from the copy, then kept
        got, units = handler.magnitude_in_units(conv, q, dtype, exact=exact)
        assert units == expected_units
        assert torch.equal(got, expected)
