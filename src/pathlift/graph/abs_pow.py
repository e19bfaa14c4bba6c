"""The |theta|^q forward pass of Thm 3.1.1, carried in log space.

Running the network with every weight and bias w replaced by |w|^q, max-pool neurons
replaced by sums over their windows, on the all-ones input, yields at output neuron v the
quantity ||Phi^{->v}(theta)||_q^q. For deep networks these numbers leave the range of
float64 (ResNet-152's l1 path-norm is about 1e194 on pretrained weights and larger at
random initialisation), so each value is carried as ``mantissa * exp(log_scale)`` with the
mantissa renormalised to max 1 after every op that mixes scales.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, fx, nn
from torch.utils._pytree import tree_leaves, tree_map

from pathlift.graph.boundary import output_leaves
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import (
    Activation,
    Call,
    FixedLinear,
    Handler,
    Workspace,
    abs_power,
    channel_view,
)
from pathlift.graph.walk import OpWalker

_DRIFT = 16  # a mantissa peak may drift within 2^(+-16) before it is rescaled


@dataclass(frozen=True)
class Scaled:
    """A non-negative tensor ``mantissa * exp(log_scale)``."""

    mantissa: Tensor
    log_scale: float

    @staticmethod
    def normalised(t: Tensor, log_scale: float) -> Scaled:
        """``t * e^log_scale`` with t's peak brought within 2^(+-16) of 1 when it has drifted
        further, by an exact power-of-two scaling (in place unless t records autograd
        history; ``t`` must be a fresh result that nothing else reads)."""
        peak = float(t.detach().amax()) if t.numel() else 0.0  # amax: 3x max() on CPU
        if peak == 0.0 or not math.isfinite(peak):
            return Scaled(t, log_scale)
        exponent = math.frexp(peak)[1]
        if abs(exponent) <= _DRIFT:
            return Scaled(t, log_scale)
        for step in _power_steps(-exponent):  # factors every float dtype holds exactly
            t = t * step if t.requires_grad else t.mul_(step)
        return Scaled(t, log_scale + exponent * _LN2)

    def log(self) -> Tensor:
        """Elementwise natural log of the represented values (-inf where zero)."""
        return self.mantissa.log() + self.log_scale


_LN2 = math.log(2.0)
_STEP = 100  # 2^(+-100) is a normal float32: a peak from subnormal to huge in a few steps


def _power_steps(exponent: int) -> list[float]:
    """Powers of two, each within 2^(+-100), whose product is 2^exponent."""
    sign = 1 if exponent > 0 else -1
    whole, rest = divmod(abs(exponent), _STEP)
    return [*[math.ldexp(1.0, sign * _STEP)] * whole, math.ldexp(1.0, sign * rest)]


def _align(values: list[Scaled]) -> tuple[list[Tensor], float]:
    """Mantissas brought to the largest common scale (those at it are not copied)."""
    top = max(v.log_scale for v in values)
    return [v.mantissa if v.log_scale == top else v.mantissa * math.exp(v.log_scale - top)
            for v in values], top


def output_sum(out: object) -> tuple[Tensor, float]:
    """sum_v o_v over every output neuron of a pass (nested tuples, lists, dicts of
    ``Scaled``), as (mantissa, natural-log scale) at one scale: ||Phi||_q^q of the
    |theta|^q pass (Thm 3.1.1). Differentiable when the mantissas are."""
    mantissas, top = _align(output_leaves(out, Scaled))
    total = mantissas[0].sum()
    for m in mantissas[1:]:  # no 0 + ... node, as sum() would add
        total = total + m.sum()
    return total, top


def output_logs(out: object) -> Tensor:
    """ln o_v for every output neuron of a pass, in order (natural log, scale included)."""
    return torch.cat([o.log().reshape(-1) for o in output_leaves(out, Scaled)])


def scaled_affine(weight_part: Callable[[Tensor | None], Tensor], log_scale: float,
                  bias: Tensor | None, channel_dim: int, bias_log_scale: float = 0.0
                  ) -> Scaled:
    """y e^s + b e^t for y = ``weight_part(None)`` (b >= 0, one entry per channel along
    ``channel_dim``, t = ``bias_log_scale``), as a normalised ``Scaled`` in log space.

    When b e^t <= e^s the bias fits in y's scale and enters the layer itself,
    e^s (W x + b e^{t-s}) = e^s ``weight_part(b e^{t-s})`` (a convolution adds its bias
    for free); otherwise e^m (y e^{s-m} + b e^{t-m}) with m = ln max b + t, in one fused add.
    """
    peak = float(bias.detach().max()) if bias is not None and bias.numel() else 0.0
    if peak == 0.0 and not (bias is not None and bias.requires_grad
                            and abs(bias_log_scale - log_scale) < _EXP_RANGE):
        return Scaled.normalised(weight_part(None), log_scale)
    # a zero bias that is an autograd leaf stays in the graph: its gradient is not zero
    top = math.log(peak) + bias_log_scale if peak > 0 else -math.inf
    if top <= log_scale:
        gain = math.exp(bias_log_scale - log_scale)
        return Scaled.normalised(weight_part(bias if gain == 1.0 else bias * gain), log_scale)
    y = weight_part(None)
    return Scaled.normalised(torch.add(channel_bias(bias / peak, y.dim(), channel_dim), y,
                                       alpha=math.exp(log_scale - top)), top)


_EXP_RANGE = 700.0  # |x| below which math.exp(x) is a normal float64


def channel_bias(bias: Tensor, ndim: int, channel_dim: int) -> Tensor:
    """A per-channel vector shaped to broadcast against an activation of ``ndim`` dims."""
    return bias if channel_dim == -1 else channel_view(bias, ndim)


def _holds_scaled(value: object) -> bool:
    """A ``Scaled`` value, or a list, tuple or dict holding one (at any depth)."""
    if isinstance(value, (list, tuple, dict)):
        return any(isinstance(v, Scaled) for v in tree_leaves(value))
    return isinstance(value, Scaled)


@runtime_checkable
class AbsPowLayer(Protocol):
    """What the |theta|^q pass (Thm 3.1.1) asks of a layer with parameters: the dim of its
    output channels, what it computes for all its modules at once (``prepare``), the units its
    weights and bias enter in, |W/u|^q x (+ bias) and its
    bias. ``AffineHandler`` implements it."""

    channel_dim: int

    def prepare(self, modules: Sequence[nn.Module]) -> None: ...

    def units(self, module: nn.Module, exact: bool = False) -> tuple[float, float]: ...

    def weight_part(self, x: Tensor, q: float, call: Call, bias: Tensor | None = None,
                    workspace: Workspace | None = None, unit: float = 1.0) -> Tensor: ...

    def bias(self, module: nn.Module) -> Tensor | None: ...


@runtime_checkable
class FoldingLayer(AbsPowLayer, Protocol):
    """A layer whose handler ``scales_rows``: its whole |W/u|^q with its units
    (``magnitude_in_units``, output channels along dim 0) and its map with a given weight
    (``apply``)."""

    def magnitude_in_units(self, module: nn.Module, q: float, dtype: torch.dtype,
                           workspace: Workspace | None = None, exact: bool = False
                           ) -> tuple[Tensor, tuple[float, float]]: ...

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor: ...


class ScaledWalker(OpWalker):
    """A pass whose values are ``Scaled`` tensors: relabelling ops move mantissas (several
    inputs, as in ``cat``, brought to one scale first) and keep the scale; Python-level
    ops see mantissas."""

    #: Each layer divided by its largest entry rather than a power of two near it (the
    #: pass at large q on normalised parameters).
    unit_weights = False

    def on_reshape(self, handler: Handler, call: Call) -> object:
        first = call.args[0] if call.args else None
        if isinstance(first, Scaled) and not any(_holds_scaled(v) for v in call.args[1:]) \
                and not any(_holds_scaled(v) for v in call.kwargs.values()):
            out = call.run(first.mantissa)  # one value relabelled (view, flatten, split...)
            if isinstance(out, Tensor):
                return Scaled(out, first.log_scale)
            return tree_map(lambda t: Scaled(t, first.log_scale) if isinstance(t, Tensor)
                            else t, out)
        scaled = [v for v in tree_leaves((call.args, call.kwargs)) if isinstance(v, Scaled)]
        if not scaled:
            return call.run()
        mantissas, top = _align(scaled)
        swap = dict(zip(map(id, scaled), mantissas, strict=True))
        args, kwargs = tree_map(lambda v: swap.get(id(v), v) if isinstance(v, Scaled) else v,
                                (call.args, call.kwargs))
        out = Call(call.node, call.module, args, kwargs).run()
        return tree_map(lambda t: Scaled(t, top) if isinstance(t, Tensor) else t, out)

    def on_shape(self, handler: Handler, call: Call) -> object:
        args, kwargs = tree_map(lambda v: v.mantissa if isinstance(v, Scaled) else v,
                                (call.args, call.kwargs))
        return Call(call.node, call.module, args, kwargs).run()


# One CPU workspace per dtype for the whole process, whatever the model: a new model's
# first pass then writes into memory already mapped (the buffer holds one layer's weights,
# the largest seen). Other devices get one per pass: their caching allocators already
# reuse memory, and a process-wide buffer would hold device memory for good.
_WORKSPACES: dict[torch.dtype, Workspace] = {}
_POOL_LOCK = threading.Lock()


class AbsPowInterpreter(ScaledWalker):
    """Forward pass of the |theta|^q network (Thm 3.1.1) over a traced ``LayerGraph``."""

    def __init__(self, graph: LayerGraph, q: float, dtype: torch.dtype = torch.float64,
                 unit_weights: bool = False):
        super().__init__(graph)
        self.q, self.dtype = q, dtype
        self.unit_weights = unit_weights  # divide each layer by its largest |w| (large q)
        self.rescaled = False  # a layer entered in a unit other than 1 (far from 1 in scale)
        self.workspace: Workspace | None = None
        self.folds = graph.folds() if self._folding() else {}
        self.folded: set[fx.Node] = set()  # the diagonal ops this pass folded into a layer

    def _folding(self) -> bool:
        """Whether eval BatchNorm enters folded into the rows of the layer before it
        (``LayerGraph.folds``), as |a/u_a|^q |W/u|^q x + |c|^q: the same sum of path
        products, one layer pass instead of two. Only for the pass's own magnitude hooks (a
        subclass that supplies or records magnitudes sees every layer) and where the
        product stays in range: each factor is at most 2^(16q) (``unit_of``), so 2^(32q)
        times the fan-in and the input's drift must stay far below the dtype's largest
        power of two."""
        plain = all(getattr(type(self), hook) is getattr(AbsPowInterpreter, hook)
                    for hook in ("units", "module_units", "weight_part", "bias_magnitude",
                                 "on_affine"))
        return plain and 32 * self.q + 64 <= math.frexp(torch.finfo(self.dtype).max)[1]

    def run_all_ones(self) -> Scaled | tuple[Scaled, ...]:
        """Outputs o_v = ||Phi^{->v}||_q^q. The model's parameters enter detached; a
        subclass that supplies its own |W|^q (``weight_part``, ``bias_magnitude``) can
        differentiate the mantissas through them (log scales are constants)."""
        ones = torch.ones((1, *self.layer_graph.input_shape), dtype=self.dtype,
                          device=self.layer_graph.device)
        self._prepare()
        if torch.is_grad_enabled():  # autograd keeps each |W|^q: no buffer may be reused
            return self.run(Scaled(ones, 0.0))
        if self.layer_graph.device.type == "cpu":
            with _POOL_LOCK:
                shared = _WORKSPACES.setdefault(self.dtype, Workspace())
        else:
            shared = Workspace()
        mine = shared.lock.acquire(blocking=False)  # another thread's pass: a private one
        self.workspace = shared if mine else Workspace()
        try:
            return self.run(Scaled(ones, 0.0))
        finally:
            self.workspace = None
            if mine:
                shared.lock.release()

    def _prepare(self) -> None:
        """Each layer handler's ``prepare`` on all the modules it runs (BatchNorm folds in
        one batch: the same numbers, fewer operations)."""
        layers: dict[AbsPowLayer, list[nn.Module]] = {}
        for node in self.layer_graph.affine_nodes():
            module = self.layer_graph.submodule(node)
            if module is not None:
                layers.setdefault(self.layer_graph.handler(node), []).append(module)
        for handler, modules in layers.items():
            handler.prepare(modules)

    def on_add(self, handler: Handler, call: Call) -> Scaled:
        big, small = sorted(call.args[:2], key=lambda v: -v.log_scale)
        total = torch.add(big.mantissa, small.mantissa,
                          alpha=math.exp(small.log_scale - big.log_scale))
        return Scaled.normalised(total, big.log_scale)

    def on_relu(self, handler: Handler, call: Call) -> Scaled:
        return call.args[0]  # fed non-negative values, ReLU is the identity

    def on_pool(self, handler: FixedLinear, call: Call) -> Scaled:
        x = call.args[0]
        y, log_gain = handler.abs_pow(x.mantissa, self.q, call.replace(x.mantissa))
        return Scaled.normalised(y, x.log_scale + log_gain)

    on_maxpool = on_pool

    def on_activation(self, handler: Activation, call: Call) -> Scaled:
        """A x + B for the lowered ReLU/identity neurons (``Pieces.log_terms``)."""
        x = call.args[0]
        m = x.mantissa
        log_a, log_b = handler.pieces(call.replace(m)).log_terms(
            self.q, m.new_zeros((), dtype=torch.float64))
        top = max(x.log_scale + float(log_a.max()), float(log_b.max()))
        if top == -math.inf:  # the zero function
            return Scaled(torch.zeros_like(m), 0.0)
        gain = torch.exp(log_a + (x.log_scale - top)).to(m.dtype)
        offset = torch.exp(log_b - top).to(m.dtype)
        return Scaled.normalised(torch.addcmul(offset, m, gain), top)

    def on_affine(self, handler: AbsPowLayer, call: Call) -> Scaled:
        x = call.args[0]
        if call.node in self.folded:  # computed with the layer it follows
            return x
        fold = self.folds.get(call.node)
        if fold is not None and handler.bias(call.module) is None:
            return self._folded_affine(handler, call, fold)
        return self._affine(handler, x.mantissa, x.log_scale, call.replace(x.mantissa))

    def _folded_affine(self, handler: FoldingLayer, call: Call, fold: fx.Node) -> Scaled:
        """A bias-free layer and the diagonal op ``fold`` after it (x*a + c, eval
        BatchNorm) as one: (|a/u_a|^q |W/u|^q) x e^(s + q ln u u_a) + |c/v|^q e^(q ln v),
        |a|^q scaling the output rows of |W|^q in the workspace, or the layer's output
        channels where they hold fewer numbers (the late layers of a CNN)."""
        diagonal, module = self.layer_graph.handler(fold), self.layer_graph.submodule(fold)
        x = call.args[0]
        m = x.mantissa
        weight, (unit, _) = handler.magnitude_in_units(call.module, self.q, m.dtype,
                                                       self.workspace, self.unit_weights)
        gain_unit, bias_unit = self.module_units(diagonal, module)
        self.rescaled = self.rescaled or unit != 1.0 or gain_unit != 1.0 or bias_unit != 1.0
        gain = diagonal.magnitude(module, self.q, self.dtype, unit=gain_unit)

        def weight_part(bias: Tensor | None) -> Tensor:
            outputs = math.prod(call.node.meta["tensor_meta"].shape[1:]) * m.shape[0]
            if weight.numel() <= outputs:
                weight.mul_(gain.reshape(-1, *(1,) * (weight.dim() - 1)))
                return handler.apply(m, weight, call.replace(m), bias)
            y = handler.apply(m, weight, call.replace(m))
            per_channel = channel_bias(gain, y.dim(), diagonal.channel_dim)
            return y.mul_(per_channel) if bias is None else \
                torch.addcmul(channel_bias(bias, y.dim(), diagonal.channel_dim), y, per_channel)

        self.folded.add(fold)
        return scaled_affine(weight_part, x.log_scale + self.q * math.log(unit * gain_unit),
                             self.bias_magnitude(diagonal, Call(fold, module, (), {}),
                                                 bias_unit),
                             diagonal.channel_dim, self.q * math.log(bias_unit))

    def _affine(self, handler: AbsPowLayer, x: Tensor, log_scale: float, call: Call
                ) -> Scaled:
        """|W|^q x e^s + |b|^q (see ``scaled_affine``), as u^q |W/u|^q x e^s + v^q |b/v|^q
        with (u, v) the layer's ``units``: |theta|^q itself never leaves the float range."""
        unit, bias_unit = self.units(handler, call)
        self.rescaled = self.rescaled or unit != 1.0 or bias_unit != 1.0
        return scaled_affine(lambda bias: self.weight_part(handler, x, call, bias, unit),
                             log_scale + self.q * math.log(unit),
                             self.bias_magnitude(handler, call, bias_unit),
                             handler.channel_dim, self.q * math.log(bias_unit))

    def units(self, handler: AbsPowLayer, call: Call) -> tuple[float, float]:
        """(u, v): the layer's weights and bias enter as |W/u|^q and |b/v|^q (a hook:
        subclasses that supply their own magnitudes say which units they took; sharded layers
        all-reduce their peaks). Powers
        of two that bring the largest entries near 1 (``unit_of``); with
        ``unit_weights``, the largest entries themselves."""
        return self.module_units(handler, call.module)

    def module_units(self, handler: AbsPowLayer, module: nn.Module) -> tuple[float, float]:
        """``units`` of the layer ``module`` (a hook: a sharded layer's are those of the
        whole layer, the same on every rank)."""
        return handler.units(module, exact=self.unit_weights)

    def weight_part(self, handler: AbsPowLayer, x: Tensor, call: Call,
                    bias: Tensor | None = None, unit: float = 1.0) -> Tensor:
        """|W/unit|^q x (+ bias) of one affine layer (a hook: subclasses substitute or
        record |W|^q)."""
        return handler.weight_part(x, self.q, call, bias, self.workspace, unit)

    def bias_magnitude(self, handler: AbsPowLayer, call: Call, unit: float = 1.0
                       ) -> Tensor | None:
        """|b/unit|^q of one affine layer, or None (a hook, like ``weight_part``)."""
        bias = handler.bias(call.module)
        return None if bias is None else abs_power(bias, self.q, self.dtype, unit=unit)
