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
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, fx, nn

from pathlift.errors import UnsupportedModelError, check_number
from pathlift.graph import Call, LayerGraph, Scaled, graph_of
from pathlift.graph.abs_pow import ScaledWalker, channel_bias, output_logs, scaled_affine
from pathlift.graph.ops import Activation, AffineHandler, FixedLinear, Handler, Kind, abs_power
from pathlift.graph.sharded import ShardedWalker, is_sharded_graph
from pathlift.graph.structure import lfcn_layers
from pathlift.lift.path_metric import PathMetric, path_metric
from pathlift.lift.path_norm import PathNorm, check_finite, log_r_norm, path_norm
from pathlift.logspace import LN10, format_log10, power10


# --------------------------------------------------------------------------- Pi_{q,r}
class _ProductPass(ScaledWalker):
    """M_v = max_{p ending at v} Pi(theta, p, q)^q (Def. 3.3.1) for every neuron v.

    Along a path p = (r -> v), Pi(p)^q = Pi(r)^q ||theta^{->v}||_q^q + |b_v|^q and the path
    of length 0 at v gives |b_v|^q (1 at an input), hence the recursion
    M_v = ||theta^{->v}||_q^q * max_{u in ant(v)} M_u + |b_v|^q, carried in log space.
    ||theta^{->v}||_q^q counts the edges that exist (the |theta|^q pass on the all-ones
    input); the max over antecedents is each op's ``antecedent_max``.
    """

    purpose = "the product of layer norms Pi_{q,r} (Def. 3.3.1)"
    refuses: ClassVar[dict[Kind, str]] = {Kind.ADD: ""}

    def __init__(self, graph: LayerGraph, q: float):
        super().__init__(graph)
        self.q = q

    def run_node(self, n: fx.Node):
        if n.op == "placeholder":
            shape = (1, *self.layer_graph.input_shape)
            return Scaled(torch.ones(shape, dtype=torch.float64), 0.0)
        return super().run_node(n)

    def on_relu(self, handler: Handler, call: Call) -> Scaled:
        return call.args[0]

    def on_pool(self, handler: FixedLinear, call: Call) -> Scaled:
        """Fixed weights, no bias: ||theta^{->v}||_q^q times the antecedents' max."""
        x = call.args[0]
        weights, log_gain = handler.abs_pow(torch.ones_like(x.mantissa), self.q,
                                            call.replace(torch.ones_like(x.mantissa)))
        peak = handler.antecedent_max(x.mantissa, call.replace(x.mantissa))
        return Scaled.normalised(weights * peak, x.log_scale + log_gain)

    on_maxpool = on_pool

    def on_activation(self, handler: Activation, call: Call) -> Scaled:
        """y = f(t_1) + sum_j c_j n_j, n_j = ReLU(+-z + beta_j):
        M_y = (sum_j |c_j|^q) (M_z + max_j |beta_j|^q) + |f(t_1)|^q."""
        x = call.args[0]
        pieces = handler.pieces(call.replace(x.mantissa))
        like = x.mantissa.new_zeros((), dtype=torch.float64)
        log_a, _ = pieces.log_terms(self.q, like)
        log_beta = pieces.log_max_bias(self.q)
        log_c = self.q * math.log(abs(pieces.value)) if pieces.value else -math.inf
        top = max(x.log_scale, log_beta)
        inner = (x.mantissa * math.exp(x.log_scale - top)
                 + (math.exp(log_beta - top) if log_beta > -math.inf else 0.0))
        top_a = float(log_a.max())
        scaled = Scaled.normalised(inner * torch.exp(log_a - top_a), top + top_a)
        if log_c == -math.inf:
            return scaled
        peak = max(scaled.log_scale, log_c)
        return Scaled.normalised(scaled.mantissa * math.exp(scaled.log_scale - peak)
                                 + math.exp(log_c - peak), peak)

    def on_affine(self, handler: AffineHandler, call: Call) -> Scaled:
        """||theta^{->v}||_q^q max_u M_u + |b_v|^q, the layer taken as u^q |W/u|^q and
        v^q |b/v|^q (its ``units``), so that |theta|^q never leaves the float range."""
        if handler.out_dim != 0:
            raise self.unsupported(handler, call, " (a transposed convolution)")
        x = call.args[0]
        ones = torch.ones_like(x.mantissa)
        peak = handler.antecedent_max(x.mantissa, call.replace(x.mantissa))
        unit, bias_unit = self.units(handler, call)
        y = self.weight_part(handler, ones, call.replace(ones), unit=unit) * peak
        dim = handler.channel_dim
        return scaled_affine(lambda b: y if b is None else y + channel_bias(b, y.dim(), dim),
                             x.log_scale + self.q * math.log(unit),
                             self.bias_magnitude(handler, call, bias_unit), dim,
                             self.q * math.log(bias_unit))

    def units(self, handler: AffineHandler, call: Call) -> tuple[float, float]:
        """The layer's (u, v) (a hook, as ``AbsPowInterpreter``'s)."""
        return handler.units(call.module)

    def weight_part(self, handler: AffineHandler, x: Tensor, call: Call,
                    bias: Tensor | None = None, unit: float = 1.0) -> Tensor:
        """|W/unit|^q x (+ bias) of one layer (a hook, as ``AbsPowInterpreter``'s)."""
        return handler.weight_part(x, self.q, call, bias, unit=unit)

    def bias_magnitude(self, handler: AffineHandler, call: Call, unit: float = 1.0
                       ) -> Tensor | None:
        """|b/unit|^q of one layer in float64, or None (a hook, as ``weight_part``)."""
        bias = handler.bias(call.module)
        return None if bias is None else abs_power(bias, self.q, torch.float64, unit=unit)


class _ShardedProductPass(ShardedWalker, _ProductPass):
    """``_ProductPass`` over a graph with sharded layers (``pathlift.graph.sharded``)."""

    refuses: ClassVar[dict[Kind, str]] = {Kind.ADD: " (a residual sum)"}


@dataclass(frozen=True)
class LayerNormProduct:
    """Pi_{q,r}(theta) of Def. 3.3.1 in log10 (equals prod_l ||M_l||_{q,inf} for bias-free
    layered networks and r = inf, Lemma 3.3.3)."""

    q: float
    r: float
    log10: float

    @property
    def value(self) -> float:
        return power10(self.log10)

    def __str__(self) -> str:
        return f"Pi_(q={self.q:g}, r={self.r:g}) = {format_log10(self.log10)}"


def layer_norm_product(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                       q: float = 1.0, r: float | None = None) -> LayerNormProduct:
    """Pi_{q,r}(theta) = ||(max_{p -> v} Pi(theta, p, q))_{v output}||_r (Def. 3.3.1, eq. 3.4),
    r = q when None (as ``path_norm``).

    One max-product forward pass. Thm 3.3.2: ||Phi(theta)||_{q,r} <= Pi_{q,r}(theta), with
    equality for q-normalized parameters. Raises UnsupportedModelError for residual sums
    and transposed convolutions.
    """
    r = q if r is None else r
    graph = graph_of(model, input_shape)
    graph.check_values()
    walker = _ShardedProductPass if is_sharded_graph(graph) else _ProductPass
    with torch.no_grad():
        out = walker(graph, q).run()
    logs = output_logs(out)
    check_finite(graph, logs, f"Pi_(q={q:g}) of an output neuron")
    total = float(log_r_norm(logs / q, r))
    return LayerNormProduct(q, r, total / LN10)


# --------------------------------------------------------------------------- bounds
@dataclass(frozen=True)
class InputLipschitz:
    """Lipschitz constant of x -> R_theta(x) from ||.||_inf to ||.||_r (Thm 3.3.1), and the
    product of layer norms Pi_{1,r} for comparison (None when not implemented)."""

    path_norm: PathNorm
    layer_product: LayerNormProduct | None

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
    return InputLipschitz(path_norm(graph, None, 1.0, r), product)


@dataclass(frozen=True)
class ParameterLipschitz:
    """Bound on ||R_theta(x) - R_theta'(x)||_r for inputs with ||x||_inf <= x_inf.

    ``applies`` is False when theta_i theta'_i < 0 for some i: Cor. 3.4.1 does not hold
    there (thesis Figure 3.4) and no bound is given (``log10`` is nan). Otherwise ``log10``
    bounds it with the exact path-metric, or with the upper end of its certified interval.
    ``lfcn_log10`` is the classical bound (eq. 3.7), for bias-free layered Linear/ReLU
    networks only (None otherwise); it holds without sign condition.
    """

    applies: bool
    log10: float
    metric: PathMetric
    x_inf: float
    lfcn_log10: float | None
    reason: str

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
    if not metric.same_signs:
        return ParameterLipschitz(
            False, math.nan, metric, x_inf, lfcn,
            "some theta_i theta'_i < 0: outside the assumptions of Thm 3.4.1 / Cor. 3.4.1 "
            "(thesis Figure 3.4 gives R_theta = ReLU(x), R_theta' = -ReLU(-x) with "
            "Phi(theta) = Phi(theta')); no path-metric bound")
    bound = math.log10(max(x_inf, 1.0)) + metric.upper_log10
    how = "exact path-metric" if metric.exact else "upper end of the path-metric interval"
    return ParameterLipschitz(True, bound, metric, x_inf, lfcn, f"Cor. 3.4.1 with the {how}")


@dataclass(frozen=True, repr=False)
class LipschitzBounds:
    """``lipschitz_bounds``: the bound in the input (Thm 3.3.1, with Pi_{1,r}) and, when a
    second model was given, the bound in the parameters (Cor. 3.4.1, with eq. 3.7)."""

    input: InputLipschitz
    params: ParameterLipschitz | None

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
