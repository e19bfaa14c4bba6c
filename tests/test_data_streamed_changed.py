"""A streamed .npz (``pathlift.data.load_streamed``) changed after its checks is refused
in one line at the next read, never read as other numbers: rows overwritten in place
(same size, same layout), the file cut short, or replaced by another one at the same
path; an unchanged file reads back bit for bit, in any order and any number of times."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pathlift.data import load_streamed
from pathlift.errors import InvalidParameterError


def _write(path, x, y) -> None:
    np.savez(path, x=x, y=y)


def _read_all(part) -> torch.Tensor:
    return torch.stack([x for x, _ in part.__getitems__(list(range(len(part))))])


@pytest.fixture
def stored(tmp_path):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(97, 3, 5)).astype(np.float32), rng.integers(0, 3, 97)
    _write(tmp_path / "d.npz", x, y)
    return tmp_path / "d.npz", x, y


def test_an_unchanged_file_reads_the_same_rows_every_pass(stored):
    path, x, _ = stored
    split = load_streamed(str(path), seed=2)
    first = _read_all(split.train)
    order = list(range(len(split.train)))[::-1]
    again = torch.stack([r for r, _ in split.train.__getitems__(order)])
    assert torch.equal(first, again.flip(0)) and torch.equal(first, _read_all(split.train))
    rows = sorted(torch.cat([split.train.index, split.test.index]).tolist())
    assert rows == list(range(len(x)))  # every row of the file is in one part


@pytest.mark.parametrize("how", ["one value", "one bit", "a row swapped", "replaced"])
def test_a_file_changed_after_its_checks_is_refused_in_one_line(stored, how):
    path, x, y = stored
    split = load_streamed(str(path), seed=2)
    changed = x.copy()
    if how == "one value":
        changed[int(split.train.index[5])] = changed[int(split.train.index[5])] + 1.0
    elif how == "one bit":
        flat = changed.view(np.uint32).reshape(len(x), -1)
        flat[int(split.train.index[7]), 4] ^= 1  # the last mantissa bit of one value
    elif how == "a row swapped":
        a, b = int(split.train.index[0]), int(split.train.index[1])
        changed[[a, b]] = changed[[b, a]]
    if how == "replaced":  # another file at the same path, same size and layout
        os.replace(_other(path, x * 2, y), path)
    else:  # the same file, written in place: same size, same offsets
        data = path.read_bytes()
        start = data.index(x.tobytes())
        with open(path, "r+b") as fh:
            fh.seek(start)
            fh.write(changed.tobytes())
    with pytest.raises(InvalidParameterError) as info:
        _read_all(split.train)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "changed after it was checked" \
        in message


def _other(path, x, y):
    other = path.with_name("other.npz")
    _write(other, x, y)
    return other


def test_a_file_cut_short_is_refused_before_the_short_row(stored):
    path, x, _ = stored
    split = load_streamed(str(path), seed=2)
    with open(path, "r+b") as fh:  # inside the inputs: half of them are gone
        fh.truncate(path.read_bytes().index(x.tobytes()) + x.nbytes // 2)
    with pytest.raises(InvalidParameterError, match="changed after it was checked"):
        _read_all(split.train)
