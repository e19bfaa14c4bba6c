"""Shared timing helpers of the benchmarks: median wall time of repeated calls, and the
minimum over interleaved rounds of several functions."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
    """Minimum wall time of each function over ``repeats`` rounds that call every function
    once in turn (after one warm-up round): on a shared, loaded machine the minimum of
    interleaved calls is far steadier than medians taken one function after another."""
    best = dict.fromkeys(fns, float("inf"))
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_:
                best[name] = min(best[name], time.perf_counter() - start)
    return best
