"""The exponents and mantissa precision every path-lifting quantity takes, checked in one
place: q of |theta|^q (thesis Def. 3.1.1: q in (0, inf); q >= 1 where |w|^q must be
differentiable at 0 or a norm; q = inf for the max-normalisation of Alg. 3.2.1), the outer
exponent r in (0, inf], and a floating dtype for mantissas. Each raises
``InvalidParameterError`` naming the value; none imports torch's engine or the graph."""

from __future__ import annotations

import math
import numbers
import warnings

import torch

from pathlift.errors import InvalidParameterError


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_q(q: object, minimum: float = 0.0, infinite: bool = False, what: str = "") -> float:
    """``q`` as a float if it is a real number in (0, inf) (in [minimum, inf) when
    ``minimum`` > 0, inf included when ``infinite``), else InvalidParameterError saying
    the domain, followed by ``what`` (" for a differentiable path-norm")."""
    value = _real("q", q)
    low_ok = value >= minimum if minimum > 0 else value > 0
    if not (low_ok and (math.isfinite(value) or (infinite and value == math.inf))):
        low = f"[{minimum:g}" if minimum > 0 else "(0"
        raise InvalidParameterError(
            f"q must be in {low}, inf{']' if infinite else ')'}{what}, got {q}")
    return value


def check_r(r: object) -> float:
    """``r`` as a float if it is a real number in (0, inf], else InvalidParameterError."""
    value = _real("r", r)
    if not value > 0:
        raise InvalidParameterError(f"r must be in (0, inf], got {r}")
    return value


def check_exponents(q: object, r: object) -> None:
    """InvalidParameterError unless q in (0, inf) and r in (0, inf], both real numbers."""
    _real("q", q)
    _real("r", r)
    check_q(q)
    check_r(r)


_HALF = (torch.float16, torch.bfloat16)


def check_dtype(dtype: torch.dtype) -> None:
    """Mantissas must be floating point; half precision works but costs accuracy."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InvalidParameterError(
            f"dtype must be a floating torch dtype (float64, float32), got {dtype!r}")
    if dtype in _HALF:
        warnings.warn(f"{dtype} mantissas keep 3 significant digits or fewer: path-norms "
                      "of real networks come out 0.2-4% off; use float32 (~1e-6) or float64",
                      stacklevel=3)


#: The largest q for which q * ln|w| is a finite float64 for every non-zero float64 w
#: (|ln|w|| <= 1074 ln 2, at the smallest subnormal): the |theta|^q pass of Thm 3.1.1
#: carries |w|^q as q * ln|w| in log space, so above it that exponent arithmetic overflows.
LOG_SPACE_Q_MAX = torch.finfo(torch.float64).max / (1074 * math.log(2.0))
