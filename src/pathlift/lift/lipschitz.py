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

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from pathlift.errors import Problem, UnsupportedModelError
from pathlift.graph import Call, Kind, LayerGraph, Scaled, trace
from pathlift.graph.ops import MeanHandler, PoolGeometry, UpsampleHandler
from pathlift.graph.trace import HANDLER
from pathlift.lift.path_metric import PathMetric, path_metric
from pathlift.lift.path_norm import PathNorm, path_norm_of_graph
from pathlift.logspace import format_log10, power10

_LN10 = math.log(10.0)


# --------------------------------------------------------------------------- Pi_{q,r}
class _ProductPass(fx.Interpreter):
    """M_v = max_{p ending at v} Pi(theta, p, q)^q (Def. 3.3.1) for every neuron v.

    Along a path p = (r -> v), Pi(p)^q = Pi(r)^q ||theta^{->v}||_q^q + |b_v|^q and the path
    of length 0 at v gives |b_v|^q (1 at an input), hence the recursion
    M_v = ||theta^{->v}||_q^q * max_{u in ant(v)} M_u + |b_v|^q, carried in log space.
    ||theta^{->v}||_q^q counts the edges that exist (the |theta|^q pass on the all-ones input).
    """

    def __init__(self, graph: LayerGraph, q: float):
        super().__init__(graph.module, garbage_collect_values=True)
        self.layer_graph, self.q = graph, q

    def run_node(self, n: fx.Node):
        if n.op == "placeholder":
            shape = (1, *self.layer_graph.input_shape)
            return Scaled(torch.ones(shape, dtype=torch.float64), 0.0)
        if n.op == "output":
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        handler = n.meta[HANDLER]
        kind = handler.kind
        module = self.layer_graph.submodule(n)
        if kind is Kind.CAT:
            tensors = list(args[0])
            top = max(t.log_scale for t in tensors)
            mantissas = [t.mantissa * math.exp(t.log_scale - top) for t in tensors]
            return Scaled(torch.cat(mantissas, *args[1:], **kwargs), top)
        scaled = next((a for a in args if isinstance(a, Scaled)), None)
        plain = tuple(a.mantissa if isinstance(a, Scaled) else a for a in args)
        call = Call(n, module, plain, dict(kwargs))
        if kind is Kind.SHAPE:
            return call.run(*plain)
        if kind is Kind.ADD or (kind is Kind.AFFINE and getattr(module, "transposed", False)):
            raise UnsupportedModelError([Problem(
                str(n.target if module is not None else n.name), handler.name,
                "the product of layer norms Pi_{q,r} (Def. 3.3.1) is implemented for "
                "networks without residual sums and transposed convolutions")])
        x = scaled.mantissa
        if kind in (Kind.RELU, Kind.IDENTITY, Kind.RESHAPE):
            return Scaled(call.run(x), scaled.log_scale)
        ones = torch.ones_like(x)
        if kind is Kind.AFFINE:
            norms = handler.weight_part(ones, self.q, call)
            bias = handler.bias(module)
            peak = _antecedent_max(x, call, handler, module)
        else:  # pooling neurons: fixed weights, no bias
            norms = handler.abs_pow(ones, self.q, call)
            bias = None
            peak = _antecedent_max(x, call, handler, module)
        y = norms * peak
        if bias is None:
            return Scaled.normalised(y, scaled.log_scale)
        b = bias.detach().to(torch.float64).abs().pow(self.q)
        b = b if handler.channel_dim == -1 else b.reshape((1, -1) + (1,) * (y.dim() - 2))
        top = max(scaled.log_scale, math.log(max(float(b.max()), 1e-300)))
        return Scaled.normalised(y * math.exp(scaled.log_scale - top) + b * math.exp(-top), top)


def _antecedent_max(x: Tensor, call: Call, handler, module: nn.Module | None) -> Tensor:
    """max_{u in ant(v)} M_u for every neuron v created by the op (structural edges)."""
    if isinstance(module, nn.Linear):
        return x.amax(dim=-1, keepdim=True)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return x
    if isinstance(module, nn.modules.conv._ConvNd):
        return _conv_max(x, module)
    if handler.kind is Kind.MAXPOOL:
        return call.run(x)
    if isinstance(handler, UpsampleHandler):
        return call.run(x)
    if isinstance(handler, MeanHandler):
        return x.amax(dim=handler._dims(call, x.dim()), keepdim=bool(call.arg(2, "keepdim")))
    out_spatial = call.run(x).shape[2:]
    if handler.adaptive:
        fn = (F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d)
        return fn[len(out_spatial) - 1](x, tuple(out_spatial))
    g = PoolGeometry(call, handler.dims, False)
    return _window_max(x, g.kernel, g.stride, g.padding, g.dilation, out_spatial)


def _window_max(x: Tensor, kernel, stride, padding, dilation, out_spatial) -> Tensor:
    """Max over each window, padding excluded (padded with -inf), cropped to out_spatial."""
    pad: list[int] = []
    for k, s, p, d, n, o in zip(kernel, stride, padding, dilation, x.shape[2:], out_spatial,
                                strict=True):
        extra = max((o - 1) * s + d * (k - 1) + 1 - (n + 2 * p), 0)
        pad = [p, p + extra, *pad]
    x = F.pad(x, pad, value=-math.inf)
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[len(kernel) - 1]
    out = fn(x, list(kernel), list(stride), 0, list(dilation))
    return out[(slice(None), slice(None), *(slice(0, o) for o in out_spatial))]


def _conv_max(x: Tensor, conv: nn.modules.conv._ConvNd) -> Tensor:
    if isinstance(conv.padding, str):
        raise UnsupportedModelError(f"Pi_{{q,r}}: string padding '{conv.padding}' of a conv "
                                    "is not supported; give explicit padding")
    dims = x.dim() - 2
    probe = conv._conv_forward(torch.zeros_like(x[:, :1]).expand(
        1, conv.in_channels, *x.shape[2:]).to(conv.weight.dtype), conv.weight, None)
    out_spatial = probe.shape[2:]
    pooled = _window_max(x, conv.kernel_size, conv.stride, conv.padding[:dims],
                         conv.dilation, out_spatial)
    groups = conv.groups
    pooled = pooled.reshape(1, groups, -1, *out_spatial).amax(dim=2)
    return pooled.repeat_interleave(conv.out_channels // groups, dim=1)


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


def layer_norm_product(model: nn.Module, input_shape: Sequence[int], q: float = 1.0,
                       r: float = 1.0) -> LayerNormProduct:
    """Pi_{q,r}(theta) = ||(max_{p -> v} Pi(theta, p, q))_{v output}||_r (Def. 3.3.1, eq. 3.4).

    One max-product forward pass. Thm 3.3.2: ||Phi(theta)||_{q,r} <= Pi_{q,r}(theta), with
    equality for q-normalized parameters. Raises UnsupportedModelError for residual sums
    and transposed convolutions.
    """
    graph = trace(model, input_shape)
    with torch.no_grad():
        out = _ProductPass(graph, q).run()
    outs = [out] if isinstance(out, Scaled) else list(out)
    per_output = torch.cat([o.log().reshape(-1) for o in outs]) / q
    total = float(per_output.max()) if math.isinf(r) else \
        float(torch.logsumexp(per_output * r, 0)) / r
    return LayerNormProduct(q, r, total / _LN10)


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


def lipschitz_input(model: nn.Module, input_shape: Sequence[int], r: float = 1.0
                    ) -> InputLipschitz:
    """||R(x) - R(x')||_r <= ||Phi(theta)||_{1,r} ||x - x'||_inf (thesis Thm 3.3.1)."""
    graph = trace(model, input_shape)
    try:
        product = layer_norm_product(model, input_shape, 1.0, r)
    except UnsupportedModelError:
        product = None
    return InputLipschitz(path_norm_of_graph(graph, 1.0, r), product)


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


def lipschitz_params(model_a: nn.Module, model_b: nn.Module, input_shape: Sequence[int],
                     x_inf: float = 1.0) -> ParameterLipschitz:
    """max(||x||_inf, 1) d(theta, theta') (thesis Cor. 3.4.1) for ||x||_inf <= ``x_inf``."""
    metric = path_metric(model_a, model_b, input_shape)
    lfcn = _lfcn_bound_log10(model_a, model_b, input_shape, x_inf)
    if not metric.same_signs:
        return ParameterLipschitz(
            False, math.nan, metric, x_inf, lfcn,
            "some theta_i theta'_i < 0: outside the assumptions of Thm 3.4.1 / Cor. 3.4.1 "
            "(thesis Figure 3.4 gives R_theta = ReLU(x), R_theta' = -ReLU(-x) with "
            "Phi(theta) = Phi(theta')); no path-metric bound")
    bound = math.log10(max(x_inf, 1.0)) + metric.upper_log10
    how = "exact path-metric" if metric.exact else "upper end of the path-metric interval"
    return ParameterLipschitz(True, bound, metric, x_inf, lfcn, f"Cor. 3.4.1 with the {how}")


def _lfcn_bound_log10(model_a: nn.Module, model_b: nn.Module, input_shape: Sequence[int],
                      x_inf: float) -> float | None:
    """(W ||x||_inf + 1) W L^2 R^{L-1} ||theta - theta'||_inf (thesis eq. 3.7) with
    R = max(1, max_l ||M_l||_{1,inf}) over both models, for bias-free Linear/ReLU stacks."""
    layers = []
    for model in (model_a, model_b):
        mods = list(model.children()) if isinstance(model, nn.Sequential) else []
        linear = [m for m in mods if isinstance(m, nn.Linear)]
        if not linear or any(not isinstance(m, (nn.Linear, nn.ReLU)) for m in mods) \
                or any(m.bias is not None for m in linear) or len(input_shape) != 1:
            return None
        layers.append(linear)
    L = len(layers[0])
    width = max([input_shape[0]] + [m.out_features for m in layers[0]])
    R = max([1.0] + [float(m.weight.detach().abs().sum(1).max()) for ms in layers for m in ms])
    gap = max(float((a.weight.detach() - b.weight.detach()).abs().max())
              for a, b in zip(*layers, strict=True))
    if gap == 0.0:
        return -math.inf
    return (math.log10(width * x_inf + 1) + math.log10(width) + 2 * math.log10(L)
            + (L - 1) * math.log10(R) + math.log10(gap))
