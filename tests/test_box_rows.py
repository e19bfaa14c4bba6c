"""The box event of the compression certificate is a function of the row alone (issue 39,
"At scale"): each row's bound from ``box_margins`` has the same bits whatever the other
rows of its batch, and the final pass's count is the same, bit for bit, whatever the
order of the rows, the batch sizes, the ranks they are sharded over (as torchrun would,
``Batches(world=...)``) and where each rank's float32 screen switches off; including rows
built to sit between the float32 and the float64 bounds, where the old rule (a row
counted where both bounds are <= 0 on screened batches, where the float64 one is on the
others) gave counts that moved with the batches."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.bounds import box, compression
from pathlift.bounds.box import _margin_bounds, _run, _screened, box_margins
from pathlift.bounds.code import quantized_tensors
from pathlift.bounds.compression import CompressionSearch, compression_bound
from pathlift.bounds.sample import Batches
from pathlift.distributed import World
from pathlift.graph import graph_of
from test_box_screen import _Tiny as Tiny  # a user-style CNN: functional ReLU, max-pool


class Wide(nn.Module):
    """An MLP whose products (40 -> 32) MKL computes with other bits in a tail of rows."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 40), nn.ReLU(), nn.Linear(40, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.body(x)))


def _boxes(model: nn.Module, width: float) -> dict:
    out: dict = {}
    for name, _, _, value in quantized_tensors(graph_of(model, (1, 4, 4))):
        layer, pname = name.rsplit(".", 1)
        v = value.detach().double()
        out.setdefault(layer, {})[pname] = (v - width * v.abs(), v + width * v.abs())
    return out


def _margin(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out.gather(1, y[:, None])[:, 0] - out.scatter(1, y[:, None], -torch.inf).amax(1)


def _edge_rows(model: nn.Module, x: torch.Tensor, margins: list[float]) -> tuple:
    """Rows on segments between inputs of two predicted classes, bisected in float64 to
    a margin (for the first one's class) of each of ``margins`` times the logits' scale:
    from well inside the float32 bound's rounding to well inside the float64 one's."""
    with torch.no_grad():
        pred = model(x).argmax(1)
    rows, labels = [], []
    for i, target in enumerate(margins):
        a = x[i]
        b = x[(pred != pred[i]).nonzero()[i % 5, 0]]
        y = pred[i:i + 1]
        scale = float(model(a[None]).abs().max().detach())
        lo, hi = 0.0, 1.0  # margin(lo) > target >= margin(hi)
        for _ in range(80):
            mid = (lo + hi) / 2
            m = float(_margin(model, ((1 - mid) * a + mid * b)[None], y))
            lo, hi = (mid, hi) if m > target * scale else (lo, mid)
        rows.append((1 - lo) * a + lo * b)
        labels.append(int(y))
    return torch.stack(rows), torch.tensor(labels)


@lru_cache
def _sample(kind: type[nn.Module], n: int = 240, seed: int = 0) -> tuple:
    """``n`` rows: random ones (a sixth with a wrong label, clustered at the front so some
    batches hold mostly rows of the event; one in nine of the others 1e4 times larger)
    and rows on the edge of the event."""
    torch.manual_seed(seed)
    model = kind().double().eval()
    x = torch.randn(n, 1, 4, 4, dtype=torch.float64)
    x[n // 6::9] *= 1e4  # rows that would widen the rounding bounds of the others
    with torch.no_grad():
        y = model(x).argmax(1)
    y[: n // 6] = (y[: n // 6] + 1) % 4 if model.head.out_features == 4 else \
        (y[: n // 6] + 1) % 3
    edge_x, edge_y = _edge_rows(model, x, [10.0 ** -k for k in range(2, 16)] * 3)
    return model, torch.cat([edge_x, x]), torch.cat([edge_y, y])


def _float64(graph, x, y, boxes):
    return _margin_bounds(_run(graph, x, boxes, stop_at_output=True), y, False)


@pytest.mark.parametrize("kind", [Tiny, Wide])
def test_a_rows_bounds_are_its_own_bit_for_bit(kind):
    """Every bound of the float64 pass, the float32 pass and the screened bound of each
    row: the same bits alone (batches of one, on the first 50 rows: the edge rows and
    some others), in batches of 3, 7 and 64, and among all."""
    model, x, y = _sample(kind)
    graph = graph_of(model, (1, 4, 4))
    boxes = _boxes(model, 2.0 ** -20)
    passes = {
        "float64": lambda a, b: box_margins(graph, None, a, b, boxes),
        "screened": lambda a, b: box_margins(graph, None, a, b, boxes, screen=True),
        "float64 first": lambda a, b: box_margins(graph, None, a, b, boxes, screen=True,
                                                  float64_first=True),
        "float32": lambda a, b: box._rows_apart(
            lambda c, d: _screened(graph, c, d, boxes), a, b)}
    for name, bounds in passes.items():
        whole = bounds(x, y)
        for size, rows in ((1, 50), (3, len(x)), (7, len(x)), (64, len(x))):
            parts = torch.cat([bounds(a, b) for a, b in zip(x[:rows].split(size),
                                                               y[:rows].split(size),
                                                               strict=True)])
            assert torch.equal(parts, whole[:rows]), (name, size)


def _per_row(graph, x, y, boxes) -> torch.Tensor:
    """The event, row by row (each row alone): both its bounds <= 0."""
    return torch.tensor([bool(_float64(graph, x[i:i + 1], y[i:i + 1], boxes) <= 0) and
                         bool(_screened(graph, x[i:i + 1], y[i:i + 1], boxes) <= 0)
                         for i in range(len(x))])


def _folded(model, graph, boxes, x, y, size: int, ranks: int, rate: float | None) -> int:
    """The final pass's box count (``compression._events``) over ``Batches`` of ``size``
    rows sharded over ``ranks`` ranks, each rank with its own screen (``rate``)."""
    total = 0
    for rank in range(ranks):
        screen = compression._Screen(rate)
        for _, xb, yb in Batches(x, y, batch_size=size, world=World(rank, ranks)):
            total += int(compression._events(model, graph, None, boxes, xb, yb, screen=screen,
                                             batch=max(size // 2, 1))[2])
    return total


def _check_fold(model, x, y, boxes, event: torch.Tensor) -> None:
    graph = graph_of(model, (1, 4, 4))
    gen = torch.Generator().manual_seed(3)
    for order in (torch.arange(len(x)), torch.randperm(len(x), generator=gen)):
        for size, ranks, rate in [(len(x), 1, 0.0), (16, 3, 0.0), (5, 2, 0.0), (40, 2, None)]:
            got = _folded(model, graph, boxes, x[order], y[order], size, ranks, rate)
            assert got == int(event.sum()), (size, ranks, rate)


@pytest.mark.parametrize("kind", [Tiny, Wide])
def test_the_box_count_is_the_same_whatever_the_batches_order_and_ranks(kind):
    """Rows between the bounds (float32 <= 0 < float64: a tiny box, float32's rounding
    decides) are there, and the fold counts the row-by-row event whatever the order, the
    batches, the ranks and the screen's switch-off."""
    model, x, y = _sample(kind)
    graph = graph_of(model, (1, 4, 4))
    boxes = _boxes(model, 2.0 ** -30)
    low64, low32 = _float64(graph, x, y, boxes), _screened(graph, x, y, boxes)
    between = (low32 <= 0) & (low64 > 0)
    assert int(between.sum()) >= 3 and int((low64 <= 0).sum()) >= 20
    event = _per_row(graph, x, y, boxes)
    assert 20 <= int(event.sum()) < len(x) // 2
    _check_fold(model, x, y, boxes, event)


def test_a_float32_bound_above_the_float64_one_decides_the_same_in_every_order(monkeypatch):
    """Where the float32 bound is > 0 and the float64 one <= 0 (here made so: a float32
    pass standing in, 1e-3 above the float64 one), the row is out of the event whichever
    pass runs first, so the count does not move with the screen's switch-off; under the
    old rule such rows counted on the batches after it."""
    model, x, y = _sample(Tiny)
    graph = graph_of(model, (1, 4, 4))
    boxes = _boxes(model, 2.0 ** -12)
    monkeypatch.setattr(box, "_screened",
                        lambda g, a, b, bx: _float64(g, a, b, bx) + 1e-3)
    low64 = _float64(graph, x, y, boxes)
    assert int(((low64 <= 0) & (low64 + 1e-3 > 0)).sum()) >= 3
    _check_fold(model, x, y, boxes, low64 + 1e-3 <= 0)


def test_the_certificate_on_edge_rows_is_the_same_bit_for_bit_whatever_the_batches():
    """End to end: a trained MLP, its sample with rows on the edge of its decisions, as
    tensors, a list of batches of 1, 2, 3, ... rows and batches of 7: the same bits."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))
    x = torch.randn(400, 1, 4, 4)
    y = x.flatten(1)[:, :3].argmax(1)
    opt = torch.optim.Adam(net.parameters(), 0.03)
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    edge, labels = _edge_rows(net.double().eval(), x.double(),
                              [10.0 ** -k for k in range(2, 12)] * 2)
    net.float()
    x, y = torch.cat([x, edge.float()]), torch.cat([y, labels])
    quick = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(3, 6),
                              refine=0, subsample=64)
    ref = compression_bound(net, (1, 4, 4), x, y, search=quick)
    uneven, start, size = [], 0, 1
    while start < len(x):
        uneven.append((x[start:start + size], y[start:start + size]))
        start, size = start + size, size + 1
    for source in (uneven, Batches(x, y, batch_size=7)):
        other = compression_bound(net, (1, 4, 4), source, search=quick)
        assert other.value.hex() == ref.value.hex() and other.summary() == ref.summary()
