"""Results of the prune-rewind-retrain protocol, and the folder a killed run resumes from.

``RunFolder`` holds ``manifest.json`` (every setting that defines the results, checked on
resume), ``runs.csv`` (one row per finished run, added as each run ends), ``dense/`` (the
trained and rewind weights of each seed's dense network, safetensors) and ``models/``
when asked (each run's final pruned network). Only rank 0 of a distributed run touches it.

What a folder guarantees:

- one run at a time: ``open`` takes an exclusive lock (``.lock``, holding the pid and
  host of its owner); a second run gets ``RunFolderBusyError`` naming them. The lock is
  the operating system's (``flock``), so a killed run's lock is free again at once. The
  lock file is never written through a link or into anything but pathlift's own lock
  (``pathlift.files.open_own``): a ``.lock`` that is a symbolic link, a hard link, another
  kind of file or holds other text is refused, and left as it is.
- a folder that cannot be written (read-only, or on a read-only file system) opens
  read-only, under a shared lock: its finished runs are read back, and anything to write
  is refused at once (``writable`` is False).
- the same settings: ``open`` compares the manifest with the folder's and names the first
  difference (``InvalidParameterError``).
- whole files only: every file is written to a temporary file, fsynced and renamed
  (``pathlift.files``), so a kill or a full disk leaves the previous file; opening the
  folder removes pathlift's temporary files that a kill left in it, ``dense/`` and
  ``models/``, and nothing else.
- no link followed: ``dense/``, ``models/``, ``manifest.json`` or ``runs.csv`` that is a
  symbolic link is refused (``ResultsFileError`` naming it), at ``open`` and again before
  each file is written into ``dense/`` or ``models/``.
- only its own files removed: a run that fails or is interrupted before writing any
  result removes the files it wrote (its manifest, lock, a half-saved dense network) and
  the folders it created, once they are empty; never a file it did not write (a user's
  notes put there meanwhile, a report written into the same folder).
- strict reading: anything in ``runs.csv`` that cannot be parsed raises
  ``ResultsFileError`` naming the file, line and column; a last line without its newline
  (a file cut by an older writer or by hand) is dropped and its run computed again; rows
  repeated identically count once, conflicting repeats are an error.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import json
import math
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from pathlift.errors import InvalidParameterError, PathliftError
from pathlift.files import (
    FileSystemError,
    csv_line,
    describe,
    open_own,
    os_errors,
    read_regular,
    read_safetensors,
    refuse_link,
    remove_temporaries,
    write_bytes,
    write_json,
)
from pathlift.graph.boundary import cpu_state

__all__ = ["COLUMNS", "DenseStates", "ResultsFileError", "RunFolder", "RunFolderBusyError",
           "RunKey", "RunRecord"]


class ResultsFileError(InvalidParameterError):
    """A file of a run folder is damaged: the message names it (line and column for
    ``runs.csv``) and says what to do."""


class RunFolderBusyError(InvalidParameterError):
    """Another process holds the run folder's lock."""


_LOCK_TEXT = re.compile(r"(pid \d+ on [^\n]*\n)?")  # what _acquire writes, or nothing yet


class RunKey(NamedTuple):
    """One point of the grid: which seed, whether the trained network was randomly
    rescaled before pruning, which fraction, which method."""

    seed: int
    rescaled: bool
    amount: float
    method: str


@dataclass(frozen=True)
class RunRecord:
    """One prune-rewind-retrain run: a row of ``runs.csv``.

    ``sparsity`` is the final fraction of zeroed prunable coordinates; ``pruned_accuracy``
    the accuracy right after the first pruning (before retraining); ``log10_path_metric``
    and ``log10_bound`` the certificate of that first pruning (thesis eq. 3.19, Lemma
    3.4.1); ``overlap`` is 100 |S & S_mag| / |S| between the first mask and magnitude
    pruning's at the same scope on the same network (thesis Table 3.1); ``mask_digest``
    starts the sha256 of the final masks, which every rank checked it holds;
    ``world_size`` and ``spread`` say how the run was computed.
    """

    seed: int
    method: str
    rescaled: bool
    amount: float
    rounds: int
    sparsity: float
    dense_accuracy: float
    pruned_accuracy: float
    accuracy: float
    log10_path_metric: float
    log10_bound: float
    overlap: float
    mask_digest: str
    world_size: int
    spread: str

    @property
    def key(self) -> RunKey:
        return RunKey(self.seed, self.rescaled, self.amount, self.method)

    @classmethod
    def from_row(cls, row: list[str]) -> RunRecord:
        """Parse a CSV row (the fields in ``COLUMNS`` order, every one a string).

        Raises:
            ValueError: with ``args`` (column index, message) for the first bad field.
        """
        values = []
        for column, (f, text) in enumerate(zip(fields(cls), row, strict=True)):
            try:
                values.append(_PARSE[str(f.type)](text))
            except ValueError as err:
                raise ValueError(column, f"{f.name} {text!r}: {err}") from None
        return cls(*values)

    def to_row(self) -> list[str]:
        """The CSV fields; floats written with ``repr`` (read back exactly)."""
        return [repr(v) if isinstance(v, float) else str(v) for v in asdict(self).values()]


COLUMNS = tuple(f.name for f in fields(RunRecord))


def _parse_bool(text: str) -> bool:
    if text not in ("True", "False"):
        raise ValueError("not True or False")
    return text == "True"


def _parse_str(text: str) -> str:
    if not text:
        raise ValueError("empty")
    return text


def _parse_int(text: str) -> int:
    if text.strip() != text:
        raise ValueError("not an integer")
    return int(text)


def _parse_float(text: str) -> float:
    if text.strip() != text or not text:
        raise ValueError("not a number")
    return float(text)


_PARSE: dict[str, Any] = {"int": _parse_int, "float": _parse_float, "str": _parse_str,
                          "bool": _parse_bool}


@dataclass(frozen=True)
class DenseStates:
    """One seed's dense network: trained weights, the weights after ``rewind_epoch`` epochs
    (the lottery-ticket rewind point) and its test accuracy. Tensors on the CPU."""

    seed: int
    trained: dict[str, Tensor]
    rewind: dict[str, Tensor]
    accuracy: float


class RunFolder:
    """A results folder that a killed run resumes from (rank 0 only).

    ``open`` locks the folder, checks or writes its manifest and returns the runs done;
    ``close`` releases the lock and, when this run created the folder and wrote no
    result, removes it. ``prune_rewind_retrain`` does both.

    Example::

        folder = RunFolder("runs/prune-digits")
        result = prune_rewind_retrain(..., folder=folder)   # resumes if it was killed
        folder.records()                                     # every finished run
    """

    def __init__(self, path: str | Path, *, fresh: bool = False):
        """``fresh``: the caller has just created the (empty) folder for this run, so it is
        removed like one ``open`` creates when the run writes nothing."""
        self.path = Path(path)
        self.csv = self.path / "runs.csv"
        self.manifest = self.path / "manifest.json"
        self.writable = True
        self._lock: int | None = None
        self._locked = False
        self._fresh = fresh
        self._created = False
        self._wrote = False
        self._made: list[Path] = []  # files and folders this run created, in order
        self._text = b""  # runs.csv's complete lines, what the next row is added to
        self._settings: dict[str, Any] | None = None  # the manifest, once open

    def open(self, manifest: dict[str, Any]) -> dict[RunKey, RunRecord]:
        """Lock the folder (creating it), then check that it holds runs made with the same
        ``manifest`` (or write it); returns the runs already finished there. A folder that
        cannot be written opens read-only (``writable`` False) when it has a manifest.

        Raises:
            RunFolderBusyError: another process is running into this folder.
            InvalidParameterError: the folder holds runs of other settings (the first
                difference is named) or results without a manifest.
            ResultsFileError: the manifest or ``runs.csv`` is damaged.
            FileSystemError: the folder cannot be created or written, or its ``.lock`` is
                not pathlift's (a link, or another file).
        """
        try:
            manifest = json.loads(json.dumps(manifest))  # tuples -> lists, as read back
        except (TypeError, ValueError) as err:
            raise InvalidParameterError(f"the run's settings must be JSON values: {err}") \
                from None
        with os_errors(self.path, "create"):
            self._created = self._fresh or not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
        self._locked = True
        try:
            self._acquire()
            if self.writable:  # left by writes that a kill interrupted
                remove_temporaries(self.path, self.path / "dense", self.path / "models")
            self._check_kinds()
            if self.manifest.is_file():
                _compare(self._read_manifest(), manifest, self.path)
            elif self.csv.exists() or (self.path / "dense").exists():
                raise InvalidParameterError(
                    f"'{self.path}' holds results but no manifest.json (written by an older "
                    "pathlift?): choose another output folder")
            else:
                self.check_writable()
                write_json(self.manifest, manifest)
                self._made.append(self.manifest)
            self._settings = manifest
            return {r.key: r for r in self.records()}
        except BaseException:
            self.close(failed=True)
            raise

    def close(self, failed: bool = False) -> None:
        """Release the lock. When this run wrote no result and ``failed`` (an error or an
        interrupt) or created the folder, remove what it created: its files, then its
        folders once empty, never anything else."""
        if not self._locked:
            return
        if not self._wrote and (failed or self._created):
            self._remove_own()
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the flock
        self._lock, self._locked, self._created, self._fresh = None, False, False, False
        self._made = []

    def _remove_own(self) -> None:
        """Remove the files and folders this run created, newest first, then the run
        folder if this run created it: a folder only when empty (``rmdir``), so a file
        someone else put there meanwhile keeps it."""
        if self.writable:
            with contextlib.suppress(PathliftError):
                remove_temporaries(self.path, self.path / "dense", self.path / "models")
        made = [*([self.path] if self._created else []), *self._made]
        for path in reversed(made):
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(failed=kind is not None)

    def _acquire(self) -> None:
        """Take ``.lock``: exclusively, or shared (read-only) when the folder cannot be
        written; the file is pathlift's own or is refused (``open_own``)."""
        path = self.path / ".lock"
        try:
            fd, created = open_own(path)
        except FileSystemError as err:
            if not self._read_only(err):
                raise
            self.writable = False
            self._lock = self._shared_lock(path)
            return
        try:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace")
            if not created and not _LOCK_TEXT.fullmatch(holder):
                raise FileSystemError(
                    errno.EINVAL, f"'{path}' is not pathlift's lock (it holds "
                    f"{holder[:40]!r}...): remove it, or choose another output folder")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusyError(
                f"'{self.path}' is in use by another run ({holder.strip() or 'unknown'}): "
                "wait for it to end or choose another output folder") from None
        except OSError as err:
            os.close(fd)
            raise describe(err, path, "lock") from err
        if created:
            self._made.append(path)
        with os_errors(path, "write"):
            os.ftruncate(fd, 0)  # pathlift's lock (checked above): rewritten as this run's
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._lock = fd

    def _read_only(self, err: FileSystemError) -> bool:
        """Whether ``err`` (opening the lock) says the folder cannot be written."""
        return err.errno == errno.EROFS or (
            err.errno in (errno.EACCES, errno.EPERM) and not os.access(self.path, os.W_OK))

    def _shared_lock(self, path: Path) -> int | None:
        """A shared lock on an existing ``.lock`` (a writer holding it makes this a busy
        folder), None when there is none to take."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise describe(err, path, "lock") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunFolderBusyError(f"'{self.path}' is in use by another run: wait for it "
                                     "to end or choose another output folder") from None
        return fd

    def check_writable(self, why: str = "") -> None:
        """Raise ``FileSystemError`` if the folder was opened read-only; ``why`` says what
        needed writing."""
        if not self.writable:
            raise FileSystemError(errno.EROFS, f"cannot write '{self.path}': it is "
                                  f"read-only{' and ' + why if why else ''}; make it "
                                  "writable or choose another output folder")

    def _check_kinds(self) -> None:
        """Before any run is computed: the folder's files are files and its folders
        folders (a ``runs.csv`` replaced by a folder once failed only at the first row)."""
        for path, folder in ((self.manifest, False), (self.csv, False),
                             (self.path / "dense", True), (self.path / "models", True)):
            # (a FIFO or device in a file's place is refused where the file is opened)
            refuse_link(path, ResultsFileError)
            if path.exists() and path.is_dir() != folder:
                raise ResultsFileError(
                    f"'{path}' is {'not a folder' if folder else 'not a file'}: move it away "
                    "(the run folder needs it as pathlift wrote it), or choose another "
                    "output folder")

    def _read_manifest(self) -> dict[str, Any]:
        text = read_regular(self.manifest)
        try:
            saved = json.loads(text)
        except ValueError as err:
            raise ResultsFileError(
                f"'{self.manifest}' is damaged ({err}): restore it, or choose another output "
                "folder") from None
        if not isinstance(saved, dict):
            raise ResultsFileError(f"'{self.manifest}' is damaged (not a JSON object): "
                                   "restore it, or choose another output folder")
        return saved

    def records(self) -> list[RunRecord]:
        """Every run in ``runs.csv``, in the order they finished (a last line without its
        newline is dropped: that run is computed again).

        Raises:
            ResultsFileError: naming the file, line and column of anything unparsable, a
                damaged header, or two different rows for one run.
        """
        if not os.path.lexists(self.csv):  # anything else there is read, or refused
            self._text = b""
            return []
        data = read_regular(self.csv)
        complete = data[:data.rfind(b"\n") + 1]
        lines = _decode(complete, self.csv).splitlines()
        if not lines:
            self._text = b""
            return []
        if lines[0] != ",".join(COLUMNS):
            raise ResultsFileError(
                f"'{self.csv}' line 1: the header is damaged ({lines[0][:60]!r}); restore it "
                f"as {','.join(COLUMNS)!r} or choose another output folder")
        seen: dict[RunKey, tuple[int, RunRecord]] = {}
        settings = self._settings
        if settings is None and self.manifest.is_file():
            settings = self._read_manifest()
        for number, line in enumerate(lines[1:], start=2):
            record = self._parse(line, number)
            problem = _out_of_range(record, settings or {})
            if problem:
                raise ResultsFileError(f"'{self.csv}' line {number}: {problem} (edited by "
                                       "hand?); delete the line to compute that run again")
            first = seen.setdefault(record.key, (number, record))
            if first[1].to_row() != record.to_row():  # as text: NaN equals NaN
                raise ResultsFileError(
                    f"'{self.csv}' lines {first[0]} and {number} hold different results of "
                    f"one run ({record.key}); delete the wrong line")
        self._text = complete
        return [record for _, record in seen.values()]

    def _parse(self, line: str, number: int) -> RunRecord:
        where = f"'{self.csv}' line {number}"
        try:
            (row,) = list(csv.reader([line], strict=True))
        except (csv.Error, ValueError) as err:
            raise ResultsFileError(f"{where}: not a CSV row ({err}); delete the line to "
                                   "compute that run again") from None
        if len(row) != len(COLUMNS):
            raise ResultsFileError(
                f"{where}, column {min(len(row), len(COLUMNS)) + 1}: {len(row)} fields, the "
                f"header has {len(COLUMNS)}; delete the line to compute that run again")
        try:
            return RunRecord.from_row(row)
        except ValueError as err:
            column, message = err.args
            raise ResultsFileError(f"{where}, column {column + 1} ({message}); delete the "
                                   "line to compute that run again") from None

    def append(self, record: RunRecord) -> None:
        """Add one row to ``runs.csv`` (the header first if the file is new): the file is
        replaced whole, so a kill or a full disk leaves the previous one."""
        self.check_writable()
        if not self._text:
            self._text = csv_line(COLUMNS)
        text = self._text + csv_line(record.to_row())
        write_bytes(self.csv, text)
        self._text, self._wrote = text, True

    def drop(self, keys: Iterable[RunKey]) -> None:
        """Remove the rows of ``keys`` from ``runs.csv`` (replaced whole): those runs are
        computed again."""
        gone = set(keys)
        kept = [r for r in self.records() if r.key not in gone]
        text = csv_line(COLUMNS) + b"".join(csv_line(r.to_row()) for r in kept)
        write_bytes(self.csv, text)
        self._text = text

    def dense_path(self, seed: int, part: str = "trained") -> Path:
        return self.path / "dense" / f"seed{seed}-{part}.safetensors"

    def save_dense(self, states: DenseStates) -> None:
        """Write one seed's trained and rewind weights (plain state_dicts, loadable with
        ``pathlift.models.load_model(<arch>, weights=...)``); the accuracy goes in the
        metadata. Each file is written whole or not at all, the trained one last."""
        self.check_writable()
        self._subfolder("dense")
        for part, state in (("rewind", states.rewind), ("trained", states.trained)):
            meta = {"seed": str(states.seed), "accuracy": repr(states.accuracy)}
            path = self.dense_path(states.seed, part)
            existed = os.path.lexists(path)
            write_bytes(path, safetensors_bytes(cpu_state(state), metadata=meta))
            if not existed:
                self._made.append(path)
        self._wrote = True

    def load_dense(self, seed: int, like: dict[str, Tensor] | None = None
                   ) -> DenseStates | None:
        """The seed's dense states, or None when they were not saved (completely).

        Everything read is checked (``_dense_problem``): the metadata's seed is ``seed``
        and its accuracy a number in [0, 1], the same in both files; with ``like`` (the
        model's state_dict), the tensors have its names, shapes and dtypes.

        Raises:
            ResultsFileError: a file is damaged, or holds something impossible (named,
                with the field).
        """
        paths = [self.dense_path(seed, part) for part in ("trained", "rewind")]
        if not all(p.is_file() for p in paths):
            return None
        states, accuracies = [], []
        for p in paths:
            try:
                state, metadata = read_safetensors(p)
            except OSError as err:  # the file is there but cannot be read: not damaged
                raise describe(err, p, "read") from err
            except PathliftError:  # too large for the memory limit: not damaged either
                raise
            except Exception as err:  # safetensors' own error
                raise ResultsFileError(
                    f"'{p}' is damaged ({type(err).__name__}: {str(err)[:80]}); delete it to "
                    f"train seed {seed} again") from None
            problem = _dense_problem(seed, metadata, state, like, accuracies)
            if problem:
                raise ResultsFileError(f"'{p}': {problem} (edited by hand?); delete it to "
                                       f"train seed {seed} again")
            states.append(state)
        return DenseStates(seed, states[0], states[1], accuracies[0])

    def model_path(self, record: RunRecord) -> Path:
        """Where ``save_model`` writes ``record``'s network: one name per run (the amount
        written in full, so amounts that round alike never share a file)."""
        tag = f"seed{record.seed}-{record.method}-{'rescaled-' if record.rescaled else ''}" \
              f"{record.amount!r}"
        return self.path / "models" / f"{tag}.safetensors"

    def save_model(self, state: dict[str, Tensor], record: RunRecord) -> Path:
        """A run's final (pruned) network: its state_dict with the masks
        (``weight_orig``/``weight_mask``; ``load_model`` re-attaches them)."""
        self.check_writable()
        self._subfolder("models")
        path = write_bytes(self.model_path(record), safetensors_bytes(cpu_state(state)))
        self._wrote = True
        return path

    def _subfolder(self, name: str) -> Path:
        """``self.path / name``, created if missing (and recorded as this run's), refused
        when it is a symbolic link: nothing is written through a link."""
        path = self.path / name
        with os_errors(path, "create"):
            try:
                path.mkdir(parents=True)
                self._made.append(path)
            except FileExistsError:
                pass
        refuse_link(path, ResultsFileError)
        if not path.is_dir():
            raise ResultsFileError(f"'{path}' is not a folder: move it away (the run folder "
                                   "needs it as pathlift wrote it), or choose another output "
                                   "folder")
        return path


def _dense_problem(seed: int, metadata: dict[str, str], state: dict[str, Tensor],
                   like: dict[str, Tensor] | None, accuracies: list[float]) -> str | None:
    """What is impossible in a dense-weights file, or None (its accuracy appended to
    ``accuracies``): a seed other than ``seed``, an accuracy that is not a number in
    [0, 1] or differs from the other file's, tensors unlike ``like``'s."""
    if metadata.get("seed") != str(seed):
        return f"metadata seed {metadata.get('seed')!r} is not {seed}"
    text = metadata.get("accuracy")
    try:
        accuracy = _parse_float(text) if isinstance(text, str) else math.nan
    except ValueError:
        accuracy = math.nan
    if not 0.0 <= accuracy <= 1.0:
        return f"metadata accuracy {text!r} is not an accuracy in [0, 1]"
    if accuracies and accuracy != accuracies[0]:
        return f"metadata accuracy {text!r} differs from the trained file's {accuracies[0]!r}"
    accuracies.append(accuracy)
    for name, tensor in (like or {}).items():
        got = state.get(name)
        if got is None or got.shape != tensor.shape or got.dtype != tensor.dtype:
            found = "missing" if got is None else f"{tuple(got.shape)} {got.dtype}"
            return f"tensor {name!r} is {found}, the model's is {tuple(tensor.shape)} " \
                   f"{tensor.dtype}"
    extra = sorted(set(state) - set(like)) if like is not None else []
    return f"tensor {extra[0]!r} is not one of the model's" if extra else None


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ResultsFileError(
            f"'{path}' line {line}, column {column}: bytes that are not UTF-8 text; delete "
            "the line to compute that run again") from None


_ACCURACIES = ("dense_accuracy", "pruned_accuracy", "accuracy", "sparsity")
_LOG10S = ("log10_path_metric", "log10_bound")  # -inf: a zero metric; never NaN or +inf
#: row field -> manifest setting holding every value the grid allows
_GRID = {"seed": "seeds", "method": "methods", "rescaled": "rescaled", "amount": "amounts"}
_SAME = {"rounds": "rounds", "world_size": "world_size", "spread": "spread"}


def _out_of_range(record: RunRecord, settings: dict[str, Any]) -> str | None:
    """What is impossible about a parsed row, or None: accuracies and sparsity finite in
    [0, 1], overlap in [0, 100], a 16-digit hex mask digest, and, against the folder's
    manifest, a key inside the grid and the protocol's rounds, world size and spread."""
    for name in _ACCURACIES:
        value = getattr(record, name)
        if not 0.0 <= value <= 1.0:
            return f"{name} {value!r} is not in [0, 1]"
    for name in _LOG10S:
        value = getattr(record, name)
        if math.isnan(value) or value == math.inf:
            return f"{name} {value!r} is not a log10 of a finite number"
    if not (math.isnan(record.overlap) or 0.0 <= record.overlap <= 100.0):
        return f"overlap {record.overlap!r} is not a percentage"
    if not re.fullmatch(r"[0-9a-f]{16}", record.mask_digest):
        return f"mask_digest {record.mask_digest!r} is not 16 hex digits"
    for field, setting in _GRID.items():
        allowed = settings.get(setting)
        if isinstance(allowed, list) and getattr(record, field) not in allowed:
            return f"{field} {getattr(record, field)!r} is not one of the folder's {setting} " \
                   f"{json.dumps(allowed)}"
    for field, setting in _SAME.items():
        if setting in settings and getattr(record, field) != settings[setting]:
            return f"{field} {getattr(record, field)!r} differs from the folder's " \
                   f"{json.dumps(settings[setting])}"
    return None


def _compare(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    """Raise naming the first setting (in ``now``'s order) that differs."""
    for key in [*now, *(k for k in saved if k not in now)]:
        if saved.get(key) != now.get(key):
            raise InvalidParameterError(
                f"'{path}' holds runs made with other settings: {key} was "
                f"{_show(saved, key)}, now {_show(now, key)}; resume with the same options "
                "or choose another output folder")


def _show(settings: dict[str, Any], key: str) -> str:
    return json.dumps(settings[key]) if key in settings else "not set"

