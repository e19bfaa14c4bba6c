"""One line saying whether a bound on a top-1 error says anything: against 1 (a
probability) and against chance, the error of the best constant classifier on the data's
classes (1 - the largest class frequency of the training labels; 1 - 1/C when the C
classes are balanced). A bound at or above chance certifies nothing a constant guess
would not: it is not "informative" even when it is below 1.

Every bound is printed with as many decimals as it takes to stay on its side of 1 and of
chance (``format_bound``): 0.99999994 prints 0.99999994, never 1.0000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from pathlift.bounds.entry import chance_error, chance_rule
from pathlift.logspace import power10

__all__ = ["Verdict", "format_bound", "judge", "verdict"]


@dataclass(frozen=True)
class Verdict:
    """A bound on a top-1 error judged against 1 and against ``chance`` (None when no
    labels were given: then only against 1). ``rule`` says how chance was computed."""

    log10_bound: float
    chance: float | None = None
    rule: str = ""
    measured: float | None = None

    @property
    def bound(self) -> float:
        return power10(self.log10_bound)

    @property
    def below_one(self) -> bool:
        return self.log10_bound < 0

    @property
    def beats_chance(self) -> bool:
        """Below chance (and so below 1); False when chance is unknown."""
        return self.chance is not None and self.bound < self.chance

    @property
    def informative(self) -> bool:
        """Below chance when chance is known, else below 1."""
        return self.beats_chance if self.chance is not None else self.below_one

    def __str__(self) -> str:
        against = "" if self.measured is None else f" (measured {self.measured:.4f})"
        shown, chance = format_bound(self.log10_bound, self.chance)
        if self.chance is None:
            if self.below_one:
                return (f"informative: {shown} < 1, {-self.log10_bound:.2f} orders below 1, "
                        f"not judged against chance (no labels){against}")
            return f"not informative: {shown} >= 1, {self.log10_bound:.2f} orders above 1" \
                + against
        if self.beats_chance:
            return (f"beats chance: {shown} < chance {chance} ({self.rule}) by "
                    f"{self.chance - self.bound:.4g}{against}")
        if self.below_one:
            return (f"not informative: {shown} < 1 but >= chance {chance} ({self.rule}), "
                    f"no better than a constant guess{against}")
        return (f"not informative: {shown} >= 1 > chance {chance} ({self.rule}), "
                f"{self.log10_bound:.2f} orders above 1{against}")


def judge(log10_bound: float, labels: Tensor | None = None, measured: float | None = None,
          *, chance: float | None = None, rule: str = "") -> Verdict:
    """The ``Verdict`` on a top-1 error bound given by its log10: against chance computed
    from the training ``labels`` (1 - max class frequency), or a ``chance`` (and its
    ``rule``) given directly, and against 1; ``measured`` is the test error it bounds.

    Example::

        v = judge(math.log10(cert.value), y_train, test_error)
        print(v)                     # "beats chance: 0.2750 < chance 0.9000 (...)"
    """
    if labels is not None:
        chance, classes, balanced = chance_error(labels)
        rule = chance_rule(classes, balanced)
    return Verdict(log10_bound, chance, rule, measured)


def verdict(log10_bound: float, measured: float | None = None, *,
            labels: Tensor | None = None, chance: float | None = None,
            rule: str = "") -> str:
    """``str(judge(...))``: "beats chance: 0.2750 < chance 0.9000 (...)", "not
    informative: 0.9688 < 1 but >= chance 0.9000 ...", or, with neither labels nor chance,
    the verdict against 1 alone."""
    return str(judge(log10_bound, labels, measured, chance=chance, rule=rule))


def format_bound(log10: float, chance: float | None = None) -> tuple[str, str]:
    """(10^log10, ``chance``) printed to 4 decimals (4 significant digits below 0.001), or
    as many more as it takes for the printed numbers to compare with each other and with
    1 as the numbers do (0.99999994 prints so, never 1.0000); the bound as "10^x.xx" from
    1000 on or below float64's range, "inf" beyond. ``chance`` prints "" when None."""
    if math.isinf(log10) or log10 >= 3 or power10(log10) == 0:
        shown = "inf" if log10 == math.inf else "0" if log10 == -math.inf else \
            f"10^{log10:.2f}"
        return shown, "" if chance is None else _rounded(chance, 4)
    value = power10(log10)
    pairs = [(value, 1.0)] + ([] if chance is None else [(value, chance), (chance, 1.0)])
    for digits in range(4, 40):
        if all(_same_order(a, b, digits) for a, b in pairs):
            break
    return _rounded(value, digits), "" if chance is None else _rounded(chance, digits)


def _rounded(value: float, digits: int) -> str:
    """value to ``digits`` decimals, or ``digits`` significant digits below 0.001."""
    return f"{value:.{digits - 1}e}" if 0 < value < 1e-3 else f"{value:.{digits}f}"


def _same_order(a: float, b: float, digits: int) -> bool:
    """Whether a and b, printed, compare as the numbers do."""
    x, y = (float(_rounded(v, digits)) for v in (a, b))
    return (x < y) == (a < b) and (x == y) == (a == b)
