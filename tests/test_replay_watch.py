"""The structure check of recorded passes (pathlift.lift.replay.Watch, one generated tuple
compared at once): every change the traced graph or the tape depends on is seen, and
nothing else (new values in place, a NaN attribute that stays the same object)."""

from __future__ import annotations

import gc
import math

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize, prune

from pathlift.lift.replay import Watch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
        self.register_buffer("offset", torch.zeros(3))
        self.note = math.nan

    def forward(self, x):
        return self.body(x) + self.offset


class Double(nn.Module):
    def forward(self, w):
        return 2 * w


CHANGES = {
    "parameter replaced": lambda m: setattr(m.body[0], "weight",
                                            nn.Parameter(m.body[0].weight.detach().clone())),
    "parameter set to None": lambda m: setattr(m.body[2], "bias", None),
    "pruned": lambda m: prune.l1_unstructured(m.body[0], "weight", amount=0.5),
    "parametrized": lambda m: parametrize.register_parametrization(m.body[0], "weight",
                                                                   Double()),
    "dtype": lambda m: m.double(),
    "data reassigned, other shape": lambda m: setattr(m.body[0].weight, "data",
                                                      torch.zeros(5, 5)),
    "buffer other shape": lambda m: setattr(m, "offset", torch.zeros(1, 3)),
    "buffer added": lambda m: m.body[0].register_buffer("extra", torch.ones(1)),
    "module swapped": lambda m: m.body.__setitem__(1, nn.ReLU()),
    "module deleted": lambda m: m.body.__delitem__(2),
    "class changed": lambda m: setattr(m.body[1], "__class__", nn.LeakyReLU),
    "train/eval flip": lambda m: m.train(not m.training),
    "forward hook": lambda m: m.body[2].register_forward_hook(lambda *a: None),
    "forward pre-hook": lambda m: m.register_forward_pre_hook(lambda *a: None),
    "instance forward": lambda m: setattr(m.body[1], "forward", torch.relu),
    "plain attribute": lambda m: setattr(m.body[0], "in_features", 6),
    "plain attribute deleted": lambda m: delattr(m, "note"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_change_is_seen(change: str) -> None:
    model = Net()
    watch = Watch(model)
    assert watch.unchanged()
    CHANGES[change](model)
    assert not watch.unchanged()


def test_new_values_in_place_and_a_same_nan_are_unchanged() -> None:
    model = Net()
    watch = Watch(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
        model.offset.add_(1.0)
    model.body[0].weight.data = model.body[0].weight.data.clone()  # same shape and dtype
    assert watch.unchanged()


def test_a_freed_model_is_changed_and_not_kept_alive() -> None:
    model = Net()
    watch = Watch(model)
    del model
    gc.collect()
    assert not watch.unchanged()
