"""A rescaling chosen to hurt magnitude pruning (thesis Sec. 3.5, Figure 3.7 and Table 3.2).

Magnitude pruning is not rescaling-invariant: a rescaling that makes the important weights
small gets them pruned while the function and Phi(theta) are unchanged. The importance of
weight i is its path-magnitude cost theta_i d||Phi(theta)||_1/d theta_i (thesis Sec. 3.5),
itself invariant. For every free neuron group, if its incoming weights carry more cost than
its outgoing ones the group is shrunk (factor 1/t), else grown (factor t). Two blunt
candidates compete with it: every group shrunk (the first layer becomes tiny and is pruned
first) and every group grown (the last layer is). Among these, for each t in ``scales``,
the one kept maximises the damage ||Phi(theta)||_1 - ||Phi(pruned)||_1, which is the exact
l1 path-metric between the rescaled copy and its magnitude-pruned version (Lemma 3.4.1).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from pathlift.graph import param, trace
from pathlift.graph.channels import BATCHNORM, ChannelMap, analyse
from pathlift.graph.factors import apply_all_, in_channel_index
from pathlift.lift.path_gradient import path_magnitudes
from pathlift.lift.path_norm import path_norm_of_graph
from pathlift.symmetry.rescale import factors_from_groups


def _path_costs(model: nn.Module, cmap: ChannelMap) -> dict[str, tuple[Tensor, Tensor | None]]:
    """theta_i d||Phi||_1/d theta_i of every weight and bias of every Linear/Conv layer, up to
    one common positive factor (one |theta| pass and its backward, Sec. 3.5); the caller's
    parameters and gradients are untouched."""
    layers = [p.name for p in cmap.producers if p.kind != BATCHNORM]
    with_bias = [name for name in layers if param(model.get_submodule(name), "bias") is not None]
    found = path_magnitudes(cmap.graph, layers, with_bias)  # cmap.graph traces ``model``
    return {name: (found.weights[name], found.biases.get(name)) for name in layers}


def _directions(cmap: ChannelMap, costs) -> Tensor:
    """+1 (grow) or -1 (shrink) per group: shrink the side carrying more path cost."""
    incoming = torch.zeros(cmap.num_groups, dtype=torch.float64)
    outgoing = torch.zeros_like(incoming)
    for p in cmap.producers:
        if p.name not in costs:
            continue
        w, b = costs[p.name]
        rows, cols = in_channel_index(p, w)
        per_entry = w.reshape(w.shape[0], w.shape[1], -1).sum(2)
        incoming.index_add_(0, cmap.group[p.neurons][rows].flatten(), per_entry.flatten())
        outgoing.index_add_(0, cmap.group[p.inputs][cols].flatten(), per_entry.flatten())
        if b is not None:
            incoming.index_add_(0, cmap.group[p.neurons], b)
    return torch.where(incoming > outgoing, -1.0, 1.0).to(torch.float64)


def magnitude_prune(model: nn.Module, amount: float) -> nn.Module:
    """A copy with the fraction ``amount`` of smallest |weights| of Linear/Conv layers zeroed
    (global unstructured magnitude pruning, biases kept)."""
    out = copy.deepcopy(model)
    _magnitude_prune_(out, amount)
    return out


def _magnitude_prune_(model: nn.Module, amount: float) -> None:
    """``magnitude_prune`` in place."""
    weights = [m.weight for m in model.modules()
               if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    flat = torch.cat([w.detach().abs().flatten().double() for w in weights])
    k = int(amount * flat.numel())
    if k == 0:
        return
    threshold = torch.kthvalue(flat, k).values
    with torch.no_grad():
        for w in weights:
            w.mul_((w.abs().double() > threshold).to(w.dtype))


def adversarial_rescale(model: nn.Module, amount: float = 0.5,
                        scales: Sequence[float] = (8.0, 128.0, 4096.0),
                        input_shape: Sequence[int] | None = None) -> nn.Module:
    """A functionally equivalent copy on which magnitude pruning of ``amount`` does the most
    damage among the candidates (see the module docstring); the model is not modified."""
    cmap = analyse(model, input_shape)
    shape = cmap.graph.input_shape
    direction = _directions(cmap, _path_costs(model, cmap))
    given = torch.ones(cmap.num_groups, dtype=torch.bool)
    for g, members in cmap.members().items():  # BatchNorm-only groups follow their input
        if {p.kind for p, _ in members} == {BATCHNORM}:
            given[g] = False
    candidates = [(t, d) for t in scales
                  for d in (direction, torch.ones_like(direction), -torch.ones_like(direction))]
    best, best_damage = torch.ones(cmap.group.shape, dtype=torch.float64), -float("inf")
    for t, d in candidates:  # one scratch copy each, rescaled then pruned in place
        grow = factors_from_groups(cmap, torch.pow(float(t), d), given)
        scratch = copy.deepcopy(model)
        apply_all_(scratch, cmap.producers, grow, 1.0 / grow)
        _magnitude_prune_(scratch, amount)
        damage = -path_norm_of_graph(trace(scratch, shape)).log10  # ||Phi(theta)||_1 is fixed
        if damage > best_damage:
            best, best_damage = grow, damage
    out = copy.deepcopy(model)
    apply_all_(out, cmap.producers, best, 1.0 / best)
    return out
