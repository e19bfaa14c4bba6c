"""Data by name: the embedded sets, ``.npz`` and CSV files, image folders and your own
``module:callable``, as one train/test ``Split`` (``load_data``).

Every file is opened through ``pathlift.files.open_regular``: only a regular file (a FIFO
or a device is refused at once, without blocking), and only when what reading it needs
fits the memory limit, checked before anything is read or decoded: an .npz by what its
zip entries and the arrays they declare unpack to, a CSV by its size times what its rows
take as Python text, an image by its pixel count (Pillow's decompression-bomb limit also
applies).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from pathlift.data.embedded import Split, load_digits, synthetic
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.files import FileSystemError, check_archive, open_regular, open_text
from pathlift.graph.memory import check_bytes
from pathlift.models.registry import import_callable, is_import_path

__all__ = ["IMAGE_SUFFIXES", "NORMALIZATIONS", "load_data"]

NORMALIZATIONS = ("none", "standard")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def load_data(spec: str, *, input_shape: Sequence[int] | None = None,
              test_fraction: float = 0.25, normalize: str = "none", seed: int = 0) -> Split:
    """A train/test split of a classification task from ``spec``.

    ``spec`` is one of:

    - ``digits`` (scikit-learn's 8x8 digits, needs ``pathlift[data]``) or ``synthetic``
      (Gaussian clusters of ``input_shape``, default (1, 8, 8));
    - an ``.npz`` file with arrays ``x`` (samples first) and ``y`` (integer labels), or
      ``x_train``, ``y_train``, ``x_test``, ``y_test`` (then the file's own split is kept);
    - a ``.csv`` file of numbers, one sample a row, the label in a column named ``label``
      or ``y`` (else the last column); a header row is optional;
    - a folder with one sub-folder of images per class (read with Pillow, ``pathlift[data]``;
      every image converted to the first one's mode and size, pixels scaled to [0, 1],
      channels first);
    - ``module:callable`` or ``path/to/file.py:callable`` returning a ``Split`` or a pair
      (train, test) of datasets of (input, label) pairs.

    Inputs are float32, reshaped to ``input_shape`` when given (same number of values per
    sample), labels int64 in 0..num_classes-1. Without a split of their own, a seeded
    random ``test_fraction`` of the samples is the test set. ``normalize="standard"``
    subtracts the training mean and divides by the training standard deviation, per input
    value (the test set gets the training statistics).

    Raises:
        InvalidParameterError: an unknown spec or normalisation, unreadable or malformed
            data (the message names the file).
        ShapeError: ``input_shape`` does not hold the samples' values.

    Example:
        >>> split = load_data("mydata.npz", test_fraction=0.2, normalize="standard")
        >>> train_loader, test_loader = loaders(split, batch_size=128)
    """
    if normalize not in NORMALIZATIONS:
        raise InvalidParameterError(f"normalize={normalize!r}; choose one of {NORMALIZATIONS}")
    if not 0.0 < test_fraction < 1.0:
        raise InvalidParameterError(f"test_fraction={test_fraction} must lie in (0, 1)")
    split = _read(str(spec), input_shape, test_fraction, seed)
    if input_shape is not None and tuple(input_shape) != split.input_shape:
        split = _reshape(split, tuple(int(s) for s in input_shape))
    return _standardized(split) if normalize == "standard" else split


def _read(spec: str, input_shape: Sequence[int] | None, test_fraction: float,
          seed: int) -> Split:
    path = Path(spec)
    if spec == "digits":
        return load_digits(test_fraction, seed)
    if spec == "synthetic":
        return synthetic(input_shape=tuple(input_shape or (1, 8, 8)), seed=seed)
    if path.is_dir():
        return _split(*_image_folder(path), test_fraction, seed, spec)
    if path.suffix in (".npz", ".csv") and not os.path.lexists(path):
        raise InvalidParameterError(f"no data at '{spec}': no such file (current folder: "
                                    f"{Path.cwd()})")
    if path.suffix == ".npz":
        return _npz(path, test_fraction, seed)
    if path.suffix == ".csv":
        return _split(*_csv(path), test_fraction, seed, spec)
    if is_import_path(spec):
        return _from_callable(spec, import_callable(spec)())
    if path.suffix:
        raise InvalidParameterError(f"cannot read '{spec}': give a .npz or .csv file")
    raise InvalidParameterError(
        f"unknown data '{spec}'; give digits, synthetic, a .npz or .csv file, a folder of "
        "class sub-folders of images, or module:callable")


def _npz(path: Path, test_fraction: float, seed: int) -> Split:
    try:
        with open_regular(path) as fh:
            check_archive(fh, path)
            _check_arrays(fh, path)
            with np.load(fh, allow_pickle=False) as arrays:
                found = dict(arrays)
    except (OSError, ValueError) as err:
        if isinstance(err, FileSystemError):
            raise
        raise InvalidParameterError(f"'{path}' is not a readable .npz file: {err}") from err
    if {"x_train", "y_train", "x_test", "y_test"} <= found.keys():
        return _split_given(found["x_train"], found["y_train"], found["x_test"],
                            found["y_test"], str(path))
    if not {"x", "y"} <= found.keys():
        raise InvalidParameterError(f"'{path}' holds arrays {sorted(found)}; it needs x and y "
                                    "(or x_train, y_train, x_test, y_test)")
    return _split(found["x"], found["y"], test_fraction, seed, str(path))


def _check_arrays(fh: io.BufferedIOBase, path: Path) -> None:
    """Refuse an .npz whose arrays declare (in their .npy headers) more data than their zip
    entries hold: numpy allocates what the header declares before reading."""
    with zipfile.ZipFile(fh) as archive:
        for entry in archive.infolist():
            if not entry.filename.endswith(".npy"):
                continue
            with archive.open(entry) as member:
                version = np.lib.format.read_magic(member)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = read(member)
            declared = math.prod(shape) * dtype.itemsize
            if declared > entry.file_size:
                raise InvalidParameterError(
                    f"'{path}': array {entry.filename[:-4]!r} declares {shape} {dtype} "
                    f"({declared:,} bytes) but holds {entry.file_size:,}: the file is damaged")
    fh.seek(0)


def _csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open_text(path) as fh:
        rows = [row for row in csv.reader(fh) if row]
    if not rows:
        raise InvalidParameterError(f"'{path}' is empty")
    header = [c.strip().lower() for c in rows[0]]
    has_header = not all(_is_number(c) for c in header)
    column = next((header.index(n) for n in ("label", "y") if has_header and n in header), -1)
    try:
        table = np.array(rows[has_header:], dtype=np.float64)
    except ValueError as err:
        raise InvalidParameterError(f"'{path}': every row after the header must hold numbers "
                                    f"only ({err})") from err
    return np.delete(table, column, axis=1), table[:, column]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _image_folder(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    if importlib.util.find_spec("PIL") is None:
        raise InvalidParameterError("image folders are read with Pillow: pip install "
                                    "'pathlift[data]'")
    classes = sorted(p for p in folder.iterdir() if p.is_dir())
    files = [(f, label) for label, c in enumerate(classes) for f in sorted(c.iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if len(classes) < 2 or not files:
        raise InvalidParameterError(f"'{folder}' must hold one sub-folder of images "
                                    f"({', '.join(IMAGE_SUFFIXES)}) per class, at least two")
    images, mode, size, kept = [], None, None, 0
    for file, _ in files:
        with open_regular(file) as fh, _open_image(fh, file) as image:
            mode = mode or ("L" if image.mode in ("1", "L", "I", "F") else "RGB")
            size = size or image.size
            # decoded and converted at full size, kept as float32 at the first's size
            out = math.prod(size) * (1 if mode == "L" else 3) * 4
            check_bytes(kept + 2 * math.prod(image.size) * len(image.getbands()) * 4 + out,
                        f"reading the images of '{folder}' (at '{file}')")
            pixels = np.asarray(image.convert(mode).resize(size), dtype=np.float32) / 255.0
        kept += 2 * out  # the list and the stacked array
        images.append(pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1))
    return np.stack(images), np.array([label for _, label in files])


def _open_image(fh: io.BufferedIOBase, file: Path) -> Any:
    """``PIL.Image.open`` on ``fh`` (nothing decoded yet); Pillow's decompression-bomb
    limits (more pixels than twice ``Image.MAX_IMAGE_PIXELS``, a compressed text chunk
    larger than ``PngImagePlugin.MAX_TEXT_CHUNK``) as one line."""
    from PIL import Image

    try:
        return Image.open(fh)
    except Image.DecompressionBombError as err:
        raise InvalidParameterError(f"'{file}' is refused as a decompression bomb ({err}); "
                                    "use smaller images") from None
    except ValueError as err:  # Pillow's limits on decompressed metadata
        raise InvalidParameterError(f"'{file}' is refused: {err}") from None


def _labels(y: np.ndarray, where: str) -> np.ndarray:
    if y.ndim != 1 or not np.all(np.isfinite(y)) or np.any(y != np.round(y)) or np.any(y < 0):
        raise InvalidParameterError(f"{where}: labels must be one non-negative integer class "
                                    "index per sample")
    return y.astype(np.int64)


def _tensors(x: np.ndarray, y: np.ndarray, where: str) -> TensorDataset:
    if len(x) != len(y) or len(x) == 0:
        raise InvalidParameterError(f"{where}: {len(x)} inputs and {len(y)} labels; need the "
                                    "same positive number")
    inputs = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return TensorDataset(inputs, torch.from_numpy(_labels(np.asarray(y), where)))


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, where: str) -> Split:
    data = _tensors(x, y, where)
    n_test = math.ceil(test_fraction * len(data))
    if not 0 < n_test < len(data):
        raise InvalidParameterError(f"{where}: {len(data)} samples are too few to split")
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    inputs, labels = data.tensors
    test, train = order[:n_test], order[n_test:]
    return _finish(TensorDataset(inputs[train], labels[train]),
                   TensorDataset(inputs[test], labels[test]), where)


def _split_given(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray,
                 where: str) -> Split:
    return _finish(_tensors(x_tr, y_tr, where), _tensors(x_te, y_te, where), where)


def _finish(train: TensorDataset, test: TensorDataset, where: str) -> Split:
    shape = tuple(train.tensors[0].shape[1:])
    if tuple(test.tensors[0].shape[1:]) != shape:
        raise ShapeError(f"{where}: train inputs have shape {shape}, test inputs "
                         f"{tuple(test.tensors[0].shape[1:])}")
    classes = int(max(train.tensors[1].max(), test.tensors[1].max())) + 1
    return Split(train, test, shape, classes)


def _from_callable(spec: str, value: object) -> Split:
    if isinstance(value, Split):
        return value
    if not (isinstance(value, tuple) and len(value) == 2 and
            all(hasattr(d, "__len__") and hasattr(d, "__getitem__") for d in value)):
        raise InvalidParameterError(f"'{spec}' returned a {type(value).__name__}; it must "
                                    "return a pathlift.data.Split or a (train, test) pair of "
                                    "map-style datasets (or lists) of (input, label) pairs")
    train, test = (_as_tensors(d, spec) for d in value)
    return _finish(train, test, spec)


def _as_tensors(data: Dataset | Sequence, where: str) -> TensorDataset:
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return TensorDataset(data.tensors[0].float(), data.tensors[1].long())
    pairs = [data[i] for i in range(len(data))]
    x = torch.stack([torch.as_tensor(p[0], dtype=torch.float32) for p in pairs])
    return TensorDataset(x, torch.as_tensor([int(p[1]) for p in pairs]))


def _reshape(split: Split, shape: tuple[int, ...]) -> Split:
    if math.prod(shape) != math.prod(split.input_shape):
        raise ShapeError(f"the data's samples have shape {split.input_shape} "
                         f"({math.prod(split.input_shape)} values), not {shape}: give an "
                         "--input-shape with as many values")
    train, test = ((d.tensors[0].reshape(-1, *shape), d.tensors[1])
                   for d in (split.train, split.test))
    return Split(TensorDataset(*train), TensorDataset(*test), shape, split.num_classes)


def _standardized(split: Split) -> Split:
    x_tr = split.train.tensors[0]
    mean, std = x_tr.mean(0), x_tr.std(0).clamp_min(1e-8)
    train, test = (TensorDataset((d.tensors[0] - mean) / std, d.tensors[1])
                   for d in (split.train, split.test))
    return Split(train, test, split.input_shape, split.num_classes)
