"""Fixed linear maps of weight 1 as users write them (issue 38): flip, roll, repeat, tile,
expand, ``Tensor.unfold`` (copies: relabelled neurons, Def. 2.2.2), ``F.unfold`` (im2col,
copies and zero padding), ``cumsum`` (identity neurons of a 0/1 lower-triangular map) and
``amin`` / ``min(dim).values`` (min x = -max(-x): max-pool neurons with weights -1, then
weight -1). Each model is checked against explicit path enumeration (``NeuronDAG``, which
probes the real ops) at q = 1, 2 and mixed, in float64 to 1e-12; a random neuron-wise
rescaling keeps its function and its enumerated norms (Thm 2.4.1); path-magnitude scores
equal autograd of the independent |theta|^q pass (sec. 3.5); Thm 3.3.1 holds on sampled
pairs and the path-metric to a pruned copy is enumerated (Lemma 3.4.1). What mixes samples
(the batch dimension) is refused in one line naming the op and the node."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

import timm_scan
from abs_pow_oracle import path_magnitude_oracle
from activation_checks import (
    assert_bounds_and_path_metric,
    assert_norms_equal_enumeration,
    assert_path_sgd_scale_is_enumerated,
    randomised,
)
from pathlift.bounds.box import box_outputs
from pathlift.errors import UnsupportedModelError
from pathlift.graph.boundary import flat_outputs
from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG

IMAGE = (2, 4, 4)

def _picked(parts: tuple[Tensor, ...]) -> Tensor:
    return parts[1] + parts[0]


#: name -> the map applied to the (batch, 3, 4, 4) output of a conv and a ReLU
MAPS = {
    "flip_method_negative_dim": lambda h: h.flip(-1),
    "torch_flip_dims_keyword": lambda h: torch.flip(h, dims=[1, 2]),
    "fliplr_channels": torch.fliplr,
    "roll_two_dims": lambda h: torch.roll(h, shifts=(1, -1), dims=(2, 3)),
    "roll_method_keywords": lambda h: h.roll(shifts=2, dims=-1),
    "rot90_spatial": lambda h: torch.rot90(h, 1, (2, 3)) + h.rot90(-1, [-1, -2]),
    "repeat_channels": lambda h: h.repeat(1, 2, 1, 1),
    "tile_short_reps": lambda h: torch.tile(h, (1, 2, 1)),
    "repeat_interleave_dim": lambda h: h.repeat_interleave(2, dim=2),
    "expand_after_mean": lambda h: h.mean((2, 3), keepdim=True).expand(-1, -1, 3, 3),
    "expand_as_broadcast_to": lambda h: h.amax(1, keepdim=True).expand_as(h)
    + torch.broadcast_to(h[:, :1], h.shape),
    "tensor_unfold_windows": lambda h: h.unfold(3, 2, 1),
    "f_unfold_padded_strided": lambda h: F.unfold(h, kernel_size=2, padding=1, stride=2),
    "cumsum_last_dim": lambda h: torch.cumsum(h, dim=-1),
    "cumsum_channels_method": lambda h: h.cumsum(1),
    "amin_spatial": lambda h: torch.amin(h, dim=(2, 3)),
    "amin_method_keepdim": lambda h: h.amin(-1, keepdim=True),
    "min_values_and_index": lambda h: torch.min(h, dim=2).values + h.min(3)[0],
    "negated_amin_is_amax": lambda h: -torch.amin(-h, dim=1),
    "stack_dim1_sum": lambda h: torch.stack([h, h.flip(-1)], dim=1).sum(1),
    "stack_last_mean": lambda h: torch.stack((h, h.cumsum(2)), -1).mean(-1),
    "stack_keywords_amax": lambda h: torch.stack(tensors=[h[:, :1], h[:, 1:2]], dim=2)
    .amax(dim=2),
    "stack_unbind_index": lambda h: _picked(torch.stack([h, h.roll(1, 2)], dim=1).unbind(1))
    + torch.stack([h, h.amin(1, keepdim=True).expand_as(h)], -2)[..., 1, :],
}
#: maps whose model the independent pass (abs_pow_oracle) reads: it keeps negations and
#: min(dim) as they are
ORACLE_READS = set(MAPS) - {"negated_amin_is_amax", "min_values_and_index"}


class Mapped(nn.Module):
    """Conv, ReLU, one of ``MAPS``, ReLU of a conv-free Linear head: as users write it."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.unfold = nn.Unfold(2, dilation=(1, 2)) if name == "module_unfold" else None
        self.head = nn.LazyLinear(2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.conv(x))
        h = self.unfold(h) if self.unfold is not None else MAPS[self.name](h)
        return self.head(h.flatten(1))


MAPS["module_unfold"] = None  # nn.Unfold, a submodule (Mapped.unfold)
ORACLE_READS.add("module_unfold")


def _net(name: str) -> nn.Module:
    torch.manual_seed(0)
    net = Mapped(name)
    net(torch.zeros(1, *IMAGE))  # size the lazy head
    return randomised(net, 0)


def _conv_weight(net: nn.Module) -> Tensor:
    return net.conv.weight


@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_fixed_map_is_exact_against_enumeration(name: str) -> None:
    net = _net(name)
    before = copy.deepcopy(net.state_dict())
    assert_norms_equal_enumeration(net, IMAGE)  # q = 1, 2, mixed, outputs, 1e-12
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_fixed_map_keeps_function_and_enumerated_norms_under_rescaling(name: str) -> None:
    net = _net(name)
    rescaled = random_rescale(net, seed=1, input_shape=IMAGE)
    assert not torch.equal(rescaled.conv.weight, net.conv.weight)
    x = torch.randn(4, *IMAGE, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(rescaled(x), net(x), rtol=1e-10, atol=1e-10)
    dag = NeuronDAG.from_module(rescaled, IMAGE)  # the rescaled copy, enumerated anew
    for q in (1.0, 2.0):
        assert path_norm(net, IMAGE, q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                                 abs=1e-12)


@pytest.mark.parametrize("name", sorted(ORACLE_READS))
def test_path_magnitude_scores_of_a_fixed_map_are_autograd_of_the_independent_pass(
        name: str) -> None:
    net = _net(name)
    scores = path_magnitude_scores(net, IMAGE)
    oracle = path_magnitude_oracle(net, IMAGE)
    assert set(oracle) <= set(scores.tensors)
    for key, expected in oracle.items():
        torch.testing.assert_close(scores.value(key), expected, rtol=1e-12,
                                   atol=1e-12 * float(expected.abs().max()))
    worst = timm_scan.check_measured(net, IMAGE)  # per output, q = 1, 2, rescaled
    assert max(worst.values()) <= timm_scan.RTOL, worst


@pytest.mark.parametrize("name", sorted(MAPS))
def test_bounds_hold_and_the_path_metric_of_a_fixed_map_is_enumerated(name: str) -> None:
    """Thm 3.3.1 on 40 sampled pairs; the l1 path-metric to a copy with 30% of the conv's
    weights zeroed is exact and equals ||Phi||_1 - ||Phi'||_1 by enumeration (Lemma
    3.4.1), and bounds the change of the outputs (Cor. 3.4.1)."""
    net = _net(name)
    pruned = copy.deepcopy(net)
    with torch.no_grad():
        keep = torch.rand(pruned.conv.weight.shape, generator=torch.Generator().manual_seed(5),
                          dtype=torch.float64) > 0.3
        pruned.conv.weight.mul_(keep)
    assert_bounds_and_path_metric(net, IMAGE, pruned)


@pytest.mark.parametrize("name", ["amin_spatial", "cumsum_channels_method",
                                  "f_unfold_padded_strided", "stack_dim1_sum"])
def test_path_sgd_scales_through_a_fixed_map_are_enumerated(name: str) -> None:
    """Path-SGD's gamma_p = d||Phi||_2^2 / d(p^2), against central differences of the
    enumerated ||Phi||_2^2, entry by entry."""
    net = _net(name)
    assert_path_sgd_scale_is_enumerated(net, IMAGE, net.conv.weight, [(0, 0, 0, 0), (2, 1, 1, 2)])


@pytest.mark.parametrize("name", sorted(MAPS))
def test_the_box_pass_encloses_networks_drawn_around_a_fixed_map(name: str) -> None:
    """The interval pass of the certificates (``box_outputs``) over a box of +-0.05 around
    every parameter encloses the outputs of 10 networks drawn in the box."""
    net = _net(name)
    x = torch.randn(6, *IMAGE, dtype=torch.float64)
    boxes = {layer: {n: (p.detach() - 0.05, p.detach() + 0.05)
                     for n, p in getattr(net, layer).named_parameters()}
             for layer in ("conv", "head")}
    (out,) = box_outputs(net, IMAGE, x, boxes)
    g = torch.Generator().manual_seed(3)
    for _ in range(10):
        drawn = copy.deepcopy(net)
        with torch.no_grad():
            for p in drawn.parameters():
                p.add_(0.1 * torch.rand(p.shape, generator=g, dtype=p.dtype) - 0.05)
            y = drawn(x)
        assert bool(((out.low <= y) & (y <= out.high)).all())


class Drawn(nn.Module):
    """A conv, ReLU, then ``spell`` (a map drawn by hypothesis), a Linear head."""

    def __init__(self, spell) -> None:
        super().__init__()
        self.spell = spell
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.head = nn.LazyLinear(2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.spell(F.relu(self.conv(x))).flatten(1))


@st.composite
def _spellings(draw):
    """A map along feature dims of a (batch, 3, 4, 4) tensor, each dim drawn positive or
    negative, each argument positional or by keyword."""
    dim = draw(st.sampled_from([1, 2, 3, -1, -2, -3]))
    dims = tuple(draw(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=2,
                               unique=True)))
    dims = tuple(d - 4 if draw(st.booleans()) else d for d in dims)
    shift = draw(st.integers(-5, 5))
    reps = (1, *draw(st.lists(st.integers(1, 2), min_size=3, max_size=3)))
    keep = draw(st.booleans())
    spellings = [
        lambda h: torch.flip(h, dims), lambda h: h.flip(dims=dims),
        lambda h: torch.roll(h, shift, dim), lambda h: h.roll(shifts=shift, dims=dim),
        lambda h: h.repeat(*reps), lambda h: torch.tile(h, reps),
        lambda h: h.repeat_interleave(2, dim=dim),
        lambda h: torch.cumsum(h, dim=dim), lambda h: h.cumsum(dim),
        lambda h: torch.amin(h, dims, keepdim=keep), lambda h: h.amin(dim=dims),
        lambda h: torch.min(h, dim, keep).values, lambda h: h.min(dim=dim)[0],
        lambda h: torch.stack([h, h.flip(dim)], dim=dim).sum(dim),
        lambda h: torch.stack([h, h], dim if dim < 0 else dim + 1).amax(dims),
        lambda h: h.unfold(dim, 2, 1 + keep),
    ]
    return draw(st.sampled_from(spellings))


@settings(max_examples=20, deadline=None)
@given(_spellings(), st.integers(0, 2**16), st.floats(1.0, 3.0))
def test_any_spelling_of_a_fixed_map_is_exact_against_enumeration(spell, seed, q) -> None:
    torch.manual_seed(seed)
    net = Drawn(spell)
    net(torch.zeros(1, *IMAGE))
    net = randomised(net, seed)
    dag = NeuronDAG.from_module(net, IMAGE)
    x = torch.randn(1, *IMAGE, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(dag.output(x)), net(x).reshape(-1),
                                   rtol=0, atol=1e-12)
    assert path_norm(net, IMAGE, q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                             abs=1e-12)


class TwoHeads(nn.Module):
    """A shared trunk, then a dict of two heads reading a rolled, tiled copy and a
    cumulative min-pool of it (outputs as users return them)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Conv1d(2, 3, 3, padding=1, padding_mode="circular")
        self.heads = nn.ModuleDict({"rolled": nn.Linear(3 * 14, 2), "pooled": nn.Linear(3, 1)})

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        h = F.relu(self.trunk(x))
        rolled = torch.tile(h.roll(-2, -1), (1, 2))[..., 1:-1]
        pooled = torch.cumsum(h, -1).amin(-1)
        return {"rolled": self.heads["rolled"](rolled.flatten(1)),
                "pooled": self.heads["pooled"](pooled)}


def test_dict_outputs_through_fixed_maps_are_exact_against_enumeration() -> None:
    torch.manual_seed(0)
    net, shape = randomised(TwoHeads(), 0), (2, 8)
    dag = NeuronDAG.from_module(net, shape)
    x = torch.randn(3, *shape, dtype=torch.float64)
    with torch.no_grad():
        y = flat_outputs(net(x), 3)
    for i in range(3):
        torch.testing.assert_close(torch.as_tensor(dag.output(x[i:i + 1])), y[i], rtol=0,
                                   atol=1e-12)
    for q, r in ((1.0, None), (2.0, None), (1.0, math.inf), (2.0, 1.0)):
        assert path_norm(net, shape, q=q, r=r).log10 == pytest.approx(
            dag.path_norm_log10(q, r), abs=1e-12), (q, r)
    rescaled = random_rescale(net, seed=2, input_shape=shape)
    assert not torch.equal(rescaled.trunk.weight, net.trunk.weight)
    with torch.no_grad():
        torch.testing.assert_close(flat_outputs(rescaled(x), 3), y, rtol=1e-10, atol=1e-10)
    assert NeuronDAG.from_module(rescaled, shape).path_norm_log10(2.0) == pytest.approx(
        dag.path_norm_log10(2.0), abs=1e-12)


class ChannelMean(nn.Module):
    """A mean over the channels of a (batch, 4, 4) map: as many positions as channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.relu(self.conv(x)).mean(1))


def test_a_mean_across_channels_ties_them_when_rescaling() -> None:
    """The channel analysis read a map that keeps the channel count as per-channel and
    rescaled each channel on its own: a mean across 4 channels of length 4 changed the
    function by 231 (the ids of every channel it mixes are now tied)."""
    torch.manual_seed(0)
    net = ChannelMean().double().eval()
    rescaled = random_rescale(net, seed=1, input_shape=(2, 4))
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(rescaled(x), net(x), rtol=1e-12, atol=1e-12)


class Across(nn.Module):
    """A map over the batch dimension: it mixes samples."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op = op
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.op(F.relu(self.fc(x)))


ACROSS = {
    "flip_batch": (lambda h: h.flip(0), "flip"),
    "flipud": (torch.flipud, "flipud"),
    "roll_flattened": (lambda h: torch.roll(h, 1), "roll"),
    "rot90_default_dims": (lambda h: torch.rot90(h.reshape(2, 2, 2), 1).flatten(1), "rot90"),
    "roll_batch_keyword": (lambda h: h.roll(1, dims=-2), "roll"),
    "cumsum_batch": (lambda h: h.cumsum(dim=-2), "cumsum"),
    "amin_batch": (lambda h: torch.amin(h, 0, keepdim=True).expand(2, 4), "amin"),
    "repeat_interleave_flat": (lambda h: h.repeat_interleave(2).reshape(2, 8), "repeat_interleave"),
    "unfold_unbatched": (lambda h: F.unfold(h.reshape(2, 2, 2), 1), "unfold"),
    "stack_dim0_sum": (lambda h: torch.stack([h, h.flip(1)]).sum(0), "stack"),
    "stack_dim0_keyword": (lambda h: torch.stack([h, h, h], dim=-3).amax(0), "stack"),
}


@pytest.mark.parametrize("name", sorted(ACROSS))
def test_a_map_across_the_batch_is_refused_in_one_line(name: str) -> None:
    op, label = ACROSS[name]
    torch.manual_seed(0)
    net = Across(op).double().eval()
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(net, (4,))
    line = timm_scan.check_refused(info.value)
    assert label in line and "batch" in line, line
