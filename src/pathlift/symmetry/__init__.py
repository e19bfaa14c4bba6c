"""pathlift.symmetry."""
