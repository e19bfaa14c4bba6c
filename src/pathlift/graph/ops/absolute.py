"""The absolute value |z| = ReLU(z) + ReLU(-z): a continuous piecewise-linear activation
(breakpoint 0, slopes -1 and 1), so two ReLU neurons per unit feeding one identity neuron
with weights 1 (thesis Def. 2.2.2), lowered like every such activation
(``pathlift.graph.ops.activation``). It is positively homogeneous (|lambda z| = lambda |z|
for lambda > 0), so the rescalings of Def. 2.4.1 hold through it; it is neither monotone
nor a ReLU, which the passes read off its pieces: the interval of |z| over a box is
taken at the box's ends and at 0, and the |theta|^q pass (Thm 3.1.1) maps a unit's value
x to 2x, the sum over its two paths.
"""

from __future__ import annotations

import operator

import torch

from pathlift.graph.ops.activation import Activation, Pieces
from pathlift.graph.ops.base import Call, register

_ABS = Pieces((0.0,), (-1.0, 1.0), 0.0)


class AbsHandler(Activation):
    """``torch.abs`` / ``torch.absolute`` / ``abs(h)`` / ``h.abs()`` (and in place)."""

    def pieces(self, call: Call) -> Pieces:
        return _ABS


register(AbsHandler("abs"), functions=[torch.abs, torch.absolute, torch.abs_, operator.abs],
         methods=["abs", "absolute", "abs_", "absolute_", "__abs__"],
         note="(two ReLU neurons, ReLU(z) + ReLU(-z))")
