"""Files written atomically, and file-system errors as one-line typed errors.

Every file pathlift writes (checkpoints, CSV rows, JSON, figures, HTML, the kernel cache)
goes through ``atomic_write``: the bytes go to a temporary file in the target's folder,
are flushed and fsynced, and the temporary file is renamed over the target. A crash, a
kill or a full disk at any moment leaves either the previous file or the new one, never a
partial one. An ``OSError`` becomes a ``FileSystemError`` naming the path and saying what
to do (``os_errors``).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from pathlift.errors import InvalidParameterError, PathliftError


class FileSystemError(PathliftError, OSError):
    """A file or folder pathlift reads or writes is unusable: the message names the path,
    the cause and what to do, on one line."""

    def __str__(self) -> str:
        return str(self.strerror)


_ADVICE = {
    errno.ENOSPC: "the disk is full; free space or write elsewhere",
    errno.EDQUOT: "the disk quota is exhausted; free space or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "permission denied; write elsewhere or fix the permissions",
    errno.EPERM: "operation not permitted; write elsewhere or fix the permissions",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EEXIST: "a part of the path is a file, not a folder; choose another path",
    errno.EISDIR: "it is a folder, not a file; give a file name",
    errno.ENOENT: "no such file or folder; check the path",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
    errno.ENOLCK: "the file system does not support locks; use a folder on a local disk",
}


def describe(err: OSError, path: str | os.PathLike[str], action: str) -> FileSystemError:
    """A ``FileSystemError`` for ``err`` met while doing ``action`` ("write", "read") on
    ``path``: one line with the path, the cause and what to do."""
    if isinstance(err, FileSystemError):
        return err
    advice = _ADVICE.get(err.errno or -1) or (err.strerror or type(err).__name__)
    return FileSystemError(err.errno or 0, f"cannot {action} '{os.fspath(path)}': {advice}")


@contextmanager
def os_errors(path: str | os.PathLike[str], action: str = "write") -> Iterator[None]:
    """Turn any ``OSError`` raised inside into a one-line ``FileSystemError`` about ``path``."""
    try:
        yield
    except OSError as err:
        raise describe(err, path, action) from err


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` atomically: ``write(fh)`` fills a temporary file in the same folder
    (opened in binary mode), which is flushed, fsynced and renamed over ``path``; the
    folder is created if needed. On any error the temporary file is removed and the
    previous ``path`` (if any) is left intact; OS errors are raised as ``FileSystemError``.
    The new file's mode follows the umask, as ``open`` would give it."""
    path = Path(path)
    with os_errors(path, "write"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
    return path


def remove_temporaries(folder: str | os.PathLike[str]) -> None:
    """Delete the temporary files that ``atomic_write`` calls killed in ``folder`` (and its
    subfolders) left behind. Only for a folder no other process is writing (locked)."""
    for tmp in Path(folder).rglob(".*.tmp"):
        with os_errors(tmp, "remove"):
            tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """``data`` written atomically to ``path``."""
    return atomic_write(path, lambda fh: fh.write(data))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``text`` (UTF-8) written atomically to ``path``."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], value: Any, indent: int | None = 1) -> Path:
    """``value`` as JSON, written atomically to ``path``."""
    return write_text(path, json.dumps(value, indent=indent) + "\n")


def csv_line(row: Sequence[object]) -> bytes:
    """One CSV row (``csv.writer``'s quoting), UTF-8, ending in a newline."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(row)
    return out.getvalue().encode("utf-8")


def append_rows(path: str | os.PathLike[str], header: Sequence[str],
                rows: Iterable[Sequence[object]]) -> Path:
    """Add CSV ``rows`` to ``path``, the ``header`` first when the file is new or empty.

    The file is replaced whole (``atomic_write``), so a kill or a full disk leaves the
    previous rows; fine for the few hundred rows of an experiment log."""
    path = Path(path)
    with os_errors(path, "read"):
        old = path.read_bytes() if path.exists() else b""
    _check_header(old, header, path)
    if old and not old.endswith(b"\n"):
        old += b"\n"
    new = b"".join(csv_line(r) for r in rows)
    return write_bytes(path, (old or csv_line(header)) + new)


def _check_header(old: bytes, header: Sequence[str], path: Path) -> None:
    """InvalidParameterError unless ``old`` is empty or starts with ``header``'s line:
    rows are never added under another table's columns."""
    first = old.split(b"\n", 1)[0].rstrip(b"\r")
    if old.strip() and first != csv_line(header).rstrip(b"\n"):
        shown = first[:60].decode("utf-8", "replace")
        raise InvalidParameterError(
            f"'{path}' holds another table (its header is {shown!r}, not "
            f"{','.join(header)[:60]!r}...): give a new file, or the file this command "
            "wrote before")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
