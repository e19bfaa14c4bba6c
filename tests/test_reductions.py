"""Reductions over feature dims (pathlift.graph.ops.pooling): ``amax`` and
``torch.max(h, dim).values`` / ``[0]`` are 1-max-pool neurons (PointNet's global feature,
what ``nn.AdaptiveMaxPool1d(1)`` computes), ``sum`` identity neurons with weights 1; each
exact against path enumeration and against the module form; indices and reductions over
the batch are refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.bounds import architecture_constants
from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores

SHAPE = (3, 5)  # 5 points in 3-d


def _amax(h: Tensor) -> Tensor:
    return torch.amax(h, dim=2)


def _max_values(h: Tensor) -> Tensor:
    return torch.max(h, dim=-1).values


def _max_item(h: Tensor) -> Tensor:
    return h.max(2, keepdim=True)[0].flatten(1)


class PointNet(nn.Module):
    """A shared per-point MLP (1x1 convolutions), a global max over the points, a head."""

    def __init__(self, pool=_amax):
        super().__init__()
        self.mlp1, self.mlp2 = nn.Conv1d(3, 4, 1), nn.Conv1d(4, 4, 1)
        self.head = nn.Linear(4, 2)
        self.pool = pool

    def features(self, x: Tensor) -> Tensor:
        return F.relu(self.mlp2(F.relu(self.mlp1(x))))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pool(self.features(x)))


class ModulePointNet(PointNet):
    """The same network with ``nn.AdaptiveMaxPool1d(1)``."""

    def __init__(self):
        super().__init__(pool=None)
        self.max = nn.AdaptiveMaxPool1d(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.max(self.features(x)).flatten(1))


@pytest.mark.parametrize("pool", [_amax, _max_values, _max_item])
def test_global_max_is_max_pool_neurons(pool):
    net = randomised(PointNet(pool), seed=4)
    twin = ModulePointNet().double().eval()
    twin.load_state_dict(net.state_dict())
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(net(x), twin(x), rtol=0, atol=0)
    assert_norms_equal_enumeration(net, SHAPE)
    for q in (1.0, 2.0):
        assert path_norm(net, SHAPE, q=q).log10 == pytest.approx(
            path_norm(twin, SHAPE, q=q).log10, abs=1e-12)
    scores, expected = (path_magnitude_scores(m, SHAPE).tensors for m in (net, twin))
    for key, value in scores.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-12, atol=0)
    assert architecture_constants(net, SHAPE).kernel == 5  # one window of 5 points
    assert_rescaling_keeps_function_and_norms(net, SHAPE, lambda m: m.mlp1.weight)


class _Sum(PointNet):
    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x).sum(dim=-1)) + self.head(
            self.features(x).mean(dim=2))


def test_sum_and_mean_over_points_are_fixed_linear_maps():
    net = randomised(_Sum(), seed=5)
    assert_norms_equal_enumeration(net, SHAPE)


class _Refused(PointNet):
    def __init__(self, forward):
        super().__init__()
        self.pick = forward

    def forward(self, x: Tensor) -> Tensor:
        return self.pick(self, self.features(x))


@pytest.mark.parametrize(("pick", "words"), [
    (lambda m, h: m.head(h[:, :, 0]) + torch.max(h, 2).indices[:, :2], "indices"),
    (lambda m, h: m.head(torch.amax(h, dim=(0, 2))[None]), "batch dimension"),
    (lambda m, h: m.head(h.amax(dim=2)) * 0 + h.sum(dim=0)[:, :2], "batch dimension"),
])
def test_indices_and_reductions_over_the_batch_are_refused(pick, words):
    with pytest.raises(UnsupportedModelError, match=words):
        path_norm(randomised(_Refused(pick), seed=6), SHAPE)
