"""Timing helpers of the benchmarks: the library's one round-robin timer
(``pathlift.kron.timing.round_robin``, re-exported here), the statistics the scripts
report (the median of repeated calls of one function, the minimum over interleaved
rounds of several) and the labelled CSV their rows go to."""

from __future__ import annotations

import csv
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from pathlift.files import write_text
from pathlift.kron.timing import round_robin, steady_allocator

__all__ = ["interleaved_min", "median_seconds", "round_robin", "steady_allocator", "write_rows"]


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


def write_rows(path: Path, rows: list[dict]) -> None:
    """``rows`` (dicts with the same keys, a "label" among them) into the CSV at ``path``
    after the file's rows of other labels with the same columns (atomically): runs of
    several checkouts or settings gather in one file, a rerun of a label replaces its
    rows."""
    kept = []
    if path.exists():
        with path.open(newline="") as f:
            kept = [r for r in csv.DictReader(f) if r.get("label") != rows[0]["label"]
                    and list(r) == list(rows[0])]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows([*kept, *rows])
    write_text(path, buffer.getvalue())
