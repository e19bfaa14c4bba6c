"""Tensors computed in forward through shared sub-expressions (DaViT's and Swin's
position tables are built this way): a walk back to their sources visits each node once.
Walked once per path, a chain of 64 doublings `t = t + t * c` has 2^64 paths, and timm's
`davit_base` held the scan of timm's families for hours."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm

DEPTH = 64


def _doubled(t: torch.Tensor) -> torch.Tensor:
    for _ in range(DEPTH):
        t = t + t * 0.5
    return t


class TableScale(nn.Module):
    """An activation scaled by a table computed from a parameter."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.t = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc(x) * _doubled(self.t)


class TableLayer(nn.Module):
    """A functional layer over a weight and a bias computed through the chain, then an
    activation scaled by that bias: the layer is refused with the computation explained."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, 4))
        self.b = nn.Parameter(torch.ones(3))

    def forward(self, x):
        b = _doubled(self.b)
        return F.linear(x, self.w * b[:, None], b) * b


@pytest.mark.parametrize(("model", "named"), [(TableScale(), "computed in forward"),
                                             (TableLayer(), "op over b, w")],
                         ids=["scale", "layer"])
def test_a_table_built_through_shared_sub_expressions_is_judged_once(model, named):
    with pytest.raises(UnsupportedModelError) as err:
        path_norm(model, (4,))
    assert named in str(err.value)
    assert "reshaped before" not in str(err.value)  # computed, not merely reshaped
