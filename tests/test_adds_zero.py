"""A sum started at zero (``out = 0; out = out + branch(x)``, MobileOne's reparameterisable
blocks; ``x + 0.0``, ``x - 0``) is the identity: no neuron, no bias (thesis Def. 2.2.2).
``0 - x`` is a negation and stays refused, as any other constant added is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm


class Branches(nn.Module):
    """MobileOne-style: the branches summed into a Python 0, some of them absent."""

    def __init__(self, identity: bool):
        super().__init__()
        self.identity = nn.BatchNorm2d(3) if identity else None
        self.scale = None
        self.convs = nn.ModuleList(nn.Conv2d(3, 3, 3, padding=1) for _ in range(2))
        self.head = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x):
        identity_out = 0
        if self.identity is not None:
            identity_out = self.identity(x)
        scale_out = 0
        if self.scale is not None:
            scale_out = self.scale(x)
        out = scale_out + identity_out
        for conv in self.convs:
            out += conv(x)
        return self.head(torch.relu(out).flatten(1))


class Constants(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x):
        h = torch.relu(self.a(x) + 0.0) - 0
        return 0 + self.b(h)


@pytest.mark.parametrize("net", [Branches(identity=True), Branches(identity=False),
                                 Constants()], ids=["branches+bn", "branches", "constants"])
def test_a_sum_started_at_zero_is_the_identity(net):
    shape = (3, 4, 4) if isinstance(net, Branches) else (4,)
    net = randomised(net, seed=0)
    assert_norms_equal_enumeration(net, shape)
    assert_rescaling_keeps_function_and_norms(net, shape, lambda m: m.head.weight
                                              if isinstance(m, Branches) else m.a.weight)


class Negated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 5)

    def forward(self, x):
        return 0 - self.a(x)


class Shifted(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 5)

    def forward(self, x):
        return self.a(x) + 1


@pytest.mark.parametrize("net", [Negated(), Shifted()], ids=["0-x", "x+1"])
def test_any_other_constant_added_is_refused_in_one_line(net):
    with pytest.raises(UnsupportedModelError, match="adding a constant"):
        path_norm(net, (4,))
