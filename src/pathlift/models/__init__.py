"""pathlift.models."""
