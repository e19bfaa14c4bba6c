"""pathlift.quant."""
