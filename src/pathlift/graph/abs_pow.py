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
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, fx

from pathlift.graph.ops import AffineHandler, Call, Kind, Workspace, _channel_view, abs_power
from pathlift.graph.trace import HANDLER, GraphInterpreter, LayerGraph

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
        peak = float(t.detach().max()) if t.numel() else 0.0
        if peak == 0.0 or not math.isfinite(peak):
            return Scaled(t, log_scale)
        exponent = math.frexp(peak)[1]
        if abs(exponent) <= _DRIFT:
            return Scaled(t, log_scale)
        factor = math.ldexp(1.0, -exponent)
        t = t * factor if t.requires_grad else t.mul_(factor)
        return Scaled(t, log_scale + exponent * _LN2)

    def log(self) -> Tensor:
        """Elementwise natural log of the represented values (-inf where zero)."""
        return self.mantissa.log() + self.log_scale


_LN2 = math.log(2.0)


def _align(values: list[Scaled]) -> tuple[list[Tensor], float]:
    """Mantissas brought to the largest common scale (those at it are not copied)."""
    top = max(v.log_scale for v in values)
    return [v.mantissa if v.log_scale == top else v.mantissa * math.exp(v.log_scale - top)
            for v in values], top


def scaled_affine(weight_part: Callable[[Tensor | None], Tensor], log_scale: float,
                  bias: Tensor | None, channel_dim: int) -> Scaled:
    """y e^s + b for y = ``weight_part(None)`` (b >= 0, one entry per channel along
    ``channel_dim``), as a normalised ``Scaled`` in log space.

    When b <= e^s the bias fits in y's scale and enters the layer itself,
    e^s (W x + b e^{-s}) = e^s ``weight_part(b e^{-s})`` (a convolution adds its bias for
    free); otherwise e^m (y e^{s-m} + b e^{-m}) with m = ln max b, in one fused add.
    """
    peak = float(bias.detach().max()) if bias is not None and bias.numel() else 0.0
    if peak == 0.0:
        return Scaled.normalised(weight_part(None), log_scale)
    top = math.log(peak)
    if top <= log_scale:
        return Scaled.normalised(weight_part(bias * math.exp(-log_scale)), log_scale)
    y = weight_part(None)
    return Scaled.normalised(torch.add(channel_bias(bias / peak, y.dim(), channel_dim), y,
                                       alpha=math.exp(log_scale - top)), top)


def channel_bias(bias: Tensor, ndim: int, channel_dim: int) -> Tensor:
    """A per-channel vector shaped to broadcast against an activation of ``ndim`` dims."""
    return bias if channel_dim == -1 else _channel_view(bias, ndim)


# One CPU workspace per dtype for the whole process, whatever the model: a new model's
# first pass then writes into memory already mapped (the buffer holds one layer's weights,
# the largest seen). Other devices get one per pass: their caching allocators already
# reuse memory, and a process-wide buffer would hold device memory for good.
_WORKSPACES: dict[torch.dtype, Workspace] = {}
_POOL_LOCK = threading.Lock()


class AbsPowInterpreter(GraphInterpreter):
    """Forward pass of the |theta|^q network (Thm 3.1.1) over a traced ``LayerGraph``."""

    def __init__(self, graph: LayerGraph, q: float, dtype: torch.dtype = torch.float64):
        super().__init__(graph)
        self.q, self.dtype = q, dtype
        self.workspace: Workspace | None = None

    def run_all_ones(self) -> Scaled | tuple[Scaled, ...]:
        """Outputs o_v = ||Phi^{->v}||_q^q. The model's parameters enter detached; a
        subclass that supplies its own |W|^q (``weight_part``, ``bias_magnitude``) can
        differentiate the mantissas through them (log scales are constants)."""
        ones = torch.ones((1, *self.layer_graph.input_shape), dtype=self.dtype,
                          device=self.layer_graph.device)
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

    def run_node(self, n: fx.Node):
        if n.op in ("placeholder", "output"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        module = self.layer_graph.submodule(n)
        handler = n.meta[HANDLER]
        kind = handler.kind
        if kind is Kind.ADD:
            big, small = sorted(args[:2], key=lambda v: -v.log_scale)
            total = torch.add(big.mantissa, small.mantissa,
                              alpha=math.exp(small.log_scale - big.log_scale))
            return Scaled.normalised(total, big.log_scale)
        if kind is Kind.CAT:
            tensors = args[0] if args else kwargs["tensors"]
            mantissas, top = _align(list(tensors))
            rest = dict(kwargs)
            rest.pop("tensors", None)
            return Scaled.normalised(torch.cat(mantissas, *args[1:], **rest), top)
        scaled = next((a for a in args if isinstance(a, Scaled)), None)
        plain = tuple(a.mantissa if isinstance(a, Scaled) else a for a in args)
        call = Call(n, module, plain, dict(kwargs))
        if kind is Kind.SHAPE:
            return call.run(*plain)
        x = scaled.mantissa
        if kind is Kind.AFFINE:
            return self._affine(handler, x, scaled.log_scale, call)
        return Scaled(handler.abs_pow(x, self.q, call), scaled.log_scale)

    def _affine(self, handler: AffineHandler, x: Tensor, log_scale: float, call: Call
                ) -> Scaled:
        """|W|^q x e^s + |b|^q (see ``scaled_affine``)."""
        return scaled_affine(lambda bias: self.weight_part(handler, x, call, bias), log_scale,
                             self.bias_magnitude(handler, call), handler.channel_dim)

    def weight_part(self, handler: AffineHandler, x: Tensor, call: Call,
                    bias: Tensor | None = None) -> Tensor:
        """|W|^q x (+ bias) of one affine layer (a hook: subclasses substitute or record
        |W|^q)."""
        return handler.weight_part(x, self.q, call, bias, self.workspace)

    def bias_magnitude(self, handler: AffineHandler, call: Call) -> Tensor | None:
        """|b|^q of one affine layer, or None (a hook, like ``weight_part``)."""
        bias = handler.bias(call.module)
        return None if bias is None else abs_power(bias, self.q, self.dtype)
