"""Numbers carried by their log10: path-norms of deep networks exceed float64."""

from __future__ import annotations

import math
import sys

_LOG10_MAX = math.log10(sys.float_info.max)  # ~308.2547


def power10(log10: float) -> float:
    """10**log10 as a float, inf beyond float64 instead of an OverflowError."""
    return math.inf if log10 > _LOG10_MAX else 10.0**log10


def format_log10(log10: float, digits: int = 4) -> str:
    """A number given by its log10 in scientific notation, even far beyond float64."""
    if math.isinf(log10):
        return "0" if log10 < 0 else "inf"
    exponent = math.floor(log10)
    return f"{10 ** (log10 - exponent):.{digits}f}e{exponent:+d}"
