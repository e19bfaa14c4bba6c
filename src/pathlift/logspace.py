"""Numbers carried by their log10: path-norms of deep networks exceed float64."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

_LOG10_MAX = math.log10(sys.float_info.max)  # ~308.2547


def power10(log10: float) -> float:
    """10**log10 as a float, inf beyond float64 instead of an OverflowError."""
    return math.inf if log10 > _LOG10_MAX else 10.0**log10


def format_log10(log10: float, digits: int = 4) -> str:
    """A number given by its log10 in scientific notation, even far beyond float64."""
    if math.isinf(log10):
        return "0" if log10 < 0 else "inf"
    exponent = math.floor(log10)
    mantissa = f"{10 ** (log10 - exponent):.{digits}f}"
    if float(mantissa) >= 10:  # rounded up to 10: one more power of ten
        exponent, mantissa = exponent + 1, f"{1:.{digits}f}"
    return f"{mantissa}e{exponent:+d}"


LN10 = math.log(10.0)


def log10_sum(logs: Sequence[float]) -> float:
    """log10 of sum 10**v over ``logs``, exact far beyond float64 (-inf for no terms)."""
    top = max(logs, default=-math.inf)
    if math.isinf(top):
        return top
    return top + math.log10(math.fsum(10.0 ** (v - top) for v in logs))


def log10_difference(a: float, b: float) -> float:
    """log10(10**a - 10**b) for a >= b, -inf when they are equal."""
    if b == -math.inf:
        return a
    gap = -math.expm1((b - a) * LN10)
    return a + math.log10(gap) if gap > 0 else -math.inf
