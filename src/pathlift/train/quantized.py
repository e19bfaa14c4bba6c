"""Quantisation-aware training for the compression certificate: the trained network IS its
own coded network Q.

Each parameter tensor is seen by the forward pass through the quantiser of the code
(``pathlift.bounds.code``): truncation towards zero on the grid of step
2^(floor(log2 max|w|) - offset), with the straight-through gradient (Bengio et al. 2013);
at the end every tensor is set to its quantised value. The trained theta then lies exactly
on the grid the certificate's search tries at that ``offset`` (truncation towards zero
keeps grid points, and the largest |w| keeps its power of two), so Q = theta: the exact
path-metric d = ||Phi(theta)||_1 - ||Phi(Q)||_1 is 0 (Lemma 3.4.1) and the certified event
is the network's own margin <= tau B(x) at the grid's smallest tau, while the code spends
only ``offset`` + 1 bits of mantissa per non-zero weight.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call

__all__ = ["grid_step", "quantize_towards_zero", "quantized_forward", "snap_"]


def grid_step(w: Tensor, offset: int) -> float:
    """2^(floor(log2 max|w|) - offset), the step of w's grid (0 when w is all zeros)."""
    top = float(w.detach().abs().max()) if w.numel() else 0.0
    return math.ldexp(1.0, math.frexp(top)[1] - 1 - offset) if top else 0.0


def quantize_towards_zero(w: Tensor, offset: int, step: float | None = None) -> Tensor:
    """w truncated towards zero on the grid of step ``step`` (default: ``grid_step(w,
    offset)``; w itself when the step is 0)."""
    step = grid_step(w, offset) if step is None else step
    if step == 0:
        return w
    return torch.trunc(w / step) * step


def quantized_forward(model: nn.Module, x: Tensor, offset: int,
                      steps: dict[str, float] | None = None) -> Tensor:
    """model(x) with every parameter replaced by its quantised value in the forward pass
    and the identity in the backward pass (straight-through); ``steps`` fixes the step of
    the parameters it names (a reference network's grids). A pruned layer's
    ``weight_orig`` is quantised before its mask applies (truncation keeps zeros)."""
    steps = steps or {}
    params = {name: p + (quantize_towards_zero(p, offset, steps.get(name)) - p).detach()
              for name, p in model.named_parameters()}
    return functional_call(model, params, (x,))


@torch.no_grad()
def snap_(model: nn.Module, offset: int, steps: dict[str, float] | None = None) -> None:
    """Set every parameter of ``model`` to its quantised value, in place (on the grids of
    ``steps`` for the parameters it names)."""
    steps = steps or {}
    for name, p in model.named_parameters():
        p.copy_(quantize_towards_zero(p, offset, steps.get(name)))
