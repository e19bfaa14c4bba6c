"""Architecture constants of the generalisation bounds, read from a traced ``LayerGraph``.

Thesis Thm 4.4.1 needs the depth D (longest input->output path), K (largest number of
inputs of a max-pool neuron), P (number of distinct k of k-max-pooling), d_in and d_out;
Thm 4.3.1 needs the number of parameters, with and without weight sharing (Appendix C.2);
Remark 4.4.1 needs the number M of max-pool layers and whether skips jump over them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from pathlift.graph import Call, Kind, LayerGraph, trace

_CLOSES = (Kind.RELU, Kind.MAXPOOL)  # activations that end a neuron layer
_OPENS = (Kind.AFFINE, Kind.POOL, Kind.ADD)  # ops that create (or feed) identity neurons
_RELABEL = (Kind.RESHAPE, Kind.CAT, Kind.IDENTITY, Kind.SHAPE)  # ops creating no neuron


@dataclass(frozen=True)
class ArchitectureConstants:
    """Constants of the DAG of a traced network (thesis Def. 2.2.2, Thm 4.4.1, Thm 4.3.1).

    - ``depth``: D of Thm 4.4.1 with the refinement below it ("Improving Theorem 4.4.1"):
      identity neurons are merged into their successors, so D counts the ReLU and max-pool
      layers on the longest input->output path, plus the output layer when it is an
      identity (affine) layer. Identity neurons feeding a max-pool cannot be merged (the
      max of a sum is not a max of terms) and are counted; a ReLU applied to ReLU neurons
      adds no layer (relu(relu(z)) = relu(z)).
    - ``depth_unrefined``: D of Def. 2.2.2 before that refinement: every neuron layer,
      identity ones (average-pool, a linear layer not followed by ReLU) included; an eval
      BatchNorm is folded into the affine layer it follows, ``+`` merges skip edges.
    - ``depth_without_maxpool``: the longest path counting only ReLU layers and the output
      layer: the D - M of Remark 4.4.1 (its log 3 term), and the convention of thesis
      Appendix E.1 (D = 2 + #blocks x #convs for ResNets, max-pool layer not counted).
    - ``maxpool_layers``: M, the largest number of max-pool layers on one path.
    - ``kernel``: K, the largest number of antecedents of a max-pool neuron (1 if none).
    - ``pool_types``: P, the number of distinct k of k-max-pooling (torch: k = 1 only).
    - ``sharpened_applies``: Remark 4.4.1's assumptions (P = 1, every path through every
      max-pool layer, i.e. no skip connection jumps over one).
    - ``num_params``: free parameters (weight sharing counted once, Appendix C.2).
    - ``num_params_unshared``: coordinates of theta in the unrolled DAG (one weight per
      edge, one bias per neuron), the #params of Thm 4.3.1.
    """

    depth: int
    depth_unrefined: int
    depth_without_maxpool: int
    maxpool_layers: int
    kernel: int
    pool_types: int
    d_in: int
    d_out: int
    num_params: int
    num_params_unshared: int
    sharpened_applies: bool


def architecture_constants(model: nn.Module, input_shape: Sequence[int]
                           ) -> ArchitectureConstants:
    """D, K, P, d_in, d_out, #params of ``model`` (thesis Thm 4.4.1, Thm 4.3.1).

    The model is not modified. Raises UnsupportedModelError like ``pathlift.graph.trace``.
    """
    return constants_of_graph(trace(model, input_shape))


def constants_of_graph(graph: LayerGraph) -> ArchitectureConstants:
    """Architecture constants of an already traced graph (thesis Thm 4.4.1, Thm 4.3.1)."""
    with torch.no_grad():
        counts = _count(graph)
    maxpools = [n for n in graph.nodes() if graph.handler(n).kind is Kind.MAXPOOL]
    return ArchitectureConstants(
        depth=_longest(graph, refined=True, count_maxpool=True),
        depth_unrefined=_longest(graph, refined=False, count_maxpool=True),
        depth_without_maxpool=_longest(graph, refined=True, count_maxpool=False),
        maxpool_layers=_max_on_path(graph, Kind.MAXPOOL),
        kernel=max(counts.kernels, default=1),
        pool_types=1 if maxpools else 0,
        d_in=math.prod(graph.input_shape),
        d_out=graph.d_out,
        num_params=sum(counts.shared.values()),
        num_params_unshared=counts.unshared,
        sharpened_applies=bool(maxpools) and all(_cuts(graph, m) for m in maxpools),
    )


def _longest(graph: LayerGraph, refined: bool, count_maxpool: bool) -> int:
    """Longest input->output path in neuron layers, by dynamic programming in topological
    order. Per node: ``done`` = layers completed, ``open`` = done + 1 if identity neurons
    are still waiting for the activation that ends their layer."""
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
    module = graph.submodule(node)
    pred = node.all_input_nodes[0]
    return (isinstance(module, nn.modules.batchnorm._BatchNorm) and pred.op != "placeholder"
            and graph.handler(pred).kind is Kind.AFFINE)


def _max_on_path(graph: LayerGraph, kind: Kind) -> int:
    best: dict[fx.Node, int] = {}
    for n in graph.graph.nodes:
        here = max((best[p] for p in n.all_input_nodes), default=0)
        if n.op not in ("placeholder", "output") and graph.handler(n).kind is kind:
            here += 1
        best[n] = here
        if n.op == "output":
            return here
    return 0


def _cuts(graph: LayerGraph, removed: fx.Node) -> bool:
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


@dataclass
class _Counts:
    kernels: list[int]
    shared: dict[int, int]
    unshared: int


def _count(graph: LayerGraph) -> _Counts:
    """Per node, on all-ones inputs of the recorded shapes (batch 1): max-pool antecedents
    (window sums of ones), edges of affine layers (|W|^0 applied to ones), neurons."""
    counts = _Counts([], {}, 0)
    for n in graph.nodes():
        if graph.handler(n).kind not in (Kind.MAXPOOL, Kind.AFFINE):
            continue
        handler, module = graph.handler(n), graph.submodule(n)
        ones = torch.ones((1, *_shape(n.args[0])), dtype=graph.dtype, device=graph.device)
        call = Call(n, module, (ones, *n.args[1:]), dict(n.kwargs))
        if handler.kind is Kind.MAXPOOL:
            counts.kernels.append(int(handler.abs_pow(ones, 1.0, call).max()))
            continue
        edges = int(handler.weight_part(ones, 0.0, call).double().sum())
        bias = math.prod(_shape(n)) if handler.bias(module) is not None else 0
        counts.unshared += edges + bias
        counts.shared[id(module)] = sum(p.numel() for p in module.parameters())
    return counts


def _shape(node: fx.Node) -> tuple[int, ...]:
    return tuple(node.meta["tensor_meta"].shape[1:])
