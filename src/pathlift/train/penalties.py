"""Path-norm penalties for training: ||Phi||_q, ln ||Phi||_1 (thesis Thm 3.1.1) and the
average-case path-norm E_x ||A(theta, x)^T Phi(theta)||_1 (thesis Sec. 7.2.2), each a tensor
in the autograd graph of the model's parameters, to add to your loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import eval_mode, unwrap
from pathlift.graph.boundary import flat_outputs
from pathlift.lift.differentiable import differentiable_path_norm, path_norm_backward

__all__ = ["PENALTIES", "AverageCasePenalty", "PathNormPenalty", "make_penalty"]


@dataclass(frozen=True)
class PathNormPenalty:
    """``penalty(model)``: ||Phi(theta)||_q (``log=False``) or ln ||Phi(theta)||_q
    (``log=True``, the one for deep networks, whose norms leave float64) as a 0-dim tensor,
    differentiable in the model's parameters: one |theta|^q pass at batch 1 through
    autograd (thesis Thm 3.1.1). ``x`` is accepted and ignored (the norm is data-free).

    The model is measured as in eval mode (flags restored), never modified; ``backward``
    adds to the parameters' ``.grad`` as any loss term does.

    Example::

        penalty = PathNormPenalty((1, 8, 8), q=1.0, log=True)
        loss = F.cross_entropy(model(x), y) + 1e-2 * penalty(model)

    or, the same step without the penalty's autograd graph (``backward``)::

        F.cross_entropy(model(x), y).backward()
        penalty.backward(model, 1e-2)
    """

    input_shape: tuple[int, ...]
    q: float = 1.0
    log: bool = False
    dtype: torch.dtype | None = None

    def __call__(self, model: nn.Module, x: Tensor | None = None) -> Tensor:
        ln_norm = differentiable_path_norm(model, self.input_shape, self.q, None, self.dtype)
        return ln_norm if self.log else ln_norm.exp()

    def backward(self, model: nn.Module, weight: float = 1.0, x: Tensor | None = None
                 ) -> float:
        """``(weight * penalty(model)).backward()``, called after the loss's ``backward``,
        at the cost of arithmetic on an MLP (``pathlift.lift.path_norm_backward``); returns
        the penalty's value."""
        return path_norm_backward(model, self.input_shape, weight, self.q, None, self.dtype,
                                  self.log)


@dataclass(frozen=True)
class AverageCasePenalty:
    """``penalty(model, x)``: the average-case path-norm E_x sum_v ||A(theta, x)^T
    Phi^{->v}(theta)||_1 (thesis Sec. 7.2.2) over the first ``samples`` rows of x, as a
    tensor differentiable in the parameters.

    A(theta, x)^T Phi^{->v} holds the input gradient of output v and its offset
    R_v(x) - <grad R_v(x), x> (Thm 2.4.2), so the penalty is sum_v (||grad_x R_v||_1 +
    |R_v(x) - <grad_x R_v(x), x>|), averaged: one forward and d_out double-backward passes
    (``create_graph``). Equals ``pathlift.lift.average_case_path_norm(...).mean`` on the
    same inputs. Runs the model as in eval mode (flags restored).
    """

    samples: int = 32

    def __call__(self, model: nn.Module, x: Tensor | None = None) -> Tensor:
        if x is None or len(x) == 0:
            raise InvalidParameterError("the average-case penalty needs a batch of inputs x")
        net = unwrap(model)
        probe = x[:self.samples].detach().requires_grad_()
        with eval_mode(net), torch.enable_grad():
            out = flat_outputs(net(probe), len(probe))
            flat = probe.flatten(1)
            total = out.new_zeros(len(probe))
            for v in range(out.shape[1]):
                (grad,) = torch.autograd.grad(out[:, v].sum(), probe, create_graph=True)
                slopes = grad.flatten(1)
                offset = out[:, v] - (slopes * flat).sum(1)
                total = total + slopes.abs().sum(1) + offset.abs()
        return total.mean()

    def backward(self, model: nn.Module, weight: float = 1.0, x: Tensor | None = None
                 ) -> float:
        """``(weight * penalty(model, x)).backward()``; returns the penalty's value."""
        value = self(model, x)
        (weight * value).backward()
        return float(value.detach())


PENALTIES = ("l1", "l2", "l4", "log-l1", "average-case")


def make_penalty(name: str, input_shape: Sequence[int], dtype: torch.dtype | None = None
                 ) -> PathNormPenalty | AverageCasePenalty:
    """The penalty called ``name``: "l1", "l2", "l4" (||Phi||_q), "log-l1" (ln ||Phi||_1) or
    "average-case" (Sec. 7.2.2)."""
    shape = tuple(int(d) for d in input_shape)
    if name == "average-case":
        return AverageCasePenalty()
    if name == "log-l1":
        return PathNormPenalty(shape, 1.0, True, dtype)
    if name in ("l1", "l2", "l4"):
        return PathNormPenalty(shape, float(name[1:]), False, dtype)
    raise InvalidParameterError(f"unknown penalty {name!r}; choose one of {PENALTIES}")

