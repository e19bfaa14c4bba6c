"""Constant padding that crops (negative amounts, NASNet's ``ZeroPad2d((-1, 0, -1, 0))``)
selects neurons; padding with -inf read only by max-pools (TensorFlow's "same" max-pool,
timm's ``MaxPool2dSame``) leaves each window the max over the input's entries alone:
max-pool neurons (Def. 2.2.2). Both checked against enumeration and a real rescaling; -inf
read by anything else, or another constant, stays refused in one line."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm


class SameMaxPool(nn.Module):
    def forward(self, x):
        ih, iw = x.shape[-2:]
        pad_h, pad_w = max((math.ceil(ih / 2) - 1) * 2 + 3 - ih, 0), \
            max((math.ceil(iw / 2) - 1) * 2 + 3 - iw, 0)
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2),
                  value=-float("inf"))
        return F.max_pool2d(x, 3, 2)


class Net(nn.Module):
    def __init__(self, pool: nn.Module):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.pool = pool
        self.head = nn.LazyLinear(2)

    def forward(self, x):
        return self.head(self.pool(self.conv(x)).flatten(1))


def _built(pool: nn.Module, shape: tuple[int, ...]) -> nn.Module:
    net = Net(pool)
    net(torch.zeros(1, *shape))  # the lazy head takes its size
    return randomised(net, seed=0)


@pytest.mark.parametrize("pool", [lambda: nn.ZeroPad2d((-1, 0, -1, 0)),
                                  lambda: nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)),
                                                        nn.ZeroPad2d((-1, 0, -1, 0)))],
                         ids=["crop", "shift"])
def test_cropping_is_a_fixed_map(pool):
    net = _built(pool(), (2, 5, 5))
    assert_norms_equal_enumeration(net, (2, 5, 5))
    assert_rescaling_keeps_function_and_norms(net, (2, 5, 5), lambda m: m.conv.weight)


@pytest.mark.parametrize("q", [1.0, 2.0, 3.5])
def test_same_max_pooling_is_the_max_pool_of_its_padding(q):
    """On 5 x 5 maps TensorFlow's "same" window 3, stride 2 pads one entry each side: the
    network is its twin with ``nn.MaxPool2d(3, 2, padding=1)`` (PyTorch pads max-pools with
    -inf too), whose norms equal enumeration."""
    net = _built(SameMaxPool(), (2, 5, 5))
    twin = _built(nn.MaxPool2d(3, 2, padding=1), (2, 5, 5))
    twin.load_state_dict(net.state_dict())
    x = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(net(x), twin(x), rtol=0, atol=0)
    assert_norms_equal_enumeration(twin, (2, 5, 5))
    assert path_norm(net, (2, 5, 5), q=q).log10 == pytest.approx(
        path_norm(twin, (2, 5, 5), q=q).log10, abs=1e-13)
    assert_rescaling_keeps_function_and_norms(net, (2, 5, 5), lambda m: m.conv.weight)


class InfThenSum(nn.Module):
    def forward(self, x):
        return F.pad(x, (1, 1, 1, 1), value=-float("inf")).sum(dim=(2, 3))


class OneThenPool(nn.Module):
    def forward(self, x):
        return F.max_pool2d(F.pad(x, (1, 1, 1, 1), value=1.0), 3, 2)


@pytest.mark.parametrize("pool", [InfThenSum, OneThenPool], ids=["-inf-summed", "one"])
def test_other_constants_stay_refused_in_one_line(pool):
    with pytest.raises(UnsupportedModelError, match="padding with the constant"):
        path_norm(nn.Sequential(nn.Conv2d(2, 3, 3), pool()), (2, 5, 5))
