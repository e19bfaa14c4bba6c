"""Symmetries of ReLU networks: rescaling, normalisation, permutations, conserved quantities."""

from pathlift.symmetry.conserved import ConservedQuantities, conserved_quantities
from pathlift.symmetry.normalize import Normalized, normalize, normalize_report
from pathlift.symmetry.rescale import analyse, random_rescale, rescale

__all__ = ["ConservedQuantities", "Normalized", "analyse", "conserved_quantities", "normalize",
           "normalize_report", "random_rescale", "rescale"]
