"""A compression (Occam) certificate for the trained network itself, carried from a coded
quantised network through the exact path-metric (thesis Lemma 3.4.1, Cor. 3.4.1) or
through interval arithmetic on a box of parameters.

**Theorem.** Fix in advance: a family of architectures (``pathlift.bounds.code``), delta
in (0, 1), and the event grid (``EventGrid``): margins tau_t = 2^(t/s) for t = t_0..t_1,
and the box event; T = its size. Let B(x) = max(1, ||x||_inf), m_f(x, y) = f(x)_y -
max_{c != y} f(x)_c, and for a coded network Q (code word of L(Q) bits)

    E_t(Q) = {(x, y): m_Q(x, y) <= tau_t B(x)},
    E_box(Q) = {(x, y): the interval lower bound of m_theta'(x, y) over theta' in the box
                of Q (``CodedNetwork.box``, ``pathlift.bounds.box``) is <= 0}
                (where ``box_margins``'s float32 pass runs on the architecture, both
                its float32 and its float64 lower bounds are <= 0: a function of
                (x, y) alone, whatever the batches).

With probability >= 1 - delta over the n iid training samples S, for every trained
parameter theta of an architecture of the family, every positive rescaling lambda
(Def. 2.4.1) and every Q:

(a) if |Q| <= |lambda.theta| coordinatewise with the same signs (truncation towards zero
    of lambda.theta, after zeroing any coordinates), d = ||Phi(theta)||_1 -
    ||Phi(Q)||_1 and tau_t >= d, then
        P(argmax R_theta(x) != y) <= kl^-1(P_S[E_t(Q)], (L(Q) ln 2 + ln T + ln 1/delta)/n);
(b) if lambda.theta lies in the box of Q, the same holds with E_box(Q).

*Proof.* Occam (``pathlift.bounds.kl``): the code is prefix-free (Kraft) and T fixed,
so with probability >= 1 - delta, P(E) <= kl^-1(P_S[E], (L ln 2 + ln T + ln 1/delta)/n)
for every Q and every event of the grid at once. (a) R_{lambda.theta} = R_theta and
Phi(lambda.theta) = Phi(theta) (Thm 2.4.2, rescaling invariance); by Lemma 3.4.1,
||Phi(lambda.theta) - Phi(Q)||_1 = ||Phi(theta)||_1 - ||Phi(Q)||_1 = d exactly; by
Cor. 3.4.1 with r = 1, ||R_theta(x) - R_Q(x)||_1 <= B(x) d for every x; the margin is
1-Lipschitz from l1 (|m_f - m_g| <= |f_y - g_y| + max_{c != y} |f_c - g_c|), so if theta
errs on (x, y) (m_theta <= 0) then m_Q(x, y) <= B(x) d <= tau_t B(x): (x, y) in E_t(Q).
(b) If theta errs on (x, y), some theta' of the box (lambda.theta itself) has
m_theta' <= 0, so the interval lower bound is <= 0: (x, y) in E_box(Q). In both cases
P(theta errs) <= P(E), bounded above. Every choice made here on the training data (the
rescaling, the pruned coordinates, the step sizes, the event) changes only Q, which is
paid for by L(Q), or the event, paid for by ln T: the bound holds for the network chosen.

The final pass counts E_box on every row: P_S[E_box] n exactly, the same whatever the
batches, their order and the ranks (``box_margins``: a row's bounds are its own, bit for
bit). The search scores its candidates by the float64 bounds alone: it only chooses Q.

With a ``reference`` (``pathlift.bounds.reference``: a network A trained on a part S1 of
the sample, fixed by a split rule chosen in advance), L(Q) is the length of Q's code
relative to A and the events are counted on the other part S2 alone, n = n2: the same
proof over S2, whose code depends on S1 only (that module's theorem).

Numerics: rescalings are by powers of two (exact in floating point); Q's margins are
computed in float64 and the event counted with a slack of 1e-9 (1 + max |logit|), d is
bounded above with its float64 rounding proven (``pathlift.bounds.rounding``), the
interval pass encloses its own rounding, and kl^-1 is approached from above: each rounds
against the bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from pathlift.bounds.box import BoxReuse, box_margins
from pathlift.bounds.code import (
    Architecture,
    CodedNetwork,
    CodeLength,
    architecture_of,
    constants_of,
    encode,
    estimated_length,
    quantized_tensors,
)
from pathlift.bounds.entry import Sample, check_sample
from pathlift.bounds.kl import OccamBound, kl_inverse, occam_bound
from pathlift.bounds.reference import Reference, relative
from pathlift.bounds.rounding import certified_d
from pathlift.bounds.sample import Batches, as_batches
from pathlift.bounds.verdict import format_bound, verdict
from pathlift.errors import InvalidParameterError
from pathlift.graph import LayerGraph, copy_model, graph_of, unwrap, writable_copy
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.normalize import normalize
from pathlift.graph.outputs import OutputKey, select_output
from pathlift.graph.structure import training_mode_ops
from pathlift.lift import path_metric, path_norm
from pathlift.prune.methods import prune_model
from pathlift.quant import quantize

__all__ = ["CompressionBound", "CompressionSearch", "EventGrid", "compression_bound",
           "input_scale", "logit_margins"]

PATH_METRIC, BOX = "path-metric", "box"
_BATCH = 512  # rows a box pass of the search
_FORWARD = 2048  # rows a float64 forward
_RESCALINGS = {"none": None, "l1": 1.0, "l2": 2.0, "linf": math.inf}


@dataclass(frozen=True)
class EventGrid:
    """The events fixed in advance: margins tau_t = 2^(t/``per_octave``) for t in
    [``lowest``, ``highest``], and the box event if ``box``. Each costs ln ``size`` nats."""

    per_octave: int = 8
    lowest: int = -200
    highest: int = 80
    box: bool = True

    def __post_init__(self) -> None:
        if self.per_octave < 1 or self.highest < self.lowest:
            raise InvalidParameterError("an event grid needs per_octave >= 1 and highest >= "
                                        "lowest")

    @property
    def size(self) -> int:
        return self.highest - self.lowest + 1 + int(self.box)

    def tau(self, t: int) -> float:
        return 2.0 ** (t / self.per_octave)

    def tau_index(self, d: float) -> int | None:
        """The smallest t with tau_t >= d, or None beyond the grid."""
        if d <= self.tau(self.lowest):
            return self.lowest
        t = math.ceil(self.per_octave * math.log2(d))
        while self.tau(t) < d:
            t += 1
        return t if t <= self.highest else None


DEFAULT_EVENTS = EventGrid()


@dataclass(frozen=True)
class CompressionSearch:
    """The choices searched on training data (all paid for in the bound, see the module
    docstring): rescalings ("none", or power-of-two normalisation Alg. 3.2.1 with q = 1, 2,
    inf: "l1", "l2", "linf"), fractions of coordinates zeroed by path-magnitude (global,
    Sec. 3.5), global step offsets o (each tensor's step 2^(floor(log2 max|w|) - o)),
    ``refine`` rounds of +-1 changes of each tensor's step, the transfers tried, and the
    training subsample (``subsample`` points, ``seed``) the search scores candidates on."""

    rescalings: tuple[str, ...] = ("none", "l2")
    prune_fractions: tuple[float, ...] = (0.0, 0.5)
    offsets: tuple[int, ...] = tuple(range(1, 15))
    refine: int = 2
    transfers: tuple[str, ...] = (PATH_METRIC, BOX)
    subsample: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [r for r in self.rescalings if r not in _RESCALINGS]
        if unknown or not self.rescalings:
            raise InvalidParameterError(f"rescalings must be among {list(_RESCALINGS)}, got "
                                        f"{list(self.rescalings)}")
        if any(t not in (PATH_METRIC, BOX) for t in self.transfers) or not self.transfers:
            raise InvalidParameterError(f"transfers must be among {[PATH_METRIC, BOX]}")
        if not self.offsets or any(not 0 <= p < 1 for p in self.prune_fractions):
            raise InvalidParameterError("need step offsets and prune fractions in [0, 1)")


DEFAULT_SEARCH = CompressionSearch()


@dataclass(frozen=True, repr=False)
class CompressionBound:
    """The certificate of the module docstring for one trained network, every term laid out.

    ``value``: with probability >= 1 - ``delta``, the top-1 error of the trained network
    (its own function, not the compressed one) is at most ``value``. ``occam`` holds the
    kl inverse (``empirical`` = P_S of the event, ``budget`` = (L ln 2 + ln T + ln
    1/delta)/n); ``length`` the code length by part; ``transfer`` the event used
    ("path-metric": tau = ``tau`` >= d = 10^``d_log10``; "box": the interval event);
    ``quantized_error``: training error of Q itself; ``sample``: n, duplicates and chance
    (``pathlift.bounds.entry``); ``eval_layers``: the layers certified in eval mode;
    ``stopped``: why the search ended early ("" when it ran in full), which changes which
    Q is found, never the validity; ``prior_samples``: n1 when the code is relative to a
    reference network trained on n1 other samples (0 otherwise; n is then n2).
    """

    occam: OccamBound
    transfer: str
    length: CodeLength
    d_log10: float
    tau: float | None
    train_error: float
    quantized_error: float
    path_norm_log10: float
    quantized_path_norm_log10: float
    rescaling: str
    prune_fraction: float
    exponents: tuple[int, ...]
    num_parameters: int
    num_nonzero: int
    family_size: int
    coded: CodedNetwork = field(compare=False)
    sample: Sample | None = field(default=None, compare=False)
    eval_layers: tuple[str, ...] = ()
    stopped: str = ""
    prior_samples: int = 0

    hypothesis_class = ("every network of an architecture of the family, through the "
                        "quantised networks Q its prefix code names")
    paid_by = ("the code length L(Q) (Kraft) and ln T for the event grid fixed in advance; "
               "the rescaling, pruning and step sizes only change Q")

    @property
    def value(self) -> float:
        return self.occam.value

    @property
    def n(self) -> int:
        return self.occam.n

    @property
    def delta(self) -> float:
        return self.occam.delta

    @property
    def informative(self) -> bool:
        """Below 1 (a probability); ``beats_chance`` is the verdict that matters."""
        return self.value < 1

    @property
    def beats_chance(self) -> bool:
        """Below the best constant classifier's training error (False without a sample)."""
        return self.sample is not None and self.value < self.sample.chance

    @property
    def bits_per_parameter(self) -> float:
        return self.length.total / self.num_parameters

    def terms(self) -> dict[str, float]:
        """Every term of the bound, by name (bits, nats, probabilities)."""
        return {"L (bits)": self.length.total, "L ln 2 / n": self.length.total * math.log(2)
                / self.n, "ln T / n": math.log(self.occam.events) / self.n,
                "ln(1/delta) / n": math.log(1 / self.delta) / self.n,
                "budget": self.occam.budget, "empirical": self.occam.empirical,
                "d": 10 ** self.d_log10, "tau": math.nan if self.tau is None else self.tau,
                "bound": self.value}

    def summary(self) -> dict[str, float | int | str]:
        """The certificate as plain numbers (what ``report.json`` keeps)."""
        return {"bound": self.value, "transfer": self.transfer, "n": self.n,
                "delta": self.delta, "bits": self.length.total,
                "bits_architecture": self.length.architecture,
                "bits_header": self.length.header, "bits_symbols": self.length.symbols,
                "bits_signs": self.length.signs, "bits_mantissas": self.length.mantissas,
                "code": self.length.scheme, "bits_histogram": self.length.histogram,
                "bits_arrangement": self.length.arrangement,
                "events": self.occam.events, "empirical": self.occam.empirical,
                "budget": self.occam.budget, "d_log10": self.d_log10,
                "tau": math.nan if self.tau is None else self.tau,
                "train_error": self.train_error, "quantized_error": self.quantized_error,
                "path_norm_log10": self.path_norm_log10,
                "quantized_path_norm_log10": self.quantized_path_norm_log10,
                "rescaling": self.rescaling, "prune_fraction": self.prune_fraction,
                "num_parameters": self.num_parameters, "num_nonzero": self.num_nonzero,
                "chance": self.chance, "stopped": self.stopped,
                "prior_samples": self.prior_samples}

    @property
    def chance(self) -> float:
        """The best constant classifier's training error (``pathlift.bounds.verdict``)."""
        return math.nan if self.sample is None else self.sample.chance

    def verdict(self, measured: float | None = None) -> str:
        """The bound against 1 and against chance, one line."""
        chance = None if self.sample is None else self.sample.chance
        rule = "" if self.sample is None else self.sample.rule
        return verdict(math.log10(self.value), measured, chance=chance, rule=rule)

    def statement(self) -> str:
        network = "the trained network" if not self.eval_layers else (
            f"the trained network in eval mode ({', '.join(self.eval_layers)}: running "
            "statistics, no dropout)")
        sample = "" if self.sample is None else f"; {self.sample.statement()}"
        split = "" if not self.prior_samples else (
            f"; code from the first n1 = {self.prior_samples} samples (relative to a "
            f"reference network trained on them alone), bound on the other n2 = {self.n}")
        return (f"with probability >= {1 - self.delta:g} over the n = {self.n} training "
                f"samples{split}, the top-1 error of {network} is at most "
                f"{format_bound(math.log10(self.value))[0]} (transfer: {self.transfer}); "
                f"valid for {self.hypothesis_class}; paid by {self.paid_by}{sample}")

    def __repr__(self) -> str:
        event = (f"tau {self.tau:.4g} >= d {10 ** self.d_log10:.4g}" if self.tau is not None
                 else f"box event, d {10 ** self.d_log10:.4g}")
        return (f"CompressionBound({self.value:.4f} = kl^-1({self.occam.empirical:.4f}, "
                f"{self.occam.budget:.4f}), {self.transfer}: {event}; L = "
                f"{self.length.total} bits ({self.bits_per_parameter:.2f}/parameter, "
                f"{self.num_nonzero}/{self.num_parameters} non-zero), rescaling "
                f"{self.rescaling}, pruned {self.prune_fraction:g}, n {self.n}"
                + (f" (code relative to a reference from n1 = {self.prior_samples} others)"
                   if self.prior_samples else "")
                + f", train error "
                f"{self.train_error:.4f}, Q's {self.quantized_error:.4f}"
                + (f"; stopped: {self.stopped})" if self.stopped else ")"))


def input_scale(x: Tensor) -> Tensor:
    """B(x) = max(1, ||x||_inf) per sample, float64."""
    return x.detach().reshape(len(x), -1).abs().amax(1).to(torch.float64).clamp(min=1.0)


def logit_margins(model: nn.Module, x: Tensor, y: Tensor, batch: int = 4096
                  ) -> tuple[Tensor, Tensor]:
    """(m(x, y) = R(x)_y - max_{c != y} R(x)_c, max_c |R(x)_c|) per sample, in float64 on
    a float64 copy of ``model`` (eval mode)."""
    net = _float64(model)
    parts = [_margins(net, xb, yb) for xb, yb in zip(x.split(batch), y.split(batch),
                                                      strict=True)]
    return torch.cat([m for m, _ in parts]), torch.cat([s for _, s in parts])


def _float64(model: nn.Module) -> nn.Module:
    return copy_model(unwrap(model)).double().eval()


def _margins(net: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``logit_margins`` of one batch on the float64 eval copy ``net``, by pieces of
    ``_FORWARD`` rows (a float64 forward on 4,096 MNIST-1D rows is 1.4 times slower per
    row than on 2,048: its intermediates leave the caches)."""
    if len(x) > _FORWARD:
        parts = [_margins(net, xb, yb) for xb, yb in zip(x.split(_FORWARD),
                                                         y.split(_FORWARD), strict=True)]
        return torch.cat([m for m, _ in parts]), torch.cat([s for _, s in parts])
    with torch.no_grad():
        out = flat_outputs(net(x.to(torch.float64)), len(x))
    index = y.reshape(-1, 1)
    return (out.gather(1, index).squeeze(1) - out.scatter(1, index, -math.inf).amax(1),
            out.abs().amax(1))


@dataclass(frozen=True)
class _Candidate:
    """One Q of the search and the scores of its events on the data it was scored on
    (``bounds``: the transfers evaluated to the end; ``quantized_error``: Q's own error,
    NaN where its margins were not needed)."""

    rescaling: str
    prune_fraction: float
    exponents: tuple[int, ...]
    coded: CodedNetwork
    length: CodeLength
    d_log10: float
    quantized_path_norm_log10: float
    bounds: dict[str, tuple[OccamBound, float | None]]
    quantized_error: float
    box_count: int | None = None
    box_lower: Tensor | None = field(default=None, compare=False)  # per row, data's order

    @property
    def best(self) -> tuple[str, OccamBound, float | None]:
        transfer = min(self.bounds, key=lambda k: self.bounds[k][0].value)
        return (transfer, *self.bounds[transfer])

    @property
    def value(self) -> float:
        return self.best[1].value


@dataclass(frozen=True)
class _Scored:
    """The data a candidate is scored on: (x, y), B(x), the trained network's own margins
    m_theta(x, y) (its errors lie in every event of every Q: the floors of ``_Problem``);
    ``shuffled``: the rows come in random order (what ``_likely_rate`` assumes)."""

    x: Tensor
    y: Tensor
    scale: Tensor
    own: Tensor
    shuffled: bool = True

    @property
    def own_error(self) -> float:
        return float((self.own <= 0).double().mean())

    def hardest_first(self, lower: Tensor) -> _Scored:
        """The same rows by increasing ``lower`` (a Q's box lower bounds on them, the rows
        in its event first), no longer in random order."""
        order = torch.argsort(lower, stable=True)
        return _Scored(self.x[order], self.y[order], self.scale[order], self.own[order],
                       shuffled=False)


class _Problem:
    """What every candidate of one certificate shares: the trained network, its rescaled
    and pruned versions, the data, the family, the grid."""

    def __init__(self, model: nn.Module, shape: tuple[int, ...], n: int,
                 family: Sequence[Architecture], events: EventGrid, delta: float,
                 transfers: Sequence[str], reference: Reference | None = None):
        self.model, self.shape, self.reference = model, shape, reference
        self.family, self.events, self.delta = list(family), events, delta
        self.transfers = tuple(transfers)
        self.n = n
        arch = architecture_of(model, shape)
        if arch not in self.family:
            raise InvalidParameterError(
                "the network's architecture is not in the family fixed in advance; add it "
                "(pathlift.bounds.code.architecture_of) before certifying")
        self.index = self.family.index(arch)
        self.constants = constants_of(model, shape)
        tensors = [(name, v.shape) for name, *_, v in quantized_tensors(graph_of(model, shape))]
        if reference is not None and tensors != [
                (name, v.shape) for name, v in zip(reference.names, reference.values,
                                                   strict=True)]:
            raise InvalidParameterError("the reference network's tensors are not the "
                                        "certified network's: train it with the same "
                                        "architecture")

    def rescaled(self, name: str) -> tuple[nn.Module, LayerGraph]:
        """lambda.theta (a copy; powers of two, exact) and its graph (which holds only a
        weak reference: keep the model)."""
        q = _RESCALINGS[name]
        model = copy_model(self.model) if q is None else normalize(
            self.model, self.shape, q, power_of_two=True)
        return model, graph_of(model, self.shape)

    def pruned(self, graph: LayerGraph, fraction: float) -> nn.Module:
        """A copy of the rescaled network with ``fraction`` of its weights pruned by
        path-magnitude (global), as torch.nn.utils.prune masks."""
        model = copy_model(graph.model)
        if fraction > 0:
            prune_model(model, self.shape, fraction)
        return model

    def coded(self, graph: LayerGraph, pruned: nn.Module, exponents: Sequence[int],
              exact_length: bool = False) -> tuple[nn.Module, CodedNetwork, CodeLength]:
        """Q: ``pruned`` quantised with steps 2^exponents (towards zero), its code and the
        code's length: the bits ``encode`` writes when ``exact_length``, else the
        search's estimate (``estimated_length``, within a few bits); with a reference, the
        length of the code relative to it (``pathlift.bounds.reference``). No pass over
        data."""
        names = [name for name, _, _, _ in quantized_tensors(graph)]
        q = quantize(pruned, self.shape, step={n: math.ldexp(1.0, e)
                                               for n, e in zip(names, exponents, strict=True)})
        codes, zero_exponents, exact = [], [], []
        for (name, _, _, value), e in zip(quantized_tensors(graph), exponents, strict=True):
            c = q.codes[name].codes.to(torch.int64)
            v = value.detach()
            hidden = v[(c == 0) & (v != 0)].abs()
            f = e if not hidden.numel() else max(e, _ceil_log2(float(hidden.max())))
            codes.append(c)
            zero_exponents.append(f)
            exact.append(v == 0)
        coded = CodedNetwork(self.index, tuple(exponents), tuple(zero_exponents),
                             tuple(codes), tuple(exact), self.constants)
        word = coded if self.reference is None else relative(coded, self.reference)
        length = encode(word, self.family).length if exact_length else \
            estimated_length(word, self.family)
        return q.model, coded, length

    def budget(self, bits: int) -> float:
        return (bits * math.log(2) + math.log(self.events.size) + math.log(1 / self.delta)) \
            / self.n

    def floor(self, error: float, bits: int) -> float:
        """kl^-1(error, budget of ``bits`` bits): no event of a Q of ``bits`` bits is rarer
        than the trained network's own errors (module docstring, proofs of (a) and (b)),
        so no certificate through Q lies below this, with ``error`` theta's error."""
        return kl_inverse(error, self.budget(bits))

    def checked_d(self, graph: LayerGraph, model: nn.Module) -> tuple[float, object]:
        """(d, the path-metric result) for Q = ``model`` against theta's ``graph``, d
        certified (``certified_d``); refused unless |Q| <= |theta| with the same signs."""
        metric = path_metric(graph, model, self.shape)
        if not (metric.same_signs and metric.exact):  # Cor. 3.4.1 and Lemma 3.4.1's premise
            raise InvalidParameterError("the compressed network does not satisfy Lemma "
                                        "3.4.1's |Q| <= |theta|, same signs")
        return certified_d(graph, graph_of(model, self.shape)), metric

    def candidate(self, rescaling: str, fraction: float, graph: LayerGraph,
                  model: nn.Module, coded: CodedNetwork, length: CodeLength, data: _Scored,
                  target: float, clock: _Clock | None = None,
                  reuse: BoxReuse | None = None) -> _Candidate | None:
        """Score Q (``model``, ``coded``) for the search on ``data`` with the budget of the
        full sample (the bound's n), each transfer only while it can still end below
        ``target``: a transfer whose floor (its event holds at least where theta errs, and
        for the path-metric wherever m_theta <= (tau - d) B, as |m_Q - m_theta| <= B d)
        reaches ``target`` is not evaluated, the box pass stops once the points already in
        its event do, or when ``clock``'s budget is spent; ``reuse`` carries the interval
        passes' values over layers whose boxes an earlier candidate shared. None when no
        transfer finished. Q's own error is NaN where its margins were not needed."""
        d, metric = self.checked_d(graph, model)
        bits = length.total
        bounds: dict[str, tuple[OccamBound, float | None]] = {}
        margins = None
        t = self.events.tau_index(d) if PATH_METRIC in self.transfers else None
        if t is not None:
            tau = self.events.tau(t)
            reached = float((data.own <= (tau - d) * data.scale).double().mean())
            if self.floor(reached, bits) < target:
                margins, sizes = logit_margins(model, data.x, data.y)
                hit = margins <= tau * data.scale + 1e-9 * (1 + sizes)
                bounds[PATH_METRIC] = (self.occam(int(hit.sum()), len(hit), bits), tau)
                target = min(target, bounds[PATH_METRIC][0].value)
        lower = None
        if self.boxed:
            lower = self.box_event(graph, self.boxes(graph, coded), data, bits, target, clock,
                                   reuse)
            if lower is not None:
                count = int((lower <= 0).sum())
                bounds[BOX] = (self.occam(count, len(data.x), bits), None)
        if not bounds:
            return None
        error = math.nan if margins is None else float((margins <= 0).double().mean())
        return _Candidate(rescaling, fraction, tuple(coded.exponents), coded, length,
                          metric.upper_log10, metric.norm_b_log10, bounds, error,
                          None if lower is None else count, lower)

    def certificate(self, rescaling: str, fraction: float, graph: LayerGraph,
                    model: nn.Module, coded: CodedNetwork, length: CodeLength,
                    data: Batches, rate: float | None = None) -> _Candidate:
        """The certificate of Q (``model``, ``coded``): every transfer and Q's own error on
        the whole sample, one fold over its batches with exact integer counts. ``rate``:
        the frequency of Q's float64 box event on the search's rows (None: not scored),
        which orders the box event's two passes (``_Screen``)."""
        d, metric = self.checked_d(graph, model)
        t = self.events.tau_index(d) if PATH_METRIC in self.transfers else None
        tau = None if t is None else self.events.tau(t)
        box = self.boxes(graph, coded) if self.boxed else None
        if tau is None and box is None:
            raise InvalidParameterError(f"d = {d:.3g} lies beyond the event grid and no box "
                                        "event was asked for")
        net = _float64(model)
        screen = _Screen(rate)
        errors, near, boxed = data.count(
            lambda x, y: _events(net, graph, tau, box, x, y, screen), 3)
        bounds: dict[str, tuple[OccamBound, float | None]] = {}
        if tau is not None:
            bounds[PATH_METRIC] = (self.occam(near, data.n, length.total), tau)
        if box is not None:
            bounds[BOX] = (self.occam(boxed, data.n, length.total), None)
        return _Candidate(rescaling, fraction, tuple(coded.exponents), coded, length,
                          metric.upper_log10, metric.norm_b_log10, bounds, errors / data.n)

    @property
    def boxed(self) -> bool:
        """Whether the box event is among the transfers."""
        return BOX in self.transfers and self.events.box

    def peek(self, graph: LayerGraph, coded: CodedNetwork, data: _Scored, bits: int,
             reuse: BoxReuse | None = None) -> float:
        """The bound the box event of Q (``coded``) gives on the first ``_BATCH`` rows of
        ``data`` alone: the order in which the search scores its candidates, no score."""
        x, y = data.x[:_BATCH], data.y[:_BATCH]
        count = int((box_margins(graph, None, x, y, self.boxes(graph, coded), reuse=reuse)
                     <= 0).sum())
        return self.occam(count, len(x), bits).value

    def occam(self, hits: int, rows: int, bits: int) -> OccamBound:
        """The Occam bound of an event met ``hits`` times in ``rows`` scored rows."""
        return occam_bound(hits / rows, self.n, bits, self.events.size, self.delta)

    @staticmethod
    def boxes(graph: LayerGraph, coded: CodedNetwork
              ) -> dict[str, dict[str, tuple[Tensor, Tensor]]]:
        """Q's box, by layer and parameter name (``box_margins``'s ``boxes``)."""
        boxes: dict[str, dict[str, tuple[Tensor, Tensor]]] = {}
        for (name, _, _, _), ends in zip(quantized_tensors(graph), coded.box(), strict=True):
            layer, pname = name.rsplit(".", 1)
            boxes.setdefault(layer, {})[pname] = ends
        return boxes

    def box_event(self, graph: LayerGraph, boxes: dict[str, dict[str, tuple[Tensor, Tensor]]],
                  data: _Scored, bits: int, target: float,
                  clock: _Clock | None = None, reuse: BoxReuse | None = None
                  ) -> Tensor | None:
        """The box lower bounds of every point of ``data`` (those <= 0 are in the box
        event), batch by batch of ``_BATCH``; None as soon as the points seen make a bound
        below ``target`` out of reach or, for rows in random order, unlikely
        (``_likely_rate``), or ``clock``'s budget is spent."""
        count, seen, lower = 0, 0, []
        for xb, yb in zip(data.x.split(_BATCH), data.y.split(_BATCH), strict=True):
            lower.append(box_margins(graph, None, xb, yb, boxes, reuse=reuse))
            count += int((lower[-1] <= 0).sum())
            seen += len(xb)
            rate = _likely_rate(count, seen, len(data.x)) if data.shuffled \
                else count / len(data.x)
            if self.floor(rate, bits) >= target or (clock is not None and clock.spent):
                return None
        return torch.cat(lower)


class _Screen:
    """Whether the final pass runs the float32 pass of the box event first (``box_margins(
    screen=True)``, else the float64 one first): worth it where most rows lie outside the
    event, so only when the search's rate on its rows (``rate``; None when it scored no
    candidate) is at most 1/2, and off from the first batch that finds most rows inside.
    The order changes no row's decision, so no count (``box_margins``)."""

    def __init__(self, rate: float | None):
        self.on = rate is not None and rate <= 0.5

    def seen(self, inside: int, rows: int) -> None:
        self.on = self.on and 2 * inside <= rows


def _events(net: nn.Module, graph: LayerGraph, tau: float | None,
            boxes: dict[str, dict[str, tuple[Tensor, Tensor]]] | None, x: Tensor, y: Tensor,
            screen: _Screen | None = None, batch: int = 2048) -> Tensor:
    """The counts on one batch of Q's errors (``net``, float64), of the path-metric event
    at ``tau`` (0 when None) and of the box event (0 when None), the float32 pass of the
    box event first as ``screen`` says (default: the float64 pass first)."""
    margins, sizes = _margins(net, x, y)
    near = 0 if tau is None else int((margins <= tau * input_scale(x)
                                      + 1e-9 * (1 + sizes)).sum())
    boxed = 0
    for xb, yb in zip(x.split(batch), y.split(batch), strict=True) if boxes and len(x) \
            else ():
        inside = int((box_margins(graph, None, xb, yb, boxes, screen=True,
                                  float64_first=screen is None or not screen.on) <= 0).sum())
        boxed += inside
        if screen is not None:
            screen.seen(inside, len(xb))
    return torch.tensor([int((margins <= 0).sum()), near, boxed])


_UNLIKELY = 1e-4


def _likely_rate(count: int, seen: int, total: int) -> float:
    """A rate the event's frequency on all ``total`` points exceeds, given ``count`` of the
    first ``seen`` in it: surely count / total; and, as the points come in random order (a
    uniform sample without replacement, whose Chernoff bounds are those of i.i.d. draws,
    Hoeffding 1963 Thm 4), with probability >= 1 - ``_UNLIKELY`` the lower kl confidence
    bound 1 - kl^-1(1 - count/seen, ln(1/_UNLIKELY)/seen). For the search only: a
    candidate dropped on it is one it would most likely not keep."""
    if seen >= total:
        return count / total
    return max(count / total,
               1 - kl_inverse(1 - count / seen, math.log(1 / _UNLIKELY) / seen))


def _ceil_log2(v: float) -> int:
    """The smallest integer f with 2^f >= v > 0, exactly (frexp, no rounded logarithm)."""
    mantissa, exponent = math.frexp(v)
    return exponent - 1 if mantissa == 0.5 else exponent


def _start_exponents(graph: LayerGraph, offset: int) -> list[int]:
    out = []
    for _, _, _, value in quantized_tensors(graph):
        top = float(value.detach().abs().max()) if value.numel() else 0.0
        out.append((math.frexp(top)[1] - 1 if top > 0 else 0) - offset)
    return out


def compression_bound(model: nn.Module, input_shape: Sequence[int], x: Tensor | Batches,
                      y: Tensor | None = None, *,
                      family: Sequence[Architecture] | None = None, delta: float = 0.05,
                      events: EventGrid = DEFAULT_EVENTS,
                      search: CompressionSearch = DEFAULT_SEARCH,
                      outputs: OutputKey | None = None,
                      progress: Callable[[int, int], None] | None = None,
                      time_budget: float | None = None,
                      reference: Reference | None = None) -> CompressionBound:
    """The certificate of the module docstring for ``model`` trained on (x, y): the coded
    network Q (rescaling, pruning, steps) and the event found by ``search`` on the
    training data, then the bound on all of (x, y). The sample may come in batches: x a
    ``pathlift.bounds.sample.Batches`` (or a Dataset, a DataLoader that does not shuffle,
    a list of (x, y) batches) and y None. Every pass over the sample is a fold over its
    batches with exact integer counts: memory of a batch, 8 bytes a row for the
    duplicates (``pathlift.bounds.duplicates``) and the search's subsample of
    ``search.subsample`` rows; a ``Batches`` over a torchrun world shards the passes over
    the ranks. The same certificate, bit for bit, as the whole sample in two tensors on
    one process (every rank runs the search on the same subsample and certifies rank
    0's Q). ``family`` is the list of architectures fixed in advance (default: this
    model's alone, 0 bits). ``outputs`` picks the output holding the class logits of a
    model returning several (``pathlift.graph.outputs.select_output``). ``reference``
    (``pathlift.bounds.reference.reference_of``): a network trained on the part S1 of
    (x, y) alone; Q is coded relative to it and every event counted on the other part S2
    only (x, y must be the whole sample the split was made on, as two tensors: the rows
    counted are the complement of those the reference saw, checked by their digest).

    The model is measured in eval mode and not modified; the certificate is for the
    function its weights define, computed on a float64 copy (which holds any float16,
    bfloat16 or float32 weights exactly; a parametrized layer counts as its effective
    weight). Every constant of the computation (a Python float in ``forward``, a module
    setting) is coded (``pathlift.bounds.code.constants_of``).

    Raises InvalidParameterError when the architecture is not in ``family``, the
    arguments are out of range, x holds NaN/inf or y labels outside the network's
    outputs (``pathlift.bounds.entry``), or a layer that computes otherwise in training
    (BatchNorm, Dropout) is in training mode: call ``model.eval()`` first, and the
    statement says the network is certified in eval mode. UnsupportedModelError for a
    model outside the supported ops. The sample must be i.i.d.: exact duplicates are
    counted (``sample.duplicates``; with a reference, S2's rows equal to a row of S1 too,
    ``Reference.repeats``) and said in the statement.

    The search (``_Search``) scores candidates with the estimated code length
    (``estimated_length``) and skips those that cannot beat the best so far nor chance
    (no event is rarer than the network's own errors: kl^-1(train error, budget of L)),
    abandons a score once it cannot or most likely will not beat them,
    calls ``progress(done, planned)`` after each, stops when ``time_budget`` seconds (wall
    clock, from the call) are spent, and tries a single candidate when the network's own
    training error already keeps every bound at or above chance (``stopped`` says why);
    the certificate counts the exact bits of the Q it keeps. With a time budget the Q
    found depends on the machine's speed; the bound is valid whatever is found.

    Example::

        cert = compression_bound(net, (1, 8, 8), x_train, y_train)
        print(cert)            # the bound on the trained net and every term
    """
    start = time.perf_counter()
    shape = tuple(input_shape)
    net = select_output(unwrap(model), outputs, shape)
    training = {name for name, m in net.named_modules() if m.training}
    # float64 holds a float16/bfloat16/float32 theta exactly
    net = writable_copy(net).to(torch.float64).eval()
    graph = graph_of(net, shape)
    eval_layers = tuple(training_mode_ops(graph))
    if training & set(eval_layers):
        first = sorted(training & set(eval_layers))[0]
        raise InvalidParameterError(
            f"layer '{first}' ({type(net.get_submodule(first)).__name__}) is in training "
            "mode, which computes otherwise (batch statistics, randomness); call "
            "model.eval() before certifying: the certificate is for the eval-mode network")
    whole = (x, y)
    if reference is not None:
        x, y = reference.held_out(x, y)
    data = as_batches(x, y)
    sample = check_sample(data, outputs=graph.d_out)
    if reference is not None:  # S2's repeats of S1's rows too: A saw those
        sample = replace(sample, duplicates=reference.repeats(*whole))
    family = [architecture_of(net, shape)] if family is None else list(family)
    problem = _Problem(net, shape, sample.n, family, events, delta, search.transfers,
                       reference)
    own = _float64(net)
    train_error = data.count(lambda xb, yb: (_margins(own, xb, yb)[0] <= 0).sum(), 1)[0] \
        / sample.n
    search, stopped = _hopeless(search, train_error, sample, events, delta)
    gen = torch.Generator().manual_seed(search.seed)
    picked = torch.randperm(sample.n, generator=gen)[:search.subsample]
    xs, ys = data.rows(picked)
    clock = _Clock(search, len(problem.family[problem.index].tensors), progress,
                   None if time_budget is None else start + time_budget)
    searched = _Search(problem, _Scored(xs, ys, input_scale(xs), _margins(own, xs, ys)[0]),
                       clock, train_error, sample.chance)
    found = searched.run(search)
    stopped = stopped or searched.why(time_budget)
    # one Q on every rank, whatever each rank's search found
    rescaling, fraction, exponents, counted = data.world.broadcast(
        (found.rescaling, found.prune_fraction, found.exponents, found.box_count))
    _kept, graph = problem.rescaled(rescaling)
    model_q, coded, length = problem.coded(
        graph, problem.pruned(graph, fraction), exponents, exact_length=True)
    final = problem.certificate(rescaling, fraction, graph, model_q, coded, length, data,
                                None if counted is None else counted / len(picked))
    transfer, occam, tau = final.best
    return CompressionBound(
        occam, transfer, final.length, final.d_log10, tau, train_error,
        final.quantized_error, path_norm(net, shape).log10, final.quantized_path_norm_log10,
        final.rescaling, final.prune_fraction, final.exponents,
        sum(v.numel() for *_, v in quantized_tensors(graph)), final.coded.num_nonzero,
        len(family), final.coded, sample, eval_layers, stopped,
        0 if reference is None else reference.n1)


def _hopeless(search: CompressionSearch, train_error: float, sample: Sample,
              events: EventGrid, delta: float) -> tuple[CompressionSearch, str]:
    """(``search``, "") or, when no candidate can beat chance, one candidate and why: every
    event of every Q holds wherever the network errs (module docstring, proof of (a) and
    (b)), so every bound is at least kl^-1(train error, (ln T + ln 1/delta)/n)."""
    floor = kl_inverse(train_error, (math.log(events.size) + math.log(1 / delta)) / sample.n)
    if floor < sample.chance:
        return search, ""
    return replace(search, rescalings=search.rescalings[:1],
                   prune_fractions=search.prune_fractions[:1], offsets=search.offsets[:1],
                   refine=0), (
        f"no candidate can beat chance: the network errs on {train_error:.4f} of its "
        f"training sample, so every bound is >= kl^-1 of it = {floor:.4f} >= chance "
        f"{sample.chance:.4f}; one candidate certified")


class _Clock:
    """Progress (``progress(done, planned)`` after each candidate; ``planned`` counts the
    refinement rounds in full) and the time budget of one search."""

    def __init__(self, search: CompressionSearch, tensors: int,
                 progress: Callable[[int, int], None] | None, deadline: float | None):
        self.done, self.progress, self.deadline = 0, progress, deadline
        self.planned = len(search.rescalings) * len(search.prune_fractions) * (
            len(search.offsets) + 2 * tensors * search.refine)

    @property
    def spent(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.planned)


@dataclass(frozen=True)
class _Choice:
    """The Q the search keeps: how it is made, and its score (NaN when none was scored)."""

    rescaling: str
    prune_fraction: float
    exponents: tuple[int, ...]
    value: float = math.nan
    floor: float = math.inf
    bits: int = 0
    box_count: int | None = None  # of its box event on the search's rows


class _Search:
    """The search of ``CompressionSearch`` over one problem, coarse to fine: for each
    rescaling and pruned fraction, the step offsets from the coarsest, then coordinate
    descent on the step exponents (``refine``). A candidate costs a quantisation and its
    estimated code length; it is scored on the data (``_Problem.candidate``) only when
    its floor kl^-1(theta's error, budget of its bits) lies below ``target`` (the best
    score so far, and chance), and its score is abandoned as soon as it cannot, or most
    likely will not, end below it (``_likely_rate``). Once a first Q is scored in full,
    the later ones score the rows hardest for it first (``_Scored.hardest_first``: the
    candidates are its neighbours, their events mostly on the same rows), so that one
    which cannot beat the target is abandoned within its first batches; the likelihood
    rule, which assumes random order, is then off. Nothing skipped could have been kept
    (every score is at least its floor); a score abandoned on likelihood would have been
    kept with probability <= 1e-4 per batch. What the search keeps changes only which Q
    is certified, never the validity of the certificate."""

    def __init__(self, problem: _Problem, data: _Scored, clock: _Clock, train_error: float,
                 chance: float):
        self.problem, self.data, self.clock = problem, data, clock
        self.scoring = data  # the rows in the order candidates score them
        self.train_error, self.chance = train_error, chance
        self.sub_error = data.own_error
        self.best: _Candidate | None = None
        self.shortest: _Choice | None = None  # the lowest floor seen, when none is scored
        self.reuse: BoxReuse | None = None
        self.scored = 0

    @property
    def target(self) -> float:
        return min(self.chance, math.inf if self.best is None else self.best.value)

    def run(self, search: CompressionSearch) -> _Choice:
        for rescaling in search.rescalings:
            _kept, graph = self.problem.rescaled(rescaling)  # the graph's model stays alive
            self.reuse = BoxReuse()  # values of this graph's passes
            for fraction in search.prune_fractions:
                if self.clock.spent and self.clock.done:
                    break
                pruned = self.problem.pruned(graph, fraction)
                local, first = None, math.inf
                for i, made in self.ordered(rescaling, fraction, graph, pruned, [
                        _start_exponents(graph, offset) for offset in search.offsets]):
                    if self.clock.spent and self.clock.done:
                        break
                    c = self.try_(rescaling, fraction, graph, pruned, made[0], made[1:])
                    if c is not None and (local is None or (c.value, i) < (local.value, first)):
                        local, first = c, i
                if local is not None:
                    self.refine(graph, pruned, local, search.refine)
        if self.best is not None:
            b = self.best
            return _Choice(b.rescaling, b.prune_fraction, b.exponents, b.value,
                           box_count=b.box_count)
        assert self.shortest is not None  # the first candidate is always coded
        return self.shortest

    def try_(self, rescaling: str, fraction: float, graph: LayerGraph, pruned: nn.Module,
             exponents: Sequence[int], made: tuple = ()) -> _Candidate | None:
        """One candidate: coded (unless ``made`` holds its ``_Problem.coded``), then scored
        if its floor lets it beat the target."""
        model, coded, length = made or self.problem.coded(graph, pruned, exponents)
        bits = max(length.total - 8, 0)  # the estimate exceeds the written bits by <= 3
        floor = self.problem.floor(self.train_error, bits)
        if self.shortest is None or floor < self.shortest.floor:
            self.shortest = _Choice(rescaling, fraction, tuple(exponents), floor=floor,
                                    bits=bits)
        c = None
        if floor < self.chance and self.problem.floor(self.sub_error, length.total) \
                < self.target:
            self.scored += 1
            c = self.problem.candidate(rescaling, fraction, graph, model, coded, length,
                                       self.scoring, self.target, self.clock, self.reuse)
            if c is not None and c.value < self.target:
                self.best = c
                if self.scoring.shuffled and c.box_lower is not None:
                    self.scoring = self.scoring.hardest_first(c.box_lower)
        self.clock.tick()
        return c

    def ordered(self, rescaling: str, fraction: float, graph: LayerGraph, pruned: nn.Module,
                starts: list[list[int]]) -> list[tuple[int, tuple]]:
        """(index, (exponents, model, coded, length)) of the step offsets' candidates in the
        order they are scored: by the bound of their box event on the first batch of the
        search's rows (``_Problem.peek``), those that cannot beat chance last, so that the
        best is scored early and the others are abandoned early. The order changes no
        score: the offset kept is the best of those scored in full, ties to the first."""
        made = [(e, *self.problem.coded(graph, pruned, e)) for e in starts]
        if not self.problem.boxed or self.clock.spent:
            return list(enumerate(made))
        keys = []
        for i, (_e, _model, coded, length) in enumerate(made):
            bits = max(length.total - 8, 0)  # as ``try_``
            hopeless = self.problem.floor(self.train_error, bits) >= self.chance
            keys.append((math.inf if hopeless else self.problem.peek(
                graph, coded, self.data, length.total, self.reuse), i))
        return [(i, made[i]) for _, i in sorted(keys)]

    def refine(self, graph: LayerGraph, pruned: nn.Module, start: _Candidate,
               rounds: int) -> None:
        """Coordinate descent on each tensor's step exponent (+1 coarser, -1 finer) from
        ``start``, until no move improves or the time budget is spent."""
        best = start
        for _ in range(rounds):
            improved = False
            for i in range(len(best.exponents)):
                for move in (1, -1):
                    if self.clock.spent:
                        return
                    exponents = list(best.exponents)
                    exponents[i] += move
                    c = self.try_(best.rescaling, best.prune_fraction, graph, pruned,
                                  exponents)
                    if c is not None and c.value < best.value:
                        best, improved = c, True
                        break
            if not improved:
                break

    def why(self, time_budget: float | None) -> str:
        """Why the search ended early or found nothing below chance ("" otherwise)."""
        if self.clock.spent:
            return (f"time budget of {time_budget:g} s spent after {self.clock.done} "
                    "candidates: the best so far is certified")
        if self.best is not None:
            return ""
        if not self.scored:
            return (f"no candidate can beat chance: the shortest of the {self.clock.done} "
                    f"codes tried has {self.shortest.bits} bits or more, so its bound is >= "
                    f"kl^-1(train error {self.train_error:.4f}, budget) = "
                    f"{self.shortest.floor:.4f} >= chance {self.chance:.4f}; it is certified")
        return (f"no candidate scored below chance {self.chance:.4f} on the search's "
                f"{len(self.data.x)} points ({self.scored} of {self.clock.done} scored); the "
                "one with the shortest code is certified")
