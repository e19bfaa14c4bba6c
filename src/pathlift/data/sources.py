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
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from pathlift.data.embedded import Split, load_digits, synthetic
from pathlift.errors import InvalidParameterError, PathliftError, ShapeError
from pathlift.files import TEXT_MEMORY_PER_BYTE, check_archive, open_regular, read_regular
from pathlift.memory import check_bytes
from pathlift.models.registry import import_callable, is_import_path

__all__ = ["IMAGE_SUFFIXES", "NORMALIZATIONS", "load_data"]

NORMALIZATIONS = ("none", "standard")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
#: the only Pillow plugins an image file may be opened with (those of ``IMAGE_SUFFIXES``):
#: whatever its name, a file of another format (EPS, which runs Ghostscript; PDF, PSD...)
#: is refused before any plugin of that format sees it
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")
#: stored value -> value read, per Pillow image mode: divided by the mode's largest value,
#: so that 8-bit and 16-bit pixels land in [0, 1]; 1-bit pixels are 0 or 1; 32-bit float
#: (F) pixels are read as stored. Bands are kept as stored (LA: luminance, alpha; CMYK: its
#: four inks); a palette (P, PA) is looked up as RGB, or RGBA when it has transparency.
IMAGE_SCALES = {"1": 1.0, "L": 255.0, "LA": 255.0, "RGB": 255.0, "RGBA": 255.0,
                "CMYK": 255.0, "I;16": 65535.0, "I;16L": 65535.0, "I;16B": 65535.0,
                "I;16N": 65535.0, "I": 65535.0, "F": 1.0}


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
    - a folder with one sub-folder of images per class (read with Pillow, ``pathlift[data]``,
      only as one of ``IMAGE_FORMATS``; channels first, resized to the first image's size;
      values by ``IMAGE_SCALES``: 8-bit pixels / 255, 16-bit ones (I;16) / 65535, 32-bit
      integers (I) / 65535 when in 0..65535, 1-bit ones 0 or 1, floats (F) as stored and
      finite, every band kept (LA 2 channels, RGBA and CMYK 4; a palette as RGB, or RGBA
      with transparency); another mode, 16 bits per colour channel (RGB, RGBA or LA, which
      Pillow rounds to 8 bits), or an image with another number of channels than the
      first, is refused naming the file);
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
    except (PathliftError, PermissionError):
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        # a truncated or corrupt archive, an object array (refused: it would unpickle)
        raise InvalidParameterError(
            f"'{path}' is not a readable .npz file ({type(err).__name__}: "
            f"{str(err)[:100]}); save it with numpy.savez from numeric arrays") from None
    if not isinstance(found, dict):  # np.load read a plain .npy saved under .npz
        raise InvalidParameterError(f"'{path}' holds one array, not the named arrays of an "
                                    ".npz; save it with numpy.savez(path, x=..., y=...)")
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
            if dtype.hasobject:
                raise InvalidParameterError(
                    f"'{path}' is not a readable .npz file: array {entry.filename[:-4]!r} "
                    "holds Python objects (refused: numpy would unpickle them); save it with "
                    "numpy.savez from numeric arrays")
            declared = math.prod(shape) * dtype.itemsize
            if declared > entry.file_size:
                raise InvalidParameterError(
                    f"'{path}': array {entry.filename[:-4]!r} declares {shape} {dtype} "
                    f"({declared:,} bytes) but holds {entry.file_size:,}: the file is damaged")
    fh.seek(0)


def _csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    return _csv_table(_csv_text(read_regular(path, TEXT_MEMORY_PER_BYTE), path), path)


def _csv_text(data: bytes, path: Path) -> str:
    """The file's text: UTF-8, a byte-order mark dropped (a spreadsheet's "CSV UTF-8")."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InvalidParameterError(
            f"'{path}' line {line}: bytes that are not UTF-8 text (saved as Latin-1 or "
            "another code page?); save the file as UTF-8 CSV") from None


def _csv_table(text: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of a CSV's text: numbers only, one sample a row, the label in a
    column named ``label`` or ``y`` (else the last); a header row is optional."""
    rows = [(number, row) for number, row in enumerate(csv.reader(io.StringIO(text)), 1)
            if row]
    if not rows:
        raise InvalidParameterError(f"'{path}' is empty")
    header = [c.strip().lower() for c in rows[0][1]]
    has_header = not all(_is_number(c) for c in header)
    column = next((header.index(n) for n in ("label", "y") if has_header and n in header), -1)
    body = rows[has_header:]
    if not body:
        raise InvalidParameterError(f"'{path}' holds a header and no samples: add one row "
                                    "of numbers per sample")
    width = len(rows[0][1])
    if width < 2:
        raise InvalidParameterError(f"'{path}' has one column: each row needs the inputs and "
                                    "a label (comma-separated)")
    for number, row in body:
        if len(row) != width:
            raise InvalidParameterError(f"'{path}' line {number}: {len(row)} fields, the first "
                                        f"row has {width}; every row needs as many")
        bad = next((c for c in row if not _is_number(c)), None)
        if bad is not None:
            raise InvalidParameterError(f"'{path}' line {number}: {bad[:40]!r} is not a number; "
                                        "every row after the header must hold numbers only")
    table = np.array([row for _, row in body], dtype=np.float64)
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
    from PIL import Image  # start-up: Pillow only for image folders

    images, channels, size, kept = [], 0, None, 0
    for file, _ in files:
        try:
            with open_regular(file) as fh, \
                    Image.open(fh, formats=IMAGE_FORMATS) as image:  # nothing decoded yet
                size = size or image.size
                # decoded at full size, kept as float32 at the first's size
                out = math.prod(size) * max(len(image.getbands()), 3) * 4
                check_bytes(kept + 2 * math.prod(image.size) * max(len(image.getbands()), 4)
                            * 4 + out, f"reading the images of '{folder}' (at '{file}')")
                pixels = _pixels(image, file)
        except (PathliftError, PermissionError):
            raise
        except Image.DecompressionBombError as err:  # twice Image.MAX_IMAGE_PIXELS
            raise InvalidParameterError(f"'{file}' is refused as a decompression bomb "
                                        f"({err}); use smaller images") from None
        except (OSError, ValueError, SyntaxError, EOFError) as err:
            # Pillow's errors: not an image (or not one of IMAGE_FORMATS), a zero-byte or
            # truncated file, decompressed metadata over its limits (a text chunk above
            # PngImagePlugin.MAX_TEXT_CHUNK)
            raise InvalidParameterError(
                f"'{file}' is not a readable image of a format pathlift reads "
                f"({', '.join(IMAGE_FORMATS)}; {type(err).__name__}: {str(err)[:100]}); "
                "replace or remove it") from None
        channels = channels or pixels.shape[0]
        if pixels.shape[0] != channels:
            raise InvalidParameterError(
                f"'{file}' has {pixels.shape[0]} channel(s), the folder's first image "
                f"'{files[0][0]}' {channels}: save every image in one mode (e.g. all RGB)")
        kept += 2 * out  # the list and the stacked array
        images.append(_resized(pixels, size))
    return np.stack(images), np.array([label for _, label in files])


def _pixels(image, file: Path) -> np.ndarray:
    """The decoded pixels of a Pillow ``image``, channels first, float32, by its mode's
    ``IMAGE_SCALES`` (a palette looked up first); another mode, 16-bit colour (which
    Pillow rounds to 8 bits), 32-bit integers outside 0..65535 or non-finite floats are
    refused naming ``file``."""
    if IMAGE_SCALES.get(image.mode) == 255.0 and any(";16" in r for r in _rawmodes(image)):
        raise InvalidParameterError(  # Pillow decodes 16-bit colour to its 8-bit modes
            f"'{file}' holds 16 bits per colour channel ({_rawmodes(image)[0]}), which Pillow "
            "reads rounded to 8 bits; save it as 8-bit colour, 16-bit grayscale or float")
    if image.mode in ("P", "PA"):
        rgba = image.mode == "PA" or "transparency" in image.info
        image = image.convert("RGBA" if rgba else "RGB")
    scale = IMAGE_SCALES.get(image.mode)
    if scale is None:
        raise InvalidParameterError(
            f"'{file}' has the image mode {image.mode!r}, which pathlift does not read; save "
            f"it in one of {', '.join(IMAGE_SCALES)} (or a palette)")
    values = np.asarray(image)
    if image.mode == "I" and values.size and not 0 <= values.min() <= values.max() <= 65535:
        raise InvalidParameterError(
            f"'{file}' holds 32-bit integer pixels from {values.min()} to {values.max()}, "
            "outside 0..65535 (read / 65535); save it as 8-bit, 16-bit or float")
    pixels = values.astype(np.float32) / np.float32(scale)
    if not np.isfinite(pixels).all():
        raise InvalidParameterError(f"'{file}' holds NaN or infinite pixels; replace it")
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _rawmodes(image) -> list[str]:
    """How the file stores the pixels Pillow is about to decode into ``image.mode``, per
    tile (``RGB;16B``: big-endian 16-bit RGB), from the tiles' decoder arguments."""
    args = [tile[3] for tile in image.tile]
    return [a if isinstance(a, str) else a[0] for a in args
            if isinstance(a, str) or (isinstance(a, tuple) and a and isinstance(a[0], str))]


def _resized(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``pixels`` (channels, height, width) resized to ``size`` (width, height), each
    channel as a float image (bicubic), or as they are when already that size."""
    if pixels.shape[2:0:-1] == size:
        return pixels
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(channel).resize(
        size, Image.Resampling.BICUBIC)) for channel in pixels])


#: Labels are class indices below this (int32's range): a larger one is a mistake, and
#: would be cast or allocated for before anything else noticed.
MAX_LABEL = 2**31 - 1


def _inputs(x: object, where: str) -> np.ndarray:
    """The inputs as a float32 array (samples first), or a one-line refusal: no text or
    objects, no complex numbers (their imaginary part would be dropped), no NaN or inf,
    nothing beyond float32's range."""
    x = _array(x)
    if x.dtype.kind not in "biufc":
        raise InvalidParameterError(f"{where}: the inputs are {_kind(x)}, not numbers; give "
                                    "numeric arrays")
    if x.dtype.kind == "c":
        raise InvalidParameterError(
            f"{where}: the inputs are complex numbers; pathlift's networks take real inputs "
            "(give the real and imaginary parts as two channels)")
    if x.ndim < 2:
        raise InvalidParameterError(f"{where}: the inputs have shape {x.shape}; give one "
                                    "array of values per sample (samples first)")
    with np.errstate(over="ignore"):  # beyond float32: inf, refused below
        out = np.asarray(x, dtype=np.float32)
    finite = np.isfinite(out)
    if not finite.all():
        first = int(np.argwhere(~finite.reshape(len(out), -1).all(axis=1))[0, 0])
        _refuse_nonfinite(where, int((~finite).sum()), first, not np.isfinite(x).all())
    return out


def _refuse_nonfinite(where: str, count: int, first: int, stored: bool) -> None:
    """The one-line refusal of ``count`` input values that are not finite in float32, the
    first in sample ``first``: NaN or inf as ``stored``, else beyond float32's range."""
    source = "NaN or inf" if stored else "beyond float32's range"
    raise InvalidParameterError(
        f"{where}: {count} input value(s) are {source} (the first in sample {first}); "
        "remove or impute those samples")


def _labels(y: object, where: str) -> np.ndarray:
    """Labels as int64 class indices, checked before any cast: one per sample, integers
    in 0..MAX_LABEL (1e300 would wrap to a negative int64, 0.5 be truncated)."""
    y = _array(y)
    if y.dtype.kind not in "biuf":
        raise InvalidParameterError(f"{where}: the labels are {_kind(y)}; labels must be one "
                                    "non-negative integer class index per sample")
    if y.ndim != 1 or not np.all(np.isfinite(y)) or np.any(y != np.round(y)) \
            or np.any(y < 0) or np.any(y > MAX_LABEL):
        raise InvalidParameterError(
            f"{where}: labels must be one non-negative integer class index per sample "
            f"(0..{MAX_LABEL}); found shape {y.shape}" + (
                f", values {_range(y)}" if y.ndim == 1 and y.size else ""))
    return y.astype(np.int64)


def _array(v: object) -> np.ndarray:
    """``v`` as a numpy array (a tensor without copy where numpy holds its dtype)."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        if v.dtype in (torch.bfloat16, torch.float16):
            v = v.float()
        return v.numpy()
    return np.asarray(v)


def _kind(a: np.ndarray) -> str:
    return {"U": "text", "S": "bytes", "O": "Python objects", "c": "complex numbers",
            "M": "dates", "m": "time spans", "V": "records"}.get(a.dtype.kind, str(a.dtype))


def _range(y: np.ndarray) -> str:
    finite = y[np.isfinite(y)]
    bad = "NaN/inf, " if finite.size < y.size else ""
    return bad + (f"from {finite.min():g} to {finite.max():g}" if finite.size else "none finite")


def _tensors(x: object, y: object, where: str) -> TensorDataset:
    inputs, labels = _inputs(x, where), _labels(y, where)
    if len(inputs) != len(labels) or len(inputs) == 0:
        raise InvalidParameterError(f"{where}: {len(inputs)} inputs and {len(labels)} labels; "
                                    "need the same positive number")
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(inputs)),
                         torch.from_numpy(labels))


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
    labels = torch.cat([train.tensors[1], test.tensors[1]]).unique()
    if len(labels) < 2:
        raise InvalidParameterError(
            f"{where}: every sample has label {int(labels[0])}; a classification task needs "
            "at least two classes (is the label column the right one?)")
    return Split(train, test, shape, int(labels.max()) + 1)


def _from_callable(spec: str, value: object) -> Split:
    if isinstance(value, Split):  # checked like every other source
        split = _finish(_as_tensors(value.train, f"{spec} (train)"),
                        _as_tensors(value.test, f"{spec} (test)"), spec)
        return Split(split.train, split.test, split.input_shape,
                     max(split.num_classes, value.num_classes))
    if not (isinstance(value, tuple) and len(value) == 2 and
            all(hasattr(d, "__len__") and hasattr(d, "__getitem__") for d in value)):
        raise InvalidParameterError(f"'{spec}' returned a {type(value).__name__}; it must "
                                    "return a pathlift.data.Split or a (train, test) pair of "
                                    "map-style datasets (or lists) of (input, label) pairs")
    train, test = (_as_tensors(d, spec) for d in value)
    return _finish(train, test, spec)


def _as_tensors(data: Dataset | Sequence, where: str) -> TensorDataset:
    """A dataset of (input, label) items as checked tensors (``_tensors``): items of
    another form (a dict, a lone tensor) and inputs of different shapes are refused."""
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return _tensors(*data.tensors, where)
    inputs, labels = [], []
    for i in range(len(data)):
        item = data[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            what = f"a {type(item).__name__}" + (
                f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
            raise InvalidParameterError(
                f"{where}: item {i} is {what}; each item must be an (input, label) pair "
                "(for a dict, return (item['input'], item['label']))")
        x = _array(item[0])
        if inputs and x.shape != inputs[0].shape:
            raise ShapeError(f"{where}: item {i} has an input of shape {x.shape}, item 0 "
                             f"{inputs[0].shape}; every input needs one shape")
        inputs.append(x)
        labels.append(_array(item[1]).reshape(-1))
    if not inputs:
        raise InvalidParameterError(f"{where}: the dataset is empty")
    if any(y.size != 1 for y in labels):
        raise InvalidParameterError(f"{where}: each label must be one class index")
    return _tensors(np.stack(inputs), np.concatenate(labels), where)


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
