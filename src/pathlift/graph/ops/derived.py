"""Layers whose weight their module computes in forward from its own tensors alone: weight
standardisation (timm's ``StdConv2d``: W_o = (V_o - mean V_o) / sqrt(var V_o + eps) per
output channel o; ``ScaledStdConv2d``: the same times gain_o * gamma / sqrt(fan-in)), or a
user's ``F.conv2d(x, standardise(self.weight))``.

The layer's neurons (thesis Def. 2.2.2) have the effective weight W, not the stored V: the
path-lifting, path-norms, bounds and path-magnitude scores are those of W (read through the
functional view, ``pathlift.graph.functional``), as for a torch.nn.utils.parametrize layer.
What writes the stored tensors cannot act on W exactly, so it is refused, saying why:
scaling V_o by lambda > 0 leaves W_o unchanged (standardisation is invariant to it: a
rescaling of the stored weight is a no-op on the function), and any other change of V
(dividing its input columns, zeroing an entry, rounding it) changes W non-linearly, so the
rescaling of Def. 2.4.1, normalisation (Alg. 3.2.1), pruning and quantisation of W are not
those of V.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.ops.base import Handler

_CLASSES: dict[type, type] = {}


class DerivedLayer:
    """Mixin of a layer handler whose module computes the layer's weight in forward from
    ``reads`` (its own tensors): every transformation that writes the stored tensors is
    refused in one line (module docstring)."""

    layer: str = ""
    reads: tuple[str, ...] = ()

    def unwritable(self, what: str) -> str:
        """Why ``what`` (a transformation) cannot act on the effective weight."""
        return (f"layer '{self.layer}' computes its weight in forward from "
                f"{', '.join(self.reads)} (a weight standardisation, as timm's StdConv2d): "
                f"pathlift measures it on that effective weight but cannot {what} it, since "
                "scaling a stored output channel is undone by the standardisation (a no-op "
                "on the function) and any other change of the stored weight changes the "
                f"effective one non-linearly; {what} a copy whose layer holds the effective "
                "weight as a plain parameter")

    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        raise UnsupportedModelError(self.unwritable("rescale or normalise"))

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        raise UnsupportedModelError(self.unwritable("permute"))

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        raise UnsupportedModelError(self.unwritable("quantise"))


def derived_layer(handler: Handler, layer: str, reads: Sequence[str]) -> Any:
    """``handler`` (a layer's) for the layer ``layer`` whose weight its module computes
    from ``reads``: the same op, refusing what would write the stored tensors."""
    cls = type(handler)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Derived{cls.__name__}", (DerivedLayer, cls),
                             {"__module__": __name__})
    out = copy.copy(handler)
    out.__class__ = _CLASSES[cls]
    out.layer, out.reads = layer, tuple(reads)
    return out
