"""Symmetries of ReLU networks: rescaling, normalisation, permutations, conserved quantities.

The transformation engine itself (channel analysis, per-neuron factors, Alg. 3.2.1
normalisation) lives in ``pathlift.graph``, which ``pathlift.lift`` may use as well (the
Lemma F.3 path-metric bound needs normalised parameters); it is re-exported here.
"""

from pathlift.graph.channels import analyse
from pathlift.graph.normalize import Normalized, normalize, normalize_report
from pathlift.symmetry.adversarial import adversarial_rescale, magnitude_prune
from pathlift.symmetry.compare import Comparison, compare_models
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
from pathlift.symmetry.identify import (
    Identifiability,
    SymmetryDimension,
    identify,
    symmetry_dimension,
)
from pathlift.symmetry.rescale import random_rescale, rescale

__all__ = [
    "Canonical", "Comparison", "ConservedQuantities", "Equivalence", "Identifiability",
    "Normalized", "Symmetries", "SymmetryDimension", "adversarial_rescale",
    "analyse", "canonicalize", "compare_models",
    "conserved_quantities", "equivalent", "identify",
    "magnitude_prune", "normalize", "normalize_report", "permutable_units", "permute",
    "random_rescale", "rescale", "symmetries", "symmetry_dimension",
]
