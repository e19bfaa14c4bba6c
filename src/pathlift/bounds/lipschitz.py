"""Lipschitz bounds of ReLU networks in the input and in the parameters (thesis Sec. 3.3-3.4).

- in x: ||R(x) - R(x')||_r <= ||Phi(theta)||_{1,r} ||x - x'||_inf (Thm 3.3.1), compared
  with the product of layer norms Pi_{q,r}(theta) (Def. 3.3.1, Lemma 3.3.3), which is
  never smaller (Thm 3.3.2);
- in theta: ||R_theta(x) - R_theta'(x)||_r <= max(||x||_inf, 1) d(theta, theta') when
  theta_i theta'_i >= 0 for all i (Cor. 3.4.1), compared with the classical bound
  (W||x||_inf + 1) W L^2 R^{L-1} ||theta - theta'||_inf of layered networks (eq. 3.7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from pathlift.errors import UnsupportedModelError, check_number
from pathlift.graph import LayerGraph, graph_of
from pathlift.graph.input_shape import InputShape, shape_used
from pathlift.graph.structure import lfcn_layers
from pathlift.lift.layer_norm import LayerNormProduct, layer_norm_product
from pathlift.lift.path_metric import PathMetric, path_metric
from pathlift.lift.path_norm import PathNorm, path_norm
from pathlift.logspace import power10


@dataclass(frozen=True)
class InputLipschitz:
    """Lipschitz constant of x -> R_theta(x) from ||.||_inf to ||.||_r (Thm 3.3.1), and the
    product of layer norms Pi_{1,r} for comparison (None when not implemented), at
    ``input_shape`` (its ``source`` says where it came from: given, or the model's own
    declaration; never a guess)."""

    path_norm: PathNorm
    layer_product: LayerNormProduct | None
    input_shape: InputShape | None = field(default=None, repr=False, compare=False)

    @property
    def log10(self) -> float:
        return self.path_norm.log10


def lipschitz_input(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                    r: float = 1.0) -> InputLipschitz:
    """||R(x) - R(x')||_r <= ||Phi(theta)||_{1,r} ||x - x'||_inf (thesis Thm 3.3.1)."""
    graph = graph_of(model, input_shape)
    try:
        product = layer_norm_product(graph, None, 1.0, r)
    except UnsupportedModelError:
        product = None
    return InputLipschitz(path_norm(graph, None, 1.0, r), product,
                          shape_used(graph.input_shape, input_shape))


@dataclass(frozen=True)
class ParameterLipschitz:
    """Bound on ||R_theta(x) - R_theta'(x)||_r for inputs with ||x||_inf <= x_inf.

    ``applies`` is False when theta_i theta'_i < 0 for some i: Cor. 3.4.1 does not hold
    there (thesis Figure 3.4) and no bound is given (``log10`` is nan). Otherwise ``log10``
    bounds it with the exact path-metric, or with the upper end of its certified interval.
    ``lfcn_log10`` is the classical bound (eq. 3.7), for bias-free layered Linear/ReLU
    networks only (None otherwise); it holds without sign condition. ``input_shape``: the
    shape both models were traced at, with its ``source``.
    """

    applies: bool
    log10: float
    metric: PathMetric
    x_inf: float
    lfcn_log10: float | None
    reason: str
    input_shape: InputShape | None = field(default=None, repr=False, compare=False)

    @property
    def value(self) -> float:
        return power10(self.log10) if self.applies else math.nan


def lipschitz_params(model_a: nn.Module | LayerGraph, model_b: nn.Module | LayerGraph,
                     input_shape: Sequence[int] | None = None, x_inf: float = 1.0
                     ) -> ParameterLipschitz:
    """max(||x||_inf, 1) d(theta, theta') (thesis Cor. 3.4.1) for ||x||_inf <= ``x_inf``."""
    x_inf = check_number("x_inf", x_inf, 0.0)
    graph_a = graph_of(model_a, input_shape)
    graph_b = graph_of(model_b, graph_a.input_shape)
    metric = path_metric(graph_a, graph_b)
    lfcn = _lfcn_bound_log10(graph_a, graph_b, x_inf)
    shape = shape_used(graph_a.input_shape, input_shape)
    if not metric.same_signs:
        return ParameterLipschitz(
            False, math.nan, metric, x_inf, lfcn,
            "some theta_i theta'_i < 0: outside the assumptions of Thm 3.4.1 / Cor. 3.4.1 "
            "(thesis Figure 3.4 gives R_theta = ReLU(x), R_theta' = -ReLU(-x) with "
            "Phi(theta) = Phi(theta')); no path-metric bound", shape)
    bound = math.log10(max(x_inf, 1.0)) + metric.upper_log10
    how = "exact path-metric" if metric.exact else "upper end of the path-metric interval"
    return ParameterLipschitz(True, bound, metric, x_inf, lfcn, f"Cor. 3.4.1 with the {how}",
                              shape)


@dataclass(frozen=True, repr=False)
class LipschitzBounds:
    """``lipschitz_bounds``: the bound in the input (Thm 3.3.1, with Pi_{1,r}) and, when a
    second model was given, the bound in the parameters (Cor. 3.4.1, with eq. 3.7)."""

    input: InputLipschitz
    params: ParameterLipschitz | None

    @property
    def input_shape(self) -> InputShape | None:
        """The shape both bounds were computed at, with its ``source``."""
        return self.input.input_shape

    def __repr__(self) -> str:
        text = f"LipschitzBounds(in x: log10 {self.input.log10:.6f}"
        if self.params is not None:
            text += (f", in theta: log10 {self.params.log10:.6f}" if self.params.applies
                     else ", in theta: no bound")
        return text + ")"


def lipschitz_bounds(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                     r: float = 1.0, *, other: nn.Module | LayerGraph | None = None,
                     x_inf: float = 1.0) -> LipschitzBounds:
    """``lipschitz_input(model, input_shape, r)`` and, with ``other``, ``lipschitz_params(
    model, other, input_shape, x_inf)``, in one call (``pathlift lipschitz``)."""
    x_inf = check_number("x_inf", x_inf, 0.0)  # checked also when no second model uses it
    params = None if other is None else lipschitz_params(model, other, input_shape, x_inf)
    return LipschitzBounds(lipschitz_input(model, input_shape, r), params)


def _lfcn_bound_log10(graph_a: LayerGraph, graph_b: LayerGraph, x_inf: float
                      ) -> float | None:
    """(W ||x||_inf + 1) W L^2 R^{L-1} ||theta - theta'||_inf (thesis eq. 3.7) with
    R = max(1, max_l ||M_l||_{1,inf}) over both models, for bias-free Linear/ReLU stacks."""
    layers = []
    for graph in (graph_a, graph_b):
        linear, problems = lfcn_layers(graph)
        if problems or not linear or any(m.bias is not None for m in linear) \
                or len(graph.input_shape) != 1:
            return None
        layers.append(linear)
    L = len(layers[0])
    width = max([graph_a.input_shape[0]] + [m.out_features for m in layers[0]])
    R = max([1.0] + [float(m.weight.detach().abs().sum(1).max()) for ms in layers for m in ms])
    gap = max(float((a.weight.detach() - b.weight.detach()).abs().max())
              for a, b in zip(*layers, strict=True))
    if gap == 0.0:
        return -math.inf
    return (math.log10(width * x_inf + 1) + math.log10(width) + 2 * math.log10(L)
            + (L - 1) * math.log10(R) + math.log10(gap))
