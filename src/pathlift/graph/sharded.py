"""The |theta|^q passes (thesis Thm 3.1.1) of a model whose parameters are sharded across
ranks, FSDP2's ``fully_shard`` (DTensor parameters split on dim 0), exactly and without
gathering any layer that has a rule: every rank calls, every rank gets the same numbers,
and no rank holds more than its shards, one small layer and the batch-1 activations.

- Every activation of the pass is replicated: each rank holds the same tensor.
- A layer whose weight rows are its output channels (Linear, Conv; ``AffineHandler.
  row_split`` "outputs") computes the channels of its local rows, |W_local|^q x + |b|^q,
  from the replicated input; the channels are all-gathered in rank order.
- A layer whose weight rows are its input channels (ConvTranspose, "inputs") applies its
  local rows to its input channels of the replicated input; the partial outputs are
  summed over ranks (all-reduce), then the bias is added.
- Any other layer with sharded parameters (BatchNorm, grouped convolutions, PReLU,
  Kronecker-sparse factors) has them all-gathered, one small layer at a time.
- In autograd (the differentiable path-norm, path-magnitude scores) each split layer's
  input goes through ``replicated`` (its gradient is summed over ranks) and the gathers'
  backward keeps the local slab (``pathlift.graph.collectives``), so the gradient at every
  local shard is exact and lands in the DTensor parameter's ``.grad`` as FSDP2's own does.
- Log-space scales agree across ranks: they are read off replicated tensors, and the
  per-layer unit (a layer's largest parameter) is all-reduced (max).

A rank without rows of a layer (uneven shards: 2 channels over 3 ranks) computes with one
zero row that the gather drops, so that every rank runs the same operations and
collectives, forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.abs_pow import AbsPowInterpreter, channel_bias
from pathlift.graph.boundary import module_view, sharded_parameters
from pathlift.graph.collectives import (
    Rows,
    all_max,
    gather_rows,
    replicated,
    same_pass,
    sum_ranks,
)
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import AffineHandler, Call, Handler
from pathlift.graph.ops.affine import peak_of, unit_of_peak

OUTPUTS, INPUTS = "outputs", "inputs"
_SPLITTABLE = frozenset({"weight", "bias", "weight_orig", "bias_orig"})


def rows_of(t: Tensor) -> Rows | None:
    """The rows of DTensor ``t`` this rank holds, or None when it is replicated (its local
    tensor is the whole)."""
    if not t.placements[0].is_shard(0):
        return None
    mesh = t.device_mesh
    rows = Rows.chunk(t.shape[0], mesh.get_local_rank(), mesh.size(), mesh.get_group())
    if t.to_local().shape[0] != rows.count:  # pragma: no cover - another torch's split
        raise UnsupportedModelError(
            f"a DTensor of {t.shape[0]} rows holds {t.to_local().shape[0]} on this rank, "
            f"not torch.chunk's {rows.count}: a split pathlift does not know")
    return rows


def _padded(t: Tensor) -> Tensor:
    """A local shard without rows as one zero row (see the module docstring)."""
    return t if t.shape[0] else torch.cat([t, t.new_zeros((1, *t.shape[1:]))])


@dataclass(frozen=True, eq=False)
class ShardedLayer:
    """One layer with sharded parameters as this rank reads it: ``view``, the module with
    its local rows (``split`` "outputs" / "inputs", ``rows`` those of its weight, ``bias``
    those of its bias) or with its parameters gathered whole (``split`` None)."""

    view: nn.Module
    split: str | None
    rows: Rows | None
    bias: Rows | None
    shards: dict[str, Rows | None]

    def weight_part(self, compute: Callable[[Tensor, Tensor | None], Tensor], x: Tensor,
                    bias: Tensor | None, channel_dim: int) -> Tensor:
        """The layer's |W|^q x (+ ``bias``, the whole layer's) from ``compute(x, bias)``,
        which applies the view (its local rows) to an input."""
        if self.split is None:
            return compute(x, bias)
        rows = self.rows
        x = replicated(x, rows.group)
        if self.split == OUTPUTS:
            mine = None if bias is None else _padded(bias.narrow(0, rows.start, rows.count))
            return gather_rows(compute(x, mine), channel_dim, rows)
        part = x.narrow(channel_dim, rows.start, rows.count) if rows.count else \
            x.narrow(channel_dim, 0, 1)  # read by the zero row
        y = sum_ranks(compute(part, None), rows.group)
        return y if bias is None else y + channel_bias(bias, y.dim(), channel_dim)

    def gathered_bias(self, local: Tensor | None) -> Tensor | None:
        """The whole layer's bias magnitudes from this rank's (``local``)."""
        if local is None or self.bias is None:
            return local
        return gather_rows(local, 0, self.bias)

    def local_rows(self, name: str, t: Tensor) -> Tensor:
        """This rank's rows of ``t``, a tensor of values of parameter ``name`` that a pass
        computed from the view (its local rows, or the whole parameter)."""
        rows = self.shards.get(name, self.shards.get(name + "_orig"))
        if rows is None:
            return t
        return t.narrow(0, rows.start if self.split is None else 0, rows.count)

    def units(self, handler: AffineHandler, exact: bool) -> tuple[float, float]:
        """``AffineHandler.units`` of the whole layer, the same on every rank: each
        tensor's peak is the largest of its ranks'."""
        if self.split is None:
            return handler.units(self.view, exact)
        peaks = all_max(tuple(peak_of(t) for t in handler.dag_parameters(self.view)),
                        self.rows.group)
        return unit_of_peak(peaks[0], exact), unit_of_peak(peaks[1], exact)


def _layer(module: nn.Module, handler: Handler, shards: dict[str, Tensor]) -> ShardedLayer:
    """The view of one layer whose parameters ``shards`` (name -> DTensor) are sharded."""
    rows = {name: rows_of(t) for name, t in shards.items()}
    split = handler.row_split(module) if set(shards) <= _SPLITTABLE and \
        all(r is not None for r in rows.values()) else None
    if split is None:  # replicated, or gathered one layer at a time
        return ShardedLayer(module_view(module, {
            name: t.to_local() if rows[name] is None else gather_rows(t.to_local(), 0,
                                                                       rows[name])
            for name, t in shards.items()}), None, None, None, rows)
    tensors = {name: _padded(t.to_local()) for name, t in shards.items()}
    for name, r in rows.items():  # torch.nn.utils.prune's masks follow their rows
        mask = module._buffers.get(name.removesuffix("_orig") + "_mask")
        if name.endswith("_orig") and mask is not None:
            tensors[name.removesuffix("_orig") + "_mask"] = _padded(
                mask.narrow(0, r.start, r.count))
    weight = rows.get("weight_orig", rows.get("weight"))
    return ShardedLayer(module_view(module, tensors), split, weight,
                        rows.get("bias_orig", rows.get("bias")), rows)


class ShardedLayers:
    """Every layer of ``graph`` with sharded parameters, as this rank reads them now:
    ``graph`` becomes the same graph over their views (the layers without shards are the
    model's own), ``layer(module)`` the ``ShardedLayer`` of a view. First, one small
    all-reduce checks that every rank runs ``purpose`` on a graph of the same shapes
    (``same_pass``), before any collective of the pass."""

    def __init__(self, graph: LayerGraph, purpose: str = "a pass"):
        table = sharded_parameters(graph.owner)
        groups = [t.device_mesh.get_group() for t in table.values()]
        self.group = groups[0] if groups else None
        if self.group is not None:
            shapes = [tuple(n.meta["tensor_meta"].shape) for n in graph.nodes()
                      if "tensor_meta" in n.meta]
            same_pass(f"{purpose} {graph.input_shape} {shapes}", self.group)
        layers: dict[str, ShardedLayer] = {}
        for node in graph.nodes():
            module = graph.submodule(node)
            if module is None or node.target in layers:
                continue
            shards = {k: table[id(module), k] for k in module._parameters
                      if (id(module), k) in table}
            if shards:
                layers[node.target] = _layer(module, graph.handler(node), shards)
        self.graph = graph.with_modules({t: layer.view for t, layer in layers.items()})
        self.by_target = layers
        self._layers = {id(layer.view): layer for layer in layers.values()}

    def layer(self, module: nn.Module | None) -> ShardedLayer | None:
        return self._layers.get(id(module))


class ShardedWalker:
    """The hooks of a |theta|^q pass (``weight_part``, ``bias_magnitude``, ``module_units``) for
    a graph with sharded layers: put it first among the bases of a pass class,
    ``class ShardedAbsPow(ShardedWalker, AbsPowInterpreter)``. The pass then runs over the
    layers' views, each split layer combined across ranks as the module docstring says;
    any hook a pass overrides (its own |W|^q, leaves, records) sees the local rows."""

    def __init__(self, graph: LayerGraph, *args: Any, **kwargs: Any):
        self.shards = ShardedLayers(graph, type(self).__name__)
        super().__init__(self.shards.graph, *args, **kwargs)

    def weight_part(self, handler: AffineHandler, x: Tensor, call: Call,
                    bias: Tensor | None = None, unit: float = 1.0) -> Tensor:
        layer = self.shards.layer(call.module)
        inner = super().weight_part
        if layer is None:
            return inner(handler, x, call, bias, unit)
        return layer.weight_part(lambda x, b: inner(handler, x, call.replace(x), b, unit), x,
                                 bias, handler.channel_dim)

    def bias_magnitude(self, handler: AffineHandler, call: Call, unit: float = 1.0
                       ) -> Tensor | None:
        layer = self.shards.layer(call.module)
        local = super().bias_magnitude(handler, call, unit)
        return local if layer is None else layer.gathered_bias(local)

    def module_units(self, handler: AffineHandler, module: nn.Module) -> tuple[float, float]:
        layer = self.shards.layer(module)
        return super().module_units(handler, module) if layer is None else \
            layer.units(handler, self.unit_weights)


def as_shard_of(local: Tensor, param: Tensor) -> Tensor:
    """``local``, this rank's rows of values of DTensor ``param``'s entries (scores), as a
    DTensor placed like ``param``."""
    dtensor = type(param)
    return dtensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


class ShardedAbsPow(ShardedWalker, AbsPowInterpreter):
    """``AbsPowInterpreter`` over a graph with sharded layers."""


def is_sharded_graph(graph: LayerGraph) -> bool:
    """Whether a pass over ``graph`` must run sharded (every rank taking part)."""
    return bool(sharded_parameters(graph.owner))

