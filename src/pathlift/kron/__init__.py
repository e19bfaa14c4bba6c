"""pathlift.kron."""
