"""Tracing at the input shape (pathlift.graph.trace): Python control flow on sizes
(``torch._assert`` on the rank, a head that pools small maps, ``torch.jit.is_scripting()``,
"same" padding computed from the input size) specialises at the given shape, and each
shape has its own graph; control flow on tensor values is refused in one line naming the
module and the line of code."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from activation_checks import assert_norms_equal_enumeration, randomised
from pathlift.errors import UnsupportedModelError
from pathlift.graph import trace
from pathlift.lift import path_norm


class AssertBatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: an assert on the rank, F.batch_norm, its activation."""

    def forward(self, x: Tensor) -> Tensor:
        torch._assert(x.ndim == 4, f"expected 4D input (got {x.ndim}D input)")
        return F.relu(F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                   self.bias, False, 0.1, self.eps))


class SameConv(nn.Conv2d):
    """timm's Conv2dSame: "same" padding computed from the input size."""

    def forward(self, x: Tensor) -> Tensor:
        ih, iw = x.size()[-2:]
        pads = [max((math.ceil(n / s) - 1) * s + k - n, 0)
                for n, s, k in zip((iw, ih), self.stride[::-1], self.kernel_size[::-1],
                                   strict=True)]
        x = F.pad(x, [pads[0] // 2, pads[0] - pads[0] // 2, pads[1] // 2,
                      pads[1] - pads[1] // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class PoolingHead(nn.Module):
    """timm's VGG head: pools up to its kernel size only when the map is smaller."""

    def __init__(self, channels: int, classes: int, size: int = 3):
        super().__init__()
        self.size = size
        self.fc = nn.Conv2d(channels, classes, size)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            return x
        if x.shape[-2] < self.size or x.shape[-1] < self.size:
            x = F.adaptive_avg_pool2d(x, (max(self.size, x.shape[-2]),
                                          max(self.size, x.shape[-1])))
        return self.fc(x).flatten(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = SameConv(1, 2, 3, stride=2), AssertBatchNormAct(2)
        self.head = PoolingHead(2, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.bn(self.conv(x)))


class Plain(nn.Module):
    """``Net`` at one input size, without any control flow."""

    def __init__(self, pads: list[int], pool: bool):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 2, 3, stride=2), nn.BatchNorm2d(2)
        self.fc = nn.Conv2d(2, 2, 3)
        self.pads, self.pool = pads, pool

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn(self.conv(F.pad(x, self.pads))))
        if self.pool:
            h = F.adaptive_avg_pool2d(h, (3, 3))
        return self.fc(h).flatten(1)


@pytest.mark.parametrize(("shape", "pads", "pool"), [
    ((1, 3, 3), [1, 1, 1, 1], True),  # a 2x2 map, pooled up to 3x3
    ((1, 6, 6), [0, 1, 0, 1], False),  # a 3x3 map
    ((1, 7, 5), [1, 1, 1, 1], False),
])
def test_shape_dependent_forward_specialises_exactly(shape, pads, pool):
    net = randomised(Net(), seed=1)
    plain = Plain(pads, pool).double().eval()
    plain.load_state_dict({k.replace("head.", ""): v for k, v in net.state_dict().items()})
    x = torch.randn(2, *shape, dtype=torch.float64)
    torch.testing.assert_close(net(x), plain(x), rtol=0, atol=1e-12)
    assert_norms_equal_enumeration(net, shape)
    for q in (1.0, 2.0):
        assert path_norm(net, shape, q=q).log10 == pytest.approx(
            path_norm(plain, shape, q=q).log10, abs=1e-12)
    assert trace(net, shape).input_shape == shape


def test_each_shape_has_its_own_graph():
    net = randomised(Net(), seed=2)
    small, large = trace(net, (1, 3, 3)), trace(net, (1, 6, 6))
    assert small is not large and trace(net, (1, 3, 3)) is small
    pools = [n for n in small.graph.nodes if n.target is F.adaptive_avg_pool2d]
    assert len(pools) == 1
    assert not [n for n in large.graph.nodes if n.target is F.adaptive_avg_pool2d]


class _ValueBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        if h.sum() > 0:
            return h
        return -h


def test_control_flow_on_values_is_refused_naming_module_and_line():
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(nn.Sequential(_ValueBranch()), (3,))
    message = str(info.value)
    assert "node '0'" in message and "test_shape_specialise.py:" in message
    assert "`if h.sum() > 0:`" in message
