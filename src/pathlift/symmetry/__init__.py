"""Symmetries of ReLU networks: rescaling, normalisation, permutations, conserved quantities."""

from pathlift.symmetry.rescale import analyse, random_rescale, rescale

__all__ = ["analyse", "random_rescale", "rescale"]
