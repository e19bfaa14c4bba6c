"""What a forward reads of its own module to fix its structure. A module tensor's shape is
a constant of the model: TensorFlow-style "same" padding from the kernel's size and the
input's (timm's ``Conv2dSame``, ``tf_efficientnet_lite*``), a head sized by
``self.w.size(0)``; the layer is then read as its module form. A forward chosen in
``__init__`` (``self.forward = self.forward_split``, timm's FasterNet) runs on pathlift's
copy of the module. Checked against enumeration and a real rescaling."""

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


class SameConv(nn.Conv2d):
    """Pads like TensorFlow's SAME from ``self.weight.shape``, then ``F.conv2d``."""

    def forward(self, x):
        kh, kw = self.weight.shape[-2:]
        ih, iw = x.size()[-2:]
        sh, sw = self.stride
        pad_h = max((math.ceil(ih / sh) - 1) * sh + kh - ih, 0)
        pad_w = max((math.ceil(iw / sw) - 1) * sw + kw - iw, 0)
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class Sized(nn.Module):
    """A Linear over ``self.w`` whose output is viewed by its own size."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 2 * 3 * 3))
        self.b = nn.Parameter(torch.randn(6))

    def forward(self, x):
        y = F.linear(x.flatten(1), self.w, self.b)
        return y.view(-1, self.w.size(0) // 2, 2).flatten(1)


class Net(nn.Module):
    def __init__(self, head: nn.Module):
        super().__init__()
        self.conv = SameConv(2, 2, 3, stride=2)
        self.head = head

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)))


@pytest.mark.parametrize("head", [lambda: nn.Sequential(nn.Flatten(), nn.Linear(18, 3)),
                                  Sized], ids=["linear", "sized"])
def test_a_layer_reading_its_own_shape_is_its_module_form(head):
    net = randomised(Net(head()), seed=0)
    assert_norms_equal_enumeration(net, (2, 5, 5))
    assert_rescaling_keeps_function_and_norms(net, (2, 5, 5), lambda m: m.conv.weight)


class Partial(nn.Module):
    """FasterNet's partial convolution: the forward chosen in ``__init__`` (an instance
    attribute bound to the module), a conv over the first channels, the rest untouched."""

    def __init__(self, channels: int, split: bool):
        super().__init__()
        self.first = channels // 2
        self.conv = nn.Conv2d(self.first, self.first, 3, padding=1)
        self.forward = self.forward_split if split else self.forward_slicing

    def forward_split(self, x):
        x1, x2 = torch.split(x, [self.first, x.shape[1] - self.first], dim=1)
        return torch.cat((self.conv(x1), x2), 1)

    def forward_slicing(self, x):
        return torch.cat((self.conv(x[:, :self.first]), x[:, self.first:]), 1)


@pytest.mark.parametrize("split", [True, False], ids=["split_cat", "slicing"])
def test_a_forward_chosen_in_init_is_traced_on_the_copy(split):
    net = randomised(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                                   Partial(4, split), nn.ReLU(), nn.Flatten(),
                                   nn.Linear(4 * 3 * 3, 2)), seed=0)
    assert_norms_equal_enumeration(net, (2, 3, 3))
    assert_rescaling_keeps_function_and_norms(net, (2, 3, 3), lambda m: m[2].conv.weight)
