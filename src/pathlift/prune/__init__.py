"""pathlift.prune."""
