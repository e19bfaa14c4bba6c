"""The training sample a certificate is computed on: checked at the certificate's entry
(finite inputs, integer labels in range), its exact duplicates counted, and the error of
the best constant classifier on its labels (chance).

Every certificate of ``pathlift.bounds`` (Occam, ``pathlift.bounds.kl``; Thm 4.1.2) holds
for n samples drawn i.i.d.; pathlift cannot check independence, but it reports the
duplicates it sees: a sample passed twice is not 2n independent draws (it only shrinks
the budget term 1/n by a factor the data do not give).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pathlift.bounds.duplicates import duplicates, row_hashes
from pathlift.bounds.sample import Batches, as_batches
from pathlift.errors import InvalidParameterError

__all__ = ["Sample", "chance_error", "chance_rule", "check_sample"]


@dataclass(frozen=True)
class Sample:
    """What a certificate states about its training sample: ``n`` points, ``duplicates``
    of them exact copies (input and label) of an earlier one, and ``chance``: the training
    error of the best constant classifier, 1 - max_c (count of class c) / n over the
    ``classes`` seen (1 - 1/C exactly when the C classes are balanced)."""

    n: int
    duplicates: int
    classes: int
    chance: float
    balanced: bool

    @property
    def rule(self) -> str:
        return chance_rule(self.classes, self.balanced)

    def statement(self) -> str:
        """The sentence every certificate carries about its sample."""
        dup = ("no exact duplicates" if not self.duplicates else
               f"{self.duplicates} exact duplicate(s) of earlier points, which an i.i.d. "
               "sample of a continuous distribution would not hold")
        return f"valid if the n = {self.n} samples are drawn i.i.d. ({dup})"


def chance_rule(classes: int, balanced: bool) -> str:
    """How chance was computed, in words (what every verdict prints beside it)."""
    return (f"1 - 1/C, C = {classes} balanced classes" if balanced else
            f"1 - max class frequency of the training labels, {classes} classes")


def chance_error(y: Tensor) -> tuple[float, int, bool]:
    """(1 - max class frequency of ``y``, the number of classes seen, whether they are all
    equally frequent): the error of the best constant classifier on these labels."""
    return _chance(torch.bincount(y.reshape(-1).to(torch.int64)))


def _chance(counts: Tensor) -> tuple[float, int, bool]:
    """``chance_error`` from the count of each label."""
    counts = counts[counts > 0]
    if not counts.numel():
        return 1.0, 0, True
    top = int(counts.max())
    return 1.0 - top / int(counts.sum()), int(counts.numel()), bool((counts == top).all())


def check_sample(x: Tensor | Batches | Any, y: Tensor | None = None,
                 outputs: int | None = None) -> Sample:
    """``Sample`` of (x, y), or InvalidParameterError naming what to fix: x must be a
    non-empty floating tensor of finite values (NaN/inf inputs compare false with every
    margin and once counted as correct), y one integer label per input in [0, ``outputs``)
    (the network's number of logits, when given).

    x may also be the whole sample in batches (``pathlift.bounds.sample.Batches``, or what
    it takes: a Dataset, a DataLoader, a list of (x, y) batches; y None): one pass over
    it, memory of a batch and 8 bytes a row (``duplicates``), counts all-reduced over the
    ranks of a sharded sample, the same ``Sample`` as its rows in one tensor."""
    data = as_batches(x, y)
    problems: list[tuple[int, str]] = []
    like: tuple | None = None
    classes = torch.zeros(outputs or 0, dtype=torch.int64)
    hashes = []
    stats = torch.zeros(2, dtype=torch.int64)  # rows, rows holding NaN/inf
    first = torch.full((2,), _NONE, dtype=torch.int64)  # first NaN/inf row, negative label
    top = torch.tensor([-1], dtype=torch.int64)  # the largest label
    for start, xb, yb in data:
        problem = _malformed(xb, yb, like)
        if problem:
            problems.append((start, f"the batch at row {start}: {problem}" if start
                             else problem))
            break
        like = (tuple(xb.shape[1:]), xb.dtype)
        bad = ~torch.isfinite(xb.reshape(len(xb), -1)).all(1)
        stats += torch.tensor([len(xb), int(bad.sum())])
        for i, mask in enumerate((bad, yb < 0)):
            if bool(mask.any()):
                first[i] = min(int(first[i]), start + int(mask.nonzero()[0]))
        yl = yb.to(torch.int64)
        top[0] = max(int(top[0]), int(yl.max()))
        counts = torch.bincount(yl.clamp(min=0))
        if len(counts) > len(classes):
            classes = torch.cat([classes, classes.new_zeros(len(counts) - len(classes))])
        classes[:len(counts)] += counts
        hashes.append(row_hashes(xb, yb))
    reported = [p for rank in data.world.gather(problems) for p in rank]
    if reported:
        raise InvalidParameterError(min(reported)[1])
    if len({like for like in data.world.gather(like) if like is not None}) > 1:
        raise InvalidParameterError("the ranks hold inputs of different shapes or dtypes")
    n, bad = data.world.reduce(stats).tolist()
    data.check_rows(n)
    first_bad, first_negative = data.world.reduce(first, "min").tolist()
    largest = int(data.world.reduce(top, "max"))
    if not n:
        raise InvalidParameterError("x and y must hold one label per input and at least one "
                                    "sample, got an empty sample")
    if bad:
        raise InvalidParameterError(
            f"x holds NaN/inf in {bad} of {n} samples (first: index {first_bad}); drop or "
            "impute them before certifying")
    if first_negative != _NONE:
        raise InvalidParameterError(f"y holds negative labels (first: index "
                                    f"{first_negative}); labels are 0..C-1")
    if outputs is not None and largest >= outputs:
        raise InvalidParameterError(f"y holds label {largest} but the network has "
                                    f"{outputs} outputs; labels must be 0..{outputs - 1}")
    width = int(data.world.reduce(torch.tensor([len(classes)]), "max"))
    classes = data.world.reduce(torch.cat([classes, classes.new_zeros(width - len(classes))]))
    chance, seen, balanced = _chance(classes)
    return Sample(n, duplicates(data, torch.cat(hashes) if hashes else
                                torch.zeros(0, dtype=torch.int64)), seen, chance, balanced)


_NONE = 2 ** 62  # no such row


def _malformed(x: Tensor, y: Tensor, like: tuple | None) -> str:
    """What is wrong with one batch's types and shapes ("" when nothing)."""
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        return "x and y must be tensors (inputs, integer labels)"
    if not len(x) or len(x) != len(y) or y.dim() != 1:
        return (f"x and y must hold one label per input and at least one sample, got x "
                f"{tuple(x.shape)} and y {tuple(y.shape)}")
    if not torch.is_floating_point(x):
        return f"x must be a floating tensor, got {x.dtype}"
    if torch.is_floating_point(y) or y.dtype == torch.bool or torch.is_complex(y):
        return f"y must hold integer class labels, got {y.dtype}"
    if like is not None and (tuple(x.shape[1:]), x.dtype) != like:
        return (f"inputs of shape {tuple(x.shape[1:])} and {x.dtype}, after inputs of shape "
                f"{like[0]} and {like[1]}: every row of a sample has one shape and dtype")
    return ""
