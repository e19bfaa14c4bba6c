"""Symmetries of ReLU networks: rescaling, normalisation, permutations, conserved quantities."""

from pathlift.symmetry.normalize import Normalized, normalize, normalize_report
from pathlift.symmetry.rescale import analyse, random_rescale, rescale

__all__ = ["Normalized", "analyse", "normalize", "normalize_report", "random_rescale", "rescale"]
