"""Per-machine measurements on disk: which algorithm is fastest for a pattern, and designed
chains, keyed by a fingerprint of everything the timings depend on.

The fingerprint hashes the CPU (model name and instruction-set flags), the machine type,
the torch version, torch's intra-op thread count, the fused kernel's build (compiler,
flags, source) and the source of the timing procedure (``timing.round_robin``), so a
measurement is reused only where it would come out the same. One JSON file per
fingerprint lives in ``pathlift.kron.machine.trusted_cache_dir()`` (only a folder nobody
else can write: elsewhere the entries stay in memory, one warning); writes are atomic
(``pathlift.files.atomic_write``: a concurrent writer may drop the other's newest entry,
never corrupt the file). A file that is not a JSON object reads as empty and a malformed
entry is the caller's to ignore (it measures again); where the folder cannot be written
(read-only, full, a file in its place) the entries are kept in memory for the process,
with one warning. Only explicit measurements (``tune``, ``design``) store: a forward pass
never writes.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from pathlift import files
from pathlift.errors import PathliftError
from pathlift.kron import cpu_kernel, timing
from pathlift.kron.machine import cpu_features, cpu_name, trusted_cache_dir, warn_unusable_cache
from pathlift.kron.multiply import HALF

__all__ = ["fingerprint", "lookup", "machine_description", "store"]


@functools.cache
def _fingerprint(threads: int, compiler: str | None, flags: tuple[str, ...]) -> str:
    parts = (cpu_features(), platform.machine(), torch.__version__, str(threads),
             str(compiler), *flags, cpu_kernel.SOURCE, inspect.getsource(timing.round_robin))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def fingerprint() -> str:
    """Hash of CPU model and flags, machine, torch version, thread count, kernel build and
    timing procedure."""
    return _fingerprint(torch.get_num_threads(), cpu_kernel._compiler(),
                        cpu_kernel.build_flags() + cpu_kernel.width_flags())


def machine_description(dtype: torch.dtype = torch.float32) -> str:
    """One line naming what a figure was measured on: CPU, the fused kernel's instruction
    set and tile, torch version and thread count."""
    kernel = cpu_kernel.current_kernel(dtype) or cpu_kernel.current_kernel(
        torch.float32 if dtype in HALF else dtype)  # half precision: on the float32 kernel
    build = kernel.describe() if kernel is not None else "no fused kernel (einsum fallback)"
    return (f"{cpu_name()}, {os.cpu_count()} cpus; fused kernel {build}; torch "
            f"{torch.__version__}, {torch.get_num_threads()} thread(s)")


def _path(kind: str, create: bool = False) -> Path | None:
    folder = trusted_cache_dir(create)
    return None if folder is None else folder / f"{kind}-{fingerprint()}.json"


# entries this process measured but could not write: (kind, fingerprint) -> {key: value}
_MEMORY: dict[tuple[str, str], dict[str, Any]] = {}


def _read(kind: str) -> dict[str, Any]:
    path = _path(kind)
    if path is None:
        return {}
    try:
        data = json.loads(files.read_regular(path, follow_links=False))
    except (OSError, ValueError, PathliftError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(kind: str, key: str) -> Any | None:
    """The value stored under ``key`` for this machine, or None."""
    memory = _MEMORY.get((kind, fingerprint()), {})
    return memory[key] if key in memory else _read(kind).get(key)


def store(kind: str, key: str, value: Any) -> None:
    """Store a JSON-serialisable value under ``key`` for this machine: on disk, or for this
    process only (one warning) where the cache folder cannot be written."""
    path = _path(kind, create=True)
    try:
        if path is not None:
            files.write_json(path, _read(kind) | {key: value}, indent=None)
            return
    except files.FileSystemError as err:
        warn_unusable_cache(err)
    _MEMORY.setdefault((kind, fingerprint()), {})[key] = value
