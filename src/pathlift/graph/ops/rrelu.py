"""RReLU in eval mode: LeakyReLU with the mean slope a = (lower + upper) / 2 (in training
mode it draws a random slope per element, which no fixed network computes: refused through
``training_problem``). Positively homogeneous, so the rescaling symmetries of thesis
Def. 2.4.1 hold through it; lowered to ReLU/identity neurons, ReLU(z) - a ReLU(-z), like
every piecewise-linear activation (``pathlift.graph.ops.activation``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pathlift.graph.ops.activation import Activation, Pieces
from pathlift.graph.ops.base import Call, register

_LOWER, _UPPER = 1.0 / 8.0, 1.0 / 3.0  # torch's defaults


class RReluHandler(Activation):
    """``nn.RReLU`` in eval mode and ``F.rrelu`` / ``torch.rrelu`` (and their in-place
    forms) with ``training=False``, their default."""

    def pieces(self, call: Call) -> Pieces:
        if call.module is not None:
            lower, upper = call.module.lower, call.module.upper
        else:
            lower, upper = call.arg(1, "lower", _LOWER), call.arg(2, "upper", _UPPER)
        return Pieces((0.0,), ((float(lower) + float(upper)) / 2.0, 1.0), 0.0)

    def problem(self, call: Call) -> str | None:
        if call.module is None and call.arg(3, "training", False):
            return ("rrelu with training=True draws a random slope per element; pass "
                    "training=False (the slope is then (lower + upper) / 2)")
        return None

    def training_problem(self, module: nn.Module) -> str | None:
        return ("RReLU in training mode draws a random slope per element; call model.eval() "
                "(the slope is then (lower + upper) / 2)")


register(RReluHandler("RReLU"), modules=[nn.RReLU],
         functions=[F.rrelu, F.rrelu_, torch.rrelu, torch.rrelu_], note="in eval mode")
