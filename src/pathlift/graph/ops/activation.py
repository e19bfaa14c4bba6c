"""Activations: ReLU, and every continuous piecewise-linear activation of one variable,
lowered to the ReLU and identity neurons of thesis Def. 2.2.2.

A continuous piecewise-linear f with breakpoints t_1 < ... < t_k, slope s_0 left of t_1,
s_i on (t_i, t_{i+1}), is computed exactly by

    f(z) = f(t_1) - s_0 ReLU(t_1 - z) + s_1 ReLU(z - t_1) + sum_{i>=2} (s_i - s_{i-1}) ReLU(z - t_i)

so each element z of the activation's input (an identity neuron) feeds ReLU neurons
n_j = ReLU(sigma_j z + beta_j) (sigma_j = +-1, one per non-zero coefficient) which feed
one identity neuron y = f(t_1) + sum_j c_j n_j. This is *the* representation pathlift
uses: path-norms, Lipschitz and generalisation bounds of a network with such activations
are those of this DAG (it computes the same function, so every theorem applies).
LeakyReLU(z) = ReLU(z) - a ReLU(-z), ReLU6(z) = ReLU(z) - ReLU(z - 6) and
Hardtanh(z) = -1 + ReLU(z + 1) - ReLU(z - 1) are instances.

An activation is positively homogeneous (f(lambda z) = lambda f(z) for lambda > 0, so the
rescaling symmetries of Def. 2.4.1 hold through it) exactly when its breakpoints are all 0
and f(0) = 0; otherwise it fixes the scale of the neurons it reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pathlift.graph.boundary import param
from pathlift.graph.ops.base import Call, Handler, Kind, Parametric, register


@dataclass(frozen=True)
class Pieces:
    """A continuous piecewise-linear function of one variable.

    ``breakpoints`` t_1 < ... < t_k (at least one); ``slopes`` s_0, ..., s_k, each a float
    or a tensor broadcasting against the activation (PReLU's per-channel slopes);
    ``value`` = f(t_1).
    """

    breakpoints: tuple[float, ...]
    slopes: tuple[float | Tensor, ...]
    value: float

    def neurons(self) -> list[tuple[float, float, float | Tensor]]:
        """(sigma_j, beta_j, c_j) of the ReLU neurons n_j = ReLU(sigma_j z + beta_j) of the
        lowering (module docstring), those with a coefficient that is zero left out."""
        t, s = self.breakpoints, self.slopes
        out = [(-1.0, t[0], -s[0]), (1.0, -t[0], s[1])]
        out += [(1.0, -t[i], s[i + 1] - s[i]) for i in range(1, len(t))]
        return [n for n in out if not _is_zero(n[2])]

    @property
    def homogeneous(self) -> bool:
        """f(lambda z) = lambda f(z) for every lambda > 0."""
        return self.value == 0 and all(t == 0 for t in self.breakpoints)

    def log_terms(self, q: float, like: Tensor) -> tuple[Tensor, Tensor]:
        """(ln A, ln B) with A = sum_j |c_j|^q and B = sum_j |c_j|^q |beta_j|^q + |f(t_1)|^q:
        the lowered DAG maps an input with |theta|^q-pass value x to A x + B (Thm 3.1.1).
        Float64, broadcasting like the slopes; -inf for a zero term."""
        coefs = [_log_abs(c, like) * q for _, _, c in self.neurons()]
        biases = [c + q * _log_abs_float(beta) for c, (_, beta, _) in
                  zip(coefs, self.neurons(), strict=True)]
        value = torch.full_like(like, q * _log_abs_float(self.value))
        return _logsumexp(coefs, like), _logsumexp([*biases, value], like)

    def log_max_bias(self, q: float) -> float:
        """ln max_j |beta_j|^q over the lowered ReLU neurons (-inf if all are 0)."""
        return max((q * _log_abs_float(beta) for _, beta, _ in self.neurons()),
                   default=-math.inf)


def _is_zero(v: float | Tensor) -> bool:
    return bool((v == 0).all()) if isinstance(v, Tensor) else v == 0


def _log_abs_float(v: float) -> float:
    return math.log(abs(v)) if v != 0 else -math.inf


def _log_abs(v: float | Tensor, like: Tensor) -> Tensor:
    if isinstance(v, Tensor):
        return v.detach().to(torch.float64).abs().log()
    return torch.full_like(like, _log_abs_float(v))


def _logsumexp(logs: list[Tensor], like: Tensor) -> Tensor:
    if not logs:
        return torch.full_like(like, -math.inf)
    stacked = torch.stack(torch.broadcast_tensors(*logs))
    return torch.logsumexp(stacked, dim=0)


class ReluHandler(Handler):
    """ReLU: the activation of the neurons it follows (Def. 2.2.2)."""

    kind = Kind.RELU
    idempotent = True
    in_place = True
    family = "activations"


class Activation(Handler):
    """A continuous piecewise-linear activation, lowered as in the module docstring.
    ``pieces`` describes it for one call; passes derive everything else from that."""

    kind = Kind.ACTIVATION
    creates_neurons = True
    fixed_l1_exceeds_one = True  # its identity neuron y has a bias or several inputs
    in_place = True
    family = "activations"

    def pieces(self, call: Call) -> Pieces:
        """The function computed elementwise by this call."""
        raise NotImplementedError

    def resolve(self, call: Call) -> Handler:
        """An activation that is ReLU itself (``clamp(min=0)``) is the ReLU op."""
        pieces = self.pieces(call)
        if pieces.breakpoints == (0.0,) and pieces.slopes == (0.0, 1.0) and pieces.value == 0:
            return RELU
        return self

    def fixes_scale(self, call: Call) -> bool:
        """Whether the neurons it reads lose their rescaling symmetry (a clipping bound)."""
        return not self.pieces(call).homogeneous


def _bounded(low: float | None, high: float | None) -> Pieces:
    """clamp(z, low, high) as pieces (torch: high wins when low > high)."""
    if low is not None and high is not None:
        if low >= high:
            return Pieces((high,), (0.0, 0.0), float(high))
        return Pieces((float(low), float(high)), (0.0, 1.0, 0.0), float(low))
    if low is not None:
        return Pieces((float(low),), (0.0, 1.0), float(low))
    return Pieces((float(high),), (1.0, 0.0), float(high))


class HardtanhHandler(Activation):
    """Hardtanh / ReLU6 (module or functional): clamp between two constants."""

    def pieces(self, call: Call) -> Pieces:
        if call.module is not None:
            return _bounded(call.module.min_val, call.module.max_val)
        if call.node.target in (F.relu6,):
            return _bounded(0.0, 6.0)
        return _bounded(call.arg(1, "min_val", -1.0), call.arg(2, "max_val", 1.0))


class ClampHandler(Activation):
    """``clamp`` / ``clip`` (function or method) with constant bounds; ``clamp_min`` /
    ``clamp_max`` (``sides`` ``("min",)`` / ``("max",)``: their one bound, the second
    argument); ``clamp_min(0)`` is ReLU (``Activation.resolve``)."""

    def __init__(self, name: str, sides: tuple[str, ...] = ("min", "max")):
        super().__init__(name)
        self.sides = sides

    def bounds(self, call: Call) -> tuple[object, object]:
        """(low, high) of this call, None where it has none."""
        given = {side: call.arg(1 + i, side) for i, side in enumerate(self.sides)}
        return given.get("min"), given.get("max")

    def problem(self, call: Call) -> str | None:
        low, high = self.bounds(call)
        if isinstance(low, Tensor) or isinstance(high, Tensor):
            return (f"{self.name} with tensor bounds is not an elementwise function of one "
                    "variable; give constant bounds")
        if low is None and high is None:
            return f"{self.name} without bounds"
        return None

    def pieces(self, call: Call) -> Pieces:
        return _bounded(*self.bounds(call))

    def resolve(self, call: Call) -> Handler:
        return self if self.problem(call) else super().resolve(call)


class PReLUHandler(Parametric, Activation):
    """PReLU(z) = ReLU(z) - a ReLU(-z) with learnt slopes a (one, or one per channel):
    positively homogeneous; its slopes are parameters of theta (weights of the lowered DAG)."""

    def pieces(self, call: Call) -> Pieces:
        weight = param(call.module, "weight") if call.module is not None else call.arg(1,
                                                                                       "weight")
        return self.pieces_from(call, weight)

    def pieces_from(self, call: Call, weight: Tensor) -> Pieces:
        """The pieces with ``weight`` as the slopes (a tensor of the weight's shape)."""
        x = call.args[0]
        shape = (1, -1) + (1,) * (x.dim() - 2) if weight.numel() > 1 else ()
        return Pieces((0.0,), (weight.reshape(shape), 1.0), 0.0)

    def problem(self, call: Call) -> str | None:
        weight = call.module.weight if call.module is not None else call.arg(1, "weight")
        x = call.args[0]
        if weight.numel() > 1 and (x.dim() < 2 or x.shape[1] != weight.numel()):
            return (f"PReLU has {weight.numel()} slopes but its input has "
                    f"{x.shape[1] if x.dim() > 1 else 1} channels")
        return None

    def resolve(self, call: Call) -> Handler:
        return self


RELU = register(ReluHandler("ReLU"), modules=[nn.ReLU],
                functions=[F.relu, torch.relu, torch.relu_, F.relu_], methods=["relu", "relu_"])
register(HardtanhHandler("ReLU6"), modules=[nn.ReLU6], functions=[F.relu6])
register(HardtanhHandler("Hardtanh"), modules=[nn.Hardtanh], functions=[F.hardtanh, F.hardtanh_])
register(ClampHandler("clamp"), functions=[torch.clamp, torch.clip, torch.clamp_],
         methods=["clamp", "clip", "clamp_", "clip_"], note="/`clip` with constant bounds")
register(ClampHandler("clamp_min", ("min",)), functions=[torch.clamp_min, torch.clamp_min_],
         methods=["clamp_min", "clamp_min_"], note="(`clamp_min(0)` is ReLU)")
register(ClampHandler("clamp_max", ("max",)), functions=[torch.clamp_max, torch.clamp_max_],
         methods=["clamp_max", "clamp_max_"])
register(PReLUHandler("PReLU"), modules=[nn.PReLU], functions=[F.prelu])


class HardsigmoidHandler(Activation):
    """Hardsigmoid(z) = ReLU6(z + 3) / 6: 0 below -3, z/6 + 1/2 between, 1 above 3."""

    def pieces(self, call: Call) -> Pieces:
        return Pieces((-3.0, 3.0), (0.0, 1 / 6, 0.0), 0.0)


register(HardsigmoidHandler("Hardsigmoid"), modules=[nn.Hardsigmoid], functions=[F.hardsigmoid])
