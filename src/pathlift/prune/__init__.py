"""Rescaling-invariant pruning: path-magnitude scores, torch.nn.utils.prune methods,
iterative re-scoring with certificates, and the prune-rewind-retrain pipeline."""

from pathlift.prune.methods import (
    PathMagnitudeUnstructured,
    PruningResult,
    global_magnitude,
    global_path_magnitude,
    layerwise_magnitude,
    layerwise_path_magnitude,
    path_magnitude_unstructured,
    prune_model,
)
from pathlift.prune.scores import (
    Scores,
    magnitude_scores,
    path_magnitude_scores,
    prunable_parameters,
)
from pathlift.prune.structured import channel_path_magnitude, channel_scores

__all__ = [
    "PathMagnitudeUnstructured",
    "PruningResult",
    "Scores",
    "channel_path_magnitude",
    "channel_scores",
    "global_magnitude",
    "global_path_magnitude",
    "layerwise_magnitude",
    "layerwise_path_magnitude",
    "magnitude_scores",
    "path_magnitude_scores",
    "path_magnitude_unstructured",
    "prunable_parameters",
    "prune_model",
]
