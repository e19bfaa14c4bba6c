"""The float32 screening pass of ``pathlift.bounds.box`` (``box_margins(screen=True)``):
an enclosure in its own right, checked against exact rational arithmetic on a tiny CNN,
never above the float64 pass's margins, and the matrix-product form of the affine layers
it runs on (``as_products``) against the layers themselves."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds.box import _screened, box_margins
from pathlift.bounds.code import quantized_tensors
from pathlift.graph import graph_of
from pathlift.graph.layer_graph import HANDLER
from pathlift.graph.ops.base import Call


class _Tiny(nn.Module):
    """A user-style CNN: conv, functional ReLU, max-pool, flatten, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.head(h.flatten(1))


def _exact_margins(model: _Tiny, x: torch.Tensor, y: torch.Tensor) -> list[Fraction]:
    """R(x)_y - max_{c != y} R(x)_c of ``model`` on 1x4x4 inputs, in exact rationals."""
    w = [[[[Fraction(float(v)) for v in row] for row in k[0]]] for k in model.conv.weight.detach()]
    b = [Fraction(float(v)) for v in model.conv.bias.detach()]
    lw = [[Fraction(float(v)) for v in row] for row in model.head.weight.detach()]
    lb = [Fraction(float(v)) for v in model.head.bias.detach()]
    out = []
    for image, label in zip(x, y.tolist(), strict=True):
        px = [[Fraction(float(v)) for v in row] for row in image[0]]
        act = [[[max(Fraction(0), b[c] + sum(
            w[c][0][di][dj] * px[i + di - 1][j + dj - 1] for di in range(3) for dj in range(3)
            if 0 <= i + di - 1 < 4 and 0 <= j + dj - 1 < 4)) for j in range(4)]
            for i in range(4)] for c in range(2)]
        hidden = [max(act[c][2 * i + a][2 * j + e] for a in (0, 1) for e in (0, 1))
                  for c in range(2) for i in range(2) for j in range(2)]
        logits = [lb[k] + sum(p * h for p, h in zip(lw[k], hidden, strict=True))
                  for k in range(3)]
        out.append(logits[label] - max(v for k, v in enumerate(logits) if k != label))
    return out


def _boxes(model: nn.Module, shape: tuple[int, ...], width: float
           ) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    out: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    for name, _, _, value in quantized_tensors(graph_of(model, shape)):
        layer, pname = name.rsplit(".", 1)
        v = value.detach().double()
        out.setdefault(layer, {})[pname] = (v - width, v + width)
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), width=st.sampled_from([0.0, 2.0 ** -12, 2.0 ** -6]),
       scale=st.sampled_from([1.0, 1e3]))
def test_the_float32_screen_lies_below_the_exact_margin_of_every_network_of_the_box(
        seed, width, scale):
    """Networks drawn in the box (its corners and inside), their margins computed exactly
    in rationals: the float32 bound lies below every one, and below the float64 pass's
    bound's network-wise counterpart (the float64 margin of the box's centre)."""
    torch.manual_seed(seed)
    model = _Tiny().double().eval()
    x = torch.randn(4, 1, 4, 4, dtype=torch.float64) * scale
    y = torch.randint(0, 3, (4,))
    boxes = _boxes(model, (1, 4, 4), width)
    low = _screened(graph_of(model, (1, 4, 4)), x, y, boxes)
    assert low is not None and low.dtype == torch.float64
    centre = box_margins(model, (1, 4, 4), x, y, _boxes(model, (1, 4, 4), 0.0))
    assert bool((low <= centre).all())
    g = torch.Generator().manual_seed(seed)
    for draw in range(3):
        inner = _Tiny().double().eval()
        with torch.no_grad():
            for name, param in inner.named_parameters():
                lo, hi = boxes[name.rsplit(".", 1)[0]][name.rsplit(".", 1)[1]]
                t = torch.rand(lo.shape, generator=g, dtype=torch.float64)
                t = t.round() if draw == 0 else t  # a corner, then inside
                param.copy_((lo + t * (hi - lo)).clamp(lo, hi))
        exact = _exact_margins(inner, x, y)
        for bound, value in zip(low.tolist(), exact, strict=True):
            assert Fraction(bound) <= value


def test_a_tight_screen_is_close_to_the_float64_pass_and_counts_the_same_event():
    """On a point box the float32 bound is within 1e-4 of the exact margin (relative to
    the logits' scale); ``screen=True`` returns the larger of the float32 and float64
    bounds where it is <= 0, which here is exactly where the float64 bound is."""
    torch.manual_seed(1)
    model = _Tiny().double().eval()
    x = torch.randn(400, 1, 4, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (400,))
    boxes = _boxes(model, (1, 4, 4), 2.0 ** -9)
    plain = box_margins(model, (1, 4, 4), x, y, boxes)
    screened = box_margins(model, (1, 4, 4), x, y, boxes, screen=True)
    assert torch.equal(plain <= 0, screened <= 0) and 0 < int((plain <= 0).sum()) < 400
    both = torch.maximum(plain, _screened(graph_of(model, (1, 4, 4)), x, y, boxes))
    assert torch.equal(screened[screened <= 0], both[screened <= 0])
    point = _boxes(model, (1, 4, 4), 0.0)
    low = _screened(graph_of(model, (1, 4, 4)), x[:20], y[:20], point)
    exact = _exact_margins(model, x[:20], y[:20])
    for bound, value in zip(low.tolist(), exact, strict=True):
        assert 0 <= value - Fraction(bound) <= Fraction(1, 10_000)


class _AvgPooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv1d(1, 2, 3, padding=1), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.avg_pool1d(torch.relu(self.conv(x)), 2).flatten(1))


def test_the_screen_steps_aside_where_float32_is_not_derived(monkeypatch):
    """Average pooling (its rounding derived in float64 only), reduced-precision float32
    products: no screening, the float64 pass alone, bit for bit."""
    torch.manual_seed(0)
    model = _AvgPooled().double().eval()
    x, y = torch.randn(30, 1, 8, dtype=torch.float64), torch.randint(0, 3, (30,))
    boxes = _boxes(model, (1, 8), 2.0 ** -8)
    graph = graph_of(model, (1, 8))
    assert _screened(graph, x, y, boxes) is None
    assert torch.equal(box_margins(graph, None, x, y, boxes, screen=True),
                       box_margins(graph, None, x, y, boxes))
    tiny = _Tiny().double().eval()
    tiny_graph = graph_of(tiny, (1, 4, 4))
    xs = torch.randn(5, 1, 4, 4, dtype=torch.float64)
    assert _screened(tiny_graph, xs, y[:5], _boxes(tiny, (1, 4, 4), 0.0)) is not None
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    assert _screened(tiny_graph, xs, y[:5], _boxes(tiny, (1, 4, 4), 0.0)) is None


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv1d(3, 4, 5, padding=2), (3, 17)),
    (nn.Conv1d(3, 4, 3, stride=2, dilation=2, padding=3), (3, 17)),
    (nn.Conv2d(2, 5, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2)), (2, 9, 8)),
    (nn.Conv3d(2, 3, 3, padding=1, bias=False), (2, 5, 4, 6)),
    (nn.Linear(6, 4), (6,)),
])
def test_as_products_is_the_layer(layer, shape):
    """The matrix-product form of an affine layer equals the layer (to float64 rounding);
    grouped convolutions have none."""
    torch.manual_seed(0)
    net = nn.Sequential(layer).double()
    graph = graph_of(net, shape)
    node = next(n for n in graph.graph.nodes if n.op == "call_module")
    x = torch.randn(7, *shape, dtype=torch.float64)
    call = Call(node, layer, (x,), {})
    with torch.no_grad():
        got = node.meta[HANDLER].as_products(x, layer.weight, call, layer.bias)
        want = layer(x)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-12 * max(1.0, float(want.abs().max()))
    grouped = nn.Sequential(nn.Conv1d(4, 4, 3, groups=2)).double()
    g_node = next(n for n in graph_of(grouped, (4, 9)).graph.nodes if n.op == "call_module")
    xg = torch.randn(2, 4, 9, dtype=torch.float64)
    assert g_node.meta[HANDLER].as_products(xg, grouped[0].weight, Call(
        g_node, grouped[0], (xg,), {}), None) is None
    assert math.isfinite(float(got.abs().max()))


class _OwnConv(nn.Conv1d):
    """A convolution whose ``_conv_forward`` is the user's (here: twice the layer)."""

    def _conv_forward(self, x, weight, bias):
        return 2 * super()._conv_forward(x, weight, bias)


def test_a_convolution_with_its_own_forward_has_no_product_form():
    conv = _OwnConv(2, 3, 3, padding=1).double()
    net = nn.Sequential(conv)
    node = next(n for n in graph_of(net, (2, 7)).graph.nodes if n.op == "call_module")
    x = torch.randn(2, 2, 7, dtype=torch.float64)
    assert node.meta[HANDLER].as_products(x, conv.weight, Call(node, conv, (x,), {})) is None


def test_the_final_pass_screens_only_where_most_rows_lie_outside_the_event(monkeypatch):
    """``_Screen``: on when the search's rate is at most 1/2, off when unknown or above,
    and off for good after a batch with most rows inside; it orders the two passes only,
    so the final pass counts the same box event either way."""
    from pathlift.bounds import compression

    assert compression._Screen(0.03).on and not compression._Screen(0.7).on
    assert not compression._Screen(None).on
    screen = compression._Screen(0.1)
    screen.seen(10, 100)
    assert screen.on
    screen.seen(60, 100)
    screen.seen(0, 100)
    assert not screen.on
    torch.manual_seed(2)
    model = _Tiny().double().eval()
    graph = graph_of(model, (1, 4, 4))
    x = torch.randn(300, 1, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        y = model(x).argmax(1)  # right everywhere: the event holds near the boundary alone
    y[:20] = (y[:20] + 1) % 3
    boxes = _boxes(model, (1, 4, 4), 2.0 ** -9)
    asked = []
    real = compression.box_margins
    monkeypatch.setattr(compression, "box_margins",
                        lambda *a, **k: asked.append(k["float64_first"]) or real(*a, **k))
    counts = [compression._events(model, graph, None, boxes, x, y, s, batch=100)
              for s in (compression._Screen(0.0), compression._Screen(None))]
    assert asked == [False] * 3 + [True] * 3
    assert torch.equal(counts[0], counts[1]) and 0 < int(counts[0][2]) < 300
    low = torch.maximum(box_margins(model, (1, 4, 4), x, y, boxes), _screened(graph, x, y, boxes))
    assert int(counts[0][2]) == int((low <= 0).sum())
