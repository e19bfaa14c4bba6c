"""Rescaling-invariant pruning: path-magnitude scores, torch.nn.utils.prune methods,
iterative re-scoring with certificates, and structured channel scores. The
prune-rewind-retrain protocol and its run folders are the job ``pathlift.jobs.prune``."""

from pathlift.prune.kron import densify, factor_scores, prune_factors
from pathlift.prune.methods import (
    PathMagnitudeUnstructured,
    PruningResult,
    ScoreFunction,
    global_magnitude,
    global_path_magnitude,
    layer_sparsity,
    layerwise_magnitude,
    layerwise_path_magnitude,
    path_magnitude_unstructured,
    prune_model,
)
from pathlift.prune.scores import (
    Scores,
    global_masks,
    magnitude_scores,
    path_magnitude_scores,
    prunable_parameters,
)
from pathlift.prune.structured import channel_path_magnitude, channel_scores

__all__ = [
    "PathMagnitudeUnstructured",
    "PruningResult",
    "ScoreFunction",
    "Scores",
    "channel_path_magnitude",
    "channel_scores",
    "densify",
    "factor_scores",
    "global_magnitude",
    "global_masks",
    "global_path_magnitude",
    "layer_sparsity",
    "layerwise_magnitude",
    "layerwise_path_magnitude",
    "magnitude_scores",
    "path_magnitude_scores",
    "path_magnitude_unstructured",
    "prunable_parameters",
    "prune_factors",
    "prune_model",
]
