"""Path-SGD (Neyshabur, Salakhutdinov & Srebro 2015) on any supported ReLU DAG, as a
``torch.optim.Optimizer``.

The update is steepest descent with respect to the l2 path-regulariser's diagonal
second-order term: p <- p - lr * (dL/dp) / gamma_p with gamma_p = d||Phi||_2^2 / d(p^2), the
sum over the paths through p of the product of the other squared weights (their eq. 5-6).
gamma comes from one forward and one backward pass of the squared network (the |theta|^2
pass of thesis Thm 3.1.1, ``pathlift.lift.differentiable.magnitude_gradients``), so the
update is defined for every network the engine supports (ResNets, U-Nets, max-pooling,
eval BatchNorm), not only layered fully connected ones.

Invariance: under a rescaling lambda (Def. 2.4.1) an edge u -> v has p' = p lambda_v /
lambda_u, dL/dp' = dL/dp lambda_u / lambda_v and gamma' = gamma (lambda_u / lambda_v)^2, so
the update of p' is the update of p times lambda_v / lambda_u: the step maps rescaled
networks to rescaled networks, the function after the step does not depend on the
representative (exactly for Linear/Conv layers; BatchNorm's folded bias c = b - m a breaks
it when running_mean != 0).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import unwrap
from pathlift.lift.differentiable import magnitude_gradients

__all__ = ["RATIO_WARNING", "PathSGD"]

#: PathSGD warns when its first step is this many times as long as SGD's at the same lr
#: (median over the coordinates): MLPs and CNNs that Path-SGD trains at SGD's lr measure
#: 10-100 at initialisation, a DenseNet-BC that diverged at lr 0.05 3e4 (docs/training.md)
RATIO_WARNING = 1000.0


class PathSGD(torch.optim.Optimizer):
    """Path-SGD: p <- p - lr * grad / gamma_p, gamma_p = d||Phi(theta)||_2^2 / d(p^2)
    (Neyshabur et al. 2015), with optional momentum on the scaled direction.

    Args:
        model: the network whose parameters are optimised (DDP/compiled wrappers are looked
            through); every parameter must be a weight or bias of the traced DAG.
        input_shape: input size without the batch dimension.
        lr: the step size (in units of the rescaling-invariant geometry: gamma has the
            scale of ||Phi||_2^2 / p^2, so lr is not comparable to SGD's; the first step
            measures ``sgd_ratio``, the median over the coordinates of |grad / gamma| /
            |grad|, and warns, with the lr to use, when it exceeds ``RATIO_WARNING``).
        momentum: heavy-ball momentum on the scaled direction (keeps the invariance).
        dtype: precision of the squared pass (default: the model's dtype).
        match_sgd: divide lr by ``sgd_ratio`` (measured once, at the first step), so that
            the first step moves a typical weight as far as an SGD step of that lr. The
            ratio depends on the representative, so rescaled copies then no longer take
            rescaled steps.

    Where gamma_p = 0 no path of non-zero weights crosses p, so dL/dp = 0 too: p is left
    unchanged. Each ``step`` costs one |theta|^2 forward and backward pass at batch 1
    (``benchmarks/bench_train.py``). The gamma are recomputed at each step from the current
    weights; the step reads the ``.grad`` that the user's backward left.

    Example::

        opt = PathSGD(model, (1, 8, 8), lr=0.05)
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    """

    def __init__(self, model: nn.Module, input_shape: Sequence[int], lr: float,
                 momentum: float = 0.0, dtype: torch.dtype | None = None,
                 match_sgd: bool = False):
        if not lr > 0 or not 0 <= momentum < 1:
            raise InvalidParameterError(f"need lr > 0 and momentum in [0, 1), got {lr}, "
                                        f"{momentum}")
        self.model, self.input_shape, self.dtype = unwrap(model), tuple(input_shape), dtype
        self.match_sgd = match_sgd
        #: median |Path-SGD step| / |SGD step| at the same lr, measured at the first step
        self.sgd_ratio: float | None = None
        super().__init__([p for p in self.model.parameters() if p.requires_grad],
                         {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One Path-SGD step from the parameters' ``.grad`` (Neyshabur et al. 2015, eq. 6):
        the directions and the update in a few foreach calls."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        gammas = magnitude_gradients(self.model, self.input_shape, 2.0, self.dtype)
        half = math.exp(-gammas.log_scale / 2)  # twice: e^-s may overflow, the steps not
        gain = half * half if 0 < half * half < math.inf else None  # folded into lr if any
        planned = []  # every group's directions first: a refused parameter changes nothing
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            steps = _directions(params, gammas.mantissas) if params else []
            if gain is None:
                torch._foreach_mul_(steps, half)
                torch._foreach_mul_(steps, half)
            elif group["momentum"]:  # the buffer sums true directions
                torch._foreach_mul_(steps, gain)
            folded = gain if gain is not None and not group["momentum"] else 1.0
            planned.append((group, params, steps, folded))
        if self.sgd_ratio is None:
            self._calibrate({p: d * folded for _, params, steps, folded in planned
                             for p, d in zip(params, steps, strict=True)})
        for group, params, steps, folded in planned:
            lr = group["lr"] / (self.sgd_ratio if self.match_sgd else 1.0)
            if group["momentum"]:
                steps = self._momentum(params, steps, group["momentum"])
            if all(p.dtype == d.dtype for p, d in zip(params, steps, strict=True)):
                if params:
                    torch._foreach_add_(params, steps, alpha=-lr * folded)
            else:
                for p, d in zip(params, steps, strict=True):
                    p.add_(d.to(p.dtype), alpha=-lr * folded)
        return loss

    def _momentum(self, params: list[nn.Parameter], steps: list[torch.Tensor],
                  momentum: float) -> list[torch.Tensor]:
        """The heavy-ball buffers b <- momentum * b + step (a first step's copied)."""
        old = [(self.state[p]["momentum_buffer"], d) for p, d in zip(params, steps, strict=True)
               if "momentum_buffer" in self.state[p]]
        if old:
            buffers = [b for b, _ in old]
            torch._foreach_mul_(buffers, momentum)
            torch._foreach_add_(buffers, [d for _, d in old])
        for p, d in zip(params, steps, strict=True):
            self.state[p].setdefault("momentum_buffer", d)
        return [self.state[p]["momentum_buffer"] for p in params]

    def _calibrate(self, directions: dict[nn.Parameter, torch.Tensor]) -> None:
        """Measure the median of |grad / gamma| / |grad| over the coordinates at the first
        step: how many times farther than SGD a step of the same lr moves a typical weight.
        Warn, with the lr that matches SGD's step, when it is above ``RATIO_WARNING`` and
        ``match_sgd`` does not divide lr by it."""
        ratios = torch.cat([(d.double() / p.grad.double()).abs().flatten()[p.grad.flatten() != 0]
                            for p, d in directions.items()])
        ratios = ratios[ratios > 0]
        self.sgd_ratio = float(ratios.median()) if ratios.numel() else 1.0
        if self.sgd_ratio > RATIO_WARNING and not self.match_sgd:
            lr = self.param_groups[0]["lr"]
            warnings.warn(
                f"PathSGD: at lr={lr:g} this network's first step is {self.sgd_ratio:.3g} "
                f"times as long as an SGD step (its gamma_p = d||Phi||_2^2/d(p^2) are "
                f"small); lr={lr / self.sgd_ratio:.3g} gives a step the size of SGD's, as "
                f"does PathSGD(..., match_sgd=True)", stacklevel=5)


def _directions(params: list[nn.Parameter], gammas: dict[nn.Parameter, torch.Tensor]
                ) -> list[torch.Tensor]:
    """grad / gamma, 0 where gamma = 0 (no path of non-zero weights crosses p, so
    grad = 0 there too; a non-finite grad there gives NaN): grad * sign(gamma) /
    max(gamma, the smallest subnormal), exact where gamma > 0, in four foreach calls and
    one new tensor a parameter (``gammas``, fresh from this step's pass, is clamped in
    place: a ResNet-18's 11M numbers are not copied three times)."""
    found = []
    for p in params:
        gamma = gammas.get(p)
        if gamma is None:
            raise InvalidParameterError(
                f"a parameter of shape {tuple(p.shape)} is not a weight or bias of the "
                "traced network; Path-SGD scales only those")
        found.append(gamma)
    grads = [p.grad if p.grad.dtype == g.dtype else p.grad.to(g.dtype)
             for p, g in zip(params, found, strict=True)]
    info = torch.finfo(found[0].dtype)
    directions = torch._foreach_sign(found)
    torch._foreach_mul_(directions, grads)
    torch._foreach_clamp_min_(found, info.smallest_normal * info.eps)
    torch._foreach_div_(directions, found)
    return directions
