"""Covering numbers of fully connected networks with and without the permutation discount.

Slides "Complexity of deep neural networks from the perspective of functional
equivalence", Theorems 3 and 4: permuting hidden neurons leaves the function unchanged,
so the sup-norm covering number of F(1, d_0, ..., d_L, B) is divided by d_1! ... d_L!.
The numbers have hundreds of digits (128! ~ 10^215): everything is a natural log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pathlift.errors import InvalidParameterError
from pathlift.logspace import LN10


@dataclass(frozen=True)
class CoveringNumber:
    """log10 of a covering-number bound, with and without the d_1! ... d_L! discount."""

    theorem: str
    num_params: int
    log10: float
    log10_without_discount: float

    @property
    def discount_log10(self) -> float:
        """log10(d_1! ... d_L!), what functional equivalence saves."""
        return self.log10_without_discount - self.log10


def _log_factorial(d: int) -> float:
    return math.lgamma(d + 1)


def _check(widths: Sequence[int], B: float, B_x: float, eps: float) -> None:
    if any(int(w) != w or w <= 0 for w in widths):
        raise InvalidParameterError(f"widths must be positive integers, got {list(widths)}")
    if not (B > 0 and B_x > 0 and eps > 0):
        raise InvalidParameterError(f"need B, B_x, eps > 0, got {B}, {B_x}, {eps}")


def covering_shallow(d0: int, d1: int, B: float, B_x: float, eps: float,
                     rho: float = 1.0) -> CoveringNumber:
    """N(F, eps, ||.||_inf) <= (16 B^2 (B_x+1) sqrt(d0) d1 / eps)^S rho^{S_h} / d1!
    (slides, Theorem 3), S = d0 d1 + 2 d1 + 1, S_h = d0 d1 + d1; rho = 1 for ReLU."""
    _check((d0, d1), B, B_x, eps)
    S, S_h = d0 * d1 + 2 * d1 + 1, d0 * d1 + d1
    ln = S * math.log(16 * B**2 * (B_x + 1) * math.sqrt(d0) * d1 / eps) + S_h * math.log(rho)
    return CoveringNumber("slides Theorem 3", S, (ln - _log_factorial(d1)) / LN10, ln / LN10)


def covering_deep(widths: Sequence[int], B: float, B_x: float, eps: float,
                  rhos: Sequence[float] | None = None) -> CoveringNumber:
    """N(F, eps, ||.||_inf) <= (4 (L+1)(B_x+1)(2B)^{L+2} prod rho_j prod_{j=0}^L d_j / eps)^S
    / (d_1! ... d_L!) (slides, Theorem 4), widths = (d_0, ..., d_L), scalar output,
    S = sum_{i=0}^L (d_i d_{i+1} + d_{i+1}) with d_{L+1} = 1; rho_j = 1 for ReLU."""
    _check(widths, B, B_x, eps)
    L = len(widths) - 1
    if L < 1:
        raise InvalidParameterError("covering_deep needs d_0 and at least one hidden width")
    rhos = [1.0] * L if rhos is None else list(rhos)
    if len(rhos) != L or any(not r > 0 for r in rhos):
        raise InvalidParameterError(f"need {L} positive Lipschitz constants, got {rhos}")
    dims = [*widths, 1]
    S = sum(dims[i] * dims[i + 1] + dims[i + 1] for i in range(L + 1))
    base = (math.log(4 * (L + 1) * (B_x + 1)) + (L + 2) * math.log(2 * B)
            + sum(math.log(r) for r in rhos) + sum(math.log(d) for d in widths) - math.log(eps))
    ln = S * base
    discount = sum(_log_factorial(d) for d in widths[1:])
    return CoveringNumber("slides Theorem 4", S, (ln - discount) / LN10, ln / LN10)
