"""Timing helpers of the benchmarks: the library's one round-robin timer
(``pathlift.kron.timing.round_robin``, re-exported here) and the statistics the scripts
report: the median of repeated calls of one function, the minimum over interleaved
rounds of several."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pathlift.kron.timing import round_robin, steady_allocator

__all__ = ["interleaved_min", "median_seconds", "round_robin", "steady_allocator"]


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_min(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Minimum wall time of each function's single calls over ``repeats`` rounds that call
    every function once, in a new order each round (after one warm-up call each)."""
    return {name: min(t) for name, t in round_robin(fns, repeats, min_sample=0).items()}
