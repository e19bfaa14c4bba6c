"""Model classes of the master's thesis, Tables 4.1 (CIFAR10, d = 15) and 4.2 (C10k, d = 1).

A class fixes (d, alpha, gamma, learning-rate rule); a name such as ``C10k-B12c`` adds the
initialisation: suffix ``c`` constant (eq. 4.2), ``t`` truncated normal. CIFAR-10 is not
available offline: its Table 4.1 classes run on scikit-learn's digits as ``Digits-B11`` etc.
Every class is trained for T_L = ceil(5 log L) full-gradient-descent steps (natural log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pathlift.errors import InvalidParameterError

__all__ = ["CLASSES", "ModelClass", "parse_model"]


@dataclass(frozen=True)
class ModelClass:
    """One row of Table 4.1/4.2: eta = lr_factor * L^beta or lr_factor * L^(alpha - beta)."""

    name: str
    dataset: str
    d: int
    alpha: float
    gamma: float
    lr_factor: float
    lr_rule: str  # "beta" or "alpha-beta"
    activation: str = "tanh"

    @property
    def beta(self) -> float:
        """beta = 1 - alpha (alpha + beta = 1, Assumption 3.1.1 (iii))."""
        return 1.0 - self.alpha

    def learning_rate(self, depth: int) -> float:
        """The constant learning rate eta(L) of the class at depth L."""
        exponent = self.beta if self.lr_rule == "beta" else self.alpha - self.beta
        return self.lr_factor * depth**exponent

    @staticmethod
    def steps(depth: int) -> int:
        """T_L = ceil(5 log L), natural logarithm."""
        return math.ceil(5.0 * math.log(depth))


def _rows(dataset: str, d: int, table: str) -> dict[str, ModelClass]:
    rows = {}
    for line in table.strip().splitlines():
        key, alpha, gamma, factor, rule = line.split()
        name = f"{dataset}-{key}"
        rows[name] = ModelClass(name, dataset, d, float(alpha), float(gamma), float(factor), rule)
    return rows


# key alpha gamma lr_factor lr_rule  (Table 4.2, C10k, d = 1)
_C10K = """
B11 0.975 1 1 beta
B12 0.975 1 100 beta
B13 0.975 1 1 alpha-beta
B21 0.75 1 1 beta
B22 0.75 1 20 beta
B23 0.75 1 20 alpha-beta
B31 0.5 1 1 beta
B32 0.5 1 0.01 beta
B33 0.5 1 1 alpha-beta
C11 0.25 1 1 beta
C12 0.25 1 0.01 beta
C13 0.25 1 1 alpha-beta
C21 0.49 2 1 beta
C22 0.49 2 0.01 beta
C23 0.49 2 1 alpha-beta
"""
# Table 4.1 (CIFAR10 in the thesis, d = 15), run here on the digits.
_DIGITS = """
B11 0.975 1 100 beta
B12 0.975 1 1 alpha-beta
B21 0.75 1 20 beta
B22 0.75 1 1 alpha-beta
B31 0.5 1 1 beta
B32 0.5 1 0.01 beta
B33 0.5 1 1 alpha-beta
C11 0.25 1 1 beta
C12 0.25 1 1 alpha-beta
C21 0.49 2 1 beta
C22 0.49 2 1 alpha-beta
"""
CLASSES: dict[str, ModelClass] = {**_rows("C10k", 1, _C10K), **_rows("Digits", 15, _DIGITS)}
_INITS = {"c": "constant", "t": "truncated"}


def parse_model(name: str) -> tuple[ModelClass, str]:
    """``"C10k-B12c"`` -> (the C10k-B12 class, "constant"); suffix ``t`` -> "truncated"."""
    base, suffix = name[:-1], name[-1:]
    if base not in CLASSES or suffix not in _INITS:
        hint = " (CIFAR10 classes run on the digits: use Digits-...)" if "CIFAR" in name else ""
        raise InvalidParameterError(
            f"unknown depth model {name!r}{hint}: use a class of Tables 4.1/4.2 followed by "
            f"c (constant init) or t (truncated normal), e.g. C10k-B12c; classes: "
            f"{', '.join(CLASSES)}")
    return CLASSES[base], _INITS[suffix]
