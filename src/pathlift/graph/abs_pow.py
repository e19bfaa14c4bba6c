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
from dataclasses import dataclass

import torch
from torch import Tensor, fx

from pathlift.graph.ops import AffineHandler, Call, Kind, _channel_view, abs_power
from pathlift.graph.trace import HANDLER, LayerGraph


@dataclass(frozen=True)
class Scaled:
    """A non-negative tensor ``mantissa * exp(log_scale)``."""

    mantissa: Tensor
    log_scale: float

    @staticmethod
    def normalised(t: Tensor, log_scale: float) -> Scaled:
        peak = float(t.detach().max()) if t.numel() else 0.0
        if peak == 0.0 or not math.isfinite(peak):
            return Scaled(t, log_scale)
        return Scaled(t / peak, log_scale + math.log(peak))

    def log(self) -> Tensor:
        """Elementwise natural log of the represented values (-inf where zero)."""
        return self.mantissa.log() + self.log_scale


def _align(values: list[Scaled]) -> tuple[list[Tensor], float]:
    """Mantissas brought to the largest common scale."""
    top = max(v.log_scale for v in values)
    return [v.mantissa * math.exp(v.log_scale - top) for v in values], top


def scaled_affine(y: Tensor, log_scale: float, bias: Tensor | None, channel_dim: int
                  ) -> Scaled:
    """y e^s + b (b >= 0, one entry per channel along ``channel_dim``) as a normalised
    ``Scaled``: e^m (y e^{s-m} + b e^{-m}) with m the larger of s and ln max b."""
    peak = float(bias.detach().max()) if bias is not None and bias.numel() else 0.0
    if peak == 0.0:
        return Scaled.normalised(y, log_scale)
    top = max(log_scale, math.log(peak))
    shaped = bias if channel_dim == -1 else _channel_view(bias, y.dim())
    y = y * math.exp(log_scale - top) + (shaped / peak) * math.exp(math.log(peak) - top)
    return Scaled.normalised(y, top)


class AbsPowInterpreter(fx.Interpreter):
    """Forward pass of the |theta|^q network (Thm 3.1.1) over a traced ``LayerGraph``."""

    def __init__(self, graph: LayerGraph, q: float, dtype: torch.dtype = torch.float64):
        super().__init__(graph.module, garbage_collect_values=True)
        self.layer_graph, self.q, self.dtype = graph, q, dtype

    def run_all_ones(self) -> Scaled | tuple[Scaled, ...]:
        """Outputs o_v = ||Phi^{->v}||_q^q. The model's parameters enter detached; a
        subclass that supplies its own |W|^q (``weight_part``, ``bias_magnitude``) can
        differentiate the mantissas through them (log scales are constants)."""
        ones = torch.ones((1, *self.layer_graph.input_shape), dtype=self.dtype,
                          device=self.layer_graph.device)
        return self.run(Scaled(ones, 0.0))

    def run_node(self, n: fx.Node):
        if n.op in ("placeholder", "output"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        module = self.layer_graph.submodule(n)
        handler = n.meta[HANDLER]
        kind = handler.kind
        if kind is Kind.ADD:
            mantissas, top = _align([args[0], args[1]])
            return Scaled.normalised(mantissas[0] + mantissas[1], top)
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
        return scaled_affine(self.weight_part(handler, x, call), log_scale,
                             self.bias_magnitude(handler, call), handler.channel_dim)

    def weight_part(self, handler: AffineHandler, x: Tensor, call: Call) -> Tensor:
        """|W|^q x of one affine layer (a hook: subclasses substitute or record |W|^q)."""
        return handler.weight_part(x, self.q, call)

    def bias_magnitude(self, handler: AffineHandler, call: Call) -> Tensor | None:
        """|b|^q of one affine layer, or None (a hook, like ``weight_part``)."""
        bias = handler.bias(call.module)
        return None if bias is None else abs_power(bias, self.q, self.dtype)
