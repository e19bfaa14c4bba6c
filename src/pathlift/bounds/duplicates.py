"""Exact duplicates of a sample in bounded memory: the rows (x, y) equal, bit for bit, to
an earlier row, counted by hashing with an exact re-check.

One pass hashes every row to 64 bits (``row_hashes``: the splitmix64 finaliser, a
bijection of 64-bit words, on each word of the row's bytes plus its position, summed and
mixed again); the hashes of the whole sample (8 bytes a row, gathered from every rank)
give the number of distinct hashes. A hash held by one row is one distinct row. Only for
the hashes held by several rows does a second pass read those rows and count their
distinct byte strings exactly, so a hash collision never merges two different rows:
memory 8 bytes a row plus one copy of each distinct row whose hash repeats (none for a
sample without duplicates, as an i.i.d. sample of a continuous distribution is).
"""

from __future__ import annotations

import torch
from torch import Tensor

from pathlift.bounds.sample import Batches

__all__ = ["duplicates", "row_hashes"]

_M1 = 0xBF58476D1CE4E5B9 - 2 ** 64  # splitmix64's constants, as signed int64
_M2 = 0x94D049BB133111EB - 2 ** 64
_GOLDEN = 0x9E3779B97F4A7C15 - 2 ** 64


def _shift(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: Tensor) -> Tensor:
    """splitmix64's finaliser (Steele, Lea & Flood 2014), int64 arithmetic wrapping."""
    z = (z ^ _shift(z, 30)) * _M1
    z = (z ^ _shift(z, 27)) * _M2
    return z ^ _shift(z, 31)


def _words(x: Tensor, y: Tensor) -> Tensor:
    """Each row's bytes (x in its dtype, -0.0 and 0.0 apart, then y as int64) as int64
    words, zero-padded: (rows, words)."""
    raw = x.detach().contiguous().reshape(len(x), -1).view(torch.uint8)
    words = torch.nn.functional.pad(raw, (0, -raw.shape[1] % 8)).view(torch.int64)
    return torch.cat([words, y.detach().to(torch.int64).reshape(-1, 1)], 1)


def row_hashes(x: Tensor, y: Tensor) -> Tensor:
    """A 64-bit hash (int64) of each row (x, y): equal rows hash equal."""
    words = _words(x, y)
    position = torch.arange(1, words.shape[1] + 1, dtype=torch.int64) * _GOLDEN
    return _mix(_mix(words + position).sum(1))


def duplicates(data: Batches, hashes: Tensor) -> int:
    """The number of rows of ``data`` equal to an earlier row, given ``hashes``, this
    rank's ``row_hashes`` (module docstring), the same on every rank."""
    every = torch.cat(data.world.gather(hashes))
    values, counts = torch.unique(every, return_counts=True)
    shared = values[counts > 1]
    if not len(shared):
        return len(every) - len(values)
    seen: dict[int, set[bytes]] = {}
    for _, x, y in data:
        h = row_hashes(x, y)
        hit = torch.isin(h, shared).nonzero().reshape(-1)
        if len(hit):
            words = _words(x[hit], y[hit])
            for key, row in zip(h[hit].tolist(), words, strict=True):
                seen.setdefault(key, set()).add(row.numpy().tobytes())
    merged: dict[int, set[bytes]] = {}
    for rank in data.world.gather(seen):
        for key, rows in rank.items():
            merged.setdefault(key, set()).update(rows)
    distinct = len(values) - len(shared) + sum(len(rows) for rows in merged.values())
    return len(every) - distinct
