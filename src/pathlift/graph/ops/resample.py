"""Resampling and padding: fixed linear maps of each channel (thesis Def. 2.2.2: identity
neurons with fixed weights, like average pooling).

Interpolation (``F.interpolate`` / ``nn.Upsample`` in every mode: nearest, linear,
bilinear, bicubic, trilinear, area, with or without ``align_corners`` and antialiasing,
by size or scale factor) is separable: along each spatial axis, output o reads inputs i
with weight P_axis[o, i], and the map is the tensor product of the P_axis. Each P_axis is
read off torch's own op, by running it on inputs that vary along that axis only (the
weights of every mode sum to one along the other axes), so the weights are torch's to the
last bit. Padding copies inputs (reflect, replicate, circular: weight 1) or adds neurons
without antecedents (zeros).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pathlift.graph.ops.base import Call, register
from pathlift.graph.ops.pooling import FixedLinear, ZeroOneMap

_AXES = "pathlift_axes"  # node.meta key of the per-axis weight matrices


class InterpolateHandler(FixedLinear):
    """Upsampling / interpolation of the spatial dims, one channel at a time."""

    family = "resampling"

    def problem(self, call: Call) -> str | None:
        x = call.args[0]
        if x.dim() < 3:
            return "interpolation needs (batch, channels, spatial...) inputs"
        return None

    def axes(self, call: Call) -> list[Tensor]:
        """P_axis (out x in, float64) for every spatial axis, cached on the node."""
        cached = call.node.meta.get(_AXES)
        x = call.args[0]
        key = (tuple(x.shape[2:]), x.device)
        if cached is not None and cached[0] == key:
            return cached[1]
        spatial = tuple(x.shape[2:])
        with torch.no_grad():
            mats = [self._axis(call, spatial, axis, x.device) for axis in range(len(spatial))]
        call.node.meta[_AXES] = (key, mats)
        return mats

    @staticmethod
    def _axis(call: Call, spatial: tuple[int, ...], axis: int, device: torch.device) -> Tensor:
        """P_axis from one run on the basis of that axis, constant along the others (of
        size 1 when the op accepts it: a downsampling scale factor may need them whole)."""
        n = spatial[axis]
        basis = torch.eye(n, dtype=torch.float64, device=device)
        for others in (1, None):
            shape = [n, 1] + [n if a == axis else (others or s) for a, s in enumerate(spatial)]
            view = [n, 1] + [n if a == axis else 1 for a in range(len(spatial))]
            try:
                out = call.run(basis.reshape(view).expand(shape).contiguous())
            except RuntimeError:
                if others is None:
                    raise
                continue
            index = [slice(None), 0] + [slice(None) if a == axis else 0
                                        for a in range(len(spatial))]
            return out[tuple(index)].t().contiguous()  # (out, in)
        raise AssertionError("unreachable")

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        """|P|^q x = (|P_1|^q (x) ... (x) |P_d|^q) x, each |P_a| divided by its largest entry."""
        log_scale = 0.0
        y = x
        for axis, mat in enumerate(self.axes(call)):
            top = float(mat.abs().max())
            weights = (mat.abs() / top).pow(q).to(x.dtype)
            log_scale += q * math.log(top)
            y = torch.tensordot(y, weights, dims=([axis + 2], [1])).movedim(-1, axis + 2)
        return y, log_scale

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        y = x
        for axis, mat in enumerate(self.axes(call)):
            support = (mat != 0).to(x.dtype)  # out x in
            moved = y.movedim(axis + 2, -1).unsqueeze(-2)  # (..., 1, in)
            masked = torch.where(support.bool(), moved, torch.zeros((), dtype=x.dtype))
            y = masked.amax(dim=-1).movedim(-1, axis + 2)
        return y


class PadHandler(FixedLinear):
    """``F.pad`` and the padding modules: zeros (constant 0), reflect, replicate, circular."""

    family = "resampling"

    def _mode_value(self, call: Call) -> tuple[str, float]:
        module = call.module
        if module is None:
            return call.arg(2, "mode", "constant"), call.arg(3, "value", 0.0) or 0.0
        if isinstance(module, (nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d)):
            return "reflect", 0.0
        if isinstance(module, (nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d)):
            return "replicate", 0.0
        if isinstance(module, (nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d)):
            return "circular", 0.0
        return "constant", float(module.value)

    @staticmethod
    def _pad(call: Call) -> tuple[int, ...]:
        return tuple(call.module.padding if call.module is not None else call.arg(1, "pad"))

    def problem(self, call: Call) -> str | None:
        mode, value = self._mode_value(call)
        if mode == "constant" and value == -math.inf and _max_pooled(call):
            pass  # "same" max-pooling (timm's MaxPool2dSame): windows over the input alone
        elif mode == "constant" and value != 0:
            return (f"padding with the constant {value:g} adds a bias outside any layer; pad "
                    "with zeros")
        pad = self._pad(call)
        if mode != "constant" and any(p < 0 for p in pad):
            return "negative padding crops only in constant mode: use slicing instead"
        if len(pad) // 2 >= call.args[0].dim():
            return "padding the batch dimension mixes samples"
        return None

    def _zero_padded(self, x: Tensor, call: Call) -> Tensor:
        """The op on a pass's non-negative values: constant padding (zeros, a crop where
        negative, -inf before a max-pool) enters as zeros, which no path reaches."""
        if self._mode_value(call)[0] == "constant":
            return F.pad(x, self._pad(call))
        return call.run(x)

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        return self._zero_padded(x, call), 0.0  # every weight is 1

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return self._zero_padded(x, call)


class UnfoldHandler(ZeroOneMap):
    """``F.unfold`` / ``nn.Unfold`` (im2col): each output copies one input (weight 1) or is
    zero padding (no antecedent), so |S|^q = S in the |theta|^q pass (Thm 3.1.1)."""

    family = "resampling"

    def problem(self, call: Call) -> str | None:
        if call.args[0].dim() != 4:
            return ("unfold reads a 3-d input as one unbatched image; give it (batch, "
                    "channels, height, width)")
        return None

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return call.run(x)


_MAX_POOLS = (F.max_pool1d, F.max_pool2d, F.max_pool3d, torch.max_pool1d, torch.max_pool2d,
              torch.max_pool3d)


def _max_pooled(call: Call) -> bool:
    """Whether every reader of the padded tensor is a functional max-pool (its windows then
    take the max over the input's entries alone: max-pool neurons, Def. 2.2.2)."""
    users = call.node.users
    return bool(users) and all(u.op == "call_function" and u.target in _MAX_POOLS
                               for u in users)


register(InterpolateHandler("interpolate"),
         modules=[nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d],
         functions=[F.interpolate, F.upsample, F.upsample_bilinear, F.upsample_nearest],
         note="/`Upsample` in every mode (nearest, linear, bilinear, bicubic, trilinear, "
              "area; `align_corners` either way; by size or scale factor)")
register(UnfoldHandler("Unfold"), modules=[nn.Unfold], functions=[F.unfold],
         note="(im2col, `F.unfold`)")
register(PadHandler("pad"), functions=[F.pad, torch.constant_pad_nd],
         modules=[nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d,
                  nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
                  nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d,
                  nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d,
                  nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d],
         note="and the padding modules (`ZeroPad2d`, `ReflectionPad2d`, `ReplicationPad2d`, "
              "`CircularPad2d`, in 1, 2 and 3 dims)")
