"""Quantities of the path-lifting Phi(theta): path-norms, path-metrics, Lipschitz bounds."""

from pathlift.lift.path_norm import PathNorm, path_norm, path_norm_of_graph, path_norms

__all__ = ["PathNorm", "path_norm", "path_norm_of_graph", "path_norms"]
