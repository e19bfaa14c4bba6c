"""The product of layer norms Pi_{q,r}(theta) of a ReLU DAG (thesis Def. 3.3.1, Lemma 3.3.3):
one max-product forward pass. Thm 3.3.2: ||Phi(theta)||_{q,r} <= Pi_{q,r}(theta), with
equality for q-normalized parameters; ``pathlift.bounds.lipschitz`` compares the two."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, fx, nn

from pathlift.graph import Call, LayerGraph, Scaled, graph_of
from pathlift.graph.abs_pow import ScaledWalker, channel_bias, output_logs, scaled_affine
from pathlift.graph.ops import Activation, AffineHandler, FixedLinear, Handler, Kind, abs_power
from pathlift.graph.sharded import ShardedWalker, is_sharded_graph
from pathlift.lift.path_norm import check_finite, log_r_norm
from pathlift.logspace import LN10, format_log10, power10


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
    check_finite(graph, logs, f"Pi_(q={q:g}) of an output neuron", q)
    total = float(log_r_norm(logs / q, r))
    return LayerNormProduct(q, r, total / LN10)
