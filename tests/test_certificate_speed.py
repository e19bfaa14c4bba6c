"""The compression search's shortcuts (issue 39: fast, visible, stoppable): a candidate is
scored only when its floor kl^-1(train error, budget of L) lets it beat the best so far
and chance, a score is abandoned once it cannot, the time budget stops a score half way,
and the interval pass bounds its rounding from one sample of ones. Each is checked
against the long way: every candidate scored in full, exact rational arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from torch import nn

import pathlift.bounds.compression as compression
from pathlift.bounds import compression_bound
from pathlift.bounds.box import BoxReuse, box_margins, box_outputs
from pathlift.bounds.code import architecture_of, quantized_tensors
from pathlift.bounds.compression import CompressionSearch, EventGrid, logit_margins
from pathlift.bounds.kl import kl_inverse
from pathlift.graph import graph_of
from pathlift.graph.layer_graph import HANDLER


def _blobs(n: int = 600, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, 6, generator=g) * 3
    y = torch.randint(0, 3, (n,), generator=g)
    return centers[y] + torch.randn(n, 6, generator=g), y


def _trained(hidden: int, seed: int = 0, steps: int = 200) -> tuple[nn.Module, torch.Tensor,
                                                                    torch.Tensor]:
    """An MLP written as a user writes one (a subclass, functional ReLU), trained by Adam."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden, self.out = nn.Linear(6, hidden), nn.Linear(hidden, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.relu(self.hidden(x)))

    x, y = _blobs(seed=seed)
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=0.03)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval(), x, y


@pytest.mark.parametrize("transfers", [("path-metric", "box"), ("box",)])
def test_the_search_keeps_what_scoring_every_candidate_keeps(transfers):
    """Skipping by floors and abandoning scores loses nothing: the Q kept is the best of
    every candidate of the grid scored in full, and every full score is above its floor."""
    net, x, y = _trained(8)
    search = CompressionSearch(rescalings=("none", "l2"), prune_fractions=(0.0, 0.5),
                               offsets=(1, 2, 3, 4, 6, 8, 10), refine=0, transfers=transfers)
    calls = []
    cert = compression_bound(net, (6,), x, y, search=search,
                             progress=lambda done, planned: calls.append(done))
    assert len(calls) == 2 * 2 * 7 and not cert.stopped and cert.beats_chance
    _assert_best_of_every_candidate(net, (6,), x, y, search, cert)


def _assert_best_of_every_candidate(net: nn.Module, shape: tuple[int, ...], x: torch.Tensor,
                                    y: torch.Tensor, search: CompressionSearch,
                                    cert: compression.CompressionBound) -> None:
    """The long way: every candidate of the (refine-free) grid scored in full on the whole
    sample, each full score above its floor; ``cert`` keeps the best, ties to the first."""
    model = net.double()
    events = EventGrid()
    problem = compression._Problem(model, shape, len(x), [architecture_of(model, shape)],
                                   events, 0.05, search.transfers)
    own, _ = logit_margins(model, x, y)
    data = compression._Scored(x, y, compression.input_scale(x), own)
    best = None
    for rescaling in search.rescalings:
        _kept, graph = problem.rescaled(rescaling)
        for fraction in search.prune_fractions:
            pruned = problem.pruned(graph, fraction)
            for offset in search.offsets:
                q, coded, length = problem.coded(
                    graph, pruned, compression._start_exponents(graph, offset))
                c = problem.candidate(rescaling, fraction, graph, q, coded, length, data,
                                      math.inf)
                assert c.value >= problem.floor(data.own_error, length.total)
                if best is None or c.value < best.value:
                    best = c
    assert (cert.rescaling, cert.prune_fraction, cert.exponents) == (
        best.rescaling, best.prune_fraction, best.exponents)


def _signals_cnn(seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The residual CNN trained by Adam on 3,000 noisy copies of three random signals."""
    g = torch.Generator().manual_seed(seed)
    shapes = torch.randn(3, 1, 8, generator=g)
    y = torch.randint(0, 3, (3000,), generator=g)
    x = shapes[y] + 0.6 * torch.randn(3000, 1, 8, generator=g)
    torch.manual_seed(seed)
    net = _Residual()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval(), x, y


@pytest.mark.parametrize("seed", [0, 1])
def test_the_search_in_its_peeked_order_keeps_the_best_on_a_cnn(seed):
    """A residual CNN (functional ReLU, max-pool) trained on 3,000 noisy signals: the search
    scores the step offsets in the order their box event gives on its first batch and
    abandons the others early, and keeps the Q that scoring every candidate in full keeps."""
    net, x, y = _signals_cnn(seed)
    search = CompressionSearch(rescalings=("none", "l2"), prune_fractions=(0.0,),
                               offsets=tuple(range(1, 12)), refine=0, transfers=("box",))
    cert = compression_bound(net, (1, 8), x, y, search=search)
    assert cert.beats_chance and not cert.stopped
    _assert_best_of_every_candidate(net, (1, 8), x, y, search, cert)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_refinement_scoring_the_hardest_rows_first_keeps_what_full_scores_keep(seed,
                                                                                  monkeypatch):
    """After the first Q scored in full, candidates score the rows in its event first and
    are abandoned only when they cannot beat the best: the coordinate descent ends on the
    Q it reaches with every candidate scored in full, and the rejected neighbours stop
    within their first batches."""
    net, x, y = _signals_cnn(seed)
    search = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                               offsets=tuple(range(1, 12)), refine=2, transfers=("box",))
    rows = []
    real = compression._Problem.box_event
    monkeypatch.setattr(compression._Problem, "box_event", lambda self, *a, **k: (
        lambda out: rows.append((a[2].shuffled, None if out is None else len(out))) or out)(
        real(self, *a, **k)))
    cert = compression_bound(net, (1, 8), x, y, search=search)
    monkeypatch.undo()
    assert cert.beats_chance and not cert.stopped
    # the long way: the best offset, then +-1 moves of each step, every one scored in full
    model = net.double()
    problem = compression._Problem(model, (1, 8), len(x), [architecture_of(model, (1, 8))],
                                   EventGrid(), 0.05, search.transfers)
    own, _ = logit_margins(model, x, y)
    data = compression._Scored(x, y, compression.input_scale(x), own)
    _kept, graph = problem.rescaled("none")
    pruned = problem.pruned(graph, 0.0)

    def score(exponents):
        q, coded, length = problem.coded(graph, pruned, exponents)
        return problem.candidate("none", 0.0, graph, q, coded, length, data, math.inf)

    best = min((score(compression._start_exponents(graph, o)) for o in search.offsets),
               key=lambda c: c.value)
    for _ in range(search.refine):
        improved = False
        for i in range(len(best.exponents)):
            for move in (1, -1):
                exponents = list(best.exponents)
                exponents[i] += move
                c = score(exponents)
                if c.value < best.value:
                    best, improved = c, True
                    break
        if not improved:
            break
    assert cert.exponents == best.exponents
    assert round(cert.occam.empirical * len(x)) == best.box_count
    ordered = [n for shuffled, n in rows if not shuffled]
    assert ordered and rows.count((False, None)) >= 1  # abandoned in the rows' new order


def test_no_candidate_is_scored_when_every_code_is_too_long_to_beat_chance(monkeypatch):
    """A 2,803-parameter MLP on 600 samples: each code is so long that kl^-1(its training
    error, budget of L) >= chance, so no pass over the data scores any candidate; the
    certificate of the shortest code is indeed not below chance, and not below the floor
    the message states."""
    net, x, y = _trained(400, steps=60)
    scored = []
    real = compression._Problem.candidate
    monkeypatch.setattr(compression._Problem, "candidate",
                        lambda self, *a, **k: scored.append(k) or real(self, *a, **k))
    calls = []
    cert = compression_bound(net, (6,), x, y, progress=lambda d, p: calls.append(d))
    assert scored == []  # the final certificate is _Problem.certificate's, not a score
    assert len(calls) == 2 * 2 * 14  # every start candidate coded, none refined
    assert cert.stopped.startswith(f"no candidate can beat chance: the shortest of the {56} "
                                   "codes tried has")
    floor = float(cert.stopped.split(" = ")[1].split(" ")[0])
    chance = 1 - int(torch.bincount(y).max()) / len(y)
    assert floor >= chance and cert.value >= floor - 5e-5 and not cert.beats_chance
    assert cert.value >= kl_inverse(cert.train_error, cert.occam.budget)


def test_a_spent_budget_stops_a_score_half_way(monkeypatch):
    """With the budget spent, the first candidate's box event stops after its first batch:
    one batch of 512 for the search, then the final certificate's (2,048 a batch) over all n."""
    net, x, y = _trained(8)
    x, y = torch.cat([x] * 2), torch.cat([y] * 2)  # 1,200 points: 3 batches of 512 in the search
    batches = []
    real = compression.box_margins
    monkeypatch.setattr(compression, "box_margins",
                        lambda *a, **k: batches.append(len(a[2])) or real(*a, **k))
    search = CompressionSearch(transfers=("box",))
    cert = compression_bound(net, (6,), x, y, search=search, time_budget=0.0)
    assert cert.stopped.startswith("time budget of 0 s spent after 1 candidates")
    assert batches == [512, 1200]
    assert cert.value == kl_inverse(cert.occam.empirical, cert.occam.budget)


def _exact_conv_net(model: nn.Sequential, x: torch.Tensor) -> list[list[Fraction]]:
    """The outputs of Conv2d(1, 2, 3, padding=1) - ReLU - Flatten - Linear on 1x4x4
    inputs, in exact rational arithmetic from the float64 parameters."""
    conv, lin = model[0], model[3]
    w = [[[Fraction(float(v)) for v in row] for row in k[0]] for k in conv.weight.detach()]
    b = [Fraction(float(v)) for v in conv.bias.detach()]
    lw = [[Fraction(float(v)) for v in row] for row in lin.weight.detach()]
    lb = [Fraction(float(v)) for v in lin.bias.detach()]
    out = []
    for image in x:
        pixels = [[Fraction(float(v)) for v in row] for row in image[0]]
        hidden = []
        for c in range(2):
            for i in range(4):
                for j in range(4):
                    s = b[c] + sum(w[c][di][dj] * pixels[i + di - 1][j + dj - 1]
                                   for di in range(3) for dj in range(3)
                                   if 0 <= i + di - 1 < 4 and 0 <= j + dj - 1 < 4)
                    hidden.append(max(s, Fraction(0)))
        out.append([lb[k] + sum(a * h for a, h in zip(lw[k], hidden, strict=True))
                    for k in range(3)])
    return out


def test_the_interval_pass_of_a_point_box_encloses_the_exact_outputs():
    """A box of width 0 (the network itself): the pass's radii are its rounding terms
    alone, bounded through |W| |x| <= max |x| |W| 1, and the exact rational outputs lie
    inside; the enclosure stays tight (relative width < 1e-12)."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(32, 3)).double()
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64) * 3
    boxes = {}
    for name, _, _, value in quantized_tensors(compression.graph_of(model, (1, 4, 4))):
        layer, pname = name.rsplit(".", 1)
        boxes.setdefault(layer, {})[pname] = (value.detach(), value.detach())
    (enclosure,) = box_outputs(model, (1, 4, 4), x, boxes)
    exact = _exact_conv_net(model, x)
    low, high = enclosure.low.tolist(), enclosure.high.tolist()
    for lo, hi, row in zip(low, high, exact, strict=True):
        for a, b, v in zip(lo, hi, row, strict=True):
            assert Fraction(a) <= v <= Fraction(b)
            assert b - a <= 1e-12 * max(1.0, abs(float(v)))
    assert math.isfinite(float(enclosure.radius.max()))


class _Residual(nn.Module):
    """A user-style CNN: functional ReLU, a residual sum, a max-pool, a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv1d(1, 4, 3, padding=1)
        self.second = nn.Conv1d(4, 4, 3, padding=1)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        h = torch.nn.functional.max_pool1d(torch.relu(self.second(h)) + h, 2)
        return self.head(h.flatten(1))


def _boxes(model: nn.Module, shape: tuple[int, ...], steps: dict[str, float]
           ) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """The box [w - s/2, w + s/2] around each parameter, s its layer's step."""
    out: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    for name, _, _, value in quantized_tensors(graph_of(model, shape)):
        layer, pname = name.rsplit(".", 1)
        w = value.detach().double()
        out.setdefault(layer, {})[pname] = (w - steps[layer] / 2, w + steps[layer] / 2)
    return out


@pytest.mark.parametrize("make, shape", [(_Residual, (1, 8)), (lambda: _trained(8)[0], (6,))])
def test_box_reuse_gives_the_pass_bit_for_bit_and_skips_the_layers_upstream(make, shape,
                                                                           monkeypatch):
    """A pass that starts from the values an earlier pass kept (``BoxReuse``) returns the
    margins of a pass from scratch exactly, for a change of box in the last layer, in the
    first, and back; it runs no affine layer above the changed one."""
    torch.manual_seed(0)
    model = make().double().eval()
    x = torch.randn(64, *shape, dtype=torch.float64)
    y = torch.randint(0, 3, (64,))
    layers = [name.rsplit(".", 1)[0] for name, *_ in quantized_tensors(graph_of(model, shape))]
    first, last = layers[0], layers[-1]
    base = dict.fromkeys(layers, 2.0 ** -6)
    changes = [base, {**base, last: 2.0 ** -4}, {**base, first: 2.0 ** -4}, base]
    reuse = BoxReuse()
    applied = []
    for steps in changes:
        boxes = _boxes(model, shape, steps)
        fresh = box_margins(model, shape, x, y, boxes)
        calls = []
        for handler in {type(h) for h in _affine_handlers(model, shape)}:
            original = handler.apply
            monkeypatch.setattr(handler, "apply", lambda self, *a, f=original, seen=calls,
                                **k: (seen.append(a[1].shape), f(self, *a, **k))[1])
        kept = box_margins(model, shape, x, y, boxes, reuse=reuse)
        monkeypatch.undo()
        assert torch.equal(fresh, kept)
        assert bool((fresh > -math.inf).all())
        applied.append(len(calls))
    # the first pass runs every layer; a change in the last layer reruns only the last
    # (the head: reached through the margin, no apply); back to the first boxes: all kept
    assert applied[0] > 0 and applied[1] == 0 and applied[2] == applied[0] \
        and applied[3] == 0


def _affine_handlers(model: nn.Module, shape: tuple[int, ...]) -> list[object]:
    graph = graph_of(model, shape)
    return [n.meta[HANDLER] for n in graph.graph.nodes if n.op == "call_module"
            and n.target in {name.rsplit(".", 1)[0] for name, *_ in quantized_tensors(graph)}]


@pytest.mark.parametrize("subsample", [700, 2999])
def test_the_final_pass_takes_the_search_rows_count_and_counts_the_rest(subsample):
    """The certificate's box count is the search's count on its rows plus the final pass's
    on the others: equal to the box event of the certified Q counted on every row afresh."""
    net, x, y = _signals_cnn(0)
    search = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                               offsets=(4, 6, 8), refine=0, transfers=("box",),
                               subsample=subsample)
    cert = compression_bound(net, (1, 8), x, y, search=search)
    model = net.double()
    graph = graph_of(model, (1, 8))
    boxes: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    for (name, *_), ends in zip(quantized_tensors(graph), cert.coded.box(), strict=True):
        layer, pname = name.rsplit(".", 1)
        boxes.setdefault(layer, {})[pname] = ends
    fresh = sum(int((box_margins(model, (1, 8), xb, yb, boxes) <= 0).sum())
                for xb, yb in zip(x.split(1000), y.split(1000), strict=True))
    assert cert.transfer == "box" and 0 < fresh < len(x)
    assert round(cert.occam.empirical * len(x)) == fresh
