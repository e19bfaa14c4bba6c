"""LeakyReLU(z) = ReLU(z) - a ReLU(-z) (slope a < 0 side): positively homogeneous, so the
rescaling symmetries of thesis Def. 2.4.1 hold through it; lowered to ReLU/identity
neurons like every piecewise-linear activation (``pathlift.graph.ops.activation``)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from pathlift.graph.ops.activation import Activation, Pieces
from pathlift.graph.ops.base import Call, register


class LeakyReluHandler(Activation):
    """``nn.LeakyReLU`` and ``F.leaky_relu`` / ``F.leaky_relu_``."""

    def pieces(self, call: Call) -> Pieces:
        slope = (call.module.negative_slope if call.module is not None
                 else call.arg(1, "negative_slope", 0.01))
        return Pieces((0.0,), (float(slope), 1.0), 0.0)


register(LeakyReluHandler("LeakyReLU"), modules=[nn.LeakyReLU],
         functions=[F.leaky_relu, F.leaky_relu_])
