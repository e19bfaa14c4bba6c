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
from torch import Tensor, nn
from torch.nn.utils import parametrize

from pathlift.errors import UnsupportedModelError
from pathlift.graph import LayerGraph, graph_of, param
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
    """

    criterion: str
    tensors: Mapping[str, Tensor]
    log10_scale: float = 0.0
    channel_dims: Mapping[str, int] = field(default_factory=dict)

    def value(self, name: str) -> Tensor:
        """The actual scores of one parameter (inf where they exceed float64)."""
        return self.tensors[name].double() * power10(self.log10_scale)

    def log10_sum(self, masks: Mapping[str, Tensor] | None = None) -> float:
        """log10 of the sum of the scores, restricted to entries where ``masks`` is 1."""
        total = sum(float((t.double() * (1 if masks is None else masks[n].double())).sum())
                    for n, t in self.tensors.items())
        return math.log10(total) + self.log10_scale if total > 0 else -math.inf

    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    def flat(self) -> Tensor:
        """Every mantissa in one vector (their common dtype), in the order of ``tensors``."""
        return torch.cat([t.reshape(-1) for t in self.tensors.values()])

    def __repr__(self) -> str:
        """Criterion, size and log10 of the total: no tensor printed (they can be millions)."""
        return (f"Scores({self.criterion!r}, {len(self.tensors)} tensors, {self.numel():,} "
                f"coordinates, log10 sum={self.log10_sum():.4f})")


def prunable_parameters(graph: LayerGraph, include_biases: bool = False
                        ) -> list[tuple[str, nn.Module, str]]:
    """(module name, module, parameter name) of every prunable coordinate tensor: the
    weights (and biases) of the layers whose handler says they are scored (Linear, Conv,
    ConvTranspose; not BatchNorm, see the module docstring) and PReLU slopes, once per
    layer."""
    entries, seen = [], set()
    for node in graph.parametric_nodes():
        handler, module = graph.handler(node), graph.submodule(node)
        if not handler.scored or node.target in seen:
            continue
        seen.add(node.target)
        entries.append((node.target, module, "weight"))
        if include_biases and param(module, "bias") is not None:
            entries.append((node.target, module, "bias"))
    return entries


def refuse_parametrized(targets: Sequence[tuple[str, nn.Module, str]]) -> None:
    """Refuse, naming them all, the targets computed by a torch.nn.utils.parametrize
    parametrization (weight_norm, spectral_norm, ...): torch.nn.utils.prune cannot prune
    them. Their scores are fine; ``pathlift.graph.writable_copy`` makes them plain."""
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
    tensors = {f"{m}.{p}": param(module, p).abs() for m, module, p in entries}
    return Scores("magnitude", tensors, 0.0, _channel_dims(graph))


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
    graph.check_values()
    entries = prunable_parameters(graph, include_biases)
    found = path_magnitudes(graph, [m for m, _, p in entries if p == "weight"],
                            [m for m, _, p in entries if p == "bias"], dtype)
    tensors = {f"{m}.{p}": (found.weights if p == "weight" else found.biases)[m]
               for m, _, p in entries}
    return Scores("path-magnitude", tensors, found.log_scale / LN10, _channel_dims(graph))


def _channel_dims(graph: LayerGraph) -> dict[str, int]:
    return {f"{n.target}.weight": graph.handler(n).out_dim for n in graph.affine_nodes()}
