"""Symmetries of ReLU networks: rescaling, normalisation, permutations, conserved quantities."""

from pathlift.symmetry.adversarial import adversarial_rescale, magnitude_prune
from pathlift.symmetry.conserved import ConservedQuantities, conserved_quantities
from pathlift.symmetry.equivalence import (
    Canonical,
    Equivalence,
    Symmetries,
    canonicalize,
    equivalent,
    permutable_units,
    permute,
    symmetries,
)
from pathlift.symmetry.normalize import Normalized, normalize, normalize_report
from pathlift.symmetry.rescale import analyse, random_rescale, rescale

__all__ = [
    "Canonical", "ConservedQuantities", "Equivalence", "Normalized", "Symmetries",
    "adversarial_rescale", "analyse", "canonicalize", "conserved_quantities", "equivalent",
    "magnitude_prune", "normalize", "normalize_report", "permutable_units", "permute",
    "random_rescale", "rescale", "symmetries",
]
