"""Quantities of the path-lifting Phi(theta): path-norms, path-metrics, Lipschitz bounds."""

from pathlift.lift.average_case import (
    AverageCasePathNorm,
    LocalAffine,
    average_case_path_norm,
    local_affine,
)
from pathlift.lift.lipschitz import (
    InputLipschitz,
    LayerNormProduct,
    ParameterLipschitz,
    layer_norm_product,
    lipschitz_input,
    lipschitz_params,
)
from pathlift.lift.path_metric import PathMetric, path_metric
from pathlift.lift.path_norm import PathNorm, path_norm, path_norm_of_graph, path_norms

__all__ = ["AverageCasePathNorm", "InputLipschitz", "LayerNormProduct", "LocalAffine",
           "ParameterLipschitz", "PathMetric", "PathNorm", "average_case_path_norm",
           "layer_norm_product", "lipschitz_input", "lipschitz_params", "local_affine",
           "path_metric", "path_norm", "path_norm_of_graph", "path_norms"]
