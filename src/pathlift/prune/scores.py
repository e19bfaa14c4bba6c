"""Pruning scores: Path-Mag(theta, i) = theta_i * d||Phi(theta)||_1 / d theta_i, and magnitudes.

Which coordinates are scored. The prunable coordinates are the weights of Linear, Conv and
ConvTranspose layers and, with ``include_biases=True``, their biases: ||Phi(theta)||_1 is
affine in |theta_i| for each of them (a path crosses an edge at most once and starts at
most at one bias), which is what makes eq. 14 of paper 002 the exact cost
||Phi(theta)||_1 - ||Phi(theta_{-i})||_1 of eq. 11. BatchNorm parameters are not scored:
eval BatchNorm is the identity neuron x*a + c with a = gamma/sqrt(var+eps) and
c = beta - mean*a (thesis, below Def. 2.2.2), so zeroing gamma also changes the bias c and
zeroing beta does not zero c; neither is a coordinate of theta, and gamma*d/dgamma would
not be the cost of pruning it. BatchNorm layers are kept dense, as in the thesis'
experiments (Appendix E.1). Parameters already pruned with torch.nn.utils.prune score 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parametrize

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import LayerGraph, graph_of, param
from pathlift.graph.boundary import is_dtensor, local, sharded_parameters
from pathlift.graph.collectives import all_max, all_objects
from pathlift.graph.functional import tensor_name
from pathlift.graph.input_shape import InputShape, shape_used
from pathlift.graph.ops.base import reading_once, refuse_unwritable
from pathlift.graph.sharded import ShardedLayers, as_shard_of, is_sharded_graph
from pathlift.lift.path_gradient import path_magnitudes
from pathlift.logspace import LN10, power10


@dataclass(frozen=True, repr=False)
class Scores:
    """Importance of every prunable coordinate: ``tensors[name] * 10**log10_scale``.

    ``tensors`` maps qualified parameter names (``"layer1.0.conv1.weight"``, the name of the
    effective parameter even when the module carries a torch.nn.utils.prune mask) to
    non-negative mantissas of that parameter's shape. One scale is common to all tensors,
    so rankings (global or per layer) compare mantissas directly; the scale keeps path
    magnitudes of deep networks, which exceed float64, finite. ``channel_dims`` maps each
    weight to the dim holding its layer's output channels (1 for ConvTranspose, else 0).
    ``input_shape`` is the shape the scores were computed at, ``input_shape.source`` where
    it came from (never a guess).
    """

    criterion: str
    tensors: Mapping[str, Tensor]
    log10_scale: float = 0.0
    channel_dims: Mapping[str, int] = field(default_factory=dict)
    input_shape: InputShape | None = field(default=None, repr=False, compare=False)

    def value(self, name: str) -> Tensor:
        """The actual scores of one parameter (inf where they exceed float64)."""
        return self.tensors[name].double() * power10(self.log10_scale)

    def log10_sum(self, masks: Mapping[str, Tensor] | None = None) -> float:
        """log10 of the sum of the scores, restricted to entries where ``masks`` is 1 (on a
        sharded model, masks sharded like the scores; every rank gets the same sum)."""
        total = sum(_number((t.double() * (1 if masks is None else masks[n].double())).sum())
                    for n, t in self.tensors.items())
        return math.log10(total) + self.log10_scale if total > 0 else -math.inf

    def zero_fraction(self) -> float:
        """The fraction of coordinates whose score is 0 (over every rank's shards)."""
        counts = [(t == 0).sum() for t in self.tensors.values()]
        if any(is_dtensor(c) for c in counts):
            zeros = sum(_number(c) for c in counts)
        else:  # one device sync
            zeros = float(torch.stack(counts).sum()) if counts else 0.0
        return zeros / max(self.numel(), 1)

    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    def flat(self) -> Tensor:
        """Every mantissa in one vector (their common dtype), in the order of ``tensors``
        (on a sharded model, this rank's rows of each)."""
        return torch.cat([local(t).reshape(-1) for t in self.tensors.values()])

    def __repr__(self) -> str:
        """Criterion, size and log10 of the total: no tensor printed (they can be millions)."""
        return (f"Scores({self.criterion!r}, {len(self.tensors)} tensors, {self.numel():,} "
                f"coordinates, log10 sum={self.log10_sum():.4f})")


def global_masks(scores: Scores, amount: int | float) -> dict[str, Tensor]:
    """Masks (1 keep, 0 prune) pruning the ``amount`` coordinates with the smallest scores
    across every tensor (``torch.nn.utils.prune.global_unstructured``'s ranking with
    ``L1Unstructured``; a float is a fraction of all coordinates), also for the scores of a
    sharded (FSDP2) model: each mask is then a DTensor placed like its scores, and the
    threshold comes from all-reduced counts (a bisection over the float64 values, about 64
    all-reduces of one number), so no rank holds more than its shards. Entries tied at the
    threshold are pruned in the order of ``scores.tensors``, each in row-major order. Every
    rank of a sharded model must call it.

    Example::

        masks = global_masks(path_magnitude_scores(model, (3, 32, 32)), 0.8)
    """
    total = scores.numel()
    if isinstance(amount, bool) or not (0 <= amount <= (1 if isinstance(amount, float)
                                                        else total)):
        raise InvalidParameterError(f"amount must be a fraction in [0, 1] or a count in "
                                    f"[0, {total}], got {amount!r}")
    k = round(amount * total) if isinstance(amount, float) else int(amount)
    tensors = list(scores.tensors.values())
    group = next((t.device_mesh.get_group() for t in tensors if is_dtensor(t)), None)
    main = group is None or dist.get_rank(group) == 0
    # a plain tensor of a sharded model is the same on every rank: rank 0 counts it
    values = [local(t).detach().double().reshape(-1) for t in tensors]
    counted = [v if is_dtensor(t) or main else v[:0] for t, v in zip(tensors, values,
                                                                       strict=True)]

    def count(threshold: float, strict: bool) -> int:
        """How many counted values are below (``strict``) or at most ``threshold``."""
        found = torch.tensor(sum(int((v < threshold if strict else v <= threshold).sum())
                                 for v in counted), dtype=torch.int64)
        if group is not None:
            dist.all_reduce(found, group=group)
        return int(found)

    top = max((float(v.max()) for v in counted if v.numel()), default=0.0)
    if group is not None:
        (top,) = all_max((top,), group)
    low, high = 0, _bits(top)  # the least threshold t with count(v <= t) >= k
    while low < high and k:
        mid = (low + high) // 2
        if count(_value(mid), strict=False) >= k:
            high = mid
        else:
            low = mid + 1
    threshold = _value(low) if k else -math.inf
    ties = [int((v == threshold).sum()) for v in counted]
    table = [ties] if group is None else all_objects(ties, group)  # [rank][tensor]
    spare = k - count(threshold, strict=True) if k else 0
    rank = 0 if group is None else dist.get_rank(group)
    masks = {}
    for i, (name, t, v) in enumerate(zip(scores.tensors, tensors, values, strict=True)):
        ahead = sum(table[r][j] for j in range(i) for r in range(len(table)))
        ahead += sum(table[r][i] for r in range(rank)) if is_dtensor(t) else 0
        mine = max(0, min(spare - ahead, int((v == threshold).sum())))
        prune = v < threshold
        if mine:
            tied = (v == threshold).nonzero().reshape(-1)[:mine]
            prune[tied] = True
        keep = (~prune).to(local(t).dtype).reshape(local(t).shape)
        masks[name] = as_shard_of(keep, t) if is_dtensor(t) else keep
    return masks


def _bits(x: float) -> int:
    """The int64 bit pattern of a non-negative float64: ordered like the floats."""
    return int(torch.tensor([x], dtype=torch.float64).view(torch.int64))


def _value(bits: int) -> float:
    return float(torch.tensor([bits], dtype=torch.int64).view(torch.float64))


def _number(total: Tensor) -> float:
    """A sum as a float: a DTensor sum of shards (a partial sum on each rank) is first
    all-reduced."""
    return float(total.full_tensor() if is_dtensor(total) else total)


def prunable_parameters(graph: LayerGraph, include_biases: bool = False
                        ) -> list[tuple[str, nn.Module, str]]:
    """(module name, module, parameter name) of every prunable coordinate tensor: the
    weights (and biases) of the layers whose handler says they are scored (Linear, Conv,
    ConvTranspose; not BatchNorm, see the module docstring) and PReLU slopes, once per
    layer."""
    return [(m, module, p) for m, module, p, _ in _prunable(graph, include_biases)]


def _prunable(graph: LayerGraph, include_biases: bool
              ) -> list[tuple[str, nn.Module, str, str]]:
    """``prunable_parameters`` with the role of each (``weight``, ``bias``): the module
    may hold it under another name (``F.linear(x, self.w)``: ``tensor_name``)."""
    entries, seen = [], set()
    for node in graph.parametric_nodes():
        handler, module = graph.handler(node), graph.stored_in(node)
        if not handler.scored or node.target in seen:
            continue
        seen.add(node.target)
        for role in ("weight", "bias") if include_biases else ("weight",):
            name = tensor_name(node, role)  # a parameter (a buffer is a constant)
            own = module._parameters
            if own.get(name) is not None or own.get(name + "_orig") is not None or (
                    role == "weight" and name not in module._buffers
                    and getattr(module, name, None) is not None):
                entries.append((node.target, module, name, role))
    return entries


def refuse_parametrized(targets: Sequence[tuple[str, nn.Module, str]],
                        graph: LayerGraph | None = None) -> None:
    """Refuse, naming them all, the targets computed by a torch.nn.utils.parametrize
    parametrization (weight_norm, spectral_norm, ...): torch.nn.utils.prune cannot prune
    them. Their scores are fine; ``pathlift.graph.writable_copy`` makes them plain. With
    the ``graph`` of the targets, also those of layers whose weight their module computes
    in forward (weight standardisation), each saying why."""
    if graph is not None:
        layers = {m for m, _, _ in targets}
        refuse_unwritable((graph.handler(n) for n in graph.parametric_nodes()
                           if n.target in layers), "prune")
    names = [f"{m}.{p}" for m, module, p in targets if parametrize.is_parametrized(module, p)]
    if names:
        raise UnsupportedModelError(
            f"{', '.join(names)}: computed by a torch.nn.utils.parametrize parametrization "
            "(weight_norm, spectral_norm, ...), which torch.nn.utils.prune cannot prune; "
            "remove it first (parametrize.remove_parametrizations(layer, 'weight', "
            "leave_parametrized=True)), or prune pathlift.graph.writable_copy(model), the "
            "same function with plain parameters")


def magnitude_scores(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                     include_biases: bool = False) -> Scores:
    """|theta_i| for every prunable coordinate: the baseline of magnitude pruning."""
    graph = graph_of(model, input_shape)
    entries = prunable_parameters(graph, include_biases)
    if not is_sharded_graph(graph):
        tensors = {f"{m}.{p}": param(module, p).abs() for m, module, p in entries}
        return Scores("magnitude", tensors, 0.0, _channel_dims(graph),
                      shape_used(graph.input_shape, input_shape))
    shards = ShardedLayers(graph, "magnitude_scores")
    views = {m: shards.by_target.get(m) for m, _, _ in entries}
    tensors = {f"{m}.{p}": views[m].local_rows(p, param(views[m].view, p).abs())
               if views[m] else param(module, p).abs() for m, module, p in entries}
    return Scores("magnitude", _placed(graph, entries, tensors), 0.0, _channel_dims(graph),
                  shape_used(graph.input_shape, input_shape))


def path_magnitude_scores(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                          include_biases: bool = False,
                          dtype: torch.dtype = torch.float64) -> Scores:
    """Path-Mag(theta, i) = ||Phi(theta)||_1 - ||Phi(theta_{-i})||_1 for every prunable
    coordinate, all at once by one forward and one backward pass (paper 002 eq. 11, 14).

    Args:
        model: the network (or its ``LayerGraph``); pruned, DDP-wrapped and compiled
            models are read as the plain module. It is not modified, nor its ``.grad``.
        input_shape: input size without the batch dimension.
        include_biases: score the biases too.
        dtype: mantissa precision (float32 is faster, ~1e-6 relative).

    Returns:
        ``Scores``: one non-negative mantissa tensor per parameter and a common log10
        scale (the values exceed float64 on deep networks).

    Raises:
        UnsupportedModelError for unsupported ops, NaN/inf parameters, or a layer called
        several times (its weights are then not single coordinates of the DAG).

    One forward and one backward pass of the |theta| network of Thm 3.1.1 (thesis Sec.
    3.5.1, ``pathlift.lift.path_gradient``), rescaling-invariant (paper 002 Lemma 4.2).
    The pass carries ||Phi||_1 as mantissa * e^s with s a constant, so the gradient of the
    mantissa times |theta| gives the scores up to the common factor e^s, kept apart as
    ``log10_scale``.

    Example::

        scores = path_magnitude_scores(model, (3, 224, 224))
        scores.tensors["layer1.0.conv1.weight"]   # mantissas; x 10**scores.log10_scale
    """
    graph = graph_of(model, input_shape)
    roles = _prunable(graph, include_biases)
    entries = [(m, module, p) for m, module, p, _ in roles]
    with reading_once():  # the values' check and the pass's units read each weight once
        graph.check_values()
        found = path_magnitudes(graph, [m for m, _, _, r in roles if r == "weight"],
                                [m for m, _, _, r in roles if r == "bias"], dtype)
    tensors = {f"{m}.{p}": (found.weights if r == "weight" else found.biases)[m]
               for m, _, p, r in roles}
    if is_sharded_graph(graph):
        tensors = _placed(graph, entries, tensors)
    return Scores("path-magnitude", tensors, found.log_scale / LN10, _channel_dims(graph),
                  shape_used(graph.input_shape, input_shape))


def _placed(graph: LayerGraph, entries: list[tuple[str, nn.Module, str]],
            tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each rank's rows of the scores of a sharded model as DTensors placed like their
    parameters (``tensors[name].full_tensor()`` gathers the whole)."""
    table = sharded_parameters(graph.owner)
    placed = {}
    for m, module, p in entries:
        shard = table.get((id(module), p), table.get((id(module), p + "_orig")))
        name = f"{m}.{p}"
        placed[name] = tensors[name] if shard is None else as_shard_of(tensors[name], shard)
    return placed


def _channel_dims(graph: LayerGraph) -> dict[str, int]:
    return {f"{n.target}.{tensor_name(n, 'weight')}": graph.handler(n).out_dim
            for n in graph.affine_nodes()}
