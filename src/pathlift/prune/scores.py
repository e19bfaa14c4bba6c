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
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import Problem, UnsupportedModelError
from pathlift.graph import Kind, LayerGraph, param, trace
from pathlift.lift.path_gradient import path_magnitudes
from pathlift.logspace import power10

_LN10 = math.log(10.0)
_SCORED = (nn.Linear, nn.modules.conv._ConvNd)


@dataclass(frozen=True)
class Scores:
    """Importance of every prunable coordinate: ``tensors[name] * 10**log10_scale``.

    ``tensors`` maps qualified parameter names (``"layer1.0.conv1.weight"``, the name of the
    effective parameter even when the module carries a torch.nn.utils.prune mask) to
    non-negative mantissas of that parameter's shape. One scale is common to all tensors,
    so rankings (global or per layer) compare mantissas directly; the scale keeps path
    magnitudes of deep networks, which exceed float64, finite.
    """

    criterion: str
    tensors: Mapping[str, Tensor]
    log10_scale: float = 0.0

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


def prunable_parameters(graph: LayerGraph, include_biases: bool = False
                        ) -> list[tuple[str, nn.Module, str]]:
    """(module name, module, parameter name) of every prunable coordinate tensor.

    Raises UnsupportedModelError if a layer is called twice: a path could then cross the
    same weight twice and ||Phi||_1 would not be affine in it.
    """
    calls: dict[str, int] = {}
    for node in graph.nodes():
        if node.op == "call_module" and graph.handler(node).kind is Kind.AFFINE:
            calls[node.target] = calls.get(node.target, 0) + 1
    shared = [name for name, count in calls.items() if count > 1]
    if shared:
        raise UnsupportedModelError([Problem(name, type(graph.module.get_submodule(name)).__name__,
                                             "this layer is called several times; pruning "
                                             "scores need each weight on one layer of the DAG")
                                     for name in shared])
    entries = []
    for name in calls:
        module = graph.module.get_submodule(name)
        if not isinstance(module, _SCORED):
            continue
        entries.append((name, module, "weight"))
        if include_biases and param(module, "bias") is not None:
            entries.append((name, module, "bias"))
    return entries


def magnitude_scores_of_graph(graph: LayerGraph, include_biases: bool = False) -> Scores:
    """|theta_i| for every prunable coordinate of a traced graph (magnitude pruning)."""
    tensors = {f"{m}.{p}": param(module, p).detach().abs()
               for m, module, p in prunable_parameters(graph, include_biases)}
    return Scores("magnitude", tensors)


def magnitude_scores(model: nn.Module, input_shape: Sequence[int],
                     include_biases: bool = False) -> Scores:
    """|theta_i| for every prunable coordinate: the baseline of magnitude pruning."""
    return magnitude_scores_of_graph(trace(model, input_shape), include_biases)


def path_magnitude_scores_of_graph(graph: LayerGraph, include_biases: bool = False,
                                   dtype: torch.dtype = torch.float64) -> Scores:
    """Path-Mag(theta, .) = theta . grad ||Phi(theta)||_1 (paper 002 eq. 14) of a traced graph.

    One forward and one backward pass of the |theta| network of Thm 3.1.1 (thesis Sec.
    3.5.1, ``pathlift.lift.path_gradient``). The pass carries ||Phi||_1 as mantissa * e^s
    with s a constant, so the gradient of the mantissa times |theta| gives the scores up to
    the common factor e^s, kept apart as ``log10_scale``. Everything runs in ``dtype``,
    whatever the model's: float64 scores are exact to ~1e-12 (relative), float32 ~1e-6.
    """
    entries = prunable_parameters(graph, include_biases)
    found = path_magnitudes(graph, [m for m, _, p in entries if p == "weight"],
                            [m for m, _, p in entries if p == "bias"], dtype)
    tensors = {f"{m}.{p}": (found.weights if p == "weight" else found.biases)[m]
               for m, _, p in entries}
    return Scores("path-magnitude", tensors, found.log_scale / _LN10)


def path_magnitude_scores(model: nn.Module, input_shape: Sequence[int],
                          include_biases: bool = False,
                          dtype: torch.dtype = torch.float64) -> Scores:
    """Path-Mag(theta, i) = ||Phi(theta)||_1 - ||Phi(theta_{-i})||_1 for every prunable
    coordinate, all at once by one forward and one backward pass (paper 002 eq. 11, 14).

    Rescaling-invariant (paper 002 Lemma 4.2). ``input_shape`` excludes the batch
    dimension; ``dtype`` is that of the mantissas (float32 is faster, ~1e-6 relative).
    The model is not modified (autograd.grad leaves ``.grad`` untouched).
    """
    return path_magnitude_scores_of_graph(trace(model, input_shape), include_biases, dtype)
