"""Training under an l1 path-norm budget ||Phi(theta)||_1 <= B: normalise (thesis Alg. 3.2.1),
then project onto the budget by scaling the output layer.

Normalisation (q = 2: every hidden neuron's incoming (weights, bias) gets l2 norm 0 or 1,
the scale of a usual initialisation, so SGD steps keep their meaning) leaves the function
and Phi unchanged (Lemma 3.2.1) and fixes the representative. Every path ends with one
edge (or the bias) of the output layer, so ||Phi||_1 = sum_{v,u} |W_vu| N_u + sum_v |b_v|
with N_u = d||Phi||_1 / d|W_vu| the l1 path-norm reaching input u of that layer (one
|theta| pass and its backward, ``magnitude_gradients``), and scaling (W, b) by
B / ||Phi||_1 puts the network on the sphere ||Phi||_1 = B: the radial projection, which
keeps the classifier's decisions and margins up to that factor. (The Euclidean projection
onto the weighted l1 ball, a soft threshold, zeroes much of the output layer at each step;
it was tried first, at B = 3-30 on digits only, where both stay near chance.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import eval_mode, graph_of, unwrap
from pathlift.graph.normalize import normalize
from pathlift.lift.differentiable import magnitude_gradients

__all__ = ["PathNormBudget"]

_BISECTIONS = 100


@dataclass(frozen=True)
class PathNormBudget:
    """``budget.project_(model)`` after each optimiser step keeps ||Phi(theta)||_1 <= ``budget``
    (thesis Thm 3.1.1; normalisation of Alg. 3.2.1 with q = 2, then the radial projection
    of the module doc).

    It modifies ``model`` IN PLACE (it is a training step): the hidden layers are
    normalised, which keeps the function, and the output layer is scaled down when
    ||Phi||_1 exceeds the budget. The output
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
            _copy_state_(net, normalize(graph, None, q=2.0))
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


def _copy_state_(net: nn.Module, normalised: nn.Module) -> None:
    """Write the normalised parameters and buffers (BatchNorm's running statistics are
    rescaled too) into ``net`` in place, keeping its tensors (the optimiser's)."""
    target, source = net.state_dict(), normalised.state_dict()
    if target.keys() != source.keys():
        raise UnsupportedModelError(
            "the path-norm budget rewrites the weights in place, and some are computed by a "
            "torch.nn.utils.parametrize parametrization (weight_norm, spectral_norm, ...) "
            "that cannot hold the normalised values; train without it")
    with torch.no_grad():
        for key, value in target.items():
            if value.is_floating_point():
                value.copy_(source[key])


def _output_layer(graph) -> nn.Linear:
    """The nn.Linear layer producing the network's only output, read by nothing else."""
    outputs = graph.outputs()
    node = outputs[0] if len(outputs) == 1 else None
    module = graph.submodule(node) if node is not None and node.op == "call_module" else None
    if module is None or not graph.handler(node).dense_rows or len(node.users) != 1 \
            or graph.calls()[node.target] != 1:
        raise UnsupportedModelError(
            "the path-norm budget projects the output layer: the network must return the "
            "output of one nn.Linear layer, called once")
    return module

