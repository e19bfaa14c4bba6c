"""A constant written on either side of an activation: ``2.0 * h`` is ``h * 2.0``;
``torch.mul(2.0, h)`` is refused saying how to write it; ``2.0 / h`` and a rounded division
are not constant scales and are refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from activation_checks import assert_norms_equal_enumeration, randomised
from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm


class Scaled(nn.Module):
    def __init__(self, form: str):
        super().__init__()
        self.fc1, self.fc2, self.form = nn.Linear(3, 4), nn.Linear(4, 2), form

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.fc1(x))
        h = {"left": lambda: -1.5 * h, "torch": lambda: torch.mul(-1.5, h),
             "right": lambda: h * -1.5, "reciprocal": lambda: 2.0 / h,
             "floor": lambda: torch.div(h, 2, rounding_mode="floor")}[self.form]()
        return self.fc2(h)


def test_a_constant_on_the_left_is_the_same_scale():
    net = randomised(Scaled("left"), seed=4)
    right = randomised(Scaled("right"), seed=4)
    assert_norms_equal_enumeration(net, (3,))
    for q in (1.0, 2.0):
        assert path_norm(net, (3,), q=q).log10 == pytest.approx(
            path_norm(right, (3,), q=q).log10, abs=1e-12)


@pytest.mark.parametrize(("form", "cause"), [("reciprocal", "dividing by an activation"),
                                             ("floor", "integer division"),
                                             ("torch", r"write torch.mul\(x, c\)")])
def test_a_division_that_is_not_a_scale_is_refused(form, cause):
    with pytest.raises(UnsupportedModelError, match=cause):
        path_norm(Scaled(form), (3,))
