"""Structured path-magnitude pruning: whole output channels (neurons) at once.

The score of a channel is the sum of the Path-Mag of its incoming weights (and bias): by
eq. 10 of paper 002 this is the l1 mass of the paths that enter the channel, i.e. the cost
in ||Phi||_1 of silencing it, and it inherits the rescaling invariance of Path-Mag.
``channel_path_magnitude`` zeroes channels through torch.nn.utils.prune (IN PLACE);
``pathlift.prune.torch_pruning.PathMagnitudeImportance`` plugs the same score into
Torch-Pruning (optional extra ``pathlift[prune]``), which removes channels physically.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn.utils import prune

from pathlift.errors import InvalidParameterError
from pathlift.graph import trace
from pathlift.prune.scores import Scores, path_magnitude_scores_of_graph


def channel_scores(scores: Scores) -> dict[str, Tensor]:
    """Per channel of dim 0 sums of the mantissas of each ``<layer>.weight`` (and
    ``<layer>.bias`` when scored); multiply by ``10**scores.log10_scale`` for the values.
    Dim 0 holds the output channels of Linear and Conv (not of ConvTranspose: callers
    skip those)."""
    out: dict[str, Tensor] = {}
    for name, t in scores.tensors.items():
        layer, p = name.rsplit(".", 1)
        sums = t.reshape(t.shape[0], -1).sum(1) if p == "weight" else t
        out[layer] = out.get(layer, 0) + sums
    return out


def channel_path_magnitude(model: nn.Module, input_shape: Sequence[int], amount: float
                           ) -> Scores:
    """Zero ``amount`` of the output channels of every Linear/Conv layer but the last one,
    those with the smallest channel Path-Mag, IN PLACE (``prune.ln_structured``, n=1, on
    the Path-Mag scores). ConvTranspose layers keep their channels (dim 1 holds them).
    Returns the scores the channels were ranked by."""
    if not 0.0 <= amount < 1.0:
        raise InvalidParameterError(f"amount must be a fraction in [0, 1), got {amount}")
    graph = trace(model, input_shape)
    scores = path_magnitude_scores_of_graph(graph)
    names = list(scores.tensors)[:-1]  # output neurons of the network are never removed
    for name in names:
        layer = name.rsplit(".", 1)[0]
        module = graph.module.get_submodule(layer)
        if isinstance(module, nn.modules.conv._ConvTransposeNd):
            continue
        prune.ln_structured(module, "weight", amount, n=1, dim=0,
                            importance_scores=scores.tensors[name])
    return scores
