"""Structured path-magnitude pruning: whole output channels (neurons) at once.

The score of a channel is the sum of the Path-Mag of its incoming weights (and bias): by
eq. 10 of paper 002 this is the l1 mass of the paths that enter the channel, i.e. the cost
in ||Phi||_1 of silencing it, and it inherits the rescaling invariance of Path-Mag.
``channel_path_magnitude`` zeroes channels through torch.nn.utils.prune (IN PLACE; the
output channels of a ConvTranspose are its weight's dim 1, as its handler says);
``pathlift.prune.torch_pruning.PathMagnitudeImportance`` plugs the same score into
Torch-Pruning (optional extra ``pathlift[prune]``), which removes channels physically.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn.utils import prune

from pathlift.errors import InvalidParameterError
from pathlift.graph import LayerGraph, graph_of
from pathlift.prune.scores import (
    Scores,
    path_magnitude_scores,
    prunable_parameters,
    refuse_parametrized,
)


def channel_scores(scores: Scores) -> dict[str, Tensor]:
    """Per output channel sums of the mantissas of each ``<layer>.weight`` (and
    ``<layer>.bias`` when scored): the cost of silencing that channel (paper 002 eq. 10),
    up to the common factor ``10**scores.log10_scale``. Output channels are along
    ``scores.channel_dims`` (dim 0 of Linear/Conv weights, dim 1 of ConvTranspose)."""
    out: dict[str, Tensor] = {}
    for name, t in scores.tensors.items():  # a weight has channel dims (any leaf name)
        layer = name.rsplit(".", 1)[0]
        dim = scores.channel_dims.get(name)
        sums = t if dim is None else t.movedim(dim, 0).reshape(t.shape[dim], -1).sum(1)
        out[layer] = out.get(layer, 0) + sums
    return out


def channel_path_magnitude(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                           amount: float) -> Scores:
    """Zero ``amount`` of the output channels of every prunable layer but the last one,
    those with the smallest channel Path-Mag, IN PLACE (``prune.ln_structured``, n=1, along
    each layer's output-channel dim, on the Path-Mag scores). Returns the scores the
    channels were ranked by."""
    if not 0.0 <= amount < 1.0:
        raise InvalidParameterError(f"amount must be a fraction in [0, 1), got {amount}")
    graph = graph_of(model, input_shape)
    scores = path_magnitude_scores(graph)
    targets = [(m, module, p) for m, module, p in prunable_parameters(graph)
               if f"{m}.{p}" in scores.channel_dims][:-1]  # not slopes, nor the outputs
    refuse_parametrized(targets, graph)
    for m, module, p in targets:  # on the module holding the weight, under its name
        prune.ln_structured(module, p, amount, n=1, dim=scores.channel_dims[f"{m}.{p}"],
                            importance_scores=scores.tensors[f"{m}.{p}"])
    return scores
