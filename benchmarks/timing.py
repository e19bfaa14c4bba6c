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


def round_robin(cases: dict[str, Callable[[], Callable[[], object]]], rounds: int = 5,
                warmup: int = 1, statistic: Callable[[list[float]], float] = statistics.median
                ) -> dict[str, float]:
    """``statistic`` (the median; ``min`` is steadier on a loaded machine) of the wall-clock
    seconds of every case, measured in turns: each round runs every case once, so a load
    change on a shared machine hits all of them alike.

    A case is a setup function returning the call to time: the setup (a fresh copy of a
    model, an in-place weight update) runs untimed just before its call.
    """
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(warmup + rounds):
        for name, setup in cases.items():
            fn = setup()
            start = time.perf_counter()
            fn()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistic(t) for name, t in times.items()}


def interleaved_min(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Minimum wall time of each function over ``repeats`` rounds that call every function
    once in turn (after one warm-up round)."""
    return round_robin({name: (lambda fn=fn: fn) for name, fn in fns.items()}, repeats,
                       statistic=min)
