"""Conserved quantities of gradient flow from the rescaling symmetries (thesis Sec. 7.1.2).

The one-parameter group lambda -> lambda <> theta of a hidden neuron v leaves the loss
invariant, so (Noether; Kunin et al. 2021, Thm 1) gradient flow conserves
||(theta^{->v}, b_v)||_2^2 - ||theta^{v->}||_2^2. For a conv channel the sums run over its
whole kernel and every weight reading it; for channels tied by a residual addition over
every member and reader of the group (they share one factor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.graph import LayerGraph
from pathlift.graph.boundary import stored
from pathlift.graph.channels import analyse


@dataclass(frozen=True)
class ConservedQuantities:
    """One conserved quantity per neuron group: ``incoming - outgoing`` (squared l2 norms).

    ``groups`` are the group ids of the channel analysis. Groups read by a BatchNorm are left
    out: rescaling such a channel also moves the BatchNorm's running mean, a buffer that
    training does not update, so the loss is not invariant in the trained parameters.
    """

    groups: Tensor
    incoming: Tensor
    outgoing: Tensor

    @property
    def values(self) -> Tensor:
        return self.incoming - self.outgoing


def conserved_quantities(model: nn.Module | LayerGraph,
                         input_shape: Sequence[int] | None = None) -> ConservedQuantities:
    """||(theta^{->v}, b_v)||^2 - ||theta^{v->}||^2 for every free neuron group (Sec. 7.1.2).

    Cheap to call at every step of a training run: the graph and its channel analysis are
    traced once per model object and reused. The model is not modified.
    """
    cmap = analyse(model, input_shape)
    model = cmap.graph.model
    incoming = torch.zeros(cmap.num_groups, dtype=torch.float64)
    outgoing = torch.zeros_like(incoming)
    excluded = torch.zeros(cmap.num_groups, dtype=torch.bool)
    excluded[0] = True
    for p in cmap.producers:
        module = p.module_in(model)
        out_groups, in_groups = cmap.group[p.neurons], cmap.group[p.inputs]
        if p.diagonal:
            excluded[in_groups] = True
            if p.passthrough:
                continue
            rows = torch.stack([t for t in (stored(module, "weight"), stored(module, "bias"))
                                if t is not None], 1)  # a per-channel scale has no bias
            incoming.index_add_(0, out_groups, rows.detach().double().pow(2).sum(1))
            continue
        weight = stored(module, "weight").detach().double()
        squares = weight.pow(2).reshape(weight.shape[0], weight.shape[1], -1).sum(2)
        rows, cols = (i.expand(squares.shape) for i in p.handler.entry_channels(module))
        incoming.index_add_(0, out_groups[rows].flatten(), squares.flatten())
        outgoing.index_add_(0, in_groups[cols].flatten(), squares.flatten())
        bias = stored(module, "bias")
        if bias is not None:
            incoming.index_add_(0, out_groups, bias.detach().double().pow(2))
    keep = ~excluded
    return ConservedQuantities(torch.nonzero(keep).flatten(), incoming[keep], outgoing[keep])
