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

A layer called several times (tied weights) keeps one set of neuron ids for all its calls,
and the inputs it reads at each call are tied channel by channel: one factor must then
serve every call, which is the only rescaling that keeps such a network's function.

One analysis serves rescaling, normalisation, canonicalisation and conserved quantities.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, fx, nn
from torch.utils._pytree import tree_leaves

from pathlift.graph.boundary import output_leaves
from pathlift.graph.functional import LOWERED, FunctionalCall, layer_in
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import Activation, AffineHandler, Call, FixedLinear, Handler
from pathlift.graph.trace import graph_of
from pathlift.graph.walk import OpWalker


@runtime_checkable
class ChannelLayer(Protocol):
    """What the channel analysis (rescaling and permutation classes of neurons) asks of a
    layer: the dim of its output channels, whether each neuron reads only its own channel
    (``diagonal``), its groups and whether its outputs are neurons of their own.
    ``AffineHandler`` implements it (and the protocols of the passes that read producers:
    ``pathlift.graph.factors.RescalableLayer``...)."""

    channel_dim: int
    diagonal: bool

    def groups(self, module: nn.Module) -> int: ...

    def own_neurons(self, module: nn.Module) -> bool: ...


@dataclass(frozen=True)
class Producer:
    """A layer whose output channels are neurons.

    ``neurons[c]`` is the id of output channel c and ``inputs[i]`` the id feeding input
    channel (or Linear feature) i at its first call; id 0 is the network input. A layer
    without neurons of its own (BatchNorm without affine parameters) has ``neurons`` is
    ``inputs``. ``handler`` knows its weight layout (``pathlift.graph.ops``); ``call`` is
    the ``FunctionalCall`` of a functional layer (``pathlift.graph.functional``), else None.
    """

    name: str
    handler: AffineHandler  # each pass reading producers asks its own protocol of it
    neurons: Tensor
    inputs: Tensor
    groups: int = 1
    call: FunctionalCall | None = None

    def module_in(self, model: nn.Module) -> nn.Module:
        """The module this layer computes with in ``model`` (the analysed model or a copy),
        as its handler reads and writes it (``pathlift.graph.functional.layer_in``)."""
        return layer_in(model, self.name, self.call)

    @property
    def passthrough(self) -> bool:
        return self.neurons is self.inputs

    @property
    def diagonal(self) -> bool:
        """Each neuron reads only its own input channel (eval BatchNorm)."""
        return self.handler.diagonal


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
    perm_group: Tensor | None = None
    carriers: tuple[tuple[str, Tensor], ...] = ()
    split: frozenset[int] = frozenset()  # ids of which an op keeps only some (x[:, :k])

    @property
    def permutation_group(self) -> Tensor:
        """``group`` without the ties that only fix scales (clipping activations): the
        groups a permutation must respect. Group 0 is fixed (input, outputs)."""
        return self.group if self.perm_group is None else self.perm_group

    def rebind(self, graph: LayerGraph) -> ChannelMap:
        """The same analysis for ``graph``, the graph of a copy of this one's model."""
        return dataclasses.replace(self, graph=graph)

    def producer(self, name: str) -> Producer:
        for p in self.producers:
            if p.name == name:
                return p
        raise KeyError(name)

    def free_groups(self) -> Tensor:
        """Ids of the groups that may be rescaled (all but the fixed group 0)."""
        return torch.arange(1, self.num_groups)

    def members(self) -> dict[int, list[tuple[Producer, Tensor]]]:
        """For each free group: the producers holding it and their channel indices
        (ascending), by one stable sort of each producer's channels by group."""
        out: dict[int, list[tuple[Producer, Tensor]]] = {}
        for p in self.producers:
            if p.passthrough:
                continue
            groups = self.group[p.neurons]
            order = torch.argsort(groups, stable=True)
            ids, counts = torch.unique_consecutive(groups[order], return_counts=True)
            for g, channels in zip(ids.tolist(), order.split(counts.tolist()), strict=True):
                if g:
                    out.setdefault(g, []).append((p, channels))
        return out


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


class _Labeller(OpWalker):
    """Runs the graph on tensors of neuron ids (float64, batch 1) instead of activations."""

    purpose = "the channel analysis"

    def __init__(self, graph: LayerGraph):
        super().__init__(graph)
        self.uf = _UnionFind()
        self.producers: dict[str, Producer] = {}
        self.outputs: list[Tensor] = []
        self.clipped: list[Tensor] = []
        self.carriers: list[tuple[str, Tensor]] = []
        self.split: set[int] = set()

    def run_node(self, n: fx.Node):
        if n.op == "placeholder":
            return torch.zeros((1, *self.layer_graph.input_shape), dtype=torch.float64)
        if n.op == "output":
            for t in output_leaves(self.fetch_args_kwargs_from_env(n)[0]):
                self.uf.union(0, self.uf.union_all(t.long()))
                self.outputs.append(torch.unique(t.long()))
        return super().run_node(n)

    def on_affine(self, handler: ChannelLayer, call: Call) -> Tensor:
        return self._producer(call.node, call.args[0])

    def on_add(self, handler: Handler, call: Call) -> Tensor:
        """The ids meeting in a sum are tied: distinct (a, b) pairs, one int64 key each."""
        a, b = call.args[0].long().flatten(), call.args[1].long().flatten()
        width = int(torch.maximum(a.max(), b.max())) + 1
        for key in torch.unique(a * width + b).tolist():
            self.uf.union(key // width, key % width)
        return call.args[0]

    def on_relu(self, handler: Handler, call: Call) -> Tensor:
        return call.args[0]

    def on_activation(self, handler: Activation, call: Call) -> Tensor:
        """A positively homogeneous activation keeps the ids of its input; a clipping one
        fixes their scale (they join the fixed group 0)."""
        ids = call.args[0]
        if handler.fixes_scale(call):
            self.clipped.append(ids.long())
        if any(isinstance(s, Tensor) and s.numel() > 1 for s in handler.pieces(call).slopes):
            self.carriers.append((call.node.target, _per_channel(ids.long(), 1, self.uf)))
        return ids

    def on_reshape(self, handler: Handler, call: Call) -> object:
        """Relabelling moves ids; an op that keeps only some of its input's ids (slicing,
        chunk) marks them: the order of those channels is then part of the structure."""
        out = call.run()
        inputs = [t for t in tree_leaves(call.args) if isinstance(t, Tensor)]
        kept = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        if inputs and kept:
            before = torch.unique(torch.cat([t.reshape(-1) for t in inputs]).long())
            after = torch.unique(torch.cat([t.reshape(-1) for t in kept]).long())
            if after.numel() < before.numel():
                self.split.update(before.tolist())
        return out

    def on_pool(self, handler: FixedLinear, call: Call) -> Tensor:
        if handler.elementwise:
            return call.args[0]
        return self._pool(handler, call)

    on_maxpool = on_pool

    def _out_shape(self, n: fx.Node) -> tuple[int, ...]:
        return (1, *self.layer_graph.output_shape(n))

    def _producer(self, n: fx.Node, ids: Tensor) -> Tensor:
        module = self.layer_graph.submodule(n)
        handler = self.layer_graph.handler(n)
        dim = ids.dim() - 1 if handler.channel_dim == -1 else 1
        inputs = _per_channel(ids.long(), dim, self.uf)
        first = self.producers.get(n.target)
        if first is not None:  # a layer called again: same neurons, inputs tied per channel
            for a, b in zip(first.inputs.tolist(), inputs.tolist(), strict=True):
                self.uf.union(a, b)
            neurons = first.neurons
        elif not handler.own_neurons(module):
            neurons = inputs
        else:
            neurons = self.uf.new(self._out_shape(n)[dim])
        if first is None:
            self.producers[n.target] = Producer(n.target, handler, neurons, inputs,
                                                handler.groups(module), n.meta.get(LOWERED))
        shape = self._out_shape(n)
        view = [1] * len(shape)
        view[dim] = -1
        return neurons.to(torch.float64).reshape(view).expand(shape).clone()

    def _pool(self, handler: FixedLinear, call: Call) -> Tensor:
        """Each neuron keeps the id of its antecedents where they all hold one (the op's
        ``antecedent_max`` of the ids and of ``top - ids`` agree: per-channel pooling, a
        copy, a sum along a channel's positions); where one reads several (a sum across
        channels, zero padding), every id of the input is tied."""
        ids = call.args[0]
        top = float(ids.max()) + 1  # top - ids > 0: no fill value of the op exceeds it
        high = handler.antecedent_max(ids, call)
        flipped = top - ids
        if torch.equal(high, top - handler.antecedent_max(flipped, call.replace(flipped))):
            return high
        return torch.full(high.shape, float(self.uf.union_all(ids.long())),
                          dtype=torch.float64)


def channel_map(graph: LayerGraph) -> ChannelMap:
    """Hidden neurons of every producer, their tie groups and where they flow (Def. 2.4.1).
    Computed once per graph (it depends on the structure only)."""
    if "channels" not in graph.derived:
        graph.derived["channels"] = _channel_map(graph)
    return graph.derived["channels"]


def _channel_map(graph: LayerGraph) -> ChannelMap:
    labeller = _Labeller(graph)
    with torch.no_grad():
        labeller.run()
    uf = labeller.uf
    perm_group = _groups(uf)[1] if labeller.clipped else None
    for ids in labeller.clipped:  # clipping fixes the scale, not the order
        uf.union(0, uf.union_all(ids))
    count, group = _groups(uf)
    outputs = torch.unique(torch.cat(labeller.outputs)) if labeller.outputs else \
        torch.zeros(0, dtype=torch.long)
    return ChannelMap(graph, tuple(labeller.producers.values()), group, count, outputs,
                      perm_group, tuple(labeller.carriers), frozenset(labeller.split))


def _groups(uf: _UnionFind) -> tuple[int, Tensor]:
    """Number of groups and the group of every id (the group of id 0 is 0)."""
    roots = torch.tensor([uf.find(i) for i in range(len(uf.parent))], dtype=torch.long)
    unique, group = torch.unique(roots, return_inverse=True)
    return int(unique.numel()), group


def analyse(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None
            ) -> ChannelMap:
    """The hidden neurons of ``model``, their tie groups and how they flow (see channels).
    Parameter values are checked (NaN, inf) since every user transforms them."""
    graph = graph_of(model, input_shape)
    graph.check_values()
    return channel_map(graph)
