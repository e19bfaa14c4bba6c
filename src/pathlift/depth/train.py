"""Full-batch gradient descent on the residual weights (thesis eq. 2.30) and Omega(t) (eq. 4.4).

The objective is the mean over the N samples, J(W) = (1/N) sum_i l(y_i, yhat_i), with
l = 1/2 ||y - yhat||^2 ("mse", the thesis' text, Sec. 4.2.1), l = ||y - yhat||^2
("squared_error", what the thesis' published code minimises: twice the gradient, the
convention that reproduces Tables 4.3/4.4) or cross-entropy. Only the
W_k move; the embeddings stay fixed. Omega(t) = (1/N) sum_i ||grad_yhat l(y_i, yhat_i(W(t)))||^2
is recorded before every step, for the rate fit of Assumption 3.5.1 (eq. 4.5).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pathlift.depth.model import DepthResNet
from pathlift.errors import InvalidParameterError

__all__ = ["LOSSES", "Training", "train"]

LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mse": lambda yhat, y: 0.5 * (yhat - y).pow(2).sum(dim=1),
    "squared_error": lambda yhat, y: (yhat - y).pow(2).sum(dim=1),
    "cross_entropy": lambda yhat, y: F.cross_entropy(yhat, y, reduction="none"),
}


@dataclass(frozen=True)
class Training:
    """A trained copy of the model and, per step t = 0..T-1, J(W(t)) and Omega(t)."""

    model: DepthResNet
    learning_rate: float
    loss: tuple[float, ...]
    omega: tuple[float, ...]


def train(model: DepthResNet, x: torch.Tensor, y: torch.Tensor, steps: int,
          learning_rate: float, loss: str = "mse",
          on_step: Callable[[int], None] | None = None) -> Training:
    """``steps`` full-GD steps W <- W - eta grad J(W) on a copy of ``model`` (not modified)."""
    if loss not in LOSSES:
        raise InvalidParameterError(f"loss {loss!r} is not one of {sorted(LOSSES)}")
    if steps < 0 or not 0 < learning_rate < math.inf:
        raise InvalidParameterError(
            f"need steps >= 0 and learning_rate > 0; got {steps}, {learning_rate}")
    if x.shape[0] != y.shape[0]:
        raise InvalidParameterError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
    trained = copy.deepcopy(model)
    objective = LOSSES[loss]
    losses, omegas = [], []
    workspace = trained.weight.new_empty(0)  # one activation buffer for every step
    for t in range(steps):
        yhat = trained(x, workspace)
        total = objective(yhat, y).mean()
        grad_w, grad_yhat = torch.autograd.grad(total, [trained.weight, yhat])
        n = x.shape[0]  # grad_yhat row i is grad l_i / N
        omegas.append(float(n * grad_yhat.pow(2).sum()))
        losses.append(float(total.detach()))
        with torch.no_grad():
            trained.weight.sub_(grad_w, alpha=learning_rate)
        if not (torch.isfinite(total) and torch.isfinite(trained.weight).all()):
            raise InvalidParameterError(
                f"training diverged at step {t} (loss {losses[-1]}, non-finite loss or "
                f"weights): lower the learning rate or use float64")
        if on_step is not None:
            on_step(t)
    return Training(trained, learning_rate, tuple(losses), tuple(omegas))
