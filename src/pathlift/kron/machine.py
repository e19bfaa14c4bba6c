"""What the Kronecker-sparse timings depend on: the CPU (model and instruction-set flags)
and where its compiled kernels and measurements are kept on disk."""

from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path

__all__ = ["cache_dir", "cpu_features", "cpu_name", "warn_unusable_cache"]

_WARNED: set[str] = set()


def cache_dir() -> Path:
    """Where compiled kernels and per-machine measurements live: $PATHLIFT_CACHE_DIR/kron,
    default ~/.cache/pathlift/kron."""
    root = os.environ.get("PATHLIFT_CACHE_DIR") or Path.home() / ".cache" / "pathlift"
    return Path(root) / "kron"


def warn_unusable_cache(err: OSError) -> None:
    """One warning per process and cache folder that it cannot be written (``err``): the
    kernels and measurements are then kept in memory and made again by the next process."""
    folder = str(cache_dir())
    if folder not in _WARNED:
        _WARNED.add(folder)
        warnings.warn(f"pathlift.kron: the cache folder is unusable ({err}); kernels and "
                      "measurements are kept in memory for this process only (set "
                      "PATHLIFT_CACHE_DIR to a writable folder to keep them)",
                      RuntimeWarning, stacklevel=3)


def _cpuinfo_lines() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.read_text().splitlines() if cpuinfo.exists() else []


def cpu_features() -> str:
    """The model name and instruction-set flags -march=native compiles for (Linux), not the
    lines of /proc/cpuinfo that change at run time (clock speed)."""
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in _cpuinfo_lines() if line.startswith(wanted)}))


def cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo), else the platform's machine."""
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
