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

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from pathlift.graph import LayerGraph, param, writable_copy
from pathlift.graph.boundary import assign_
from pathlift.graph.channels import ChannelMap, Producer, analyse
from pathlift.graph.factors import apply_all_, refuse_shared_parameters
from pathlift.graph.ops.base import refuse_unwritable
from pathlift.lift.path_gradient import path_magnitudes
from pathlift.lift.path_norm import path_norm
from pathlift.symmetry.rescale import diagonal_only, factors_from_groups


def _scored(cmap: ChannelMap) -> list[Producer]:
    """Layers whose weights are coordinates pruning may zero (Linear, Conv, ...)."""
    return [p for p in cmap.producers if p.handler.scored]


def _path_costs(cmap: ChannelMap) -> dict[str, tuple[Tensor, Tensor | None]]:
    """theta_i d||Phi||_1/d theta_i of every weight and bias of every scored layer, up to
    one common positive factor (one |theta| pass and its backward, Sec. 3.5); the caller's
    parameters and gradients are untouched."""
    scored = _scored(cmap)
    model = cmap.graph.model
    layers = [p.name for p in scored]
    with_bias = [p.name for p in scored if param(p.module_in(model), "bias") is not None]
    found = path_magnitudes(cmap.graph, layers, with_bias)
    return {name: (found.weights[name], found.biases.get(name)) for name in layers}


def _directions(cmap: ChannelMap, costs) -> Tensor:
    """+1 (grow) or -1 (shrink) per group: shrink the side carrying more path cost."""
    incoming = torch.zeros(cmap.num_groups, dtype=torch.float64)
    outgoing = torch.zeros_like(incoming)
    model = cmap.graph.model
    for p in cmap.producers:
        if p.name not in costs:
            continue
        w, b = costs[p.name]
        per_entry = w.reshape(w.shape[0], w.shape[1], -1).sum(2)
        rows, cols = (i.expand(per_entry.shape) for i in
                      p.handler.entry_channels(p.module_in(model)))
        incoming.index_add_(0, cmap.group[p.neurons][rows].flatten(), per_entry.flatten())
        outgoing.index_add_(0, cmap.group[p.inputs][cols].flatten(), per_entry.flatten())
        if b is not None:
            incoming.index_add_(0, cmap.group[p.neurons], b)
    return torch.where(incoming > outgoing, -1.0, 1.0).to(torch.float64)


def magnitude_prune(model: nn.Module | LayerGraph, amount: float,
                    input_shape: Sequence[int] | None = None) -> nn.Module:
    """A copy with the fraction ``amount`` of smallest |weights| of the prunable layers
    (Linear, Conv, ConvTranspose) zeroed: global unstructured magnitude pruning, biases
    kept. Pruned models (torch.nn.utils.prune) keep their masks."""
    cmap = analyse(model, input_shape)
    refuse_unwritable((p.handler for p in cmap.producers), "prune")
    out = writable_copy(cmap.graph.model)
    _magnitude_prune_(out, _scored(cmap), amount)
    cmap.graph.bind(out)
    return out


def _magnitude_prune_(model: nn.Module, layers: Sequence[Producer], amount: float) -> None:
    """``magnitude_prune`` of these layers, in place."""
    modules = [p.module_in(model) for p in layers]
    weights = [param(m, "weight") for m in modules]
    flat = torch.cat([w.abs().flatten().double() for w in weights])
    k = int(amount * flat.numel())
    if k == 0:
        return
    threshold = torch.kthvalue(flat, k).values
    for m, w in zip(modules, weights, strict=True):
        assign_(m, "weight", w * (w.abs().double() > threshold).to(w.dtype))


def adversarial_rescale(model: nn.Module | LayerGraph, amount: float = 0.5,
                        scales: Sequence[float] = (8.0, 128.0, 4096.0),
                        input_shape: Sequence[int] | None = None) -> nn.Module:
    """A functionally equivalent copy on which magnitude pruning of ``amount`` does the most
    damage among the candidates (see the module docstring); the model is not modified.
    Refuses (UnsupportedModelError) a layer called several times: its path costs are not
    those of single coordinates."""
    cmap = analyse(model, input_shape)
    source = cmap.graph.model
    refuse_shared_parameters(source, cmap.producers)
    direction = _directions(cmap, _path_costs(cmap))
    given = torch.ones(cmap.num_groups, dtype=torch.bool)
    for g in diagonal_only(cmap):  # BatchNorm-only groups follow their input
        given[g] = False
    candidates = [(t, d) for t in scales
                  for d in (direction, torch.ones_like(direction), -torch.ones_like(direction))]
    best, best_damage = torch.ones(cmap.group.shape, dtype=torch.float64), -float("inf")
    for t, d in candidates:  # one scratch copy each, rescaled then pruned in place
        grow = factors_from_groups(cmap, torch.pow(float(t), d), given)
        scratch = writable_copy(source)
        apply_all_(scratch, cmap.producers, grow, 1.0 / grow)
        _magnitude_prune_(scratch, _scored(cmap), amount)
        damage = -path_norm(cmap.graph.bind(scratch)).log10  # ||Phi(theta)||_1 is fixed
        if damage > best_damage:
            best, best_damage = grow, damage
    out = writable_copy(source)
    apply_all_(out, cmap.producers, best, 1.0 / best)
    cmap.graph.bind(out)
    return out
