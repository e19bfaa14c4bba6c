"""Round-robin timing shared by the benchmark and KSLinear's "auto" algorithm choice."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Hashable

import torch


def round_robin(fns: dict[Hashable, Callable[[], object]], repeats: int,
                device: torch.device | str = "cpu") -> dict[Hashable, list[float]]:
    """Seconds of ``repeats`` rounds, each running every function once, after one warm-up
    round; interleaving makes a change of machine load hit all functions alike."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in fns.values():
        fn()
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
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
