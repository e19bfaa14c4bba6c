"""The one round-robin timer of pathlift: KSLinear's algorithm choice (``tune``), the design
search, the Kronecker benchmark and the scripts of ``benchmarks/`` (through
``benchmarks/timing.py``)."""

from __future__ import annotations

import ctypes
import math
import random
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from pathlift.errors import check_count


def round_robin(fns: Mapping[Hashable, Callable[[], Any]], repeats: int,
                device: torch.device | str = "cpu", min_sample: float = 2e-3,
                setup: bool = False, clock: Callable[[], float] = time.perf_counter
                ) -> dict[Hashable, list[float]]:
    """Seconds per call of each function over ``repeats`` rounds, each round timing every
    function once; interleaving makes a change of machine load hit all functions alike.

    A sample is ``n`` back-to-back calls, ``n`` chosen after one warm-up call so that a
    sample lasts at least ``min_sample`` seconds (as ``timeit`` does): one call of a
    0.1 ms multiplication varies by 30-90% between runs (the first touches of its
    operands after another function ran), eight in a row by about 10%. Each round runs
    the functions in a new order (seeded, so reproducible): what ran just before a sample
    matters on CPU (a dense layer writing a 10 MB output leaves the next call cache misses
    and write-backs to pay, measured at 10-25% of a small chain's time), and a fixed
    order would charge it to the same function every round.

    With ``setup=True`` each value is a setup returning the call to time: the setup (a
    fresh copy of a model, an in-place weight update) runs untimed before every timed
    call, and a sample is that one call. ``min_sample=0`` times single calls.

    ``clock`` is wall-clock time by default; ``time.thread_time`` (the CPU time of this
    thread) leaves out the time other processes hold the core, which on a shared machine
    is most of the noise, and is exact where all the work runs on this thread (one
    intra-op thread, the fused kernel's one-thread path).
    """
    repeats = check_count("repeats", repeats)
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def seconds(fn: Callable[[], object], n: int) -> float:
        sync()
        start = clock()
        for _ in range(n):
            fn()
        sync()
        return (clock() - start) / n

    def call(name: Hashable) -> Callable[[], object]:
        return fns[name]() if setup else fns[name]

    calls = {}
    for name in fns:
        call(name)()
        first = seconds(call(name), 1)
        calls[name] = 1 if setup else max(1, math.ceil(min_sample / max(first, 1e-9)))
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    order = list(fns)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            times[name].append(seconds(call(name), calls[name]))
    return times


def steady_allocator() -> bool:
    """Keep freed memory in the process (glibc: no mmap below 1 GiB, no trimming), so that
    timings of large tensors do not include the page faults of freshly mapped outputs.

    Round-robin timing alternates tensors of many sizes, which makes glibc return and
    re-map memory: an output of 10 MB then costs 2,400 page faults, more than the
    multiplication for the sparse patterns. A repeated forward pass reuses its memory, so
    the steady state is the fair one. Process-wide: for benchmark commands, not for
    library code. Returns False where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)
                and libc.mallopt(m_trim_threshold, (1 << 31) - 1))
