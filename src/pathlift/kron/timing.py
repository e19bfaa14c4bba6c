"""Round-robin timing shared by the benchmark and KSLinear's "auto" algorithm choice."""

from __future__ import annotations

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
