"""pathlift.bounds."""
