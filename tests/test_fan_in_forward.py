"""Sizes computed in forward, at the traced input shape where each size is a number:
``graph.structure.fan_in`` (K of paper 002 Lemma F.3, the most antecedents of a neuron) on
pool sizes read off the activation (``h.shape[2:]``, ``h.size(2) // 2``), checked against
the windows counted by hand from that shape; an assertion on the input's size (timm's
patch embeddings) is a ShapeError at a shape it rejects, not control flow on values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pathlift.graph import graph_of
from pathlift.graph.structure import fan_in


class Pooled(nn.Module):
    """A 3x3 conv (2 input channels: 18 antecedents) on a 10x10 input (an 8x8 map), then a
    pool whose size is read off the map."""

    def __init__(self, pool):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.pool = pool

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(torch.relu(self.conv(x)))


@pytest.mark.parametrize(("pool", "window"), [
    (lambda h: F.avg_pool2d(h, h.size()[2:]), 64),  # the whole 8x8 map
    (lambda h: F.max_pool2d(h, kernel_size=h.shape[2:]), 64),
    (lambda h: F.max_pool2d(h, (h.size(2), h.size(3) // 2), stride=h.size(3) // 2), 32),
    (lambda h: F.adaptive_max_pool2d(h, h.size(2) // 2), 4),  # 8 -> 4: 2x2 windows
    (lambda h: F.max_pool2d(h, h.shape[-1] // 2 + 1, stride=1), 25),
])
def test_fan_in_reads_pool_sizes_computed_in_forward(pool, window):
    model = Pooled(pool).eval()
    assert fan_in(graph_of(model, (2, 10, 10))) == max(18, window)


class Asserting(nn.Module):
    """timm's patch embeddings: ``_assert(H == self.img_size, ...)`` on the input's size."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 4, stride=4)

    def forward(self, x: Tensor) -> Tensor:
        torch._assert(x.shape[-1] == 8, f"Input width ({x.shape[-1]}) doesn't match model (8).")
        return torch.relu(self.conv(x)).flatten(1)


def test_an_assertion_on_the_input_size_is_a_shape_error_not_control_flow():
    from pathlift.errors import ShapeError
    from pathlift.lift import path_norm
    from pathlift.testing.neurons import NeuronDAG

    model = Asserting().double().eval()
    with pytest.raises(ShapeError, match=r"asserts on the input's shape.*\(8\)") as info:
        graph_of(model, (1, 6, 6))
    assert "\n" not in str(info.value) and "control flow" not in str(info.value)
    assert path_norm(model, (1, 8, 8)).log10 == pytest.approx(
        NeuronDAG.from_module(model, (1, 8, 8)).path_norm_log10(1.0, 1.0), abs=1e-12)
