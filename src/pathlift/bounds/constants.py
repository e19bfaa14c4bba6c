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

from torch import nn

from pathlift.graph import LayerGraph, graph_of
from pathlift.graph.structure import counts, cuts, longest_path, neuron_layers


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


def architecture_constants(model: nn.Module | LayerGraph,
                           input_shape: Sequence[int] | None = None) -> ArchitectureConstants:
    """D, K, P, d_in, d_out, #params of ``model`` (thesis Thm 4.4.1, Thm 4.3.1), read from
    its traced graph (``pathlift.graph.structure``). The model is not modified. Raises
    UnsupportedModelError like ``pathlift.graph.trace``."""
    graph = graph_of(model, input_shape)
    maxpools = [n for n in graph.nodes() if graph.handler(n).maxpool]
    found = counts(graph)
    return ArchitectureConstants(
        depth=neuron_layers(graph, refined=True, count_maxpool=True),
        depth_unrefined=neuron_layers(graph, refined=False, count_maxpool=True),
        depth_without_maxpool=neuron_layers(graph, refined=True, count_maxpool=False),
        maxpool_layers=longest_path(graph, "maxpool"),
        kernel=found.kernel,
        pool_types=1 if maxpools else 0,
        d_in=math.prod(graph.input_shape),
        d_out=graph.d_out,
        num_params=found.shared,
        num_params_unshared=found.unshared,
        sharpened_applies=bool(maxpools) and all(cuts(graph, m) for m in maxpools),
    )
