"""An .npz file read a batch of rows at a time (``load_streamed``): the inputs stay in the
file, memory holds one batch, the labels (8 bytes a row) and a checksum of each row (4
bytes a row).

``np.savez`` stores each array uncompressed, as a .npy file inside the zip; the rows of x
are then read where they lie (``os.pread`` of each row's bytes). The checks of
``load_data`` hold as they are, on the whole file, before anything is computed: one pass
over x in chunks refuses a NaN or inf (the same one-line message, naming the first
sample), the labels are checked in memory, and the train/test split is the same seeded
permutation, so the rows, their order and every number computed from them are those of
``load_data``. The pass of the checks also takes each row's CRC-32, and every later read
compares the row it gets with it: a file changed or cut short after it was checked (by
another process, between two of the certificate's passes) is refused in one line, never
read as other numbers. Anything else (a compressed archive, Fortran order, another source,
a normalisation) is read in memory by ``load_data``.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from pathlift.data.embedded import Split
from pathlift.data.sources import _check_arrays, _labels, _refuse_nonfinite, load_data
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.files import open_regular
from pathlift.memory import check_bytes

__all__ = ["FileRows", "labels_of", "load_streamed"]

_CHUNK = 1 << 22  # bytes of x a pass of the checks reads at a time


class FileRows(Dataset):
    """Rows ``index`` of an array stored uncompressed at byte ``offset`` of ``path``
    (C order, ``dtype``, rows of ``row_shape``), as float32 of ``shape``, each with its
    label (``labels``, in memory). ``__getitems__`` reads a batch: what ``Batches``
    and ``DataLoader`` ask for. ``checksums`` holds the CRC-32 of every stored row as the
    checks read it; a row read otherwise is refused (the module docstring)."""

    def __init__(self, path: Path, offset: int, dtype: np.dtype, row_shape: tuple[int, ...],
                 shape: tuple[int, ...], index: Tensor, labels: Tensor, checksums: np.ndarray):
        self.path, self.offset, self.dtype = path, offset, dtype
        self.row_shape, self.shape, self.index, self.labels = row_shape, shape, index, labels
        self.checksums = checksums
        self.row_bytes = math.prod(row_shape) * dtype.itemsize

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.__getitems__([i])[0]

    def __getitems__(self, rows: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
        x = self.read(self.index[list(rows)])
        return list(zip(x, self.labels[list(rows)], strict=True))

    def read(self, positions: Tensor) -> Tensor:
        """The rows at ``positions`` of the stored array, in that order (float32)."""
        out = np.empty((len(positions), *self.row_shape), dtype=self.dtype)
        with open_regular(self.path, 0.0) as fh:
            fd = fh.fileno()
            for k, p in enumerate(positions.tolist()):
                row = os.pread(fd, self.row_bytes, self.offset + p * self.row_bytes)
                if len(row) < self.row_bytes or zlib.crc32(row) != self.checksums[p]:
                    raise InvalidParameterError(
                        f"'{self.path}': its row {p} is not what was checked (the file "
                        "changed after it was checked); keep it unchanged while pathlift "
                        "reads it")
                out[k] = np.frombuffer(row, dtype=self.dtype).reshape(self.row_shape)
        with np.errstate(over="ignore"):
            values = out.astype(np.float32)
        return torch.from_numpy(values).reshape(len(positions), *self.shape)


def labels_of(data: Dataset) -> Tensor:
    """The labels of a split's part: a ``TensorDataset``'s second tensor, or ``FileRows``'."""
    return data.labels if isinstance(data, FileRows) else data.tensors[1]


def load_streamed(spec: str, *, input_shape: Sequence[int] | None = None,
                  test_fraction: float = 0.25, normalize: str = "none",
                  seed: int = 0) -> Split:
    """``load_data``'s split, its inputs left in the file (``FileRows``) where ``spec`` is
    an .npz written by ``np.savez`` (module docstring) and ``normalize`` is "none"; else
    ``load_data``'s own. The same rows in the same order, the same refusals."""
    path = Path(str(spec))
    stored = _stored(path) if path.suffix == ".npz" and normalize == "none" and \
        0.0 < test_fraction < 1.0 and path.is_file() else None
    if stored is None or not ({"x", "y"} <= stored.keys() or
                              {"x_train", "y_train", "x_test", "y_test"} <= stored.keys()):
        return load_data(spec, input_shape=input_shape, test_fraction=test_fraction,
                         normalize=normalize, seed=seed)
    where = str(path)
    if "x" in stored and "x_train" not in stored:
        x, y = _checked(path, stored["x"], stored["y"], where)
        n_test = math.ceil(test_fraction * len(y))
        if not 0 < n_test < len(y):
            raise InvalidParameterError(f"{where}: {len(y)} samples are too few to split")
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        parts = [(x, order[n_test:], y[order[n_test:]]), (x, order[:n_test], y[order[:n_test]])]
    else:
        parts = []
        for name in ("train", "test"):
            x, y = _checked(path, stored[f"x_{name}"], stored[f"y_{name}"], where)
            parts.append((x, torch.arange(len(y)), y))
    shapes = {x[2] for x, _, _ in parts}
    if len(shapes) > 1:
        raise ShapeError(f"{where}: train inputs have shape {parts[0][0][2]}, test inputs "
                         f"{parts[1][0][2]}")
    row_shape = shapes.pop()
    shape = row_shape if input_shape is None else tuple(int(s) for s in input_shape)
    if math.prod(shape) != math.prod(row_shape):
        return load_data(spec, input_shape=input_shape, test_fraction=test_fraction,
                         normalize=normalize, seed=seed)  # its ShapeError
    train, test = (FileRows(path, offset, dtype, row_shape, shape, index, y, sums)
                   for (offset, dtype, row_shape, sums), index, y in parts)
    classes = torch.cat([train.labels, test.labels]).unique()
    if len(classes) < 2:
        raise InvalidParameterError(
            f"{where}: every sample has label {int(classes[0])}; a classification task needs "
            "at least two classes (is the label column the right one?)")
    return Split(train, test, shape, int(classes.max()) + 1)


_Stored = tuple[int, np.dtype, tuple[int, ...]]  # data offset, dtype, shape
_Checked = tuple[int, np.dtype, tuple[int, ...], np.ndarray]  # ... row shape, CRC-32 a row


def _stored(path: Path) -> dict[str, _Stored] | None:
    """Each array of the .npz stored uncompressed in C order, by name; None when one is
    not (then ``load_data`` reads the file: its checks and messages). The archive is
    checked as ``load_data`` checks it (``_check_arrays``); only its labels must fit the
    memory limit, not its inputs."""
    out = {}
    try:
        with open_regular(path, 0.0) as fh:
            _check_arrays(fh, path)
            with zipfile.ZipFile(fh) as archive:
                for entry in archive.infolist():
                    if not entry.filename.endswith(".npy") or \
                            entry.compress_type != zipfile.ZIP_STORED:
                        return None
                    fh.seek(entry.header_offset)
                    local = fh.read(30)
                    if local[:4] != b"PK\x03\x04":
                        return None
                    name_len, extra_len = struct.unpack("<HH", local[26:30])
                    fh.seek(entry.header_offset + 30 + name_len + extra_len)
                    version = np.lib.format.read_magic(fh)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, fortran, dtype = read(fh)
                    if fortran or dtype.kind not in "biuf" or len(shape) < 1:
                        return None
                    out[entry.filename[:-4]] = (fh.tell(), dtype, tuple(shape))
                # in memory: the labels, as int64
                check_bytes(sum(8 * math.prod(s) for name, (_, _, s) in out.items()
                                if name.startswith("y")), f"reading the labels of '{path}'")
    except (OSError, ValueError, zipfile.BadZipFile, struct.error):
        return None
    return out


def _checked(path: Path, x: _Stored, y: _Stored, where: str
             ) -> tuple[_Checked, Tensor]:
    """(x as stored, with rows of its shape and the CRC-32 of each row; the labels,
    checked as ``load_data`` checks them), after one pass over x in chunks refusing
    NaN/inf as ``load_data`` does."""
    (offset, dtype, shape), (y_offset, y_dtype, y_shape) = x, y
    if len(shape) < 2:
        raise InvalidParameterError(f"{where}: the inputs have shape {shape}; give one "
                                    "array of values per sample (samples first)")
    with open_regular(path, 0.0) as fh:
        fh.seek(y_offset)
        labels = _labels(np.fromfile(fh, dtype=y_dtype, count=math.prod(y_shape))
                         .reshape(y_shape), where)
    if len(labels) != shape[0] or shape[0] == 0:
        raise InvalidParameterError(f"{where}: {shape[0]} inputs and {len(labels)} labels; "
                                    "need the same positive number")
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    step = max(1, _CHUNK // max(row_bytes, 1))
    bad, first, stored_bad = 0, 0, False
    checksums = np.empty(shape[0], dtype=np.uint32)
    with open_regular(path, 0.0) as fh:
        fh.seek(offset)
        for start in range(0, shape[0], step):
            chunk = np.fromfile(fh, dtype=dtype, count=min(step, shape[0] - start)
                                * math.prod(shape[1:])).reshape(-1, *shape[1:])
            raw = chunk.tobytes()
            checksums[start:start + len(chunk)] = [
                zlib.crc32(raw[k:k + row_bytes]) for k in range(0, len(raw), row_bytes)]
            with np.errstate(over="ignore"):
                finite = np.isfinite(chunk.astype(np.float32))
            if not finite.all():
                if not bad:
                    rows = ~finite.reshape(len(chunk), -1).all(axis=1)
                    first = start + int(np.argwhere(rows)[0, 0])
                bad += int((~finite).sum())
                stored_bad = stored_bad or not np.isfinite(chunk).all()
    if bad:
        _refuse_nonfinite(where, bad, first, stored_bad)
    return (offset, dtype, tuple(shape[1:]), checksums), torch.from_numpy(labels)
