"""The l1 path-metric d(theta, theta') = ||Phi(theta) - Phi(theta')||_1 (thesis Lemma 3.4.1,
paper 002 Sec. 3.2, Lemma 3.2 and Lemma 3.3 / F.3)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pathlift.errors import PrecisionError, UnsupportedModelError
from pathlift.graph import Call, LayerGraph, graph_of
from pathlift.graph.channels import channel_map
from pathlift.graph.collectives import all_true
from pathlift.graph.factors import incoming_norms
from pathlift.graph.input_shape import InputShape, shape_used
from pathlift.graph.normalize import normalize
from pathlift.graph.sharded import ShardedLayers, is_sharded_graph
from pathlift.graph.structure import (
    fan_in,
    longest_path,
    outputs_are_affine,
    paired_parameters,
)
from pathlift.lift.path_norm import log_outputs
from pathlift.logspace import LN10, format_log10, power10

_EPS = 1e-15  # relative error of one float64 op chain, used for the accuracy estimate

EXACT = "exact"  # Lemma 3.4.1: signs agree and |theta'| <= |theta| (or the reverse)
INTERVAL = "interval"  # paper 002 Lemma 3.2 (lower) and Lemma F.3 (upper)


@dataclass(frozen=True)
class PathMetric:
    """The l1 path-metric between two parameters of one architecture, in log10.

    ``case`` is ``"exact"`` when Lemma 3.4.1 applies (then ``lower_log10 ==
    upper_log10``), else ``"interval"``: [| ||Phi(theta)||_1 - ||Phi(theta')||_1 |,
    Lemma F.3 of paper 002]. ``upper_log10`` is inf when the premise of Lemma F.3 cannot be
    verified (``reason`` says why). ``relative_accuracy`` estimates the floating-point
    error of the lower value caused by cancellation between the two path-norms.
    ``same_signs`` records theta_i theta'_i >= 0 for all i (Cor. 3.4.1's assumption).
    ``input_shape`` is the shape both were measured at, ``input_shape.source`` where it
    came from (never a guess).
    """

    case: str
    lower_log10: float
    upper_log10: float
    norm_a_log10: float
    norm_b_log10: float
    same_signs: bool
    relative_accuracy: float
    reason: str
    input_shape: InputShape | None = field(default=None, repr=False, compare=False)

    @property
    def exact(self) -> bool:
        return self.case == EXACT

    @property
    def value(self) -> float:
        """d(theta, theta') when exact, else the upper end of the interval."""
        return power10(self.upper_log10)

    @property
    def lower(self) -> float:
        return power10(self.lower_log10)

    @property
    def upper(self) -> float:
        return power10(self.upper_log10)

    def __str__(self) -> str:
        if self.exact:
            return f"d = {format_log10(self.lower_log10)} (exact, Lemma 3.4.1)"
        return (f"d in [{format_log10(self.lower_log10)}, {format_log10(self.upper_log10)}]"
                f" ({self.reason})")


def _log_diff(big: Tensor, small: Tensor) -> tuple[float, float]:
    """ln sum_v (e^big_v - e^small_v), each term at its own scale, and its relative error.

    e^a - e^b = e^a * (-expm1(b - a)) has no cancellation beyond the error of a - b itself,
    about _EPS * (1 + |a|) in absolute terms; that error is what ``accuracy`` reports.
    """
    gap = (small - big).clamp(max=0.0)
    finite = torch.isfinite(big)
    terms = big[finite] + torch.log(-torch.expm1(gap[finite]))
    total = float(torch.logsumexp(terms, dim=0)) if terms.numel() else -math.inf
    if total == -math.inf:  # every term cancels exactly: d = 0 up to the error of the logs
        return total, 0.0
    err = small[finite] + torch.log(_EPS * (1 + big[finite].abs()))
    return total, math.exp(float(torch.logsumexp(err, dim=0)) - total)


def _dominates(pairs: list[tuple[str, Tensor, Tensor]]) -> tuple[bool, bool, bool, bool]:
    """(signs agree, |theta_b| <= |theta_a|, |theta_a| <= |theta_b|, theta_a == theta_b)
    coordinatewise."""
    signs = all(bool((a * b >= 0).all()) for _, a, b in pairs)
    b_le_a = all(bool((b.abs() <= a.abs()).all()) for _, a, b in pairs)
    a_le_b = all(bool((a.abs() <= b.abs()).all()) for _, a, b in pairs)
    identical = all(bool(torch.equal(a, b)) for _, a, b in pairs)
    return signs, b_le_a, a_le_b, identical


def path_metric(model_a: nn.Module | LayerGraph, model_b: nn.Module | LayerGraph,
                input_shape: Sequence[int] | None = None) -> PathMetric:
    """l1 path-metric ||Phi(theta_a) - Phi(theta_b)||_1 in two forward passes when possible.

    When theta_i theta'_i >= 0 and |theta'| <= |theta| coordinatewise (pruning, rounding
    towards zero; either model may be the larger), d = ||Phi(theta)||_1 - ||Phi(theta')||_1
    exactly (thesis Lemma 3.4.1, paper 002 Lemma 3.2), computed output by output in log
    space. Otherwise a certified interval: the lower end | ||Phi(theta)||_1 -
    ||Phi(theta')||_1 | (paper 002 eq. 6) and the rescaling-invariant upper end of paper 002
    Lemma F.3 with q = 1, (W^2 + min(||Phi(theta)||_1, ||Phi(theta')||_1) L W)
    ||N(theta) - N(theta')||_inf, where N is the normalisation of Alg. 3.2.1. Parameters
    are the DAG's: an eval BatchNorm counts as its affine map (a, c). Either model may be
    given as its traced ``LayerGraph``. The models are not modified;
    ArchitectureMismatchError when they do not share one architecture.
    """
    graph_a = graph_of(model_a, input_shape)
    graph_b = graph_of(model_b, input_shape or graph_a.input_shape)
    shape = shape_used(graph_a.input_shape, input_shape)
    graph_a.check_values()
    graph_b.check_values()
    sharded = is_sharded_graph(graph_a), is_sharded_graph(graph_b)
    if sharded[0] != sharded[1]:
        raise UnsupportedModelError(
            "one model is sharded (FSDP2) and the other is not; compare two models sharded "
            "alike, or two plain ones")
    if sharded[0]:  # each rank compares its shards
        views_a, views_b = (ShardedLayers(g, "path_metric") for g in (graph_a, graph_b))
        pairs = paired_parameters(views_a.graph, views_b.graph)
        # the verdicts, equality included, are the same on every rank
        signs, b_le_a, a_le_b, identical = all_true(_dominates(pairs), views_a.group)
    else:
        pairs = paired_parameters(graph_a, graph_b)
        signs, b_le_a, a_le_b, identical = _dominates(pairs)
    log_a, log_b = log_outputs(graph_a, 1.0), log_outputs(graph_b, 1.0)
    norm_a = float(torch.logsumexp(log_a, 0)) / LN10
    norm_b = float(torch.logsumexp(log_b, 0)) / LN10
    cancelled = False
    if signs and (b_le_a or a_le_b):
        big, small = (log_a, log_b) if b_le_a else (log_b, log_a)
        d, accuracy = _log_diff(big, small)
        if d > -math.inf or identical:
            return PathMetric(EXACT, d / LN10, d / LN10, norm_a, norm_b, signs, accuracy,
                              "signs agree and one model dominates the other (Lemma 3.4.1)",
                              shape)
        cancelled = True  # the models differ by less than float64 resolves: no exact 0
    if cancelled:
        upper, why = _rounding_log(graph_a, norm_a, norm_b), (
            "Lemma 3.4.1: d is the difference of the two path-norms, at most their float64 "
            "rounding, 4 N u max(||Phi(theta)||_1, ||Phi(theta')||_1) (N parameters, u = "
            "2^-53)")
    elif sharded[0]:
        upper, why = _triangle_log(norm_a, norm_b), _TRIANGLE + (
            " (Lemma F.3 needs the normalised models, which pathlift does not compute for "
            "sharded models)")
    else:
        upper, why = _upper_bound_log(graph_a, graph_b, norm_a, norm_b)
    if upper == -math.inf:  # theta' is a rescaling of theta
        return PathMetric(EXACT, -math.inf, -math.inf, norm_a, norm_b, signs, 0.0, why, shape)
    totals = torch.tensor([norm_a, norm_b], dtype=torch.float64) * LN10
    lower, accuracy = _log_diff(totals.max().reshape(1), totals.min().reshape(1))
    # certified: the difference of the two norms less its floating-point error (0 when
    # the norms agree to their precision: then nothing is known below)
    lower = lower + math.log1p(-accuracy) if accuracy < 1 else -math.inf
    reason = ("the two path-norms agree to float64's precision, so Lemma 3.4.1's difference "
              "is lost" if cancelled else "signs differ" if not signs
              else "neither model dominates the other") + \
        "; lower bound: | ||Phi(theta)||_1 - ||Phi(theta')||_1 | (paper 002 eq. 6) less its " \
        "rounding error; upper bound: " + why
    return PathMetric(INTERVAL, lower / LN10, upper / LN10, norm_a, norm_b, signs,
                      accuracy, reason, shape)


def enumerated_path_metric(model_a: nn.Module, model_b: nn.Module,
                           input_shape: Sequence[int]) -> float:
    """sum_p |Phi_p(theta_a) - Phi_p(theta_b)| by explicit enumeration of every path (Def.
    2.3.3) with the neuron-level DAG: the ground truth for small networks (exponential)."""
    from pathlift.testing.neurons import NeuronDAG  # start-up: the oracle loads scipy.sparse

    values = []
    for model in (model_a, model_b):
        phi = NeuronDAG.from_module(model, input_shape).phi()
        keys = zip(phi.paths, phi.ends.tolist(), strict=True)
        values.append(dict(zip(keys, phi.values.tolist(), strict=True)))
    va, vb = values
    return float(sum(abs(va.get(k, 0.0) - vb.get(k, 0.0)) for k in va.keys() | vb.keys()))


def _upper_bound_log(graph_a: LayerGraph, graph_b: LayerGraph, norm_a: float, norm_b: float
                     ) -> tuple[float, str]:
    """ln of an upper bound on d with its reason: -inf (d = 0) when the normalised
    parameters N(theta), N(theta') of Alg. 3.2.1 are equal, then the invariant bound of
    paper 002 Lemma F.3 (q = 1) when its premise holds, else the triangle inequality
    d <= ||Phi(theta)||_1 + ||Phi(theta')||_1.

    N is a rescaling (Def. 2.4.1) that maps rescaling-equivalent parameters to the same
    point, and Phi is rescaling-invariant (Thm 2.4.1): N(theta) = N(theta') gives
    Phi(theta) = Phi(theta'). The proof of Lemma F.3 (Theorem F.2, then l1 <= count x
    l_inf) needs every hidden neuron of N(theta) with ||(theta^{->v}, b_v)||_1 <= 1
    (checked on both normalised models) and gives ||Phi - Phi'||_1 <= (d_out (K+1) +
    min(S, S') L (K+1)) ||N - N'||_inf with K the largest fan-in, L = D - 1 and S = sum over
    output neurons of ||theta^{->v}||_1; paper 002 then bounds S by ||Phi||_1 (exact
    normalisation) and K+1 by W. The bound computed here is that inequality, with S
    measured, so it never exceeds the stated Lemma F.3 when its premise holds and stays
    valid when S > ||Phi||_1. Normalised norms exceed 1 by the rounding of the model's
    dtype (float32: ~1e-7); a norm m <= 1 + 8 eps is accepted and the bound multiplied by
    m^L, which the proof's layer-by-layer induction then needs, so the certificate stays
    rigorous.
    """
    triangle = _triangle_log(norm_a, norm_b)
    normalised = []
    for g in (graph_a, graph_b):
        try:
            n = graph_of(normalize(g, None, 1.0), g.input_shape)
        except PrecisionError as err:
            return triangle, f"{_TRIANGLE} (N(theta) of Alg. 3.2.1 is out of reach: {err})"
        if any(not bool((torch.isfinite(m) & ((m != 0) | (t == 0))).all())
               for _, t, m in paired_parameters(g, n)):
            return triangle, (f"{_TRIANGLE} (the normalised parameters N(theta) leave "
                              "float64's range: the network's scales are too far apart)")
        normalised.append(n)
    gap = max((float((a.to(torch.float64) - b.to(torch.float64)).abs().max())
               for _, a, b in paired_parameters(*normalised) if a.numel()), default=0.0)
    if gap == 0.0:
        return -math.inf, ("d = 0 (to the precision of the parameters): N(theta) = N(theta'), "
                           "the two are rescalings of each other (Alg. 3.2.1, Thm 2.4.1)")
    unusable = _lemma_f3_blocked(graph_a)
    premise = [_premise(n) for n in normalised]
    unusable = unusable or next((p[0] for p in premise if p[0]), None)
    if unusable:
        return triangle, f"{_TRIANGLE} (Lemma F.3 of paper 002 does not apply: {unusable})"
    graph = graph_a
    k, depth, d_out = fan_in(graph), longest_path(graph, "layer_on_path"), graph.d_out
    smallest = min(p[1] for p in premise)
    excess = max(p[2] for p in premise)
    factor = d_out * (k + 1) + smallest * (depth - 1) * (k + 1)
    f3 = math.log(factor) + math.log(gap) + (depth - 1) * math.log(excess)
    return min(f3, triangle), (
        f"Lemma F.3 of paper 002 (K = {k}, L = {depth - 1}, d_out = {d_out}, "
        f"S = {smallest:.4g}, ||N(theta) - N(theta')||_inf = {gap:.3g})")


_TRIANGLE = "the triangle inequality ||Phi(theta)||_1 + ||Phi(theta')||_1"


def _triangle_log(norm_a: float, norm_b: float) -> float:
    """ln(||Phi(theta)||_1 + ||Phi(theta')||_1) from the two log10 norms (an upper bound on
    d whatever the models), rounded up."""
    top = max(norm_a, norm_b) * LN10
    return top + math.log1p(math.exp(min(norm_a, norm_b) * LN10 - top)) + _EPS * (4 + abs(top))


def _rounding_log(graph: LayerGraph, norm_a: float, norm_b: float) -> float:
    """ln of 4 N u max(||Phi(theta)||_1, ||Phi(theta')||_1): each norm is a sum of
    non-negative products computed in float64, each product and the sums together off by
    a relative (N + depth) u at most (recursive summation of N terms; depth <= N), so
    when Lemma 3.4.1 holds and the computed norms agree, d = their difference is below
    twice that."""
    n = sum(p.numel() for p in graph.model.parameters()) + sum(
        b.numel() for b in graph.model.buffers())
    return max(norm_a, norm_b) * LN10 + math.log(4 * max(n, 1) * 2.0**-53)


def _lemma_f3_blocked(graph: LayerGraph) -> str | None:
    """Why the premise of Lemma F.3 cannot hold on this architecture, or None."""
    blocking = sorted({graph.handler(n).name for n in graph.nodes() if _exceeds_l1(graph, n)})
    if blocking:
        return (f"it needs every hidden neuron of N(theta) to have l1 norm <= 1, which "
                f"{', '.join(blocking)} (fixed weights and biases of their neurons) rule out")
    if not outputs_are_affine(graph):
        return ("the output neurons are not those of an affine layer (pooling after the last "
                "layer has fixed weights)")
    return None


def _exceeds_l1(graph: LayerGraph, node) -> bool:
    """Whether a neuron the node creates has fixed incoming weights and bias of l1 norm > 1
    (the op's trait, or its fixed weights measured)."""
    exceeds = graph.handler(node).fixed_l1_exceeds_one
    return exceeds if exceeds is not None else _fixed_l1(graph, node) > 1.0


def _fixed_l1(graph: LayerGraph, node) -> float:
    """The largest l1 norm of the fixed incoming weights of a neuron the node creates."""
    ones = torch.ones((1, *graph.output_shape(node.all_input_nodes[0])), dtype=torch.float64)
    call = Call(node, graph.submodule(node), (ones, *node.args[1:]), dict(node.kwargs))
    with torch.no_grad():
        sums, log_gain = graph.handler(node).abs_pow(ones, 1.0, call)
    return float(sums.max()) * math.exp(log_gain)


def _premise(graph: LayerGraph) -> tuple[str | None, float, float]:
    """(reason the normalised parameters violate ||(theta^{->v}, b_v)||_1 <= 1 beyond the
    rounding of their dtype at a hidden neuron, or None; S = sum over output neurons of
    ||theta^{->v}||_1; the largest hidden norm, at least 1)."""
    cmap = channel_map(graph)
    total, largest = 0.0, 1.0
    tolerance = 1 + 8 * torch.finfo(graph.dtype).eps
    nodes = {n.target: n for n in graph.affine_nodes()}
    for p in cmap.producers:
        if p.passthrough:
            continue
        module = graph.submodule(nodes[p.name])
        is_out = torch.isin(p.neurons, cmap.outputs)
        norms = incoming_norms(module, p, 1.0)[~is_out]
        if norms.numel():
            largest = max(largest, float(norms.max()))
        if largest > tolerance:
            return (f"layer '{p.name}' keeps a hidden neuron of l1 norm {largest:.9g} > 1 "
                    "after normalisation (tied or fixed channels)"), math.inf, largest
        if is_out.any():
            total += _output_weight_sum(graph, nodes[p.name], module, is_out)
    return None, total, largest


def _output_weight_sum(graph: LayerGraph, node, module: nn.Module, mask: Tensor) -> float:
    """sum over the output neurons (every position) of the masked channels of ||theta^{->v}||_1."""
    handler = graph.handler(node)
    source = node.all_input_nodes[0]
    ones = torch.ones((1, *graph.output_shape(source)), dtype=torch.float64)
    call = Call(node, module, (ones,), dict(node.kwargs))
    per_neuron = handler.weight_part(ones, 1.0, call)
    dim = per_neuron.dim() - 1 if handler.channel_dim == -1 else 1
    return float(per_neuron.detach().movedim(dim, 0)[mask].sum())
