"""Structure of the DAG of a traced network: longest paths, fan-ins, counts, and the
pairing of two graphs of one architecture (thesis Def. 2.2.2).

Every quantity is read from the node handlers, never from layer classes: the depth and
kernel constants of Thm 4.4.1 and Remark 4.4.1, the parameter counts of Thm 4.3.1, the
K, L and d_out of paper 002 Lemma F.3, and the layered (LFCN) view of Thm 6.1.1 / eq. 3.7.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, fx, nn

from pathlift.errors import ArchitectureMismatchError, Problem
from pathlift.graph.abs_pow import AbsPowLayer
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import Call, Handler, Kind
from pathlift.graph.sharded import ShardedLayer, ShardedLayers, is_sharded_graph
from pathlift.graph.walk import OpWalker


def longest_path(graph: LayerGraph, trait: str) -> int:
    """The largest number of nodes whose handler has the boolean ``trait`` (``"maxpool"``,
    ``"layer_on_path"``, see ``pathlift.graph.ops.Handler``) on one input -> output path."""
    best: dict[fx.Node, int] = {}
    for n in graph.graph.nodes:
        here = max((best[p] for p in n.all_input_nodes), default=0)
        if n.op == "output":
            return here
        best[n] = here + int(n.op != "placeholder" and getattr(graph.handler(n), trait))
    return 0


class _LayerCount(OpWalker):
    """Longest input -> output path in neuron layers, by dynamic programming in
    topological order (see ``neuron_layers``). Each value is (done, open, relu_only):
    layers completed, done + 1 if identity neurons still wait for the activation that
    ends their layer, and whether it holds ReLU neurons only (a ReLU of those adds none)."""

    purpose = "counting neuron layers"

    def __init__(self, graph: LayerGraph, refined: bool, count_maxpool: bool):
        super().__init__(graph)
        self.refined, self.count_maxpool = refined, count_maxpool

    def run_node(self, n: fx.Node):
        if n.op == "placeholder":
            return (0, 0, False)
        if n.op == "output":
            return max(o for _, o, _ in self._inputs(n))
        return super().run_node(n)

    def _inputs(self, n: fx.Node) -> list[tuple[int, int, bool]]:
        return [self.env[p] for p in n.all_input_nodes] or [(0, 0, False)]

    def _merge(self, call: Call) -> tuple[int, int, bool]:
        states = self._inputs(call.node)
        return (max(d for d, _, _ in states), max(o for _, o, _ in states),
                all(r for _, _, r in states))

    def on_relu(self, handler, call):
        d, _o, relu = self._merge(call)
        d = d if self.refined and relu and handler.idempotent else d + 1
        return (d, d, True)

    def on_maxpool(self, handler, call):  # identity neurons before a max: a layer of their own
        d, o, _ = self._merge(call)
        d = o + int(self.count_maxpool)
        return (d, d, False)

    def on_activation(self, handler, call):
        """ReLU neurons n_j (the identity neurons z they read merged into them when
        refined), then one layer of identity neurons y that waits for the next activation."""
        d, o, _ = self._merge(call)
        d = d + 1 if self.refined else o + 1
        return (d, d + 1, False)

    def _opens(self, handler, call):
        d, o, _ = self._merge(call)
        if self.refined:
            return (d, d + 1, False)
        if self._folds(handler, call):
            return (d, o, False)
        return (o, o + 1, False)

    on_affine = on_pool = _opens

    def on_add(self, handler, call):
        """Identity neurons merging skip edges: a layer of their own only when refined."""
        d, o, _ = self._merge(call)
        return (d, d + 1, False) if self.refined else (d, o, False)

    def _folds(self, handler, call) -> bool:
        """An eval BatchNorm right after an affine layer is folded into it."""
        pred = call.node.all_input_nodes[0]
        return (handler.folds and pred.op != "placeholder"
                and self.layer_graph.handler(pred).absorbs_folds)

    def on_reshape(self, handler, call):
        return self._merge(call)

    on_shape = on_reshape


def neuron_layers(graph: LayerGraph, refined: bool, count_maxpool: bool) -> int:
    """Longest input -> output path in neuron layers (thesis Thm 4.4.1 and the refinement
    below it), by dynamic programming in topological order. ``refined`` merges identity
    neurons into their successors (a ReLU of ReLU neurons adds no layer); otherwise an
    eval BatchNorm right after an affine layer is folded into it and ``+`` merges skip
    edges. ``count_maxpool`` False leaves max-pool layers out (the D - M of Remark
    4.4.1). A piecewise-linear activation counts as its lowering: a layer of ReLU neurons
    and one of identity neurons."""
    return _LayerCount(graph, refined, count_maxpool).run()


def cuts(graph: LayerGraph, removed: fx.Node) -> bool:
    """True when every input->output path goes through ``removed`` (no skip jumps it)."""
    reached: set[fx.Node] = set()
    for n in graph.graph.nodes:
        if n is removed:
            continue
        if n.op == "placeholder" or any(p in reached for p in n.all_input_nodes):
            reached.add(n)
        if n.op == "output":
            return n not in reached
    return True


def antecedent_counts(graph: LayerGraph, node: fx.Node, shards: ShardedLayers | None = None
                      ) -> Tensor:
    """The number of antecedents (incoming edges of the DAG, zero weights included) of
    every neuron the node creates, batch 1: the node's |theta|^0 map applied to ones (a
    sharded layer's from its local rows, ``shards`` being the graph's ``ShardedLayers``)."""
    ones = torch.ones((1, *graph.output_shape(node.all_input_nodes[0])), dtype=torch.float64,
                      device=graph.device)
    module = graph.submodule(node)
    layer = shards.by_target.get(node.target) if shards is not None else None
    call = Call(node, module if layer is None else layer.view, (ones, *node.args[1:]),
                dict(node.kwargs))
    with torch.no_grad():
        return _Antecedents(graph, layer).dispatch(graph.handler(node), call)


class _Antecedents(OpWalker):
    """The node's |theta|^0 map applied to its input of ones (``antecedent_counts``), one
    hook per kind of op that makes neurons."""

    purpose = "counting antecedents"
    refuses: ClassVar[dict[Kind, str]] = {
        Kind.RELU: " (a ReLU makes no neurons of its own)",
        Kind.ADD: " (a residual sum makes no neurons of its own)"}

    def __init__(self, graph: LayerGraph, layer: ShardedLayer | None):
        super().__init__(graph)
        self.layer = layer

    def on_affine(self, handler, call):
        ones = call.args[0]
        if self.layer is not None:  # a sharded layer: from its local rows
            return self.layer.weight_part(
                lambda x, b: handler.weight_part(x, 0.0, call.replace(x)), ones, None,
                handler.channel_dim)
        return handler.weight_part(ones, 0.0, call)

    def on_activation(self, handler, call):  # y reads one ReLU neuron per piece
        return torch.full_like(call.args[0], float(len(handler.pieces(call).neurons())))

    def on_pool(self, handler, call):
        return handler.abs_pow(call.args[0], 0.0, call)[0]

    on_maxpool = on_pool


def fan_in(graph: LayerGraph) -> int:
    """K of paper 002 Lemma F.3: the largest number of antecedents of a neuron (1 if none)."""
    shards = ShardedLayers(graph, "fan_in") if is_sharded_graph(graph) else None
    return max((int(antecedent_counts(graph, n, shards).max()) for n in graph.nodes()
                if graph.handler(n).creates_neurons), default=1)


@dataclass(frozen=True)
class Counts:
    """Largest max-pool window, free parameters (weight sharing counted once) and
    coordinates of theta in the unrolled DAG (one weight per edge, one bias per neuron)."""

    kernel: int
    shared: int
    unshared: int


def counts(graph: LayerGraph) -> Counts:
    """Kernel, shared and unshared parameter counts (thesis Thm 4.4.1, Appendix C.2)."""
    kernel, shared, unshared = 1, {}, 0
    shards = ShardedLayers(graph, "counts") if is_sharded_graph(graph) else None
    for n in graph.nodes():
        handler, module = graph.handler(n), graph.submodule(n)
        if handler.maxpool:
            kernel = max(kernel, int(antecedent_counts(graph, n).max()))
        elif isinstance(handler, AbsPowLayer):  # a layer: its edges and biases are theta's
            edges = int(antecedent_counts(graph, n, shards).sum())
            layer = shards.by_target.get(n.target) if shards is not None else None
            read = module if layer is None else layer.view  # a DTensor reads as its shard
            biases = math.prod(graph.output_shape(n)) if handler.bias(read) is not None else 0
            unshared += edges + biases
            shared[id(module)] = _free_parameters(module)
    return Counts(kernel, sum(shared.values()), unshared)


def _free_parameters(module: nn.Module) -> int:
    """Entries of the parameters a layer computes with: a tensor computed by a
    torch.nn.utils.parametrize parametrization counts as that tensor (weight_norm's g and v
    are one weight)."""
    computed = getattr(module, "parametrizations", {})
    own = sum(p.numel() for name, p in module.named_parameters()
              if not name.startswith("parametrizations."))
    return own + sum(getattr(module, name).numel() for name in computed)


def training_mode_ops(graph: LayerGraph) -> list[str]:
    """The modules of the graph that compute otherwise in training mode (batch statistics,
    randomness: their op's ``training_problem``), whatever mode they are in now: a model
    with any trains outside Def. 2.2.2 and is measured in eval mode."""
    return [str(n.target) for n in graph.nodes() if n.op == "call_module"
            and graph.handler(n).training_problem(graph.submodule(n)) is not None]


def outputs_are_affine(graph: LayerGraph) -> bool:
    """Whether every output tensor comes from affine layers through reshapes/cat only."""
    def affine(node: fx.Node) -> bool:
        if node.op == "placeholder":
            return False
        kind = graph.handler(node).kind
        if kind is Kind.AFFINE:
            return True
        if kind in (Kind.RESHAPE, Kind.IDENTITY, Kind.CAT):
            return all(affine(a) for a in node.all_input_nodes)
        return False

    return all(affine(n) for n in graph.outputs())


def dag_parameters(graph: LayerGraph) -> Iterator[tuple[str, Tensor, Tensor | None]]:
    """(layer, weights, bias) of every op with parameters (layers, PReLU slopes) as DAG
    parameters (an eval BatchNorm is
    the identity neuron x*a + c: its parameters are (a, c), not its statistics)."""
    for node in graph.parametric_nodes():
        weight, bias = graph.handler(node).dag_parameters(graph.submodule(node))
        yield node.target, weight, bias


def paired_parameters(graph_a: LayerGraph, graph_b: LayerGraph
                      ) -> list[tuple[str, Tensor, Tensor]]:
    """Matching DAG parameters of two graphs; ArchitectureMismatchError when they differ."""
    nodes_a, nodes_b = list(graph_a.nodes()), list(graph_b.nodes())
    if len(nodes_a) != len(nodes_b):
        raise ArchitectureMismatchError(
            f"the models have {len(nodes_a)} and {len(nodes_b)} operations; compare two "
            "models of one architecture")
    for na, nb in zip(nodes_a, nodes_b, strict=True):
        if not (_same_op(graph_a.handler(na), graph_b.handler(nb)) and na.target == nb.target
                and _shape(na) == _shape(nb)):
            raise ArchitectureMismatchError(
                f"operation '{na.name}' ({graph_a.handler(na).name}, output {_shape(na)}) "
                f"differs from '{nb.name}' ({graph_b.handler(nb).name}, output "
                f"{_shape(nb)}); compare two models of one architecture")
    pairs = []
    for (name, wa, ba), (_, wb, bb) in zip(dag_parameters(graph_a), dag_parameters(graph_b),
                                            strict=True):
        if wa.shape != wb.shape or (ba is None) != (bb is None):
            raise ArchitectureMismatchError(
                f"layer '{name}' has weights {tuple(wa.shape)} vs {tuple(wb.shape)} and "
                f"bias {ba is not None} vs {bb is not None}")
        pairs.append((name, wa, wb))
        if ba is not None:
            pairs.append((name + ".bias", ba, bb))
    return pairs


def _same_op(a: Handler, b: Handler) -> bool:
    """Whether two handlers are one op: the same object, or copies made per graph with the
    same settings (a layer lowered from a functional call, whose weight its module
    computes: ``ops.derived.derived_layer``)."""
    return a is b or (type(a) is type(b) and vars(a) == vars(b))


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if hasattr(meta, "shape") else None


def lfcn_layers(graph: LayerGraph) -> tuple[list[nn.Module], list[Problem]]:
    """The Linear layers of a layered fully connected ReLU network (thesis Def. 2.1.1), in
    order, and a problem for every node that is not Linear, ReLU or a reshape."""
    neuronless = {Kind.RELU, Kind.RESHAPE, Kind.IDENTITY}  # ReLU, relabelling, nothing
    layers, problems = [], []
    for node in graph.nodes():
        handler = graph.handler(node)
        if handler.dense_rows:
            layers.append(graph.submodule(node))
        elif handler.kind not in neuronless:
            problems.append(Problem(str(node.target), handler.name, "not a layer of a "
                                    "layered fully connected ReLU network (Def. 2.1.1): "
                                    "Linear and ReLU only"))
    return layers, problems
