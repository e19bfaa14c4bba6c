"""ReLU, its one-sided clamps and LeakyReLU written as a selection by a comparison:
``torch.where(h > c, h, c)``, ``h.where(h >= 0, 0)``, ``torch.where(0 < h, h,
torch.zeros_like(h))``, ``torch.where(h < c, h, c)``, ``torch.where(h > 0, h, a * h)``.

Where z is above c the selection takes z and elsewhere c: clamp(z, min=c) (ReLU at c = 0,
thesis Def. 2.2.2); z below c and c elsewhere: clamp(z, max=c); z above 0 and a z below:
LeakyReLU, ReLU(z) - a ReLU(-z). The strictness of the comparison does not matter, as
both branches agree at c. Any other number selected with z jumps at c
(``torch.where(h > 0, h, 1)``), so no ReLU network computes it: refused in one line, as
is a selection of a tensor computed in forward (a gate).

``lower_where`` (run by the tracer before the op table is consulted) rewrites such a
``where`` into ``where(z, condition, input, other)`` of this module, which runs the user's own
``torch.where(condition, input, other)``, so that the activation z is the op's first
argument, as the passes read an activation. The comparison stays in the graph, computing
the condition as the user's forward does: no neuron, a value read only by a selection
(``ComparisonHandler``), as a filled tensor is (``pathlift.graph.ops.maximum``). A
``where`` on any other condition is left as it is, and refused as an unknown op. The
product a z of LeakyReLU is run inside ``where_scaled`` (its node removed) when the
forward computes it just before the selection and for it alone, so the ops run in the
order the forward runs them (validation compares the two runs op by op).
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor, fx

from pathlift.graph.ops.activation import Activation, Pieces, _bounded
from pathlift.graph.ops.base import Call, Handler, Kind, handler_for, register
from pathlift.graph.ops.maximum import Clipped, _fill_value

__all__ = ["lower_where", "where", "where_scaled"]

#: comparisons of an activation with a number: target -> whether true means "z above c"
_ABOVE: dict[object, bool] = {
    operator.gt: True, operator.ge: True, operator.lt: False, operator.le: False,
    torch.gt: True, torch.ge: True, torch.lt: False, torch.le: False,
    torch.greater: True, torch.greater_equal: True, torch.less: False,
    torch.less_equal: False}
_METHODS_ABOVE = {"gt": True, "ge": True, "lt": False, "le": False, "greater": True,
                  "greater_equal": True, "less": False, "less_equal": False}


def where(activation: Tensor, condition: Tensor, input: Tensor | float,
          other: Tensor | float) -> Tensor:
    """``torch.where(condition, input, other)``: a traced selection of ``activation`` by a
    comparison of it (``lower_where``), the user's own op."""
    return torch.where(condition, input, other)


def where_scaled(activation: Tensor, condition: Tensor, slope: float, scaled_when_true: bool
                 ) -> Tensor:
    """``torch.where(condition, slope * activation, activation)`` (or the activation when
    the condition holds): a traced LeakyReLU ``torch.where(h > 0, h, a * h)``
    (``lower_where``), the user's own ops (the product, then the selection)."""
    scaled = activation * slope
    return torch.where(condition, scaled, activation) if scaled_when_true else \
        torch.where(condition, activation, scaled)


def _comparison(node: object) -> tuple[fx.Node, float, bool] | None:
    """(z, c, whether true means "z above c") of ``z > c`` and its kin, c a number."""
    if not isinstance(node, fx.Node) or node.kwargs or len(node.args) != 2:
        return None
    above = _ABOVE.get(node.target) if node.op == "call_function" else \
        _METHODS_ABOVE.get(node.target) if node.op == "call_method" else None
    z, c = node.args
    if above is None or not isinstance(z, fx.Node) or not isinstance(c, int | float) \
            or isinstance(c, bool):
        return None
    return z, float(c), above


def _where_arguments(node: fx.Node) -> tuple[object, object, object] | None:
    """(condition, input, other) of ``torch.where(condition, input, other)`` or
    ``input.where(condition, other)``, else None."""
    if node.op == "call_function" and node.target is torch.where:
        names, order = ("condition", "input", "other"), (0, 1, 2)
    elif node.op == "call_method" and node.target == "where":
        names, order = ("self", "condition", "other"), (1, 0, 2)
    else:
        return None
    given = list(node.args) + [node.kwargs.get(k) for k in names[len(node.args):]]
    if len(given) != 3 or any(v is None for v in given):
        return None
    return tuple(given[i] for i in order)  # type: ignore[return-value]


def lower_where(graph: fx.Graph) -> None:
    """Each ``where`` selecting an activation z by a comparison of z with a number becomes
    ``where(z, condition, input, other)`` (the module docstring)."""
    for node in list(graph.nodes):
        found = _where_arguments(node)
        compared = _comparison(found[0]) if found is not None else None
        if compared is None or compared[0] not in (found[1], found[2]):
            continue
        z, c, _ = compared
        scaled = found[2] if found[1] is z else found[1]
        # a * z computed just before the selection, for it alone: LeakyReLU, the product
        # run inside (the same ops in the same order as the user's forward)
        lowered = (where_scaled, (z, found[0], _slope(scaled, z), scaled is found[1])) \
            if c == 0 and _slope(scaled, z) is not None and node.prev is scaled \
            and len(scaled.users) == 1 else (where, (z, *found))
        with graph.inserting_before(node):
            new = graph.call_function(*lowered)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        if lowered[0] is where_scaled:
            graph.erase_node(scaled)


def _slope(node: object, z: fx.Node) -> float | None:
    """a of ``a * z`` or ``z * a`` (a a number), else None."""
    if not isinstance(node, fx.Node) or node.target not in (operator.mul, torch.mul, "mul") \
            or node.kwargs or len(node.args) != 2 or z not in node.args:
        return None
    a = node.args[1] if node.args[0] is z else node.args[0]
    return float(a) if isinstance(a, int | float) and not isinstance(a, bool) else None


def _number(value: object) -> float | None:
    """A Python number (not a bool) or the constant a filled tensor holds, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return _fill_value(value)


class SelectionHandler(Clipped):
    """``where(z, z > c, z, c)`` and its kin: clamp(z, min=c) or clamp(z, max=c)."""

    def __init__(self, name: str):
        super().__init__(name, "min")

    def _other(self, call: Call) -> object:
        input, other = call.node.args[2:]
        return other if input is call.node.args[0] else input

    def _bound(self, call: Call) -> tuple[str, float] | None:
        """("min" or "max", c) of a continuous selection, else None."""
        z, c, above = _comparison(call.node.args[1])
        chosen = call.node.args[2] if above else call.node.args[3]  # where z is above c
        if _number(self._other(call)) != c:
            return None
        return ("min", c) if chosen is z else ("max", c)

    def pieces(self, call: Call) -> Pieces:
        side, c = self._bound(call)
        return _bounded(c, None) if side == "min" else _bounded(None, c)

    def problem(self, call: Call) -> str | None:
        z, c, _ = _comparison(call.node.args[1])
        value = _number(self._other(call))
        if value is None and _slope(self._other(call), z) is not None:
            return (f"torch.where(z > {c:g}, z, a * z) jumps at {c:g} (LeakyReLU is "
                    "torch.where(z > 0, z, a * z), its product written just before it); "
                    "write F.leaky_relu(z, a)" if c != 0 else
                    "torch.where(z > 0, z, a * z) is LeakyReLU when a * z is computed just "
                    "before it and read by it alone; write it so, or F.leaky_relu(z, a)")
        if value is None:
            return ("torch.where on a comparison of an activation selects a tensor computed "
                    "in forward: a gate, no neuron of Def. 2.2.2; torch.where(z > c, z, c) "
                    "is clamp(z, min=c)")
        if value != c:
            return (f"torch.where selects z on one side of {c:g} and {value:g} on the other: "
                    f"it jumps at {c:g}, so it is not continuous and no ReLU network computes "
                    "it (Def. 2.2.2); torch.where(z > c, z, c) is clamp(z, min=c)")
        other = self._other(call)
        if isinstance(other, fx.Node):  # a filled tensor: as maximum(z, fill) reads it
            return super().problem(call.replace(call.args[0], call.args[3] if other is
                                                call.node.args[3] else call.args[2]))
        return None


class ScaledSelectionHandler(Activation):
    """``where_scaled(z, z > 0, a, ...)``: LeakyReLU(z) = ReLU(z) - a ReLU(-z) with slope a
    below 0 (or above it, where the scaled branch is taken when z is above 0)."""

    def pieces(self, call: Call) -> Pieces:
        _, condition, slope, scaled_when_true = call.node.args
        above = _comparison(condition)[2]
        slopes = (1.0, slope) if scaled_when_true == above else (slope, 1.0)
        return Pieces((0.0,), slopes, 0.0)


_SELECTIONS = (SelectionHandler, ScaledSelectionHandler)


class ComparisonHandler(Handler):
    """``z > c`` and its kin: no neuron, a value computed from the activation, read only
    as the condition of a selection (``where``)."""

    kind = Kind.SHAPE
    family = "unsupported"  # listed with the op reading it, not as an operation

    def problem(self, call: Call) -> str | None:
        readers = call.node.users
        if not readers or not all(
                isinstance(handler_for(u, None), _SELECTIONS) and u.args[1] is call.node
                and call.node.args[0] is u.args[0] for u in readers):
            return (f"a comparison ({self.name}) of activations is read by an op other than "
                    "torch.where(z > c, z, c) (ReLU, clamp), so it is no neuron of Def. "
                    "2.2.2; use F.relu or clamp")
        return None


register(SelectionHandler("where"), functions=[where],
         note="(`torch.where(z > c, z, c)`: clamp)")
register(ScaledSelectionHandler("where"), functions=[where_scaled],
         note="(`torch.where(z > 0, z, a * z)`: LeakyReLU)")
for _target in _ABOVE:
    register(ComparisonHandler(getattr(_target, "__name__", str(_target))),
             functions=[_target])
register(ComparisonHandler("comparison"), methods=list(_METHODS_ABOVE))
