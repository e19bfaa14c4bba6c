"""Uniform scalar quantisation of one tensor: integer codes times a step (thesis Sec. 6.1).

The thesis' quantiser is Q_eta(x) = floor(x / eta) * eta (Sec. 6.1, Thm 6.1.1). Three
roundings of x / eta to an integer code are offered:

- ``"zero"`` (truncation): keeps every sign and |Q(x)| <= |x|, the two hypotheses under
  which the l1 path-metric d(theta, Q(theta)) is exact in two forward passes (Lemma 3.4.1)
  and certifies the output error (Cor. 3.4.1);
- ``"nearest"``: the rounding of Thm 6.1.1; keeps signs, not magnitudes;
- ``"down"``: the floor of Q_eta as written in Sec. 6.1; keeps signs, not magnitudes.

The dequantised tensor is ``codes.to(dtype) * step`` computed in the tensor's own dtype, so
the integer codes and the step reproduce the quantised weights bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from pathlift.errors import InvalidParameterError


class Rounding(StrEnum):
    """How x / eta becomes an integer code."""

    ZERO = "zero"
    NEAREST = "nearest"
    DOWN = "down"


def as_rounding(value: Rounding | str) -> Rounding:
    """``value`` as a Rounding; InvalidParameterError naming the choices otherwise."""
    try:
        return Rounding(value)
    except ValueError:
        raise InvalidParameterError(
            f"rounding must be one of {[r.value for r in Rounding]}, got {value!r}") from None


_ROUND = {Rounding.ZERO: torch.trunc, Rounding.NEAREST: torch.round, Rounding.DOWN: torch.floor}


@dataclass(frozen=True)
class QuantizedTensor:
    """Integer ``codes`` and the ``step`` they multiply (a scalar, or one step per slice
    along ``channel_dim``); ``bits`` is the signed code width, None for a free step."""

    codes: Tensor
    step: Tensor
    channel_dim: int | None
    bits: int | None

    def dequantize(self) -> Tensor:
        """codes * step, in the dtype of ``step`` (the quantised weights exactly)."""
        return self.codes.to(self.step.dtype) * _broadcast(self.step, self.codes.dim(),
                                                            self.channel_dim)


def max_code(bits: int) -> int:
    """Largest code magnitude of a symmetric signed ``bits``-bit grid: 2^(bits-1) - 1."""
    if not (isinstance(bits, int) and 2 <= bits <= 32):
        raise InvalidParameterError(f"bits must be an integer in [2, 32], got {bits!r}")
    return 2 ** (bits - 1) - 1


def quantize_tensor(t: Tensor, *, bits: int | None = None, step: float | None = None,
                    rounding: Rounding | str = Rounding.ZERO,
                    channel_dim: int | None = None) -> QuantizedTensor:
    """Uniform quantisation of ``t`` on the grid step * Z (thesis Sec. 6.1).

    Give exactly one of ``bits`` (step = max|t| / (2^(bits-1) - 1) over the whole tensor,
    or over each slice along ``channel_dim``; codes fit in ``bits`` signed bits) and
    ``step`` (a fixed eta, codes unbounded). With ``rounding="zero"`` the result satisfies
    sign(Q(t)) = sign(t) or 0 and |Q(t)| <= |t| exactly in the dtype of ``t``.
    """
    rounding = as_rounding(rounding)
    if (bits is None) == (step is None):
        raise InvalidParameterError("give exactly one of bits and step")
    if not t.is_floating_point():
        raise InvalidParameterError(f"cannot quantise a tensor of dtype {t.dtype}")
    if step is not None:
        if not step > 0:
            raise InvalidParameterError(f"step must be positive, got {step}")
        eta = torch.tensor(float(step), dtype=t.dtype, device=t.device)
        if channel_dim is not None:
            eta = eta.expand(t.shape[channel_dim]).clone()
        lo, hi = None, None
    else:
        top = max_code(bits)
        amax = _amax(t.detach(), channel_dim)
        eta = torch.where(amax > 0, amax / top, torch.ones_like(amax)).to(t.dtype)
        lo, hi = -top - 1, top
    view = _broadcast(eta, t.dim(), channel_dim)
    exact = t.detach().double() / view.double()
    codes = _ROUND[rounding](exact)
    if bits is not None:
        codes = codes.clamp(lo, hi)
    if rounding is Rounding.ZERO:
        codes = _shrink_past_magnitude(codes, t.detach(), view)
    return QuantizedTensor(codes.to(_code_dtype(codes)), eta, channel_dim, bits)


def _shrink_past_magnitude(codes: Tensor, t: Tensor, view: Tensor) -> Tensor:
    """Move a code one step towards zero where codes * step, rounded to t's dtype, exceeds
    |t|: floating-point rounding of the product must not break |Q(t)| <= |t|."""
    def over(c: Tensor) -> Tensor:
        return (c.to(t.dtype) * view).abs() > t.abs()

    codes = torch.where(over(codes), codes - codes.sign(), codes)
    if not over(codes).any():
        return codes
    raise InvalidParameterError(
        f"step {float(view.min()):.3g} is below the resolution of {t.dtype} at weights of "
        f"magnitude {float(t.abs().max()):.3g}; use a larger step")


def _amax(t: Tensor, channel_dim: int | None) -> Tensor:
    if channel_dim is None:
        return t.abs().max() if t.numel() else t.new_zeros(())
    return t.abs().transpose(0, channel_dim).reshape(t.shape[channel_dim], -1).amax(dim=1)


def _broadcast(step: Tensor, ndim: int, channel_dim: int | None) -> Tensor:
    if channel_dim is None or step.dim() == 0:
        return step
    shape = [1] * ndim
    shape[channel_dim] = -1
    return step.reshape(shape)


def _code_dtype(codes: Tensor) -> torch.dtype:
    """The narrowest signed integer dtype holding every code."""
    low, high = (int(codes.min()), int(codes.max())) if codes.numel() else (0, 0)
    for dtype in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return torch.int64
