"""Work sized before it starts: the pace of this machine, timed in a fraction of a second,
and a command's estimate stated in one line and refused over the time limit
(``pathlift.memory.check_seconds``: ``pathlift --max-time``, else ``PATHLIFT_MAX_TIME``,
else one hour) before the work begins. ``prune``, ``frontier`` and ``kron-bench`` size
their counts here; ``depth`` and ``kron-design`` state theirs the same way."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pathlift.memory import check_seconds, show_seconds, time_limit

__all__ = ["Estimate", "matmul_pace", "training_pace"]


@dataclass(frozen=True)
class Estimate:
    """What a command will do (``work``), its time in ``seconds`` at ``pace`` (how it was
    timed), ``at_least`` when it counts only part of the work (a lower bound)."""

    work: str
    seconds: float
    pace: str
    at_least: bool = False

    def line(self) -> str:
        """``estimate: WORK, about 12 s at PACE; limit 60.0 min``: one line, stated first."""
        return (f"estimate: {self.work}, {'at least' if self.at_least else 'about'} "
                f"{show_seconds(self.seconds)} {self.pace}; limit {show_seconds(time_limit())}")

    def check(self, what: str, lower: str) -> None:
        """``WorkLimitError`` naming ``what``, the estimate, the limit, the counts to lower
        (``lower``) and the flag that lifts it, when the estimate exceeds the time limit."""
        check_seconds(self.seconds, what, f"use {lower}, ")


#: side of the matmul timed to know this machine's pace (``matmul_pace``)
_PROBE_SIDE = 256


def matmul_pace(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                threads: int | None = None) -> float:
    """An upper bound of this machine's multiply-adds a second at ``threads`` intra-op
    threads (default torch's count): a 256-square matmul of ``dtype`` timed on one thread,
    the fastest of 3 after one untimed (a few milliseconds), times ``threads`` (perfect
    scaling; on a loaded machine several threads can be far slower, never faster). On a
    GPU, the matmul's own pace. A time estimated from it is a lower bound."""
    device = torch.device(device)
    previous = torch.get_num_threads()
    scale = 1 if device.type == "cuda" else (threads or previous)
    a = torch.ones(_PROBE_SIDE, _PROBE_SIDE, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(1)
    try:
        a @ a  # warm-up, not timed
        fastest = math.inf
        for _ in range(3):
            sync()
            start = time.perf_counter()
            a @ a
            sync()
            fastest = min(fastest, time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return scale * _PROBE_SIDE**3 / max(fastest, 1e-9)


def training_pace(make: Callable[[], nn.Module], input_shape: Sequence[int], batch_size: int,
                  classes: int, steps: int = 2) -> float:
    """A lower bound of the seconds a training sample takes in one SGD step (forward,
    cross-entropy, backward, step) of a fresh ``make()`` at torch's thread count: ``steps``
    steps on random batches of ``batch_size`` inputs of ``input_shape`` timed on one
    thread after one untimed, divided by the thread count (perfect scaling, as
    ``matmul_pace``). The global RNG and the thread count are left as they were."""
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        model = make().train()
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()),
                     torch.float32)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        x = torch.randn(batch_size, *input_shape, dtype=dtype)
        y = torch.randint(0, classes, (batch_size,))

        def step() -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        torch.set_num_threads(1)
        try:
            step()  # warm-up, not timed
            start = time.perf_counter()
            for _ in range(steps):
                step()
            seconds = time.perf_counter() - start
        finally:
            torch.set_num_threads(threads)
    return seconds / (steps * batch_size * threads)
