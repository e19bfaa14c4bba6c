"""Quantities of the path-lifting Phi(theta): path-norms, path-metrics, the average-case
path-norm and the product of layer norms (the Lipschitz bounds built on them are in
``pathlift.bounds``, which also re-exports the pruning certificate of eq. 3.19 defined here
in ``pruning_bound``: the pruning package below ``pathlift.bounds`` computes it).

Every function takes an ``nn.Module`` (plain, pruned, DDP-wrapped or compiled) and an input
shape, or the ``LayerGraph`` of a model traced before: the graph is traced once per model
object and reused while the model's structure is unchanged.
"""

from pathlift.lift.average_case import (
    AverageCasePathNorm,
    LocalAffine,
    average_case_path_norm,
    local_affine,
)
from pathlift.lift.layer_norm import LayerNormProduct, layer_norm_product
from pathlift.lift.path_metric import PathMetric, path_metric
from pathlift.lift.path_norm import PathNorm, path_norm, path_norms
from pathlift.lift.pruning_bound import PruningCertificate, pruning_certificate

__all__ = ["AverageCasePathNorm", "LayerNormProduct", "LocalAffine", "PathMetric", "PathNorm",
           "PruningCertificate", "average_case_path_norm", "layer_norm_product",
           "local_affine", "path_metric", "path_norm", "path_norms", "pruning_certificate"]
