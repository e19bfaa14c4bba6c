"""The bits calculator of thesis Thm 6.1.1 (Gonon et al. 2023a) for layered ReLU networks.

Thm 6.1.1: an LFCN with L >= 2 affine layers, width W = max_l N_l (input, hidden and output
widths), parameters theta and inputs in [-D, D]^d_in; for eps in (0, 1/2) let k >= 0 be the
smallest integer with ||theta||_inf <= eps^-k and max(W, L) <= eps^-k. For every integer
m >= 2kL + k + 1 + log2(ceil(D)), rounding theta to a nearest point of
eta Z cap [-eps^-k, eps^-k], eta = 2^(-m ceil(log2(1/eps))) <= eps^m, gives
||Q(theta)||_inf <= eps^-k and ||R_theta - R_Q(theta)||_{L^inf} <= eps.

Everything is computed in exact rational arithmetic from the float ``eps`` given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from torch import nn

from pathlift.errors import InvalidParameterError, Problem, UnsupportedModelError
from pathlift.graph import LayerGraph, graph_of
from pathlift.graph.structure import lfcn_layers


@dataclass(frozen=True)
class BitsBudget:
    """The outcome of Thm 6.1.1: exponent ``k``, smallest sufficient ``m``, the step
    ``eta`` = 2^(-m ceil(log2 1/eps)) (as ``log2_eta`` too, exact), the grid bound
    ``bound`` = eps^-k, and ``bits_per_coordinate`` = ceil(log2 #(eta Z cap [-bound, bound]))."""

    eps: float
    k: int
    m: int
    log2_eta: int
    bound: float
    bits_per_coordinate: int

    @property
    def eta(self) -> float:
        return math.ldexp(1.0, self.log2_eta)


def sufficient_bits(eps: float, theta_inf: float, width: int, depth: int,
                    input_radius: float = 1.0) -> BitsBudget:
    """Smallest m of Thm 6.1.1 and its step eta, for an LFCN with ``depth`` = L >= 2 affine
    layers, ``width`` = W, ||theta||_inf = ``theta_inf`` and inputs in [-D, D]^d_in with
    D = ``input_radius``."""
    if not 0.0 < eps < 0.5:
        raise InvalidParameterError(f"Thm 6.1.1 needs eps in (0, 1/2), got {eps}")
    if depth < 2 or width < 1:
        raise InvalidParameterError(
            f"Thm 6.1.1 needs L >= 2 affine layers and W >= 1, got L={depth}, W={width}")
    if not (theta_inf >= 0 and math.isfinite(theta_inf)) or not input_radius > 0:
        raise InvalidParameterError(
            f"need a finite ||theta||_inf >= 0 and D > 0, got {theta_inf}, {input_radius}")
    inv = 1 / Fraction(eps)
    target = max(Fraction(theta_inf), Fraction(width), Fraction(depth))
    k = 0
    while inv**k < target:
        k += 1
    m = 2 * k * depth + k + 1 + _ceil_log2(math.ceil(input_radius))
    c = _ceil_log2_fraction(inv)
    grid_half = math.floor(inv**k * 2 ** (m * c))  # points of the grid on (0, eps^-k]
    return BitsBudget(eps=eps, k=k, m=m, log2_eta=-m * c, bound=float(inv**k),
                      bits_per_coordinate=(2 * grid_half).bit_length())


def _ceil_log2(n: int) -> int:
    """ceil(log2 n) for an integer n >= 1."""
    return (n - 1).bit_length()


def _ceil_log2_fraction(x: Fraction) -> int:
    """ceil(log2 x) for a rational x > 1, exactly."""
    c = _ceil_log2(math.ceil(x))
    while Fraction(2) ** (c - 1) >= x:
        c -= 1
    return c


@dataclass(frozen=True)
class LFCNConstants:
    """W, L and ||theta||_inf of an LFCN, as Thm 6.1.1 defines them."""

    width: int
    depth: int
    theta_inf: float


def lfcn_constants(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None
                   ) -> LFCNConstants:
    """W = max of the input, hidden and output widths, L = number of Linear layers,
    ||theta||_inf over weights and biases; refuses anything but Flatten/Linear/ReLU."""
    graph = graph_of(model, input_shape)
    graph.check_values()
    linears, problems = lfcn_layers(graph)
    if problems:
        raise UnsupportedModelError([Problem(p.node, p.op, "Thm 6.1.1: " + p.reason)
                                     for p in problems])
    widths = [linears[0].in_features] + [lin.out_features for lin in linears]
    theta_inf = max(float(t.detach().abs().max()) for lin in linears
                    for t in (lin.weight, lin.bias) if t is not None)
    return LFCNConstants(width=max(widths), depth=len(linears), theta_inf=theta_inf)
