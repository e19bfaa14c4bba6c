"""Which channels are hidden neurons, which are tied together, and where each one flows.

A *producer* is a layer with parameters (Linear, Conv, ConvTranspose, affine BatchNorm):
each of its output channels (a conv channel or a Linear unit) is one rescalable hidden
neuron of Def. 2.4.1 (weight sharing makes all positions of a conv channel share one
factor). The analysis gives every producer channel an integer id and propagates, through
the traced graph, a tensor of ids the shape of each activation: ReLU, reshape, flatten,
permute and cat move the ids with the data (a conv channel becomes a block of features of
the next Linear; cat shifts channel offsets), per-channel pooling keeps them. The ids that
meet in a residual addition are *tied* (they must share one factor, else the sum is not
rescaled consistently); ids that reach a model output or meet the raw input are *fixed*
(output neurons are not rescaled). Anything else that mixes channels (pooling across
channels, ...) ties all the ids it mixes, which is always a valid, if coarser, symmetry.

One analysis serves rescaling, normalisation, canonicalisation and conserved quantities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, fx, nn

from pathlift.errors import ShapeError, UnsupportedModelError
from pathlift.graph.ops import Kind
from pathlift.graph.trace import HANDLER, LayerGraph, trace

LINEAR, CONV, CONV_TRANSPOSE, BATCHNORM = "linear", "conv", "conv_transpose", "batchnorm"


@dataclass(frozen=True)
class Producer:
    """A layer whose output channels are neurons.

    ``neurons[c]`` is the id of output channel c and ``inputs[i]`` the id feeding input
    channel (or Linear feature) i; id 0 is the network input. A BatchNorm without affine
    parameters cannot rescale on its own: its ``neurons`` are its ``inputs``.
    """

    name: str
    kind: str
    neurons: Tensor
    inputs: Tensor
    groups: int = 1


@dataclass(frozen=True)
class ChannelMap:
    """Producers in topological order and the tie groups of their neuron ids.

    ``group[i]`` is the tie group of neuron id i; group 0 is the fixed group (input,
    outputs, and everything tied to them). Groups are numbered 1..num_groups-1 otherwise.
    ``outputs`` are the ids found in the model's output tensors.
    """

    graph: LayerGraph
    producers: tuple[Producer, ...]
    group: Tensor
    num_groups: int
    outputs: Tensor

    def producer(self, name: str) -> Producer:
        for p in self.producers:
            if p.name == name:
                return p
        raise KeyError(name)

    def free_groups(self) -> Tensor:
        """Ids of the groups that may be rescaled (all but the fixed group 0)."""
        return torch.arange(1, self.num_groups)

    def members(self) -> dict[int, list[tuple[Producer, Tensor]]]:
        """For each free group: the producers holding it and their channel indices."""
        out: dict[int, list[tuple[Producer, Tensor]]] = {}
        for p in self.producers:
            if p.kind == BATCHNORM and p.neurons is p.inputs:
                continue
            groups = self.group[p.neurons]
            for g in torch.unique(groups).tolist():
                if g:
                    out.setdefault(g, []).append((p, torch.nonzero(groups == g).flatten()))
        return out


def producer_kind(module: nn.Module) -> str:
    if isinstance(module, nn.Linear):
        return LINEAR
    if isinstance(module, nn.modules.conv._ConvNd):
        return CONV_TRANSPOSE if module.transposed else CONV
    return BATCHNORM


class _UnionFind:
    def __init__(self) -> None:
        self.parent = [0]

    def new(self, n: int) -> Tensor:
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return torch.arange(start, start + n)

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:  # the smaller root wins, so anything tied to 0 stays fixed
            self.parent[max(ra, rb)] = min(ra, rb)

    def union_all(self, ids: Tensor) -> int:
        """Tie every id in ``ids`` together; return one of them."""
        unique = torch.unique(ids).tolist()
        for other in unique[1:]:
            self.union(unique[0], other)
        return unique[0]


def _per_channel(ids: Tensor, dim: int, uf: _UnionFind) -> Tensor:
    """The id of each slice along ``dim``; slices holding several ids get them tied."""
    moved = ids.movedim(dim, 0).reshape(ids.shape[dim], -1)
    first = moved[:, 0]
    for c in torch.nonzero((moved != first[:, None]).any(dim=1)).flatten().tolist():
        uf.union_all(moved[c])
    return first.clone()


class _Labeller(fx.Interpreter):
    """Runs the graph on tensors of neuron ids (float64, batch 1) instead of activations."""

    def __init__(self, graph: LayerGraph):
        super().__init__(graph.module)
        self.layer_graph = graph
        self.uf = _UnionFind()
        self.producers: list[Producer] = []
        self.outputs: list[Tensor] = []

    def run_node(self, n: fx.Node):
        if n.op == "placeholder":
            return torch.zeros((1, *self.layer_graph.input_shape), dtype=torch.float64)
        if n.op == "output":
            for t in _tensors(self.fetch_args_kwargs_from_env(n)[0]):
                self.uf.union(0, self.uf.union_all(t.long()))
                self.outputs.append(torch.unique(t.long()))
            return super().run_node(n)
        kind = n.meta[HANDLER].kind
        args, _ = self.fetch_args_kwargs_from_env(n)
        if kind is Kind.AFFINE:
            return self._producer(n, args[0])
        if kind is Kind.ADD:
            pairs = torch.unique(torch.stack([args[0].long().flatten(),
                                              args[1].long().flatten()]), dim=1)
            for a, b in pairs.t().tolist():
                self.uf.union(a, b)
            return args[0]
        if kind in (Kind.POOL, Kind.MAXPOOL):
            return self._pool(n, args[0])
        return super().run_node(n)

    def _out_shape(self, n: fx.Node) -> tuple[int, ...]:
        return (1, *self.layer_graph.output_shape(n))

    def _producer(self, n: fx.Node, ids: Tensor) -> Tensor:
        module = self.layer_graph.submodule(n)
        kind = producer_kind(module)
        dim = ids.dim() - 1 if kind == LINEAR else 1
        inputs = _per_channel(ids.long(), dim, self.uf)
        if kind == BATCHNORM and not module.affine:
            neurons = inputs
        else:
            channels = self._out_shape(n)[dim]
            neurons = self.uf.new(channels)
        self.producers.append(Producer(n.target, kind, neurons, inputs,
                                       getattr(module, "groups", 1)))
        shape = self._out_shape(n)
        view = [1] * len(shape)
        view[dim] = -1
        return neurons.to(torch.float64).reshape(view).expand(shape).clone()

    def _pool(self, n: fx.Node, ids: Tensor) -> Tensor:
        shape = self._out_shape(n)
        long = ids.long()
        if (long.dim() >= 2 and len(shape) >= 2 and shape[1] == long.shape[1]
                and (long == long.flatten(2)[:, :, :1].reshape(
                    long.shape[:2] + (1,) * (long.dim() - 2))).all()):
            channel = long.flatten(2)[0, :, 0].to(torch.float64)
            return channel.reshape((1, -1) + (1,) * (len(shape) - 2)).expand(shape).clone()
        return torch.full(shape, float(self.uf.union_all(long)), dtype=torch.float64)


def _tensors(value) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def channel_map(graph: LayerGraph) -> ChannelMap:
    """Hidden neurons of every producer, their tie groups and where they flow (Def. 2.4.1)."""
    labeller = _Labeller(graph)
    with torch.no_grad():
        labeller.run()
    uf = labeller.uf
    roots = torch.tensor([uf.find(i) for i in range(len(uf.parent))], dtype=torch.long)
    unique, group = torch.unique(roots, return_inverse=True)  # root 0 -> group 0
    outputs = torch.unique(torch.cat(labeller.outputs)) if labeller.outputs else \
        torch.zeros(0, dtype=torch.long)
    return ChannelMap(graph, tuple(labeller.producers), group, int(unique.numel()), outputs)


_SPATIAL_GUESSES = (32, 224, 64, 8, 28, 16, 96, 128, 256)


def resolve_input_shape(model: nn.Module, input_shape: Sequence[int] | None) -> tuple[int, ...]:
    """``input_shape`` itself, or one inferred from the first layer when it is None.

    A first Linear gives (in_features,); a first ConvNd gives (in_channels, s, ..., s) for
    the first spatial size s among common ones for which the model traces.
    """
    if input_shape is not None:
        return tuple(int(s) for s in input_shape)
    first = next((m for m in model.modules()
                  if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))), None)
    if isinstance(first, nn.Linear):
        return (first.in_features,)
    if first is not None:
        dims = len(first.kernel_size)
        for size in _SPATIAL_GUESSES:
            shape = (first.in_channels, *(size,) * dims)
            try:
                trace(model, shape)
            except (ShapeError, UnsupportedModelError):
                continue
            return shape
    raise ShapeError("cannot infer the input shape of this model; pass input_shape "
                     "(without the batch dimension), e.g. input_shape=(3, 32, 32)")


def analyse(model: nn.Module, input_shape: Sequence[int] | None = None) -> ChannelMap:
    """The hidden neurons of ``model``, their tie groups and how they flow (see channels)."""
    return channel_map(trace(model, resolve_input_shape(model, input_shape)))
