"""pathlift.data."""
