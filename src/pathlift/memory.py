"""The memory limit: refuse what cannot fit, before anything is allocated.

``check_bytes(needed, what)`` raises ``MemoryLimitError`` when ``needed`` exceeds the
limit: ``set_memory_limit(bytes)``, else the ``PATHLIFT_MAX_MEMORY`` environment variable
(``8G``, ``512M``, ``2e9``), else the memory available now (``MemAvailable`` of
/proc/meminfo and the cgroup's limit on Linux, ``os.sysconf`` elsewhere, the free CUDA
memory for a GPU; no check where none can be read). An explicit limit replaces the
available memory, so it can also raise the bar.

The time limit is the same for work sized by the user's counts: ``check_seconds(seconds,
what)`` raises ``WorkLimitError`` when an estimate exceeds ``set_time_limit(seconds)``,
else ``PATHLIFT_MAX_TIME``, else one hour (``inf``: no limit).

Checkpoints whose architecture is too large are refused before they are built; buffers of
random inputs by ``check_samples`` before they are drawn; files before they are read
(``pathlift.files``); every pass over a traced graph by ``pathlift.graph.memory``. A base
module (it imports nothing of pathlift but the errors, and torch only for CUDA), so that
every layer can ask it.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from pathlift.errors import InvalidParameterError, PathliftError, check_count

__all__ = ["PASS_BYTES", "MemoryLimitError", "WorkLimitError", "available_memory", "check_bytes",
           "check_samples", "check_seconds", "memory_limit", "parse_size", "set_memory_limit",
           "set_time_limit", "show_seconds", "show_size", "time_limit"]

ENV = "PATHLIFT_MAX_MEMORY"
PASS_BYTES = 8  # passes run in float64 (bytes a value)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_limit: int | None = None
_CPU_ROOM_FRESH_S = 1.0
_cpu_room: tuple[float, int | None] = (-math.inf, None)  # (when read, bytes available)


class MemoryLimitError(PathliftError):
    """A computation would need more memory than the limit: the message gives the
    estimate, the largest layer and what to do."""


def parse_size(text: str | int | float) -> int:
    """Bytes from ``8G``, ``512MB``, ``1.5T``, ``2e9`` or a number (binary units).

    Raises InvalidParameterError for anything else, or a size that is not positive."""
    if isinstance(text, bool):
        raise InvalidParameterError(f"a memory size must be a number of bytes, got {text!r}")
    if isinstance(text, int | float):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9.]+(?:[eE][0-9]+)?)\s*([KMGT]?)i?B?\s*", text,
                             re.IGNORECASE)
        if match is None:
            raise InvalidParameterError(
                f"memory size {text!r} is not a size; write it as 8G, 512M or 2e9 (bytes)")
        value = float(match[1]) * _UNITS[match[2].upper()]
    if not math.isfinite(value) or value < 1:
        raise InvalidParameterError(f"memory size {text!r} must be a positive number of bytes")
    return int(value)


def set_memory_limit(limit: int | str | None) -> None:
    """Refuse any pass (and any checkpoint) estimated to need more than ``limit`` bytes
    (an int, or a size such as "8G"); None returns to ``PATHLIFT_MAX_MEMORY``, else the
    memory available."""
    global _limit
    _limit = None if limit is None else parse_size(limit)


def memory_limit() -> int | None:
    """The explicit limit: ``set_memory_limit``'s, else ``PATHLIFT_MAX_MEMORY``'s, else None."""
    if _limit is not None:
        return _limit
    env = os.environ.get(ENV)
    return parse_size(env) if env else None


def available_memory(device: str = "cpu") -> int | None:
    """Bytes that can be allocated now on ``device`` ("cpu" or "cuda:i"), None if unknown.
    On the CPU it is read at most once a second: reading it costs about 0.2 ms, and every
    file pathlift reads (each image of a folder) is checked."""
    global _cpu_room
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    now = time.monotonic()
    if now - _cpu_room[0] > _CPU_ROOM_FRESH_S:
        _cpu_room = (now, _cpu_available())
    return _cpu_room[1]


def _cpu_available() -> int | None:
    found = [v for v in (_meminfo(), _cgroup_room()) if v is not None]
    if found:
        return min(found)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _meminfo() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE)
    return int(match[1]) * 1024 if match else None


def _cgroup_room() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), None without a limit."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text().strip().rpartition(":")[2]
        folder = Path("/sys/fs/cgroup") / cgroup.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((folder / "memory.current").read_text())
    except (OSError, ValueError):
        return None


def check_bytes(needed: int, what: str, detail: str = "", device: str = "cpu") -> None:
    """Raise ``MemoryLimitError`` when ``needed`` bytes exceed the explicit limit, else
    the memory available on ``device`` (nothing when neither is known).

    ``what`` says what needs them, ``detail`` (ending in "; ") what dominates."""
    limit = memory_limit()
    source = f"the limit set by pathlift --max-memory, pathlift.set_memory_limit or {ENV}"
    if limit is None:
        limit, source = available_memory(device), f"the memory available on {device}"
    if limit is None or needed <= limit:
        return
    raise MemoryLimitError(
        f"{what} needs about {show_size(needed)}, more than {source} ({show_size(limit)}); {detail}"
        f"use a smaller input shape or model, or set a higher limit (pathlift --max-memory "
        f"64G, or {ENV}=64G)")


def check_samples(samples: int, input_shape: Sequence[int], what: str,
                  itemsize: int = PASS_BYTES) -> None:
    """Refuse a buffer of ``samples`` random inputs of ``input_shape`` (``itemsize`` bytes a
    value) before it is drawn: ``samples`` must be a positive integer
    (``InvalidParameterError``) and the buffer must fit (``check_bytes``). ``what`` names
    the computation they are for."""
    check_count(f"{what}: samples", samples)
    check_bytes(samples * math.prod(input_shape) * itemsize,
                f"{what} on {samples:,} random inputs of shape {tuple(input_shape)}",
                "use fewer samples, or ")


def show_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


TIME_ENV = "PATHLIFT_MAX_TIME"
DEFAULT_MAX_TIME_S = 3600.0
_time_limit: float | None = None


class WorkLimitError(PathliftError):
    """Work sized by the user's counts is estimated to take longer than the time limit."""


def _parse_seconds(value: str | float) -> float:
    """A time limit in seconds: a number > 0, ``inf`` for none."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise InvalidParameterError(f"time limit {value!r} must be a number of seconds > 0 "
                                    "(inf for none)")
    return seconds


def set_time_limit(seconds: float | str | None) -> None:
    """Refuse work estimated to take more than ``seconds`` (``inf``: no limit); None
    returns to ``PATHLIFT_MAX_TIME``, else ``DEFAULT_MAX_TIME_S``."""
    global _time_limit
    _time_limit = None if seconds is None else _parse_seconds(seconds)


def time_limit() -> float:
    """``set_time_limit``'s limit, else ``PATHLIFT_MAX_TIME``'s, else one hour."""
    if _time_limit is not None:
        return _time_limit
    env = os.environ.get(TIME_ENV)
    return _parse_seconds(env) if env else DEFAULT_MAX_TIME_S


def check_seconds(seconds: float, what: str, detail: str = "") -> None:
    """Raise ``WorkLimitError`` when ``what``, estimated at ``seconds``, exceeds
    ``time_limit()``; ``detail`` (ending in "; ") says which counts to lower."""
    limit = time_limit()
    if seconds <= limit:
        return
    raise WorkLimitError(
        f"{what} is estimated at {show_seconds(seconds)}, more than the time limit "
        f"({show_seconds(limit)}: pathlift --max-time, else {TIME_ENV}, else one hour); "
        f"{detail}or raise the limit (pathlift --max-time SECONDS COMMAND ..., or "
        f"{TIME_ENV}=inf for none)")


def show_seconds(seconds: float) -> str:
    """``42 s``, ``12.5 min``, ``3.1 h``, ``inf``."""
    if math.isinf(seconds):
        return "no limit"
    if seconds < 600:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.1f} min" if seconds < 36_000 else f"{seconds / 3600:.1f} h"
