"""What the Kronecker-sparse timings depend on: the CPU (model and instruction-set flags)
and where its compiled kernels and measurements are kept on disk.

The cache holds shared libraries that pathlift loads into the process, so it is used only
where nobody but the user can write (``trusted_cache_dir``): the folder is the user's, not
a symbolic link, not writable by group or others, and every folder above it is the user's
or root's and writable by nobody else (or sticky, as /tmp). Anywhere else kernels are
built in a private temporary folder and measurements kept in memory, with one warning.
"""

from __future__ import annotations

import os
import platform
import stat
import warnings
from pathlib import Path

__all__ = ["cache_dir", "cpu_features", "cpu_name", "trusted_cache_dir", "unsafe_to_load",
           "warn_unusable_cache"]

_WARNED: set[str] = set()


def cache_dir() -> Path:
    """Where compiled kernels and per-machine measurements live: $PATHLIFT_CACHE_DIR/kron,
    default ~/.cache/pathlift/kron."""
    root = os.environ.get("PATHLIFT_CACHE_DIR") or Path.home() / ".cache" / "pathlift"
    return Path(root) / "kron"


def trusted_cache_dir(create: bool = True) -> Path | None:
    """``cache_dir()``, created (mode 0700) if missing and ``create``, when it is safe to
    load code from (see the module docstring); None, with one warning, when it is not or
    cannot be made (without a warning when it is missing and not to be created)."""
    folder = cache_dir()
    try:
        if not create and not os.path.lexists(folder):
            return None
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = unsafe_to_load(folder, directory=True)
    except OSError as err:
        problem = f"cannot create '{folder}': {err.strerror or err}"
    if problem is None:
        return folder
    warn_unusable_cache(problem)
    return None


def unsafe_to_load(path: Path, directory: bool = False) -> str | None:
    """Why code must not be loaded from ``path`` (a cached library, or with ``directory``
    the cache folder): a symbolic link, not a regular file (folder), another user's, or
    writable by group or others; for a folder, also any folder above it that someone else
    could change. None when it is safe."""
    info = path.lstat()
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if not kind(info.st_mode):
        return f"'{path}' is " + ("a symbolic link" if stat.S_ISLNK(info.st_mode) else
                                  f"not a {'folder' if directory else 'regular file'}")
    if info.st_uid != os.geteuid():
        return f"'{path}' belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"'{path}' is writable by other users (mode {stat.filemode(info.st_mode)})"
    if directory:
        for parent in path.resolve().parents:
            up = parent.stat()
            if up.st_uid not in (0, os.geteuid()) or (
                    up.st_mode & 0o022 and not up.st_mode & stat.S_ISVTX):
                return f"'{parent}', a folder above it, can be changed by other users"
    return None


def warn_unusable_cache(reason: OSError | str) -> None:
    """One warning per process and cache folder that it cannot be written or trusted
    (``reason``): the kernels and measurements are then kept in memory (kernels built in a
    private temporary folder) and made again by the next process."""
    folder = str(cache_dir())
    if folder not in _WARNED:
        _WARNED.add(folder)
        warnings.warn(f"pathlift.kron: the cache folder is unusable ({reason}); kernels and "
                      "measurements are kept in memory for this process only (set "
                      "PATHLIFT_CACHE_DIR to a folder only you can write to keep them)",
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
