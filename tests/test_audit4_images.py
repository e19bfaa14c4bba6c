"""Issue 40, "silent wrong", variants the issue does not list: 16 bits per colour channel.
Pillow opens a 48-bit RGB or 64-bit RGBA PNG, a 32-bit gray+alpha PNG and a 48-bit RGB
TIFF in its 8-bit modes, keeping each value's high byte (55746 read as 217/255, and the
gray+alpha one as four channels): an image folder of them loaded without a word. Now each
is refused in one line naming the file and what to save instead, and the 16-bit
grayscale and 8-bit colour files beside them still read exactly. The files are written
byte by byte here (Pillow cannot write them), from values the test knows."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_runner import invoke
from pathlift.data import load_data
from pathlift.errors import InvalidParameterError

RNG = np.random.default_rng(404)


def _png(values: np.ndarray, color: int) -> bytes:
    """A 16-bit PNG of ``values`` (height, width, channels), PNG colour type ``color``."""
    h, w = values.shape[:2]
    rows = b"".join(b"\0" + values[i].astype(">u2").tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color, 0, 0,
                                                               0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _tiff(values: np.ndarray) -> bytes:
    """An uncompressed little-endian 16-bit RGB TIFF of ``values`` (height, width, 3)."""
    h, w, c = values.shape
    data = values.astype("<u2").tobytes()
    # (tag, type: 3 short / 4 long, count, value); 258 and 273 point past the directory
    entries = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, c, 0), (259, 3, 1, 1), (262, 3, 1, 2),
               (273, 4, 1, 0), (277, 3, 1, c), (278, 3, 1, h), (279, 4, 1, len(data)),
               (284, 3, 1, 1)]
    bits_at = 8 + 2 + 12 * len(entries) + 4
    places = {258: bits_at, 273: bits_at + 2 * c}
    directory = b"".join(
        struct.pack("<HHI", tag, kind, count) + (struct.pack("<I", places[tag]) if tag in places
                                                 else struct.pack("<HH", value, 0)
                                                 if kind == 3 else struct.pack("<I", value))
        for tag, kind, count, value in entries)
    return (b"II*\0" + struct.pack("<IH", 8, len(entries)) + directory + struct.pack("<I", 0)
            + struct.pack(f"<{c}H", *[16] * c) + data)


def _folder(root: Path, name: str, data: bytes) -> Path:
    """Two classes, each holding an 8-bit RGB image and then the file ``name``."""
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        Image.new("RGB", (4, 3), (10, 20, 30)).save(root / f"class{c}" / "a.png")
        (root / f"class{c}" / name).write_bytes(data)
    return root


SIXTEEN_BIT_COLOUR = [
    ("rgb48.png", lambda v: _png(v[..., :3], 2), "RGB;16B"),
    ("rgba64.png", lambda v: _png(v, 6), "RGBA;16B"),
    ("gray-alpha32.png", lambda v: _png(v[..., :2], 4), "LA;16B"),
    ("rgb48.tif", lambda v: _tiff(v[..., :3]), "RGB;16L"),
]


@pytest.mark.parametrize(("name", "encode", "stored"), SIXTEEN_BIT_COLOUR,
                         ids=[n for n, _, _ in SIXTEEN_BIT_COLOUR])
def test_sixteen_bit_colour_is_refused_naming_the_file_not_rounded(name, encode, stored,
                                                                  tmp_path):
    values = RNG.integers(0, 65536, (3, 4, 4), dtype=np.uint16)
    data = encode(values)
    with Image.open(_folder(tmp_path, name, data) / "class0" / name) as image:
        rounded = np.asarray(image)  # what Pillow gives: the high bytes, or more channels
    assert image.mode in ("RGB", "RGBA") and rounded.max() <= 255
    with pytest.raises(InvalidParameterError, match=rf"class0/{name}' holds 16 bits per "
                       rf"colour channel \({stored}\)"):
        load_data(str(tmp_path))


@pytest.mark.parametrize("name", ["rgb48.png", "rgb48.tif"])
def test_the_command_line_refuses_it_in_one_line(name, tmp_path):
    values = RNG.integers(0, 65536, (3, 4, 3), dtype=np.uint16)
    data = _png(values, 2) if name.endswith(".png") else _tiff(values)
    folder = _folder(tmp_path / "images", name, data)
    result = invoke("prune", "--model", "mlp", "--data", str(folder), "--epochs", "3",
                    "--seeds", "1", "--out", str(tmp_path / "out"))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"{name}' holds 16 bits per colour channel" in lines[0] and "8 bits" in lines[0]
    assert not (tmp_path / "out").exists()


def test_sixteen_bit_gray_and_eight_bit_colour_beside_them_read_exactly(tmp_path):
    """What is not refused is read exactly: 16-bit grayscale / 65535 (I;16, the file's own
    values), and Pillow's 8-bit RGB / 255."""
    values = RNG.integers(0, 65536, (3, 4), dtype=np.uint16)
    for c in range(2):
        (tmp_path / f"class{c}").mkdir()
        (tmp_path / f"class{c}" / "gray16.png").write_bytes(_png(values[..., None], 0))
    split = load_data(str(tmp_path), test_fraction=0.5)
    x = torch.cat([split.train.tensors[0], split.test.tensors[0]]).numpy()
    for sample in x:
        np.testing.assert_allclose(sample[0], values / 65535, rtol=1e-6, atol=0)
