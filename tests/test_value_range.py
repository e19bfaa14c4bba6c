"""``value_range`` inside ``reading_once`` reads a tensor once and never serves a stale or a
foreign range: the same memory, layout and version is the same tensor; an in-place update,
another view or another tensor is read again."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.ops.base import reading_once, value_range
from pathlift.prune import path_magnitude_scores


def test_a_tensor_is_read_once_and_again_after_an_in_place_update(monkeypatch):
    reads = []
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: reads.append(t.shape) or aminmax(t))
    t = torch.tensor([[-3.0, 2.0], [1.0, 0.5]])
    with reading_once():
        assert value_range(t) == (-3.0, 2.0)
        assert value_range(t.detach()) == (-3.0, 2.0)  # the same memory and version
        assert len(reads) == 1
        t.mul_(2)
        assert value_range(t) == (-6.0, 4.0)
        assert value_range(t[1]) == (1.0, 2.0)  # a view: other memory
        assert value_range(t.t()) == (-6.0, 4.0)  # another layout
        assert len(reads) == 4
    assert value_range(t) == (-6.0, 4.0) and len(reads) == 5  # outside: no memory


def test_nan_is_reported_inside_and_inference_tensors_are_read_each_time():
    with reading_once():
        low, high = value_range(torch.tensor([1.0, math.nan]))
        assert math.isnan(low) and math.isnan(high)
        with torch.inference_mode():
            t = torch.ones(3)
        assert value_range(t) == (1.0, 1.0)


def test_scores_still_refuse_a_nan_weight_naming_the_layer():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        model[2].weight[0, 1] = math.nan
    with pytest.raises(UnsupportedModelError, match="2"):
        path_magnitude_scores(model, (3,))
