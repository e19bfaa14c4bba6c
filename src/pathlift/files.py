"""Every file pathlift opens: written atomically, read only when it is a regular file that
fits in memory, locked without following links; file-system errors as one-line typed errors.

- Writing: every file pathlift writes (checkpoints, CSV rows, JSON, figures, HTML, the
  kernel cache) goes through ``atomic_write``: the bytes go to a new temporary file
  ``.pathlift-XXXXXXXX.tmp`` in the target's folder (created exclusively, so never through
  a link, and short, so any legal target name works), are flushed and fsynced, and the
  temporary file is renamed over the target. A crash, a kill or a full disk at any moment
  leaves either the previous file or the new one, never a partial one; an existing target
  is replaced, never written into (a link there is replaced, its target left alone).
  ``remove_temporaries`` removes only those temporary names, only in the folders named.
- Reading: ``open_regular`` (and ``read_regular``) open a file without blocking and
  refuse anything but a regular file (a FIFO, a device such as /dev/zero, a folder) and a
  file too large for the memory limit (``pathlift.memory``) before a byte is read;
  ``check_archive`` does the same for what a zip archive (.pt, .npz) unpacks to.
- Replacing: ``refuse_replacing`` refuses, before any work, an output folder that already
  holds a file a command would write, unless the user says ``overwrite``.
- Appending: ``append_rows`` adds rows to a CSV under an exclusive lock, so concurrent
  writers take turns and lose nothing.
- Locking: ``open_own`` opens a file pathlift keeps open (a lock) without following a
  link, and only when it is a regular file with no other name (no hard link).

An ``OSError`` becomes a ``FileSystemError`` naming the path and saying what to do
(``os_errors``).
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, BinaryIO

from pathlift.errors import InvalidParameterError, PathliftError
from pathlift.memory import check_bytes


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
    errno.ELOOP: "it is a symbolic link, which pathlift does not follow here; give the real "
                 "path",
}
TEMPORARY_PREFIX, TEMPORARY_SUFFIX = ".pathlift-", ".tmp"
# memory per byte of a CSV (text) file while it is parsed: its rows are held as Python
# strings first (measured: about 28 bytes per byte for two-digit fields)
TEXT_MEMORY_PER_BYTE = 32


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
        fd, tmp = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, suffix=TEMPORARY_SUFFIX,
                                   dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fchmod(fh.fileno(), 0o666 & ~_umask())
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
    return path


def remove_temporaries(*folders: str | os.PathLike[str]) -> None:
    """Delete the temporary files (``.pathlift-XXXXXXXX.tmp``) that ``atomic_write`` calls
    killed in each of ``folders`` left behind: only those names, only in those folders (not
    their subfolders), never a folder. Only for folders no other pathlift process is
    writing (locked); a folder that does not exist is skipped."""
    for folder in map(Path, folders):
        if not folder.is_dir():
            continue
        for tmp in folder.glob(f"{TEMPORARY_PREFIX}*{TEMPORARY_SUFFIX}"):
            with os_errors(tmp, "remove"):
                if not stat.S_ISDIR(tmp.lstat().st_mode):
                    tmp.unlink(missing_ok=True)


def open_regular(path: str | os.PathLike[str], memory_per_byte: float = 1.0, *,
                 follow_links: bool = True, action: str = "read") -> BinaryIO:
    """``path`` opened for binary reading, once it is known to be a regular file whose size
    times ``memory_per_byte`` (the memory its reader needs per byte of file) fits the memory
    limit (``pathlift.memory.check_bytes``): nothing has been read yet.

    The file is opened without blocking, so a FIFO, a device (/dev/zero, /dev/full), a
    socket or a folder is refused at once, by what the opened file is (no race with a
    rename). A symbolic link is followed (what it points to is checked) unless
    ``follow_links`` is False: then it is refused, as for the files pathlift rewrites.
    ``action`` ("read", "write") is what the one-line messages say pathlift could not do.

    Raises:
        FileSystemError: not a regular file, or unreadable (one line, with the path).
        MemoryLimitError: the file is larger than the memory limit allows.
    """
    path = os.fspath(path)
    with os_errors(path, action):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
                     | (0 if follow_links else os.O_NOFOLLOW))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileSystemError(errno.EINVAL, f"cannot {action} '{path}': it is "
                                  f"{_kind(info.st_mode)}, not a regular file; give a file")
        os.set_blocking(fd, True)
        check_bytes(int(info.st_size * memory_per_byte), f"reading '{path}'")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_text(path: str | os.PathLike[str], encoding: str = "utf-8",
              memory_per_byte: float = TEXT_MEMORY_PER_BYTE) -> IO[str]:
    """``open_regular`` as text (``newline=""``, as the csv module wants), for a file parsed
    into rows of Python strings (``memory_per_byte`` of memory per byte of file)."""
    return io.TextIOWrapper(open_regular(path, memory_per_byte), encoding=encoding,
                            newline="")


def read_regular(path: str | os.PathLike[str], memory_per_byte: float = 1.0, *,
                 follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (``open_regular``'s checks first); a file
    that grows while it is read is refused rather than read past the size checked."""
    with open_regular(path, memory_per_byte, follow_links=follow_links) as fh:
        return _read_all(fh, path)


def _read_all(fh: BinaryIO, path: str | os.PathLike[str]) -> bytes:
    with os_errors(path, "read"):
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(size + 1)
    if len(data) > size:
        raise FileSystemError(errno.EIO, f"cannot read '{os.fspath(path)}': it grew while "
                              "it was read (another program is writing it); try again")
    return data


def check_appendable(path: str | os.PathLike[str]) -> None:
    """Refuse at once, before any work, a file ``append_rows`` would refuse when the work
    is done: an existing ``path`` that is a symbolic link, not a regular file (a FIFO, a
    device such as /dev/full) or too large to read back. A missing one is fine."""
    fh = _open_rewritten(path)
    if fh is not None:
        fh.close()


def check_archive(fh: BinaryIO, path: str | os.PathLike[str]) -> None:
    """If ``fh`` (a file opened by ``open_regular``) is a zip archive (a .pt written by
    ``torch.save``, an .npz), refuse it when what its entries unpack to does not fit the
    memory limit, before anything is unpacked: each entry's declared size bounds what
    its readers allocate (torch and numpy stop at it), so a deflate bomb is refused
    here. ``fh`` is left at its start."""
    try:
        if not zipfile.is_zipfile(fh):
            return
        fh.seek(0)
        with zipfile.ZipFile(fh) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError):
        return  # not a readable archive: the reader says so in its own words
    finally:
        fh.seek(0)
    total = sum(e.file_size for e in entries)
    check_bytes(total, f"unpacking '{os.fspath(path)}' ({len(entries)} entries)")


def read_safetensors(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors and the metadata of a ``.safetensors`` file, read with ``read_regular``
    (the file's bytes and the tensors copied out of them: twice its size must fit) and
    parsed from memory (``parse_safetensors``), so any path the operating system takes
    works, not only UTF-8 ones.

    Raises:
        FileSystemError, MemoryLimitError: as ``read_regular``.
        safetensors.SafetensorError: the bytes are not a valid safetensors file.
    """
    return parse_safetensors(read_regular(path, memory_per_byte=2))


def parse_safetensors(data: bytes) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors and the metadata held by the bytes of a ``.safetensors`` file.

    Raises:
        safetensors.SafetensorError: the bytes are not a valid safetensors file.
    """
    from safetensors.torch import load  # imported with torch, on first use

    tensors = load(data)  # checks the header: its length, JSON, offsets and dtypes
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    return tensors, header.get("__metadata__") or {}


def open_own(path: str | os.PathLike[str]) -> tuple[int, bool]:
    """A file pathlift keeps open and rewrites (a lock), as a read-write descriptor and
    whether this call created it: created exclusively, else opened without following a
    symbolic link and only when it is a regular file with no other name (one hard link),
    so that nothing else (a link's target, another file) is ever written through it.

    Raises:
        FileSystemError: a link, not a regular file, a file with other names, or an OS
            error (one line, with the path).
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    with os_errors(path, "open"):
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
        except FileExistsError:
            fd = os.open(path, flags)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = _kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else \
            f"a file with {info.st_nlink} names (hard links)"
        raise FileSystemError(errno.EINVAL, f"cannot open '{os.fspath(path)}': it is {what}, "
                              "which pathlift does not write into; remove it")
    os.set_blocking(fd, True)
    return fd, False


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def refuse_link(path: str | os.PathLike[str],
                error: Callable[[str], Exception] | None = None) -> None:
    """Refuse, in one line naming it, a file or sub-folder of an output folder that is a
    symbolic link: pathlift would read or write what it points to, elsewhere. ``error``
    makes the exception from the message (default ``FileSystemError``, ``ELOOP``)."""
    if not Path(path).is_symlink():
        return
    message = (f"'{os.fspath(path)}' is a symbolic link: pathlift does not follow links "
               "inside an output or run folder (it would write elsewhere); replace it by "
               "the real file or folder, or choose another output folder")
    raise FileSystemError(errno.ELOOP, message) if error is None else error(message)


def refuse_links(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """``refuse_link`` for each of the files ``names`` a command will write in ``folder``,
    before any of them is written."""
    for name in names:
        refuse_link(Path(folder) / name)


class OutputExistsError(InvalidParameterError):
    """An output folder already holds a file a command would replace (``refuse_replacing``)."""


def refuse_replacing(folder: str | os.PathLike[str], names: Iterable[str],
                     overwrite: bool = False) -> None:
    """Before any work: refuse (``OutputExistsError``, one line) when ``folder`` already
    holds one of the files ``names`` that a command is about to write there, unless
    ``overwrite``, so that a user's own ``report.md`` or ``summary.png`` is never replaced
    unasked. A link in such a place counts as a file."""
    if overwrite:
        return
    for name in names:
        path = Path(folder) / name
        if os.path.lexists(path):
            raise OutputExistsError(
                f"'{path}' already exists and would be replaced: give --overwrite "
                "(overwrite=True in Python) to replace it, or choose another output folder")


def refuse_outputs(folder: str | os.PathLike[str], names: Iterable[str],
                   overwrite: bool = False) -> None:
    """Before any work, for the files ``names`` a command will write in ``folder``:
    ``refuse_links``, then ``refuse_replacing`` unless ``overwrite``."""
    names = list(names)
    refuse_links(folder, names)
    refuse_replacing(folder, names, overwrite)


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

    An existing ``path`` must be a regular file, not a link (``check_appendable``); it is
    read back size-checked and replaced whole (``atomic_write``), so a kill or a full disk
    leaves the previous rows; fine for the few hundred rows of an experiment log. Writers
    take turns (``_locked_csv``: an exclusive ``flock`` on the file they read), so several
    processes appending to one file at once each add every row, none lost."""
    path = Path(path)
    new = b"".join(csv_line(r) for r in rows)
    with _locked_csv(path) as fh:
        old = _read_all(fh, path)
        _check_header(old, header, path)
        if old and not old.endswith(b"\n"):
            old += b"\n"
        write_bytes(path, (old or csv_line(header)) + new)
    return path


@contextmanager
def _locked_csv(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for reading under an exclusive ``flock``, once the file locked is
    still the one at ``path`` (a writer that replaced it meanwhile is waited for, then its
    new file is locked and read): the lock is held until the new file is renamed in place.
    A missing ``path`` is created empty first (and removed again, if still empty, when the
    caller fails), so that a first writer has a file to lock too."""
    created = False
    with os_errors(path, "write"):
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        while True:
            with os_errors(path, "write"), suppress(FileExistsError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o666))
                created = True
            fh = _open_rewritten(path)
            if fh is None:
                continue  # removed meanwhile: created again
            with fh:
                with os_errors(path, "lock"):
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                    now = os.fstat(fh.fileno())
                    there = os.stat(path, follow_symlinks=False) if os.path.lexists(path) \
                        else None
                if there is None or (there.st_ino, there.st_dev) != (now.st_ino, now.st_dev):
                    continue  # replaced by the writer before: lock its file
                yield fh
                return
    except BaseException:
        if created:  # the empty file this call made, unless another writer filled it
            with suppress(OSError):
                if os.stat(path, follow_symlinks=False).st_size == 0:
                    os.unlink(path)
        raise


def _open_rewritten(path: str | os.PathLike[str]) -> BinaryIO | None:
    """A file pathlift reads back to rewrite it whole (a CSV it appends to), opened with
    ``open_regular``'s checks and without following a link; None when there is none."""
    try:
        return open_regular(path, follow_links=False, action="write")
    except FileSystemError as err:
        if err.errno == errno.ENOENT:
            return None
        raise


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
