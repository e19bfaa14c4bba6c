"""The l1 path-metric d(theta, theta') = ||Phi(theta) - Phi(theta')||_1 (thesis Lemma 3.4.1,
paper 002 Sec. 3.2, Lemma 3.2 and Lemma 3.3 / F.3)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import ArchitectureMismatchError
from pathlift.graph import (
    AbsPowInterpreter,
    Call,
    Kind,
    LayerGraph,
    batchnorm_affine,
    param,
    trace,
)
from pathlift.graph.channels import channel_map
from pathlift.graph.factors import incoming_norms
from pathlift.graph.normalize import normalize
from pathlift.graph.ops import MeanHandler, UpsampleHandler
from pathlift.lift.path_norm import _flatten_outputs
from pathlift.logspace import format_log10, power10

_LN10 = math.log(10.0)
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
    """

    case: str
    lower_log10: float
    upper_log10: float
    norm_a_log10: float
    norm_b_log10: float
    same_signs: bool
    relative_accuracy: float
    reason: str

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


def dag_parameters(graph: LayerGraph) -> Iterator[tuple[str, Tensor, Tensor | None]]:
    """(layer, weights, bias) of every affine layer as DAG parameters: an eval BatchNorm is
    the identity neuron x*a + c, so its parameters are (a, c), not (weight, bias, stats)."""
    for node in graph.nodes():
        handler = graph.handler(node)
        if handler.kind is not Kind.AFFINE:
            continue
        module = graph.submodule(node)
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            a, c = batchnorm_affine(module)
            yield node.target, a.detach(), c.detach()
        else:
            bias = handler.bias(module)
            yield (node.target, param(module, "weight").detach(),
                   None if bias is None else bias.detach())


def paired_parameters(graph_a: LayerGraph, graph_b: LayerGraph
                      ) -> list[tuple[str, Tensor, Tensor]]:
    """Matching DAG parameters of two graphs; ArchitectureMismatchError when they differ."""
    nodes_a, nodes_b = list(graph_a.nodes()), list(graph_b.nodes())
    if len(nodes_a) != len(nodes_b):
        raise ArchitectureMismatchError(
            f"the models have {len(nodes_a)} and {len(nodes_b)} operations; compare two "
            "models of one architecture")
    for na, nb in zip(nodes_a, nodes_b, strict=True):
        same = (graph_a.handler(na) is graph_b.handler(nb) and na.target == nb.target
                and _shape(na) == _shape(nb))
        if not same:
            raise ArchitectureMismatchError(
                f"operation '{na.name}' ({graph_a.handler(na).name}, output {_shape(na)}) "
                f"differs from '{nb.name}' ({graph_b.handler(nb).name}, output "
                f"{_shape(nb)}); compare two models of one architecture")
    pairs = []
    for (name, wa, ba), (_, wb, bb) in zip(dag_parameters(graph_a), dag_parameters(graph_b),
                                            strict=True):
        if wa.shape != wb.shape or (ba is None) != (bb is None):
            raise ArchitectureMismatchError(
                f"layer '{name}' has weights {tuple(wa.shape)} vs {tuple(wb.shape)} and "
                f"bias {ba is not None} vs {bb is not None}")
        pairs.append((name, wa, wb))
        if ba is not None:
            pairs.append((name + ".bias", ba, bb))
    return pairs


def _shape(node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if hasattr(meta, "shape") else None


def _log_outputs(graph: LayerGraph) -> Tensor:
    """ln ||Phi^{->v}||_1 for every output neuron v (Thm 3.1.1, one |theta| pass)."""
    with torch.no_grad():
        return _flatten_outputs(AbsPowInterpreter(graph, 1.0, torch.float64).run_all_ones())


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


def _dominates(pairs: list[tuple[str, Tensor, Tensor]]) -> tuple[bool, bool, bool]:
    """(signs agree, |theta_b| <= |theta_a|, |theta_a| <= |theta_b|) coordinatewise."""
    signs = all(bool((a * b >= 0).all()) for _, a, b in pairs)
    b_le_a = all(bool((b.abs() <= a.abs()).all()) for _, a, b in pairs)
    a_le_b = all(bool((a.abs() <= b.abs()).all()) for _, a, b in pairs)
    return signs, b_le_a, a_le_b


def path_metric(model_a: nn.Module, model_b: nn.Module, input_shape: Sequence[int]
                ) -> PathMetric:
    """l1 path-metric ||Phi(theta_a) - Phi(theta_b)||_1 in two forward passes when possible.

    When theta_i theta'_i >= 0 and |theta'| <= |theta| coordinatewise (pruning, rounding
    towards zero; either model may be the larger), d = ||Phi(theta)||_1 - ||Phi(theta')||_1
    exactly (thesis Lemma 3.4.1, paper 002 Lemma 3.2), computed output by output in log
    space. Otherwise a certified interval: the lower end | ||Phi(theta)||_1 -
    ||Phi(theta')||_1 | (paper 002 eq. 6) and the rescaling-invariant upper end of paper 002
    Lemma F.3 with q = 1, (W^2 + min(||Phi(theta)||_1, ||Phi(theta')||_1) L W)
    ||N(theta) - N(theta')||_inf, where N is the normalisation of Alg. 3.2.1. Parameters
    are the DAG's: an eval BatchNorm counts as its affine map (a, c). The models are not
    modified; ArchitectureMismatchError when they do not share one architecture.
    """
    graph_a, graph_b = trace(model_a, input_shape), trace(model_b, input_shape)
    pairs = paired_parameters(graph_a, graph_b)
    log_a, log_b = _log_outputs(graph_a), _log_outputs(graph_b)
    norm_a = float(torch.logsumexp(log_a, 0)) / _LN10
    norm_b = float(torch.logsumexp(log_b, 0)) / _LN10
    signs, b_le_a, a_le_b = _dominates(pairs)
    if signs and (b_le_a or a_le_b):
        big, small = (log_a, log_b) if b_le_a else (log_b, log_a)
        d, accuracy = _log_diff(big, small)
        return PathMetric(EXACT, d / _LN10, d / _LN10, norm_a, norm_b, signs, accuracy,
                          "signs agree and one model dominates the other (Lemma 3.4.1)")
    totals = torch.tensor([norm_a, norm_b], dtype=torch.float64) * _LN10
    lower, accuracy = _log_diff(totals.max().reshape(1), totals.min().reshape(1))
    upper, why = _upper_bound_log(model_a, model_b, graph_a, input_shape)
    reason = ("signs differ" if not signs else "neither model dominates the other") + \
        "; lower bound: paper 002 eq. (6); upper bound: " + why
    return PathMetric(INTERVAL, lower / _LN10, upper / _LN10, norm_a, norm_b, signs,
                      accuracy, reason)


def enumerated_path_metric(model_a: nn.Module, model_b: nn.Module,
                           input_shape: Sequence[int]) -> float:
    """sum_p |Phi_p(theta_a) - Phi_p(theta_b)| by explicit enumeration of every path (Def.
    2.3.3) with the neuron-level DAG: the ground truth for small networks (exponential)."""
    from pathlift.graph.neurons import NeuronDAG

    values = []
    for model in (model_a, model_b):
        phi = NeuronDAG.from_module(model, input_shape).phi()
        keys = zip(phi.paths, phi.ends.tolist(), strict=True)
        values.append(dict(zip(keys, phi.values.tolist(), strict=True)))
    va, vb = values
    return float(sum(abs(va.get(k, 0.0) - vb.get(k, 0.0)) for k in va.keys() | vb.keys()))


def _upper_bound_log(model_a: nn.Module, model_b: nn.Module, graph: LayerGraph,
                     input_shape: Sequence[int]) -> tuple[float, str]:
    """ln of the invariant upper bound of paper 002 Lemma F.3 (q = 1), or +inf with the
    reason when its premise cannot be verified on the normalised parameters.

    The proof (Theorem F.2, then l1 <= count x l_inf) needs, for N = Alg. 3.2.1 with q = 1,
    every hidden neuron with ||(theta^{->v}, b_v)||_1 <= 1 (checked on both normalised
    models) and gives ||Phi - Phi'||_1 <= (d_out (K+1) + min(S, S') L (K+1)) ||N - N'||_inf
    with K the largest fan-in, L = D - 1 and S = sum over output neurons of
    ||theta^{->v}||_1; paper 002 then bounds S by ||Phi||_1 (exact normalisation) and K+1
    by W. The bound computed here is that inequality, with S measured, so it never
    exceeds the stated Lemma F.3 when its premise holds and stays valid when S > ||Phi||_1.
    """
    blocking = sorted({graph.handler(n).name for n in graph.nodes()
                       if graph.handler(n).kind in (Kind.ADD, Kind.MAXPOOL)})
    if blocking:
        return math.inf, (
            f"Lemma F.3 needs every hidden neuron of N(theta) to have l1 norm <= 1, which "
            f"{', '.join(blocking)} (fixed weights 1) rule out; no certified upper bound")
    if not _outputs_are_affine(graph):
        return math.inf, ("the output neurons are not those of an affine layer (pooling "
                          "after the last layer has fixed weights); no certified upper bound")
    traced, sums = [], []
    for model in (model_a, model_b):
        g = trace(normalize(model, input_shape, 1.0), input_shape)
        problem, total = _premise(g)
        if problem:
            return math.inf, problem + "; no certified upper bound"
        traced.append(g)
        sums.append(total)
    gap = max((float((a.to(torch.float64) - b.to(torch.float64)).abs().max())
               for _, a, b in paired_parameters(*traced) if a.numel()), default=0.0)
    fan_in, depth, d_out = width_and_depth(graph)
    if gap == 0.0:
        return -math.inf, "Lemma F.3 of paper 002 (N(theta) = N(theta'))"
    factor = d_out * (fan_in + 1) + min(sums) * (depth - 1) * (fan_in + 1)
    return math.log(factor) + math.log(gap), (
        f"Lemma F.3 of paper 002 (K = {fan_in}, L = {depth - 1}, d_out = {d_out}, "
        f"S = {min(sums):.4g}, ||N(theta) - N(theta')||_inf = {gap:.3g})")


def _outputs_are_affine(graph: LayerGraph) -> bool:
    """Whether every output tensor comes from affine layers through reshapes/cat only."""
    def affine(node) -> bool:
        if node.op == "placeholder":
            return False
        kind = graph.handler(node).kind
        if kind is Kind.AFFINE:
            return True
        if kind in (Kind.RESHAPE, Kind.IDENTITY, Kind.CAT):
            return all(affine(a) for a in node.all_input_nodes)
        return False

    out = next(n for n in graph.graph.nodes if n.op == "output")
    return all(affine(a) for a in out.all_input_nodes)


def _premise(graph: LayerGraph) -> tuple[str | None, float]:
    """(reason the normalised parameters violate ||(theta^{->v}, b_v)||_1 <= 1 at a hidden
    neuron, or None; S = sum over output neurons of ||theta^{->v}||_1)."""
    cmap = channel_map(graph)
    total = 0.0
    nodes = {n.target: n for n in graph.nodes() if n.op == "call_module"}
    for p in cmap.producers:
        if p.kind == "batchnorm" and p.neurons is p.inputs:
            continue
        module = graph.submodule(nodes[p.name])
        is_out = torch.isin(p.neurons, cmap.outputs)
        norms = incoming_norms(module, p, 1.0)
        if (norms[~is_out] > 1 + 1e-9).any():
            return (f"layer '{p.name}' keeps a hidden neuron of l1 norm "
                    f"{float(norms[~is_out].max()):.4g} > 1 after normalisation (tied or "
                    "fixed channels)"), 0.0
        if is_out.any():
            total += _output_weight_sum(graph, nodes[p.name], module, is_out)
    return None, total


def _output_weight_sum(graph: LayerGraph, node, module: nn.Module, mask: Tensor) -> float:
    """sum over the output neurons (every position) of the masked channels of ||theta^{->v}||_1."""
    handler = graph.handler(node)
    source = node.all_input_nodes[0]
    ones = torch.ones((1, *graph.output_shape(source)), dtype=torch.float64)
    call = Call(node, module, (ones,), dict(node.kwargs))
    per_neuron = handler.weight_part(ones, 1.0, call)
    dim = per_neuron.dim() - 1 if handler.channel_dim == -1 else 1
    return float(per_neuron.detach().movedim(dim, 0)[mask].sum())


def width_and_depth(graph: LayerGraph) -> tuple[int, int, int]:
    """(K, D, d_out): the largest number of antecedents of a neuron, the longest path (in
    edges, each affine or pooling layer one step) and the number of outputs (paper 002
    Lemma F.3 uses W = max(d_out, K)). Fan-ins count every kernel entry, so K may
    over-count at borders: the bound stays valid."""
    depth: dict[str, int] = {}
    width = 1
    for node in graph.nodes():
        handler = graph.handler(node)
        inputs = [depth[a.name] for a in node.all_input_nodes if a.name in depth]
        d = max(inputs, default=0)
        if handler.kind in (Kind.AFFINE, Kind.POOL, Kind.MAXPOOL):
            d += 1
            width = max(width, _fan_in(graph, node))
        depth[node.name] = d
    longest = max((depth.get(a.name, 0) for a in graph.outputs()), default=0)
    return width, longest, graph.d_out


def _fan_in(graph: LayerGraph, node) -> int:
    """Largest number of antecedents of a neuron created by ``node`` (an upper bound)."""
    module = graph.submodule(node)
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.in_channels // module.groups * math.prod(module.kernel_size)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return 1
    handler = graph.handler(node)
    in_shape = graph.output_shape(node.all_input_nodes[0])
    out_shape = graph.output_shape(node)
    if isinstance(handler, UpsampleHandler):
        return 1
    if isinstance(handler, MeanHandler):
        return math.prod(in_shape) // max(math.prod(out_shape), 1)
    if getattr(handler, "adaptive", False):
        return math.prod(-(-i // o) + 1 for i, o in zip(in_shape[1:], out_shape[1:],
                                                         strict=True))
    kernel = module.kernel_size if module is not None else \
        node.kwargs.get("kernel_size", node.args[1] if len(node.args) > 1 else None)
    if isinstance(kernel, int):
        return kernel ** (len(out_shape) - 1)
    return math.prod(kernel)
