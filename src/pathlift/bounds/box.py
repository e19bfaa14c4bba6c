"""Interval arithmetic over a box of parameters: for each input x, an enclosure of the
outputs R_theta'(x) of EVERY theta' in a box [low, high] of parameters, in one pass.

Every value is an ``Interval`` (center c, radius r >= 0), meaning [c - r, c + r], in
float64; each op encloses the image of its input intervals under every parameter of the
box, and also the rounding of its own float64 arithmetic (the gamma_n bound of Higham,
Accuracy and Stability of Numerical Algorithms, Thm 3.1: |fl(sum) - sum| <= gamma_n
sum |terms|, gamma_n = n u / (1 - n u), u = 2^-53), so the enclosure is rigorous:

- affine (Linear, Conv, ConvTranspose, eval BatchNorm x*a + c): W x + b with W in
  [Wc - Wr, Wc + Wr], b likewise and x in [xc - xr, xc + xr] lies in
  Wc xc + bc +- (|Wc| xr + Wr (|xc| + xr) + br) (Rump's midpoint-radius product);
- ReLU, max-pooling: monotone in each input, applied to both ends;
- fixed linear maps (average pools, mean, interpolation, padding, constant scales):
  P c +- |P| r, |P| being the op's own |theta| pass (``FixedLinear.abs_pow``, q = 1);
- residual sums and differences: centres combine, radii add; relabelling ops (views,
  slicing, cat) move both;
- piecewise-linear activations (the lowering of ``pathlift.graph.ops.activation``): the
  extremes of a continuous piecewise-linear function of one variable over [lo, hi] are
  among lo, hi and the breakpoints inside; PReLU, bilinear in (slope, z) on each piece,
  reaches its extremes at the corners of (slope box) x (those points).

``box_margins`` turns the pass into a lower bound on the multiclass margin
R(x)_y - max_{c != y} R(x)_c of every network in the box, the per-input transfer of
``pathlift.bounds.compression``. When the network returns the output of a Linear layer,
the margin is enclosed through that layer directly: R_y - R_c = (W_y - W_c) h + b_y - b_c
with W_y - W_c in [Wc_y - Wc_c -+ (Wr_y + Wr_c)] (distinct coordinates of the box, so
independent), instead of low(R_y) - high(R_c), which would count h's uncertainty twice.
For a network with one hidden layer the enclosure is then the exact range up to the
midpoint-radius product: the hidden units depend on disjoint rows of the box.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
from torch import Tensor, fx, nn
from torch.utils._pytree import tree_map

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import Call, LayerGraph, graph_of
from pathlift.graph.abs_pow import channel_bias
from pathlift.graph.boundary import output_leaves
from pathlift.graph.ops import Activation, AffineHandler, FixedLinear, Handler
from pathlift.graph.walk import OpWalker

__all__ = ["BoxReuse", "Interval", "box_margins", "box_outputs", "margin_lower_bounds"]

_U = 2.0 ** -53


def _gamma(n: int, dtype: torch.dtype = torch.float64) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of a sum of n terms in
    ``dtype`` (u = 2^-53 in float64, 2^-24 in float32)."""
    u = torch.finfo(dtype).eps / 2
    return n * u / (1 - n * u)


def _up(t: Tensor) -> Tensor:
    """The next float above (rounding outward); the identity on a differentiable tensor."""
    return t if t.requires_grad else torch.nextafter(t, _infinity(t.dtype, 1.0))


def _down(t: Tensor) -> Tensor:
    return t if t.requires_grad else torch.nextafter(t, _infinity(t.dtype, -1.0))


@lru_cache
def _infinity(dtype: torch.dtype, sign: float) -> Tensor:
    """sign * inf as a 0-dim CPU tensor (taken by an op on any device, made once)."""
    return torch.tensor(sign * math.inf, dtype=dtype)


@dataclass(frozen=True)
class Interval:
    """[center - radius, center + radius], elementwise (float64 tensors of one shape)."""

    center: Tensor
    radius: Tensor

    @staticmethod
    def between(low: Tensor, high: Tensor) -> Interval:
        """The smallest representable interval holding [low, high]."""
        center = (low + high) / 2
        return Interval(center, _up(torch.maximum(high - center, center - low)))

    @property
    def low(self) -> Tensor:
        return _down(self.center - self.radius)

    @property
    def high(self) -> Tensor:
        return _up(self.center + self.radius)


def _inflate(radius: Tensor, magnitude: Tensor, n: int) -> Tensor:
    """radius (1 + gamma) + gamma |terms|: the float64 rounding of a sum of n terms whose
    absolute values sum to ``magnitude``, and of the radius computation itself."""
    if radius.requires_grad:  # the differentiable pass of training: no rounding terms
        return radius
    g = _gamma(n + 3, radius.dtype)
    return _up(radius * (1 + g) + g * magnitude)


class _Ends:
    """An enclosure held by its ends [low, high] (what ReLU and max-pooling compute on,
    exactly); ``interval`` gives its centre-radius form, rounded outward, when an op
    reads one."""

    def __init__(self, low: Tensor, high: Tensor):
        self.low, self.high = low, high

    def interval(self) -> Interval:
        return Interval.between(self.low, self.high)


class _Rectified(_Ends):
    """ReLU of the ``Interval`` x: ends max(low, 0) and max(high, 0); as an ``Interval``,
    x itself where low >= 0 (the interval kept as it is), 0 where high <= 0 and [0, high]
    elsewhere: centre and radius high / 2, exact in binary floating point but for
    subnormal high, rounded up then. Each form is computed when first read."""

    def __init__(self, x: Interval):  # the ends are made when read
        self.x = x

    @cached_property
    def low(self) -> Tensor:  # type: ignore[override]
        return self.x.low.clamp(min=0)

    @cached_property
    def high(self) -> Tensor:  # type: ignore[override]
        return self.x.high.clamp(min=0)

    def interval(self) -> Interval:
        kept = self.x.center - self.x.radius > 0  # low = the float below it >= 0
        half = self.high / 2
        return Interval(torch.where(kept, self.x.center, half),
                        torch.where(kept, self.x.radius, _up(half)))


def _form(value: object) -> object:
    """A value as the ops that read centres and radii take it."""
    return value.interval() if isinstance(value, _Ends) else value


def _formed(call: Call) -> Call:
    args, kwargs = tree_map(_form, (call.args, call.kwargs),
                            is_leaf=lambda v: isinstance(v, _Ends))
    return Call(call.node, call.module, args, kwargs)


class _BoxPass(OpWalker):
    """The interval pass of the module docstring over a traced graph; ``boxes`` maps a
    layer's qualified name to {quantised parameter name: Interval}."""

    purpose = "interval arithmetic over a box of parameters"

    def __init__(self, graph: LayerGraph, boxes: Mapping[str, Mapping[str, Interval]],
                 stop_at_output: bool = False, watch: Collection[fx.Node] = (),
                 screening: bool = False):
        super().__init__(graph)
        self.boxes, self.screening = boxes, screening
        self.watch, self.kept = watch, {}  # the values ``BoxReuse`` keeps
        outputs = graph.outputs()
        only = outputs[0] if len(outputs) == 1 else None  # returned alone, read by nothing
        self.final = {only} if stop_at_output and only is not None and all(
            u.op == "output" for u in only.users) else set()

    def run_node(self, n: fx.Node) -> object:
        value = super().run_node(n)
        if n.op == "output":
            return tree_map(_form, value, is_leaf=lambda v: isinstance(v, _Ends))
        if n in self.watch:
            value = _form(value)
            if isinstance(value, Interval):
                self.kept[n] = value
        return value

    def _params(self, handler: Handler, call: Call) -> Mapping[str, Interval]:
        name = call.node.target
        if name not in self.boxes:
            raise self.unsupported(handler, call, ": no box was given for its parameters")
        return self.boxes[name]

    def on_affine(self, handler: AffineHandler, call: Call) -> Interval:
        x = _form(call.args[0])
        params = self._params(handler, call)
        if set(params) - {"weight", "bias"} or "weight" not in params:
            raise self.unsupported(handler, call, ": its parameters are not a weight and a "
                                   "bias")
        w, b = params["weight"], params.get("bias")
        if call.node in self.final and handler.channel_dim == -1 and w.center.dim() == 2 \
                and x.center.dim() == 2:  # a Linear on (batch, features), not on a signal
            return _Final(x, w, b)  # the margin is enclosed through this layer
        run = call.replace(x.center)
        center = self._apply(handler, x.center, w.center, run, None if b is None else b.center)
        abs_w = w.center.abs()
        radius = self._apply(handler, x.center.abs() + x.radius, w.radius, run)
        if x.radius.requires_grad or bool(x.radius.any()):  # a point input: no |Wc| xr
            radius = radius + self._apply(handler, x.radius, abs_w, run)
        if radius.requires_grad:  # the differentiable pass: no rounding terms
            magnitude = radius
        else:
            magnitude = _magnitude(handler, call, x.center, abs_w, w.center.numel() + 1)
        if b is not None:
            dim = handler.channel_dim
            radius = radius + channel_bias(b.radius, radius.dim(), dim)
            magnitude = magnitude + channel_bias(b.center.abs(), radius.dim(), dim)
        return Interval(center, _inflate(radius, magnitude, w.center.numel() + 1))

    def _apply(self, handler: AffineHandler, x: Tensor, w: Tensor, call: Call,
               bias: Tensor | None = None) -> Tensor:
        """The layer's map; when screening, as matrix products (``as_products``: the
        rounding bound holds in any summation order), or _NotScreenedError."""
        if not self.screening:
            return handler.apply(x, w, call, bias)
        out = handler.as_products(x, w, call, bias)
        if out is None:
            raise _NotScreenedError
        return out

    def on_relu(self, handler: Handler, call: Call) -> Interval | _Ends:
        """[max(low, 0), max(high, 0)], the exact image of the enclosure; held by its ends
        (``_Rectified``: the centre-radius form only when an op reads it)."""
        x = call.args[0]
        if isinstance(x, _Ends):
            return _Ends(x.low.clamp(min=0), x.high.clamp(min=0))
        if x.center.requires_grad or x.radius.requires_grad:
            return Interval.between(x.low.clamp(min=0), x.high.clamp(min=0))
        return _Rectified(x)

    def on_maxpool(self, handler: FixedLinear, call: Call) -> _Ends:
        """Monotone in each input: the op on both ends."""
        x = call.args[0]
        ends = _Ends(call.run(x.low), call.run(x.high))
        return ends.interval() if ends.low.requires_grad else ends

    def on_pool(self, handler: FixedLinear, call: Call) -> Interval:
        if self.screening:  # its rounding is derived for float64 only
            raise _NotScreenedError
        x = _form(call.args[0])
        center = call.run(x.center)
        spread, log_gain = handler.abs_pow(x.radius, 1.0, call.replace(x.radius))
        size, _ = handler.abs_pow(x.center.abs(), 1.0, call.replace(x.center.abs()))
        gain = math.exp(log_gain) * (1 + 4 * _U)
        n = x.center[0].numel() if x.center.dim() else 1
        return Interval(center, _inflate(spread * gain, size * gain, n))

    def on_add(self, handler: Handler, call: Call) -> Interval:
        a, b = (_form(v) for v in call.args[:2])
        center = call.run(a.center.clone(), b.center)  # + or -, as the op says (in place)
        return Interval(center, _inflate(a.radius + b.radius,
                                         a.center.abs() + b.center.abs(), 2))

    def on_activation(self, handler: Activation, call: Call) -> Interval:
        if self.screening:  # its rounding is derived for float64 only
            raise _NotScreenedError
        x = _form(call.args[0])
        low, high = x.low, x.high
        if handler.parametric:  # PReLU: its slopes lie in the box too
            slopes = self._params(handler, call)["weight"]
            all_pieces = [handler.pieces_from(call.replace(x.center), s)
                          for s in (slopes.low, slopes.high)]
        else:
            all_pieces = [handler.pieces(call.replace(x.center))]
        points = [low, high]
        for t in all_pieces[0].breakpoints:
            points.append(torch.clamp(torch.full_like(low, t), low, high))
        values = [_evaluate(p, z) for p in all_pieces for z in points]
        stacked = [v for v, _ in values]
        size = torch.stack([s for _, s in values]).amax(0)
        g = _gamma(3 * (len(all_pieces[0].neurons()) + 2))
        slack = g * size
        return Interval.between(_down(torch.stack(stacked).amin(0) - slack),
                                _up(torch.stack(stacked).amax(0) + slack))

    def on_reshape(self, handler: Handler, call: Call) -> object:
        call = _formed(call)
        intervals = [v for v in _leaves((call.args, call.kwargs)) if isinstance(v, Interval)]
        if not intervals:
            return call.run()
        parts = []
        for field in ("center", "radius"):
            args, kwargs = tree_map(lambda v, f=field: getattr(v, f) if isinstance(v, Interval)
                                    else v, (call.args, call.kwargs),
                                    is_leaf=lambda v: isinstance(v, Interval))
            parts.append(Call(call.node, call.module, args, kwargs).run())
        return tree_map(lambda c, r: Interval(c, r), parts[0], parts[1])

    def on_shape(self, handler: Handler, call: Call) -> object:
        call = _formed(call)
        args, kwargs = tree_map(lambda v: v.center if isinstance(v, Interval) else v,
                                (call.args, call.kwargs),
                                is_leaf=lambda v: isinstance(v, Interval))
        return Call(call.node, call.module, args, kwargs).run()


def _magnitude(handler: AffineHandler, call: Call, x: Tensor, abs_w: Tensor, n: int
               ) -> Tensor:
    """An upper bound on |W| |x| (the sum of the absolute terms of each output, which
    the rounding bound of ``_inflate`` scales by gamma): max |x| times |W| 1, the sums of
    |W| feeding each output, from one sample of ones (the map is linear and acts on each
    sample alone), raised by 2 gamma_n for its own rounding; computed in float64 and
    rounded up to x's dtype. The max is each sample's own, so a sample's bound never
    depends on the other samples of its batch."""
    batched = x.dim() > 1
    ones = torch.ones_like(x[:1] if batched else x, dtype=torch.float64)
    sums = handler.apply(ones, abs_w.to(torch.float64), call.replace(ones))
    if x.numel():
        top = x.detach().abs().amax(tuple(range(1, x.dim())), keepdim=True) if batched \
            else x.detach().abs().max()
        sums = _up(sums * (top.to(torch.float64) * (1 + 2 * _gamma(n + 3))))
    return sums if x.dtype == torch.float64 else _up(sums.to(x.dtype))


@dataclass(frozen=True)
class _Final:
    """The input interval and parameter box of a Linear layer whose output is returned."""

    x: Interval
    weight: Interval
    bias: Interval | None


def _leaves(value: object) -> list[object]:
    if isinstance(value, Interval):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


def _evaluate(pieces, z: Tensor) -> tuple[Tensor, Tensor]:
    """f(z) = f(t_1) + sum_j c_j ReLU(sigma_j z + beta_j) (the lowering), and the sum of
    the absolute values of its terms (for the rounding bound)."""
    out = torch.full_like(z, float(pieces.value))
    size = out.abs()
    for sigma, beta, c in pieces.neurons():
        c = c.to(z.dtype) if isinstance(c, Tensor) else torch.tensor(c, dtype=z.dtype)
        out = out + c * torch.relu(sigma * z + beta)
        size = size + c.abs() * (z.abs() + abs(beta))
    return out, size


def box_outputs(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                x: Tensor, boxes: Mapping[str, Mapping[str, tuple[Tensor, Tensor]]]
                ) -> list[Interval]:
    """Enclosures of the outputs of every network of ``model``'s architecture whose
    parameters lie in ``boxes`` ({layer name: {parameter name: (low, high)}}, the names
    and shapes of ``pathlift.bounds.code.quantized_tensors``; every parametric layer
    needs one), on the inputs ``x``: one ``Interval`` per returned tensor, in order.

    Raises UnsupportedModelError for a layer without a box or an op the pass does not
    enclose, InvalidParameterError for a box with low > high.
    """
    graph = graph_of(model, input_shape)
    leaves = output_leaves(_run(graph, x, boxes, stop_at_output=False), Interval)
    if not leaves:
        raise UnsupportedModelError("the model returns no tensor")
    return leaves


def margin_lower_bounds(outputs: Sequence[Interval], y: Tensor) -> Tensor:
    """For each sample, low(R_y) - max_{c != y} high(R_c) over the enclosure: a lower bound
    on the margin R(x)_y - max_{c != y} R(x)_c of every network in the box."""
    return _pairwise_lower(outputs, y).amin(1)


def _pairwise_lower(outputs: Sequence[Interval], y: Tensor) -> Tensor:
    """low(R_y) - high(R_c) per sample and class c, +inf at c = y."""
    batch = len(y)
    low = torch.cat([o.low.reshape(batch, -1) for o in outputs], dim=1)
    high = torch.cat([o.high.reshape(batch, -1) for o in outputs], dim=1)
    index = y.reshape(-1, 1)
    return _down(low.gather(1, index) - high).scatter(1, index, math.inf)


def box_margins(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None, x: Tensor,
                y: Tensor,
                boxes: Mapping[str, Mapping[str, tuple[Tensor, Tensor] | Interval]],
                per_class: bool = False, reuse: BoxReuse | None = None,
                screen: bool = False, float64_first: bool = False) -> Tensor:
    """A lower bound, per sample, on the margin R(x)_y - max_{c != y} R(x)_c of every
    network whose parameters lie in ``boxes`` (as ``box_outputs``), through the last
    Linear layer when the network returns its output (module docstring), else from the
    output enclosure (``margin_lower_bounds``). With ``per_class``, the lower bounds of
    each R_y - R_c instead, shape (batch, classes), +inf at c = y. With ``reuse``, the
    values an earlier pass on the same ``x`` computed under the same boxes upstream are
    taken from it (``BoxReuse``): the same numbers, bit for bit.

    Each sample's bound is a function of that sample alone, bit for bit, whatever the
    other samples of the batch: every bound of the pass is the sample's own (``_magnitude``)
    and every matrix product runs on a multiple of ``_ROWS`` rows (``_rows_apart``).

    With ``screen``, the bound of a sample is the larger of two enclosures' bounds, the
    float32 pass (``_screened``, where it can run: CPU, float32 matrix products at full
    precision, affine layers as matrix products, no average pooling or other activation
    than ReLU) and the float64 pass, so it is <= 0 exactly where both are. One pass runs
    on every sample, the other only on the samples the first leaves <= 0: the float32
    pass first (fast where most samples have a bound > 0), or with ``float64_first``
    the float64 pass first (using ``reuse``). Which runs first changes no sample's
    decision and no bound <= 0."""
    graph = graph_of(model, input_shape)
    screening = screen and not per_class and graph not in _UNSCREENED

    def wide(a: Tensor, b: Tensor, reuse: BoxReuse | None = None) -> Tensor:
        return _margin_bounds(_run(graph, a, boxes, stop_at_output=True, reuse=reuse), b,
                              per_class)

    if not screening:
        return _rows_apart(lambda a, b: wide(a, b, reuse), x, y)
    passes = [lambda a, b: _screened(graph, a, b, boxes), wide]
    if float64_first:  # the only pass on all of x: the one ``reuse`` serves
        passes = [lambda a, b: wide(a, b, reuse), passes[0]]
    low = _rows_apart(passes[0], x, y)
    if low is None:  # the float32 pass cannot run on this graph or device
        return _rows_apart(wide, x, y)
    hard = low <= 0
    if bool(hard.any()):
        other = _rows_apart(passes[1], x[hard], y[hard])
        if other is not None:
            low[hard] = torch.maximum(low[hard], other)
    return low


_ROWS = 8


def _rows_apart(compute: Callable[..., Tensor | None], *rows: Tensor) -> Tensor | None:
    """``compute(*rows)`` on the tensors ``rows`` (one row a sample) padded with zero rows
    to a multiple of ``_ROWS`` rows, cut back. MKL computes a row of a matrix product
    with other bits when it falls in the last M mod 8 rows of the product (M its rows,
    ``tests/test_box_rows.py``); padded, a row's bits never depend on how many rows
    share its batch."""
    pad = -len(rows[0]) % _ROWS
    if not pad:
        return compute(*rows)
    out = compute(*(torch.cat([r, r.new_zeros((pad, *r.shape[1:]))]) for r in rows))
    return None if out is None else out[:len(rows[0])]


class _NotScreenedError(Exception):
    """The float32 screening pass meets an op it does not enclose in float32."""


_UNSCREENED: weakref.WeakSet[LayerGraph] = weakref.WeakSet()  # graphs with such an op


def _screened(graph: LayerGraph, x: Tensor, y: Tensor,
              boxes: Mapping[str, Mapping[str, tuple[Tensor, Tensor] | Interval]]
              ) -> Tensor | None:
    """The lower bounds of ``box_margins`` from the pass in float32 (as float64), or None
    where it cannot run. Sound as the float64 pass: every op rounds outward or bounds its
    rounding with float32's unit roundoff 2^-24 (``_gamma``), the affine layers are
    matrix products (``as_products``), whose error obeys the classical bound in any
    summation order and with fused multiply-adds (not a convolution library, which may
    use Winograd or FFT algorithms), the boxes and inputs are rounded outward. Refused:
    other devices, reduced-precision float32 products (``torch.
    set_float32_matmul_precision`` other than "highest", oneDNN's bf16/tf32 modes),
    differentiable boxes."""
    matmul = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if x.device.type != "cpu" or torch.get_float32_matmul_precision() != "highest" or \
            getattr(matmul, "fp32_precision", "none") not in ("none", "ieee") or any(
                isinstance(ends, Interval) for params in boxes.values()
                for ends in params.values()):
        return None
    try:
        out = _run(graph, x, boxes, stop_at_output=True, precision=torch.float32)
        return _margin_bounds(out, y, False).to(torch.float64)
    except _NotScreenedError:
        _UNSCREENED.add(graph)
        return None


def _margin_bounds(out: object, y: Tensor, per_class: bool) -> Tensor:
    """``box_margins`` from the output of the pass."""
    if not isinstance(out, _Final):
        low = _pairwise_lower(output_leaves(out, Interval), y)
        return low if per_class else low.amin(1)
    h, w, b = out.x, out.weight, out.bias
    hc, hr = h.center.reshape(len(y), -1), h.radius.reshape(len(y), -1)
    index = y.reshape(-1, 1)
    # centre: (W_y - W_c) hc + b_y - b_c
    scores = hc @ w.center.t() + (0.0 if b is None else b.center)
    center = scores.gather(1, index) - scores
    # radius: |W_y - W_c| hr + (Wr_y + Wr_c)(|hc| + hr) + br_y + br_c
    size = hc.abs()
    spread, magnitude = _through_differences(w.center, y, hr, size)
    uncertain = (size + hr) @ w.radius.t()
    radius = spread + uncertain.gather(1, index) + uncertain
    magnitude = magnitude + 2 * (size @ w.center.abs().t())
    if b is not None:
        radius = radius + b.radius[y][:, None] + b.radius[None, :]
        magnitude = magnitude + b.center.abs()[y][:, None] + b.center.abs()[None, :]
    radius = _inflate(radius, magnitude, w.center.shape[1] + 2)
    low = _down(center - radius).scatter(1, index, math.inf)
    return low if per_class else low.amin(1)


def _through_differences(w: Tensor, y: Tensor, *rows: Tensor) -> list[Tensor]:
    """For each (batch, in) tensor r of ``rows``: sum_i |W_(y_b) i - W_c i| r_b i per sample b
    and class c, a matrix product per label present (memory: one |W_k - W| at a time)."""
    out = [r.new_empty(len(y), len(w)) for r in rows]
    for k in y.unique().tolist():
        picked = y == k
        diff = (w[k] - w).abs().t()  # (in, C)
        for o, r in zip(out, rows, strict=True):
            o[picked] = _rows_apart(diff.__rmatmul__, r[picked])
    return out


def _run(graph: LayerGraph, x: Tensor,
         boxes: Mapping[str, Mapping[str, tuple[Tensor, Tensor] | Interval]],
         stop_at_output: bool, reuse: BoxReuse | None = None,
         precision: torch.dtype = torch.float64) -> object:
    """The pass on x. A box given as (low, high) is enclosed rigorously in float64 (in
    float32 with ``precision``: the screening pass of ``_screened``, boxes and inputs rounded
    outward); given as ``Interval`` objects that require grad (training), the pass is
    differentiable, in their dtype, without the rounding terms."""
    intervals: dict[str, dict[str, Interval]] = {}
    for layer, params in boxes.items():
        intervals[layer] = {}
        for name, ends in params.items():
            if isinstance(ends, Interval):
                intervals[layer][name] = ends
                continue
            low, high = ends[0].to(torch.float64), ends[1].to(torch.float64)
            if bool((low > high).any()):
                raise InvalidParameterError(f"box of '{layer}.{name}' has low > high")
            intervals[layer][name] = Interval.between(*_outward(low, high, precision))
    trained = any(i.center.requires_grad or i.radius.requires_grad
                  for params in intervals.values() for i in params.values())
    dtype = next((i.center.dtype for params in intervals.values() for i in params.values()),
                 torch.float64) if trained else torch.float64
    start = Interval(x.detach().to(dtype), torch.zeros_like(x, dtype=dtype))
    screening = precision != torch.float64 and not trained
    if screening:  # x rounded outward
        low, high = _outward(x.detach(), x.detach(), precision)
        start = Interval(low, torch.zeros_like(low)) if torch.equal(low, high) else \
            Interval.between(low, high)
    if reuse is None or trained or screening:
        with torch.set_grad_enabled(trained):
            return _BoxPass(graph, intervals, stop_at_output, screening=screening).run(start)
    keys = reuse.keys(graph, x, boxes)
    walker = _BoxPass(graph, intervals, stop_at_output, watch=keys)
    out = walker.run(start, initial_env=reuse.known(graph, keys))
    reuse.keep(keys, walker.kept)
    return out


def _outward(low: Tensor, high: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """[low, high] in ``dtype``, each end rounded outward where the conversion is not
    exact (low and high in float64 or narrower, so the comparison is exact)."""
    lo, hi = low.to(dtype), high.to(dtype)
    if dtype == low.dtype == high.dtype:
        return lo, hi
    lo = torch.where(lo.to(torch.float64) > low.to(torch.float64), _down(lo), lo)
    hi = torch.where(hi.to(torch.float64) < high.to(torch.float64), _up(hi), hi)
    return lo, hi


class BoxReuse:
    """Values of the interval pass kept from one pass to the next on the same inputs. A
    node's value depends only on the inputs and on the boxes of the parametric layers
    upstream of it (and the fixed ops between), so a pass whose boxes differ from an
    earlier pass's only downstream of a node starts from that node's kept value, bit for
    bit the value it would compute (the compression search's candidates differ from the
    best so far in one tensor's step). Kept: the input of every layer with a box, keyed by
    the inputs and the exact bytes of every box upstream, the least recently used dropped
    beyond ``limit`` bytes. The inputs must not be changed in place while kept."""

    def __init__(self, limit: int = 1 << 26):
        self.limit, self.size = limit, 0
        self.values: OrderedDict[Hashable, tuple[Tensor, Interval]] = OrderedDict()

    def keys(self, graph: LayerGraph, x: Tensor,
             boxes: Mapping[str, Mapping[str, tuple[Tensor, Tensor] | Interval]]
             ) -> dict[fx.Node, tuple[Tensor, Hashable]]:
        """The key of each node whose value is kept: the input of a layer with a box."""
        ends = {layer: tuple((name, _bytes(params[name])) for name in sorted(params))
                for layer, params in boxes.items()}
        upstream: dict[fx.Node, frozenset[str]] = {}
        inputs = (x.data_ptr(), x.dtype, tuple(x.shape), tuple(x.stride()))
        keys = {}
        for node in graph.graph.nodes:
            above = frozenset().union(*(upstream[a] for a in node.all_input_nodes))
            upstream[node] = above | ({node.target} if node.target in boxes else set())
            if node.op == "call_module" and node.target in boxes and node.args \
                    and isinstance(node.args[0], fx.Node):
                source = node.args[0]
                keys[source] = (x, (inputs, source.name,
                                    tuple((u, ends[u]) for u in sorted(upstream[source]))))
        return keys

    def known(self, graph: LayerGraph, keys: dict[fx.Node, tuple[Tensor, Hashable]]
              ) -> dict[fx.Node, object]:
        """The starting environment of a pass: the kept values found, and None for every
        node only they read (never run)."""
        found = {}
        for node, (_, key) in keys.items():
            if key in self.values:
                self.values.move_to_end(key)
                found[node] = self.values[key][1]
        needed, stack = set(), [n for n in graph.graph.nodes if n.op == "output"]
        while stack:
            node = stack.pop()
            if node in needed or node in found:
                continue
            needed.add(node)
            stack.extend(node.all_input_nodes)
        return {n: found.get(n) for n in graph.graph.nodes if n not in needed}

    def keep(self, keys: dict[fx.Node, tuple[Tensor, Hashable]],
             values: dict[fx.Node, Interval]) -> None:
        for node, value in values.items():
            x, key = keys[node]
            if key in self.values:
                continue
            self.values[key] = (x, value)
            self.size += _nbytes(value)
        while self.size > self.limit and self.values:
            _, (_, old) = self.values.popitem(last=False)
            self.size -= _nbytes(old)


def _bytes(ends: tuple[Tensor, Tensor] | Interval) -> bytes:
    """The exact contents of a box, as given (two tensors or an ``Interval``)."""
    pair = (ends.center, ends.radius) if isinstance(ends, Interval) else ends
    return b"".join(t.detach().to("cpu", torch.float64).contiguous().numpy().tobytes()
                    for t in pair)


def _nbytes(value: Interval) -> int:
    return sum(t.numel() * t.element_size() for t in (value.center, value.radius))
