"""pathlift.depth."""
