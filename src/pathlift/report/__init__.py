"""pathlift.report."""
