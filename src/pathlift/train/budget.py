"""Training under an l1 path-norm budget ||Phi(theta)||_1 <= B: normalise (thesis Alg. 3.2.1),
then project the output layer (the Euclidean projection onto the weighted l1 ball that
{||Phi||_1 <= B} is in its coordinates).

After normalisation every hidden neuron's incoming (weights, bias) has l1 norm 0 or 1, the
function unchanged (Lemma 3.2.1). ||Phi||_1 is then linear in the magnitudes of the output
layer: ||Phi||_1 = sum_{v,u} |W_vu| N_u + sum_v |b_v| with N_u = d||Phi||_1 / d|W_vu| the l1
path-norm reaching input u of that layer (one |theta| pass and its backward). Projecting
(W, b) onto {sum N |W| + sum |b| <= B} is a soft threshold |w| - tau N at the tau that
meets the budget (found by bisection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import eval_mode, graph_of, unwrap
from pathlift.graph.normalize import normalize
from pathlift.lift.differentiable import magnitude_gradients

__all__ = ["PathNormBudget"]

_BISECTIONS = 100


@dataclass(frozen=True)
class PathNormBudget:
    """``budget.project_(model)`` after each optimiser step keeps ||Phi(theta)||_1 <= ``budget``
    (thesis Thm 3.1.1; normalisation of Alg. 3.2.1, then the projection of the module doc).

    It modifies ``model`` IN PLACE (it is a training step): the hidden layers are
    normalised, which keeps the function, and the output layer is projected. The output
    must be one ``nn.Linear`` layer read by nothing else (UnsupportedModelError otherwise).
    Optimiser states such as momentum refer to the weights before normalisation; plain SGD
    or Adam cope.

    Example::

        budget = PathNormBudget((1, 8, 8), budget=20.0)
        for x, y in loader:
            opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
            budget.project_(model)
    """

    input_shape: tuple[int, ...]
    budget: float

    def __post_init__(self) -> None:
        if not (self.budget > 0 and math.isfinite(self.budget)):
            raise InvalidParameterError(f"the budget must be positive, got {self.budget}")

    def project_(self, model: nn.Module) -> float:
        """Normalise ``model`` and project its output layer in place; returns ||Phi||_1
        after the projection."""
        net = unwrap(model)
        with eval_mode(net):
            graph = graph_of(net, self.input_shape)
            normalised = normalize(graph, None, q=2.0)
            with torch.no_grad():
                for mine, theirs in zip(net.parameters(), normalised.parameters(), strict=True):
                    mine.copy_(theirs)
            last = _output_layer(graph)
            gammas = magnitude_gradients(graph, None, 1.0, torch.float64)
        total = sum(float((gammas.mantissas[p].to(torch.float64) * p.detach().abs()).sum())
                    for p in (last.weight, last.bias) if p is not None)
        current = total * math.exp(gammas.log_scale)
        if current > self.budget:
            with torch.no_grad():
                for p in (last.weight, last.bias):
                    if p is not None:
                        p.mul_(self.budget / current)
        return min(current, self.budget)


def _output_layer(graph) -> nn.Linear:
    """The nn.Linear layer producing the network's only output, read by nothing else."""
    outputs = graph.outputs()
    node = outputs[0] if len(outputs) == 1 else None
    module = graph.submodule(node) if node is not None and node.op == "call_module" else None
    if not isinstance(module, nn.Linear) or len(node.users) != 1 or graph.calls()[node.target] != 1:
        raise UnsupportedModelError(
            "the path-norm budget projects the output layer: the network must return the "
            "output of one nn.Linear layer, called once")
    return module


def _project_weighted_l1_(weighted: list[tuple[Tensor, Tensor]], budget: float) -> float:
    """Project the tensors onto {sum_i n_i |p_i| <= budget} (n_i >= 0, Euclidean), in place:
    p <- sign(p) max(|p| - tau n, 0) at the least tau >= 0 that meets the budget."""
    flat = [(p.detach().to(torch.float64), n) for p, n in weighted]

    def norm(tau: float) -> float:
        return sum(float(((v.abs() - tau * n).clamp_min(0) * n).sum()) for v, n in flat)

    current = norm(0.0)
    if current <= budget:
        return current
    low, high = 0.0, max(float(torch.where(n > 0, v.abs() / n, 0.0).max()) for v, n in flat)
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if norm(mid) > budget else (low, mid)
    for (p, n), (v, _) in zip(weighted, flat, strict=True):
        p.copy_((v.sign() * (v.abs() - high * n).clamp_min(0)).to(p.dtype))
    return norm(high)
