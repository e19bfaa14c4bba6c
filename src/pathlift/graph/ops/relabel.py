"""Structure: residual sums, concatenation, relabelling and selection of neurons, and the
Python-level values of a forward (sizes, shape arithmetic).

A residual ``+`` (or ``-``) is a set of skip edges of weight +-1 into identity neurons
(thesis Def. 2.2.2); ``cat``, views, permutes, slicing (``x[:, a:b]``, ``chunk``,
``split``, ``narrow``, ``unbind``) only relabel or select neurons and create none; scaling
by a constant is an identity neuron with one fixed weight. Shape arithmetic
(``x.size(1) // 2``) runs as plain Python on the sizes.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pathlift.graph.ops.base import Call, Handler, Kind, register
from pathlift.graph.ops.pooling import FixedLinear


def _tensors(values: Any) -> list[Tensor]:
    return [v for v in (values if isinstance(values, (tuple, list)) else (values,))
            if isinstance(v, Tensor)]


class ShapeHandler(Handler):
    """Python-level values: sizes, shape attributes, arithmetic on them, picking one."""

    kind = Kind.SHAPE
    aliases_input = True


class ReshapeHandler(Handler):
    """Relabels or selects neurons (views, permutes, slices, splits): creates none."""

    kind = Kind.RESHAPE
    aliases_input = True


class CopyHandler(ReshapeHandler):
    """Moves or copies neurons along feature dims, each output a copy of one input (flip,
    roll, rot90, repeat, tile, expand, ``Tensor.unfold``): relabels, creates none (a neuron read
    twice by the next layer is two edges of it, Def. 2.2.2). Refused where an output reads
    another sample: run on a probe holding each sample's index in the batch."""

    def problem(self, call: Call) -> str | None:
        x = call.args[0]
        index = torch.arange(x.shape[0], dtype=torch.uint8)
        probe = index.reshape(-1, *(1,) * (x.dim() - 1)).expand(x.shape)
        out = call.replace(probe).run()
        if out.dim() == 0 or out.shape[0] != x.shape[0] or not bool(
                (out == index.reshape(-1, *(1,) * (out.dim() - 1))).all()):
            return ("it moves or copies entries across the batch dimension, which mixes "
                    "samples; apply it along feature dims only")
        return None


class IdentityHandler(Handler):
    """No neuron at all: ``nn.Identity``, ``contiguous``."""

    aliases_input = True


class GetItemHandler(Handler):
    """``operator.getitem``: slicing a tensor selects neurons, indexing a tuple of tensors
    (the parts of a ``chunk``) picks one, indexing sizes picks a number."""

    kind = Kind.SHAPE

    def resolve(self, call: Call) -> Handler:
        source = call.args[0]
        if isinstance(source, Tensor) or _tensors(source):
            return SLICE
        return SHAPE


class ArithmeticHandler(Handler):
    """``*``, ``/``, ``//``, ``-`` and unary minus: shape arithmetic on sizes, or scaling
    of a tensor by a constant; a product of two tensors is refused."""

    kind = Kind.SHAPE
    family = "structure"

    def problem(self, call: Call) -> str | None:
        if len(_tensors(call.args)) > 1:
            return ("a product of two activations is not a neuron of Def. 2.2.2 (gating, "
                    "squeeze-excitation, attention); supported: sums, constant scales")
        if _tensors(call.args) and (call.node.target in (operator.floordiv, operator.mod)
                                    or call.kwargs.get("rounding_mode") is not None):
            return "integer division of activations is not piecewise linear"
        if call.node.target in _DIVISIONS and len(call.args) == 2 and \
                isinstance(call.args[1], Tensor):
            return ("dividing by an activation (c / x) is not piecewise linear; divide an "
                    "activation by a constant")
        if call.node.target is torch.mul and len(call.args) == 2 and \
                isinstance(call.args[1], Tensor):
            return "torch.mul(c, x) with the constant first: write torch.mul(x, c) or c * x"
        return None

    def resolve(self, call: Call) -> Handler:
        if self.problem(call) is None and _tensors(call.args):
            return SCALE
        return self


_DIVISIONS = (operator.truediv, torch.div, torch.true_divide, "div", "__truediv__")


class ScaleHandler(FixedLinear):
    """x * c, x / c, -x for a constant c: identity neurons with the one fixed weight c."""

    family = "structure"
    elementwise = True

    def factor(self, call: Call) -> float:
        target = call.node.target
        if target in (operator.neg, torch.neg) or (call.node.op == "call_method"
                                                   and target == "neg"):
            return -1.0
        other = next(a for a in call.args if not isinstance(a, Tensor))
        if target in _DIVISIONS:
            return 1.0 / float(other)
        return float(other)

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        c = abs(self.factor(call))
        return (x.clone() if c else torch.zeros_like(x)), (q * math.log(c) if c else 0.0)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x


class AddHandler(Handler):
    """Residual sum (or difference) of two tensors of one shape: skip edges of weight +-1.
    On sizes, it is shape arithmetic."""

    kind = Kind.ADD
    in_place = True
    fixed_l1_exceeds_one = True  # a sum neuron reads two skip edges of weight 1

    def problem(self, call: Call) -> str | None:
        if len(call.args) < 2 or not all(isinstance(a, Tensor) for a in call.args[:2]):
            return ("adding a constant is a bias outside any layer; put it in a layer's bias")
        if call.kwargs.get("alpha", 1) != 1:
            return "torch.add with alpha != 1 is not supported; scale inside a layer instead"
        if call.args[0].shape != call.args[1].shape:
            return "residual addition with broadcasting is not supported; shapes must match"
        return None

    def resolve(self, call: Call) -> Handler:
        if not _tensors(call.args):
            return SHAPE
        return _PLUS_ZERO if _adds_zero(call) else self


def _adds_zero(call: Call) -> bool:
    """``x + 0``, ``0 + x``, ``x - 0`` (a sum started at 0, as MobileOne's branches are):
    the identity, no neuron. ``0 - x`` is not."""
    if len(call.args) != 2:
        return False
    tensor = [isinstance(a, Tensor) for a in call.args]
    other = call.args[tensor.index(False)] if tensor.count(True) == 1 else None
    if isinstance(other, bool) or not isinstance(other, int | float) or other != 0:
        return False
    subtracts = call.node.target in (operator.sub, torch.sub, "sub", "__sub__")
    return not (subtracts and tensor[1])


class CatHandler(Handler):
    """Concatenation along a non-batch dim (U-Net skips): relabels, creates no neuron."""

    kind = Kind.CAT

    def problem(self, call: Call) -> str | None:
        tensors = call.arg(0, "tensors")
        dim = call.arg(1, "dim", 0)
        if dim % tensors[0].dim() == 0:
            return "concatenation along the batch dimension mixes samples"
        return None


class StackHandler(CatHandler):
    """``stack`` along a new feature dim: the concatenation of its tensors each unsqueezed
    there, which relabels neurons (a sum, mean or max over that dim then makes them)."""

    def problem(self, call: Call) -> str | None:
        tensors = call.arg(0, "tensors")
        if call.arg(1, "dim", 0) % (tensors[0].dim() + 1) == 0:
            return ("stacking at dim 0 puts the stacked tensors before the batch dimension; "
                    "stack along a feature dim (dim=1 or dim=-1) and reduce over that dim")
        return None


class TrainingModeHandler(Handler):
    """Identity in eval mode (Dropout); refused in training mode, where it is random."""

    aliases_input = True

    def problem(self, call: Call) -> str | None:
        if call.module is None and call.arg(2, "training", True):
            return "functional dropout with training=True is random; pass training=False"
        return None

    def training_problem(self, module: nn.Module) -> str | None:
        return f"{type(module).__name__} in training mode is random; call model.eval()"


SHAPE = ShapeHandler("sizes")
SLICE = ReshapeHandler("slicing")
SCALE = ScaleHandler("constant scale")
_RESHAPE = ReshapeHandler("views and splits")
_ARITHMETIC = ArithmeticHandler("shape arithmetic")
_ADD = AddHandler("+/-")
_PLUS_ZERO = IdentityHandler("+ 0")

register(ReshapeHandler("namedtuple outputs"), functions=[tuple])  # handler_for: namedtuple classes
register(_RESHAPE, modules=[nn.Flatten, nn.Unflatten, nn.PixelShuffle, nn.PixelUnshuffle,
                            nn.ChannelShuffle],
         functions=[torch.flatten, torch.reshape, torch.permute, torch.transpose,
                    torch.squeeze, torch.unsqueeze, torch.chunk, torch.split, torch.narrow,
                    torch.unbind, torch.tensor_split, torch.movedim, torch.swapaxes,
                    F.pixel_shuffle, F.pixel_unshuffle, F.channel_shuffle],
         methods=["view", "reshape", "flatten", "permute", "transpose", "squeeze",
                  "unsqueeze", "chunk", "split", "narrow", "unbind", "tensor_split",
                  "movedim", "swapaxes", "view_as", "reshape_as", "unflatten"],
         note="(`view`, `reshape`, `permute`, `flatten`, `chunk`, `split`, `narrow`, "
              "`unbind`, `PixelShuffle`)")
register(CopyHandler("copies along features"),
         functions=[torch.flip, torch.fliplr, torch.flipud, torch.roll, torch.rot90,
                    torch.tile, torch.broadcast_to, torch.repeat_interleave],
         methods=["flip", "fliplr", "flipud", "roll", "rot90", "repeat", "tile", "expand",
                  "expand_as", "broadcast_to", "unfold", "repeat_interleave"],
         note="(`flip`, `roll`, `rot90`, `repeat`, `tile`, `expand`, `repeat_interleave`, "
              "`Tensor.unfold`)")
register(IdentityHandler("Identity"), modules=[nn.Identity], methods=["contiguous"])
register(GetItemHandler("indexing"), functions=[operator.getitem],
         note="(slicing `x[:, a:b]`, picking from a tuple)")
register(SHAPE, functions=[getattr, len], methods=["size", "dim"], note="(`x.size(1)`)")
register(_ARITHMETIC, functions=[operator.mul, operator.truediv, operator.floordiv,
                                 operator.mod, operator.neg, torch.mul, torch.div, torch.neg,
                                 torch.true_divide],
         methods=["mul", "div", "neg", "__mul__", "__rmul__", "__truediv__"],
         note="(`x.size(1) // 2`, scaling by a constant)")
register(_ADD, functions=[operator.add, operator.iadd, torch.add, operator.sub, torch.sub],
         methods=["add", "add_", "__add__", "__radd__", "sub", "__sub__"])


register(CatHandler("cat"), functions=[torch.cat, torch.concat, torch.concatenate])
register(StackHandler("stack"), functions=[torch.stack], note="along a feature dim")
register(TrainingModeHandler("Dropout"),
         modules=[getattr(nn, n) for n in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d")],
         functions=[F.dropout], note="in eval mode")
