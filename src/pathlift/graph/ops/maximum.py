"""ReLU and its one-sided clamps written with a constant tensor: ``torch.maximum(h,
torch.zeros_like(h))``, ``torch.max(h, h.new_zeros(h.shape))``, ``h.maximum(torch.zeros(
C, dtype=h.dtype))`` (broadcast), ``torch.minimum(h, torch.full_like(h, c))``, and
``F.threshold(h, t, t)`` / ``nn.Threshold(t, t)``.

The maximum of an activation and a tensor filled with one constant c is clamp(z, min=c):
ReLU when c = 0 (thesis Def. 2.2.2), otherwise the continuous piecewise-linear activation
``pathlift.graph.ops.activation`` lowers (a bias c, so it is not positively homogeneous
and fixes the scale of the neurons it reads, as ``clamp(min=c)`` does). ``threshold(z, t,
v)`` is z above t and v elsewhere: continuous only when v = t, where it is clamp(z, min=t).
The filled tensor makes no neuron: it is a value of the forward known from shapes alone
(the kind of sizes), which only such an op may read. The activation is the first argument
(the one the op's passes read); a maximum of two activations is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from pathlift.graph.ops.activation import Activation, Pieces, _bounded
from pathlift.graph.ops.base import Call, Handler, Kind, fx_constant, handler_for, register

#: tensor factories filling a tensor with one constant: name -> (where its value is given,
#: positional index and keyword, or the value itself)
_FILLS: dict[object, tuple[int, str] | float] = {
    torch.zeros: 0.0, torch.zeros_like: 0.0, "new_zeros": 0.0,
    torch.ones: 1.0, torch.ones_like: 1.0, "new_ones": 1.0,
    torch.full: (1, "fill_value"), torch.full_like: (1, "fill_value"),
    "new_full": (2, "fill_value"),
}


def _fill_value(node: object) -> float | None:
    """The constant a node fills its tensor with (a number argument), or None."""
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return None
    where = _FILLS.get(node.target)
    if isinstance(where, float) or where is None:
        return where
    index, name = where
    value = node.args[index] if len(node.args) > index else node.kwargs.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _sized_by_input(node: fx.Node) -> bool:
    """Whether a fill's size follows the activation's (``zeros_like(h)``, ``torch.zeros(
    h.shape)``, ``h.new_zeros(h.size())``): its size arguments read a node."""
    if node.target in (torch.zeros_like, torch.ones_like, torch.full_like):
        return True
    sizes = node.args[1:] if node.op == "call_method" else node.args[:1] + (
        () if node.target is torch.full else node.args[1:])
    sizes += tuple(v for k, v in node.kwargs.items() if k == "size")
    found: list[fx.Node] = []
    fx.node.map_arg(sizes, found.append)
    return bool(found)


class FillHandler(Handler):
    """A tensor filled with one constant (``zeros_like(h)``, ``torch.full(...)``): no
    neuron, a value known from shapes alone, read only as the bound of a ``Clipped`` op."""

    kind = Kind.SHAPE
    family = "unsupported"  # listed with the op reading it, not as an operation

    def problem(self, call: Call) -> str | None:
        readers = [handler_for(u, None) for u in call.node.users]
        if _fill_value(call.node) is None:
            return (f"{self.name} with a fill value computed in forward; fill with a "
                    "number")
        if not call.node.users or not all(isinstance(h, Clipped) for h in readers):
            return (f"a tensor made by {self.name} is read by an op other than "
                    "torch.maximum / minimum (ReLU, clamp), so it is no neuron of Def. "
                    "2.2.2; use a layer's bias, or F.relu")
        return None


class Clipped(Activation):
    """``maximum`` (``side`` "min": the fill is the lower bound) or ``minimum`` ("max")
    of an activation and a constant fill: clamp(z, min=c) or clamp(z, max=c)."""

    def __init__(self, name: str, side: str):
        super().__init__(name)
        self.side = side

    def _other(self, call: Call) -> object:
        return call.node.args[1] if len(call.node.args) > 1 else call.node.kwargs.get("other")

    def pieces(self, call: Call) -> Pieces:
        c = _fill_value(self._other(call))
        return _bounded(c, None) if self.side == "min" else _bounded(None, c)

    def problem(self, call: Call) -> str | None:
        x, other = call.arg(0, "input"), call.arg(1, "other")
        if not isinstance(other, Tensor):
            return (f"{self.name} without a second tensor reduces over every dim, the batch "
                    "too; reduce over feature dims (amax(h, dim=...))")
        other_node = self._other(call)
        if fx_constant(other_node):
            return (f"{self.name} with a tensor torch.fx made a constant (torch.zeros(C) "
                    "without a tensor argument), whose values pathlift does not read; write "
                    "torch.zeros_like(h), or torch.zeros(C, dtype=h.dtype)")
        if _fill_value(other_node) is None:
            first = _fill_value(call.node.args[0]) is not None
            return (f"{self.name} of an activation and a constant tensor is ReLU / clamp "
                    "with the activation first: write it torch." + self.name + "(h, "
                    "torch.zeros_like(h))" if first else
                    f"elementwise {self.name} of two tensors computed in forward; pathlift "
                    f"reads {self.name}(h, c) with c a tensor filled with one constant "
                    "(torch.zeros_like(h), torch.full(...)) as ReLU / clamp")
        if other.dim() == x.dim() and other.shape[0] != 1 and \
                not _sized_by_input(self._other(call)):
            return (f"{self.name} with a constant tensor of {other.shape[0]} rows (dim 0) "
                    "broadcasts or mixes the batch; give it a size of 1 in dim 0, fewer "
                    "dims, or the activation's size (torch.zeros_like(h))")
        if torch.broadcast_shapes(x.shape, other.shape) != x.shape:
            return (f"{self.name} broadcasts the activation of shape {tuple(x.shape)} to "
                    f"{tuple(torch.broadcast_shapes(x.shape, other.shape))}, copying "
                    "neurons; give the constant tensor the activation's shape or fewer dims")
        return None

    def resolve(self, call: Call) -> Handler:
        return self if self.problem(call) else super().resolve(call)


class ThresholdHandler(Activation):
    """``F.threshold(z, t, v)`` / ``nn.Threshold(t, v)``: z above t, v elsewhere;
    continuous (clamp(z, min=t)) only when v = t."""

    def _tv(self, call: Call) -> tuple[float, float]:
        if call.module is not None:
            return float(call.module.threshold), float(call.module.value)
        return float(call.arg(1, "threshold")), float(call.arg(2, "value"))

    def pieces(self, call: Call) -> Pieces:
        return _bounded(self._tv(call)[0], None)

    def problem(self, call: Call) -> str | None:
        t, v = self._tv(call)
        if t != v:
            return (f"threshold {t} with value {v} jumps at {t}, so it is not continuous and "
                    "no ReLU network computes it (Def. 2.2.2); threshold(z, 0, 0) is ReLU")
        return None

    def resolve(self, call: Call) -> Handler:
        return self if self.problem(call) else super().resolve(call)


for _fill in _FILLS:
    _name = _fill if isinstance(_fill, str) else _fill.__name__
    register(FillHandler(_name), **({"methods": [_fill]} if isinstance(_fill, str)
                                    else {"functions": [_fill]}))
register(Clipped("maximum", "min"), functions=[torch.maximum, torch.max, torch.fmax],
         methods=["maximum", "max", "fmax"],
         note="(of an activation and a constant fill: ReLU, clamp)")
register(Clipped("minimum", "max"), functions=[torch.minimum, torch.min, torch.fmin],
         methods=["minimum", "min", "fmin"])
register(ThresholdHandler("threshold"), modules=[nn.Threshold],
         functions=[F.threshold, F.threshold_, torch.threshold, torch.threshold_],
         note="(`threshold(z, t, t)`)")
