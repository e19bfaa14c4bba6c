"""One line saying whether a bound on a probability says anything, and by how much."""

from __future__ import annotations

import math

from pathlift.logspace import power10

__all__ = ["verdict"]


def verdict(log10_bound: float, measured: float | None = None) -> str:
    """"informative: 0.85 < 1 ..." or "not informative: 10^1.55, 1.55 orders above 1 ...",
    with the measured value it bounds when given."""
    against = "" if measured is None else f" (measured {measured:.4f})"
    if log10_bound < 0:
        return (f"informative: {power10(log10_bound):.4f} < 1, "
                f"{-log10_bound:.2f} orders below 1{against}")
    shown = f"{power10(log10_bound):.4g}" if log10_bound < 3 else f"10^{log10_bound:.2f}"
    if math.isinf(log10_bound):
        shown = "inf"
    return f"not informative: {shown} >= 1, {log10_bound:.2f} orders above 1{against}"
