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

import torch
from torch import Tensor, fx, nn

from pathlift.errors import ArchitectureMismatchError, Problem
from pathlift.graph.ops import AffineHandler, BatchNormHandler, Call, Kind, LinearHandler
from pathlift.graph.trace import LayerGraph

NEURON_KINDS = (Kind.AFFINE, Kind.POOL, Kind.MAXPOOL)  # ops that create neurons
_CLOSES = (Kind.RELU, Kind.MAXPOOL)  # activations that end a neuron layer
_OPENS = (Kind.AFFINE, Kind.POOL, Kind.ADD)  # ops that create (or feed) identity neurons
_RELABEL = (Kind.RESHAPE, Kind.CAT, Kind.IDENTITY, Kind.SHAPE)  # ops creating no neuron


def longest_path(graph: LayerGraph, *kinds: Kind) -> int:
    """The largest number of nodes of the given kinds on one input -> output path."""
    best: dict[fx.Node, int] = {}
    for n in graph.graph.nodes:
        here = max((best[p] for p in n.all_input_nodes), default=0)
        if n.op == "output":
            return here
        best[n] = here + int(n.op != "placeholder" and graph.handler(n).kind in kinds)
    return 0


def neuron_layers(graph: LayerGraph, refined: bool, count_maxpool: bool) -> int:
    """Longest input -> output path in neuron layers (thesis Thm 4.4.1 and the refinement
    below it), by dynamic programming in topological order. Per node: ``done`` = layers
    completed, ``open`` = done + 1 if identity neurons still wait for the activation that
    ends their layer. ``refined`` merges identity neurons into their successors (a ReLU of
    ReLU neurons adds no layer); otherwise an eval BatchNorm right after an affine layer
    is folded into it and ``+`` merges skip edges. ``count_maxpool`` False leaves max-pool
    layers out (the D - M of Remark 4.4.1)."""
    done: dict[fx.Node, int] = {}
    open_: dict[fx.Node, int] = {}
    relu_out: dict[fx.Node, bool] = {}  # holds ReLU neurons only (relu of them is themselves)
    out = 0
    for n in graph.graph.nodes:
        preds = n.all_input_nodes
        d = max((done[p] for p in preds), default=0)
        o = max((open_[p] for p in preds), default=0)
        if n.op == "output":
            out = o
            continue
        kind = graph.handler(n).kind if n.op != "placeholder" else Kind.IDENTITY
        step = int(count_maxpool or kind is not Kind.MAXPOOL)
        idempotent = refined and bool(preds) and all(relu_out[p] for p in preds)
        relu_out[n] = kind is Kind.RELU or (kind in _RELABEL and idempotent)
        if kind is Kind.RELU:
            d = o = d + (0 if idempotent else 1)  # relu(relu(z)) = relu(z)
        elif kind is Kind.MAXPOOL:  # identity neurons before a max cannot be merged into it
            d = o = o + step
        elif kind in _OPENS:
            if refined:
                o = d + 1
            elif not (kind is Kind.ADD or _folds(graph, n)):
                d, o = o, o + 1
        done[n], open_[n] = d, o
    return out


def _folds(graph: LayerGraph, node: fx.Node) -> bool:
    """An eval BatchNorm right after an affine layer is folded into it."""
    pred = node.all_input_nodes[0]
    return (isinstance(graph.handler(node), BatchNormHandler) and pred.op != "placeholder"
            and graph.handler(pred).kind is Kind.AFFINE)


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


def antecedent_counts(graph: LayerGraph, node: fx.Node) -> Tensor:
    """The number of antecedents (incoming edges of the DAG, zero weights included) of
    every neuron the node creates, batch 1: the node's |theta|^0 map applied to ones."""
    handler = graph.handler(node)
    ones = torch.ones((1, *graph.output_shape(node.all_input_nodes[0])), dtype=torch.float64,
                      device=graph.device)
    call = Call(node, graph.submodule(node), (ones, *node.args[1:]), dict(node.kwargs))
    with torch.no_grad():
        if handler.kind is Kind.AFFINE:
            return handler.weight_part(ones, 0.0, call)
        return handler.abs_pow(ones, 0.0, call)


def fan_in(graph: LayerGraph) -> int:
    """K of paper 002 Lemma F.3: the largest number of antecedents of a neuron (1 if none)."""
    return max((int(antecedent_counts(graph, n).max()) for n in graph.nodes()
                if graph.handler(n).kind in NEURON_KINDS), default=1)


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
    for n in graph.nodes():
        handler, module = graph.handler(n), graph.submodule(n)
        if handler.kind is Kind.MAXPOOL:
            kernel = max(kernel, int(antecedent_counts(graph, n).max()))
        elif handler.kind is Kind.AFFINE:
            edges = int(antecedent_counts(graph, n).sum())
            biases = math.prod(graph.output_shape(n)) if handler.bias(module) is not None else 0
            unshared += edges + biases
            shared[id(module)] = sum(p.numel() for p in module.parameters())
    return Counts(kernel, sum(shared.values()), unshared)


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
    """(layer, weights, bias) of every affine node as DAG parameters (an eval BatchNorm is
    the identity neuron x*a + c: its parameters are (a, c), not its statistics)."""
    for node in graph.nodes():
        handler = graph.handler(node)
        if isinstance(handler, AffineHandler):
            weight, bias = handler.dag_parameters(graph.submodule(node))
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
        if not (graph_a.handler(na) is graph_b.handler(nb) and na.target == nb.target
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


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if hasattr(meta, "shape") else None


def lfcn_layers(graph: LayerGraph) -> tuple[list[nn.Module], list[Problem]]:
    """The Linear layers of a layered fully connected ReLU network (thesis Def. 2.1.1), in
    order, and a problem for every node that is not Linear, ReLU or a reshape."""
    allowed = {Kind.AFFINE, Kind.RELU, Kind.RESHAPE, Kind.IDENTITY}
    layers, problems = [], []
    for node in graph.nodes():
        handler = graph.handler(node)
        if handler.kind not in allowed or (handler.kind is Kind.AFFINE
                                           and not isinstance(handler, LinearHandler)):
            problems.append(Problem(str(node.target), handler.name, "not a layer of a "
                                    "layered fully connected ReLU network (Def. 2.1.1): "
                                    "Linear and ReLU only"))
        elif handler.kind is Kind.AFFINE:
            layers.append(graph.submodule(node))
    return layers, problems
