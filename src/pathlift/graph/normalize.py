"""Normalisation of parameters (thesis Alg. 3.2.1, Def. 3.2.1, Lemma 3.2.1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pathlift.errors import PrecisionError
from pathlift.exponents import check_q
from pathlift.graph.boundary import writable_copy
from pathlift.graph.channels import ChannelMap, Producer, analyse
from pathlift.graph.factors import apply_, incoming_norms, refuse_shared_parameters
from pathlift.graph.layer_graph import LayerGraph


class FactorRangeError(PrecisionError):
    """Alg. 3.2.1 at this q would need a factor lambda_v, or give a weight times it, beyond
    the dtype's range (a small q: ||x||_q grows like (nonzero entries)^(1/q) as q -> 0)."""


@dataclass(frozen=True)
class Normalized:
    """The normalised copy, the number of input-dead neuron groups and of tied groups
    (several channels sharing one factor, for which Def. 3.2.1 holds only for the first
    member reached)."""

    model: nn.Module
    q: float
    dead_neurons: int
    tied_groups: int


def normalize(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
              q: float = 1.0, power_of_two: bool = False) -> nn.Module:
    """A functionally equivalent copy whose hidden neurons have ||(theta^{->v}, b_v)||_q in
    {0, 1} (thesis Alg. 3.2.1, Lemma 3.2.1). See ``normalize_report`` for the details.

    Args:
        model: the network or its ``LayerGraph``; it is not modified.
        input_shape: input size without the batch dimension.
        q: the exponent, in (0, inf].
        power_of_two: round each factor lambda_v to the nearest power of two (norms then
            lie in [2^-1/2, 2^1/2]): multiplying by a power of two is exact in floating
            point, so the copy is an exact rescaling of the model, not one up to rounding.

    Returns:
        The normalised copy (of the plain module under DDP or torch.compile), sharing the
        model's traced graph.

    Raises:
        InvalidParameterError for a bad q; UnsupportedModelError as ``trace``, or for two
        layers sharing one parameter tensor; FactorRangeError (a PrecisionError) when a
        factor, or a weight times it, leaves the dtype's range (a small q); PrecisionError
        when a norm is too small to divide by.

    Example::

        n = normalize(model, (3, 32, 32), q=2)   # same function, same path-norms
    """
    return normalize_report(model, input_shape, q, power_of_two).model


def normalize_report(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                     q: float = 1.0, power_of_two: bool = False) -> Normalized:
    """Alg. 3.2.1 on every hidden neuron group, in topological order; the model is not modified.

    Each hidden neuron v (a conv channel, a Linear unit, an affine BatchNorm channel; all
    positions of a conv channel share weights, so the norm is over its whole kernel) gets
    lambda_v = ||(theta^{->v}, b_v)||_q; incoming weights and bias are divided by it and
    outgoing weights multiplied by it. An input-dead neuron (lambda_v = 0) gets its outgoing
    weights set to zero, as the algorithm says. Output neurons are untouched.

    Neurons tied by a residual addition must share one factor (the skip edge has a fixed
    weight 1): the group is divided by the norm of its first member in topological order
    (the largest one if that layer holds several), whose incoming weights are final at
    that point, so the result is the same for all rescaling-equivalent parameters.
    Def. 3.2.1 then holds exactly for every untied neuron, not in general for the later
    members of a tied group: their norms depend on the group's own factor through the
    residual block, so no single factor normalises them all.
    Pooling neurons have fixed weights and are not rescaled. A layer called several times
    keeps one factor per neuron for all its calls (see ``pathlift.graph.channels``).
    ``model`` may be a traced ``LayerGraph``; the copy is of the plain module (wrappers
    such as DDP or torch.compile are looked through) and shares that graph.
    """
    check_q(q, infinite=True)
    cmap = analyse(model, input_shape)
    source = cmap.graph.model
    refuse_shared_parameters(source, cmap.producers)
    out = writable_copy(source)
    members = cmap.members()
    readers = _readers(cmap)
    dead = 0
    for producer, groups in _batches(cmap):
        lam = _group_norms(out, cmap, producer, groups, q)[groups]
        if not bool(torch.isfinite(lam).all()):  # a tiny q: (sum |theta|^q)^(1/q) overflows
            raise FactorRangeError(
                f"at q = {q:g}, layer '{producer.name}' has a neuron whose incoming weights' "
                "q-norm (sum |theta|^q)^(1/q) exceeds float64's largest value (1.8e308): as q "
                "-> 0 it grows like (number of nonzero weights)^(1/q), so Alg. 3.2.1 has no "
                "finite factor to divide by; use a larger q (1 or 2 as usual)")
        if power_of_two:
            lam = torch.where(lam > 0, torch.exp2(torch.round(torch.log2(lam))), lam)
        dead += int((lam == 0).sum())
        group_grow = torch.ones(cmap.num_groups, dtype=torch.float64)
        group_shrink = torch.ones_like(group_grow)
        grow = 1 / torch.where(lam > 0, lam, 1.0)
        if not bool(torch.isfinite(grow).all()):  # a norm below 1/float64-max: 1/lam is inf
            raise PrecisionError(
                f"layer '{producer.name}' has a neuron whose incoming weights have q-norm "
                f"{float(lam[lam > 0].min()):.3g}, below what float64 can divide by; "
                "Alg. 3.2.1 cannot normalise it exactly (scale the network up first)")
        group_grow[groups] = grow
        group_shrink[groups] = lam
        touched = {p.name: p for g in groups.tolist() for p, _ in members[g]}
        touched.update({p.name: p for g in groups.tolist() for p in readers.get(g, ())})
        grow, shrink = group_grow[cmap.group], group_shrink[cmap.group]
        for p in cmap.producers:
            if p.name in touched:
                apply_(p.module_in(out), p, grow, shrink)
                _refuse_overflow(out.get_submodule(p.name), p.name, producer.name, lam, q)
    tied = sum(sum(idx.numel() for _, idx in m) > 1 for m in members.values())
    cmap.graph.bind(out)
    return Normalized(out, q, dead, tied)


def _refuse_overflow(module: nn.Module, name: str, producer: str, lam: torch.Tensor,
                     q: float) -> None:
    """FactorRangeError when rescaling by the q-norms ``lam`` of ``producer``'s neurons left a
    weight of layer ``name`` beyond its dtype's range (its outgoing weights times lambda_v,
    Alg. 3.2.1): the cause is the norms at this q, not the model's weights."""
    for key, t in module.named_parameters(recurse=False):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise FactorRangeError(
                f"at q = {q:g}, the q-norms of layer '{producer}''s neurons reach "
                f"{float(lam.max()):.3g}, and layer '{name}''s {key} times them exceeds "
                f"{t.dtype}'s largest value ({torch.finfo(t.dtype).max:.3g}); Alg. 3.2.1 "
                "cannot normalise exactly: use a larger q (1 or 2 as usual), or a float64 "
                "copy of the model")


def _group_norms(model: nn.Module, cmap: ChannelMap, producer: Producer, groups: torch.Tensor,
                 q: float) -> torch.Tensor:
    """Largest ||(theta^{->v}, b_v)||_q over the channels of each group in ``producer``."""
    in_batch = torch.zeros(cmap.num_groups, dtype=torch.bool)
    in_batch[groups] = True
    lam = torch.zeros(cmap.num_groups, dtype=torch.float64)
    gp = cmap.group[producer.neurons]
    mask = in_batch[gp]
    norms = incoming_norms(producer.module_in(model), producer, q)
    return lam.scatter_reduce_(0, gp[mask], norms[mask], "amax")


def _batches(cmap: ChannelMap) -> list[tuple[Producer, torch.Tensor]]:
    """Free groups by the producer where they first appear (one layer at a time, in
    topological order): groups of one batch never feed each other."""
    seen = torch.zeros(cmap.num_groups, dtype=torch.bool)
    seen[0] = True
    batches = []
    for p in cmap.producers:
        groups = torch.unique(cmap.group[p.neurons])
        new = groups[~seen[groups]]
        if new.numel():
            seen[new] = True
            batches.append((p, new))
    return batches


def _readers(cmap: ChannelMap) -> dict[int, list[Producer]]:
    """For each group: the producers that read one of its channels."""
    out: dict[int, list[Producer]] = {}
    for p in cmap.producers:
        for g in torch.unique(cmap.group[p.inputs]).tolist():
            if g:
                out.setdefault(g, []).append(p)
    return out
