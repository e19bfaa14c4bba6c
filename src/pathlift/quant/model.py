"""Quantised copies of whole networks, with the integer codes of every quantised tensor.

Quantised: the weight and bias of every Linear, Conv and ConvTranspose, and every eval
BatchNorm in its affine form x * a + c (thesis, below Def. 2.2.2): the copy's BatchNorm
gets weight Q(a), bias Q(c), running mean 0, running variance 1 and eps 0, so it computes
exactly x * Q(a) + Q(c). Folding BatchNorm into the preceding convolution would change the
architecture; quantising its affine form keeps the network a copy of the caller's, and
keeps the path-lifting coordinates of Thm 3.1.1 (which treats BatchNorm as that affine
neuron) in one-to-one correspondence.

Per-channel quantisation uses one step per output channel of each weight (the dim its
handler names: 0, or 1 for ConvTranspose, whose weight is (in, out / groups, ...)); biases
and BatchNorm's (a, c) get one step per tensor. torch.nn.utils.prune masks are honoured: a
pruned weight stays zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import LayerGraph, graph_of, writable_copy
from pathlift.graph.functional import LOWERED, layer_in, tensor_name
from pathlift.quant.uniform import QuantizedTensor, Rounding, as_rounding, quantize_tensor


@runtime_checkable
class QuantizableOp(Protocol):
    """What quantisation (thesis Sec. 6.1) asks of an op with parameters: the tensors it
    rounds, each as (name, effective value, per-channel dim), and how the rounded values
    are written back so that the op computes with them. ``Parametric`` implements it (an
    eval BatchNorm rounds its affine pair, a KSLinear its factors, PReLU its slopes)."""

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]: ...

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None: ...


@dataclass(frozen=True)
class QuantizedModel:
    """A quantised copy of a network and the integer codes of each quantised tensor.

    ``codes`` maps a parameter name (``"features.0.weight"``; for BatchNorm ``"bn.weight"``
    is a and ``"bn.bias"`` is c of x * a + c) to its ``QuantizedTensor``, whose
    ``dequantize()`` equals the copy's parameter bit for bit.
    """

    model: nn.Module
    codes: dict[str, QuantizedTensor]
    bits: int | None
    step: float | Mapping[str, float] | None
    rounding: Rounding
    per_channel: bool

    @property
    def num_quantized(self) -> int:
        """Number of quantised scalars."""
        return sum(q.codes.numel() for q in self.codes.values())


def quantize(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None, *,
             bits: int | None = None, step: float | Mapping[str, float] | None = None,
             rounding: Rounding | str = Rounding.ZERO, per_channel: bool = False
             ) -> QuantizedModel:
    """Uniform quantisation Q_eta of every affine layer (thesis Sec. 6.1), on a copy.

    Give exactly one of ``bits`` (signed codes of that width, a step per tensor or per
    output channel) and ``step`` (one fixed eta everywhere, or a mapping from every
    quantised tensor's name, as in ``codes``, to its own eta). ``rounding="zero"`` keeps signs
    and |Q(theta)| <= |theta| coordinatewise, so ``certified_error`` is exact (Lemma 3.4.1).
    The caller's model is not modified (the copy shares its traced graph). Raises
    UnsupportedModelError for a model outside Def. 2.2.2 and InvalidParameterError for bad
    arguments. Each layer's handler says what it quantises (a BatchNorm: its affine pair).
    """
    rounding = as_rounding(rounding)
    if bits is not None and step is not None:
        raise InvalidParameterError("give bits or step, not both")
    if bits is None and step is None:
        raise InvalidParameterError("give bits (e.g. bits=8) or a step eta")
    graph = graph_of(model, input_shape)
    graph.check_values()
    copied = writable_copy(graph.model)
    codes: dict[str, QuantizedTensor] = {}
    seen: set[str] = set()
    with torch.no_grad():
        for node in graph.parametric_nodes():
            if node.target in seen:
                continue
            seen.add(node.target)
            handler: QuantizableOp = graph.handler(node)
            module = layer_in(copied, node.target, node.meta.get(LOWERED))
            values = {}
            for pname, value, channel_dim in handler.quantizable(module):
                name = f"{node.target}.{tensor_name(node, pname)}"
                try:
                    eta = step[name] if isinstance(step, Mapping) else step
                    q = quantize_tensor(value, bits=bits, step=eta, rounding=rounding,
                                        channel_dim=channel_dim if per_channel else None)
                except KeyError:
                    raise InvalidParameterError(f"no step given for '{name}'") from None
                except InvalidParameterError as err:
                    raise InvalidParameterError(f"layer '{node.target}': {err}") from err
                codes[name] = q
                values[pname] = q.dequantize()
            handler.write_quantized_(module, values)
    graph.bind(copied)
    return QuantizedModel(copied, codes, bits, step, rounding, per_channel)
