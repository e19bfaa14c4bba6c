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

import torch
from torch import Tensor

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
    counts = torch.bincount(y.reshape(-1).to(torch.int64))
    counts = counts[counts > 0]
    if not counts.numel():
        return 1.0, 0, True
    top = int(counts.max())
    return 1.0 - top / int(counts.sum()), int(counts.numel()), bool((counts == top).all())


def check_sample(x: Tensor, y: Tensor, outputs: int | None = None) -> Sample:
    """``Sample`` of (x, y), or InvalidParameterError naming what to fix: x must be a
    non-empty floating tensor of finite values (NaN/inf inputs compare false with every
    margin and once counted as correct), y one integer label per input in [0, ``outputs``)
    (the network's number of logits, when given)."""
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise InvalidParameterError("x and y must be tensors (inputs, integer labels)")
    if not len(x) or len(x) != len(y) or y.dim() != 1:
        raise InvalidParameterError(f"x and y must hold one label per input and at least one "
                                    f"sample, got x {tuple(x.shape)} and y {tuple(y.shape)}")
    if not torch.is_floating_point(x):
        raise InvalidParameterError(f"x must be a floating tensor, got {x.dtype}")
    bad = ~torch.isfinite(x.reshape(len(x), -1)).all(1)
    if bool(bad.any()):
        raise InvalidParameterError(
            f"x holds NaN/inf in {int(bad.sum())} of {len(x)} samples (first: index "
            f"{int(bad.nonzero()[0])}); drop or impute them before certifying")
    if torch.is_floating_point(y) or y.dtype == torch.bool or torch.is_complex(y):
        raise InvalidParameterError(f"y must hold integer class labels, got {y.dtype}")
    if bool((y < 0).any()):
        raise InvalidParameterError(f"y holds negative labels (first: index "
                                    f"{int((y < 0).nonzero()[0])}); labels are 0..C-1")
    if outputs is not None and bool((y >= outputs).any()):
        raise InvalidParameterError(f"y holds label {int(y.max())} but the network has "
                                    f"{outputs} outputs; labels must be 0..{outputs - 1}")
    chance, classes, balanced = chance_error(y)
    return Sample(len(x), _duplicates(x, y), classes, chance, balanced)


def _duplicates(x: Tensor, y: Tensor) -> int:
    """The number of (x, y) pairs equal, bit for bit, to an earlier pair (-0.0 and 0.0
    differ there, as they are different draws)."""
    raw = x.detach().contiguous().reshape(len(x), -1).view(torch.uint8)
    pad = -raw.shape[1] % 8  # whole int64 words: unique sorts 8 times fewer columns
    words = torch.nn.functional.pad(raw, (0, pad)).view(torch.int64)
    rows = torch.cat([words, y.detach().to(torch.int64).reshape(-1, 1)], 1)
    return len(x) - int(torch.unique(rows, dim=0).shape[0])
