"""Issue 40, silent wrong: every image mode is read exactly (its documented scale, against
the values written into the file) or refused in one line naming the file; Pillow opens only
the listed raster formats (an EPS named .png never launches Ghostscript)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_runner import invoke
from pathlift.data import load_data
from pathlift.errors import InvalidParameterError

RNG = np.random.default_rng(40)


def _folder(root: Path, images: list[tuple[Image.Image, str]]) -> Path:
    """Two classes, each holding every image of ``images`` (image, file name)."""
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        for image, name in images:
            image.save(root / f"class{c}" / name)
    return root


def _read(root: Path) -> np.ndarray:
    """Every sample of the folder's split, in file order (test_fraction 0.5, 2 per class)."""
    split = load_data(str(root), test_fraction=0.5)
    return torch.cat([split.train.tensors[0], split.test.tensors[0]]).numpy()


def _assert_read_as(root: Path, expected: np.ndarray) -> None:
    """Every sample equals ``expected`` (channels first), to float32 rounding."""
    x = _read(root)
    assert x.shape[1:] == expected.shape
    for sample in x:
        np.testing.assert_allclose(sample, expected, rtol=1e-6, atol=0)


def _sixteen_bit() -> np.ndarray:
    return RNG.integers(0, 65536, (5, 7), dtype=np.uint16)


@pytest.mark.parametrize(("dtype", "suffix"), [("<u2", "png"), (">u2", "tif"),
                                               ("<u2", "tif")],
                         ids=["I;16-png", "I;16B-tiff", "I;16-tiff"])
def test_16_bit_images_are_read_over_65535(tmp_path, dtype, suffix):
    values = _sixteen_bit()
    values[0, :3] = (0, 65535, 256)  # the extremes, and a value an 8-bit cast would clip
    image = Image.fromarray(values.astype(dtype))
    root = _folder(tmp_path, [(image, f"a.{suffix}")])
    assert Image.open(root / "class0" / f"a.{suffix}").mode.startswith("I;16")
    stored = np.asarray(Image.open(root / "class0" / f"a.{suffix}")).astype(np.float64)
    np.testing.assert_array_equal(stored, values)  # the file holds what was written
    _assert_read_as(root, (values / 65535.0)[None])
    assert float(_read(root).max()) == 1.0 and len(np.unique(_read(root))) > 3  # not all 1.0


def test_32_bit_integer_images_in_16_bit_range_are_read_and_others_refused(tmp_path):
    values = _sixteen_bit().astype(np.int32)
    root = _folder(tmp_path / "ok", [(Image.fromarray(values), "a.tif")])
    assert Image.open(root / "class0" / "a.tif").mode == "I"
    _assert_read_as(root, (values / 65535.0)[None])
    for name, bad in (("negative", -1), ("above", 70000)):
        wrong = values.copy()
        wrong[2, 2] = bad
        root = _folder(tmp_path / name, [(Image.fromarray(wrong), "a.tif")])
        with pytest.raises(InvalidParameterError) as info:
            load_data(str(root))
        message = str(info.value)
        assert "a.tif" in message and "0..65535" in message and "\n" not in message


def test_float_images_are_read_as_stored_and_non_finite_ones_refused(tmp_path):
    values = RNG.normal(0.3, 2.0, (6, 4)).astype(np.float32)
    values[0, 0] = 0.0  # the 73% of zeros a conversion to 8 bits made
    root = _folder(tmp_path / "ok", [(Image.fromarray(values), "a.tiff")])
    assert Image.open(root / "class0" / "a.tiff").mode == "F"
    x = _read(root)
    np.testing.assert_array_equal(x[0, 0], values)  # bit for bit
    assert (x == 0).mean() < 0.1
    for bad in (np.nan, np.inf):
        wrong = values.copy()
        wrong[1, 1] = bad
        root = _folder(tmp_path / str(bad), [(Image.fromarray(wrong), "a.tiff")])
        with pytest.raises(InvalidParameterError, match=r"a\.tiff' holds NaN or infinite"):
            load_data(str(root))


def test_a_palette_with_transparency_keeps_its_alpha_and_one_without_is_rgb(tmp_path):
    palette = RNG.integers(0, 256, (16, 3), dtype=np.uint8)
    index = RNG.integers(0, 16, (6, 5), dtype=np.uint8)
    index[0, 0] = 3
    image = Image.frombytes("P", (5, 6), index.tobytes())
    image.putpalette(palette.flatten().tolist())
    root = _folder(tmp_path / "opaque", [(image, "a.png")])
    _assert_read_as(root, (palette[index] / 255.0).transpose(2, 0, 1))
    image.info["transparency"] = 3
    root = _folder(tmp_path / "transparent", [(image, "a.png")])
    reopened = Image.open(root / "class0" / "a.png")
    assert reopened.mode == "P" and reopened.info.get("transparency") == 3
    alpha = np.where(index == 3, 0, 255)
    expected = np.concatenate([palette[index], alpha[..., None]], axis=2) / 255.0
    _assert_read_as(root, expected.transpose(2, 0, 1))


@pytest.mark.parametrize(("mode", "bands", "suffix"), [
    ("LA", 2, "png"), ("RGBA", 4, "png"), ("CMYK", 4, "tif"), ("RGB", 3, "bmp"),
    ("L", 1, "tif")])
def test_every_band_of_8_bit_modes_is_kept_over_255(tmp_path, mode, bands, suffix):
    values = RNG.integers(0, 256, (5, 6, bands), dtype=np.uint8)
    image = Image.frombytes(mode, (6, 5), values.tobytes())
    root = _folder(tmp_path, [(image, f"a.{suffix}")])
    stored = np.asarray(Image.open(root / "class0" / f"a.{suffix}").convert(mode))
    np.testing.assert_array_equal(stored.reshape(values.shape), values)
    _assert_read_as(root, (values / 255.0).transpose(2, 0, 1))


def test_one_bit_images_are_zero_or_one(tmp_path):
    bits = RNG.integers(0, 2, (4, 9)).astype(bool)
    image = Image.fromarray(bits.astype(np.uint8) * 255, mode="L").convert("1")
    root = _folder(tmp_path, [(image, "a.png")])
    assert Image.open(root / "class0" / "a.png").mode == "1"
    _assert_read_as(root, bits.astype(np.float32)[None])


@pytest.mark.parametrize(("first", "other"), [("L", "RGB"), ("RGB", "RGBA"), ("RGBA", "LA")])
def test_images_with_another_channel_count_are_refused_naming_the_file(tmp_path, first,
                                                                        other):
    root = _folder(tmp_path, [(Image.new(first, (4, 4)), "a.png"),
                              (Image.new(other, (4, 4)), "b.png")])
    with pytest.raises(InvalidParameterError) as info:
        load_data(str(root))
    message = str(info.value)
    assert "b.png" in message and "a.png" in message and "\n" not in message


@pytest.mark.parametrize("mode", ["LAB", "YCbCr"])
def test_an_unlisted_mode_is_refused_naming_it(tmp_path, mode):
    """Unlisted modes: a TIFF in CIELAB or YCbCr (no documented scale to [0, 1])."""
    root = _folder(tmp_path, [(Image.new(mode, (4, 4)), "a.tif")])
    assert Image.open(root / "class0" / "a.tif").mode == mode
    with pytest.raises(InvalidParameterError) as info:
        load_data(str(root))
    message = str(info.value)
    assert f"a.tif' has the image mode '{mode}'" in message and "\n" not in message


def _fake_ghostscript(tmp_path: Path, monkeypatch) -> Path:
    """A ``gs`` first on PATH that only leaves a marker file: proof that it ran."""
    marker = tmp_path / "gs-ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gs = bin_dir / "gs"
    gs.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n")
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return marker


EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n%%EndComments\n"
       b"0 0 moveto 8 8 lineto stroke\nshowpage\n%%EOF\n")


@pytest.mark.parametrize("name", ["evil.png", "evil.jpg"])
def test_an_eps_named_as_an_image_is_refused_and_ghostscript_never_runs(tmp_path, monkeypatch,
                                                                        name):
    marker = _fake_ghostscript(tmp_path, monkeypatch)
    root = _folder(tmp_path / "images", [(Image.new("L", (8, 8)), "a.png")])
    (root / "class1" / name).write_bytes(EPS)
    result = invoke("quantize", "mlp", "--bits", "8", "--data", str(root))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert name in lines[0] and "format" in lines[0] and "internal error" not in lines[0]
    assert not marker.exists()
    from PIL import EpsImagePlugin

    EpsImagePlugin.gs_binary = None  # found again on the PATH above
    with contextlib.suppress(Exception), Image.open(root / "class1" / name) as unrestricted:
        unrestricted.load()  # the control: Pillow unrestricted does launch "gs"
    assert marker.exists()


@pytest.mark.parametrize("data", [b"P5\n4 4\n255\n" + bytes(16), b"%PDF-1.4\n%%EOF\n"],
                         ids=["ppm", "pdf"])
def test_another_format_named_png_is_refused(tmp_path, data):
    """Unlisted: a PPM (a format Pillow reads, not listed) or a PDF named .png."""
    root = _folder(tmp_path, [(Image.new("L", (4, 4)), "a.png")])
    (root / "class1" / "b.png").write_bytes(data)
    with pytest.raises(InvalidParameterError, match=r"b\.png' is not a readable image of a "
                                                    r"format pathlift reads"):
        load_data(str(root))
