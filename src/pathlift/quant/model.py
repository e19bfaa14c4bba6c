"""Quantised copies of whole networks, with the integer codes of every quantised tensor.

Quantised: the weight and bias of every Linear, Conv and ConvTranspose, and every eval
BatchNorm in its affine form x * a + c (thesis, below Def. 2.2.2): the copy's BatchNorm
gets weight Q(a), bias Q(c), running mean 0, running variance 1 and eps 0, so it computes
exactly x * Q(a) + Q(c). Folding BatchNorm into the preceding convolution would change the
architecture; quantising its affine form keeps the network a copy of the caller's, and
keeps the path-lifting coordinates of Thm 3.1.1 (which treats BatchNorm as that affine
neuron) in one-to-one correspondence.

Per-channel quantisation uses one step per output channel of each weight (dim 0; dim 1 for
ConvTranspose, whose weight is (in, out / groups, ...)); biases and BatchNorm's (a, c) get
one step per tensor. torch.nn.utils.prune masks are honoured: a pruned weight stays zero.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import Kind, batchnorm_affine, param, trace
from pathlift.quant.uniform import QuantizedTensor, Rounding, as_rounding, quantize_tensor


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
    step: float | None
    rounding: Rounding
    per_channel: bool

    @property
    def num_quantized(self) -> int:
        """Number of quantised scalars."""
        return sum(q.codes.numel() for q in self.codes.values())


def quantize(model: nn.Module, input_shape: Sequence[int], *, bits: int | None = None,
             step: float | None = None, rounding: Rounding | str = Rounding.ZERO,
             per_channel: bool = False) -> QuantizedModel:
    """Uniform quantisation Q_eta of every affine layer (thesis Sec. 6.1), on a copy.

    Give exactly one of ``bits`` (signed codes of that width, a step per tensor or per
    output channel) and ``step`` (one fixed eta everywhere). ``rounding="zero"`` keeps signs
    and |Q(theta)| <= |theta| coordinatewise, so ``certified_error`` is exact (Lemma 3.4.1).
    The caller's model is not modified. Raises UnsupportedModelError for a model outside
    Def. 2.2.2 and InvalidParameterError for bad arguments.
    """
    rounding = as_rounding(rounding)
    if bits is not None and step is not None:
        raise InvalidParameterError("give bits or step, not both")
    if bits is None and step is None:
        raise InvalidParameterError("give bits (e.g. bits=8) or a step eta")
    copied = _copy(model)
    graph = trace(copied, input_shape)
    seen: set[int] = set()
    codes: dict[str, QuantizedTensor] = {}
    with torch.no_grad():
        for name, module in graph.layers(Kind.AFFINE):
            if id(module) in seen:
                continue
            seen.add(id(module))

            def quant(t: Tensor, channel_dim: int | None, name: str = name) -> QuantizedTensor:
                try:
                    return quantize_tensor(t, bits=bits, step=step, rounding=rounding,
                                           channel_dim=channel_dim if per_channel else None)
                except InvalidParameterError as err:
                    raise InvalidParameterError(f"layer '{name}': {err}") from err

            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                codes.update(_quantize_batchnorm(name, module, quant))
            else:
                codes.update(_quantize_affine(name, module, quant))
    return QuantizedModel(copied, codes, bits, step, rounding, per_channel)


def _copy(model: nn.Module) -> nn.Module:
    """deepcopy, also of pruned modules: their recomputed ``weight = weight_orig * mask``
    is a non-leaf tensor that deepcopy refuses, so it is copied detached."""
    memo = {id(v): v.detach().clone() for m in model.modules() for v in vars(m).values()
            if isinstance(v, Tensor) and not v.is_leaf}
    return copy.deepcopy(model, memo)


def _quantize_affine(name: str, module: nn.Module, quant) -> dict[str, QuantizedTensor]:
    out = {}
    weight_dim = 1 if isinstance(module, nn.modules.conv._ConvTransposeNd) else 0
    for pname, channel_dim in (("weight", weight_dim), ("bias", None)):
        value = param(module, pname)
        if value is None:
            continue
        q = quant(value, channel_dim)
        _assign(module, pname, q.dequantize())
        out[f"{name}.{pname}"] = q
    return out


def _quantize_batchnorm(name: str, bn: nn.modules.batchnorm._BatchNorm, quant
                        ) -> dict[str, QuantizedTensor]:
    a, c = batchnorm_affine(bn)
    qa, qc = quant(a, None), quant(c, None)
    bn.running_mean.zero_()
    bn.running_var.fill_(1.0)
    bn.eps = 0.0
    for pname, q in (("weight", qa), ("bias", qc)):
        if param(bn, pname) is None:
            setattr(bn, pname, nn.Parameter(q.dequantize()))
        else:
            _assign(bn, pname, q.dequantize())
    bn.affine = True
    return {f"{name}.weight": qa, f"{name}.bias": qc}


def _assign(module: nn.Module, name: str, value: Tensor) -> None:
    """Write an effective parameter; a pruned one goes to ``name_orig`` (its mask keeps the
    zeros, and Q(0) = 0 for every rounding)."""
    target = getattr(module, name + "_orig", None)
    if target is None:
        target = getattr(module, name)
    target.copy_(value)
    if hasattr(module, name + "_mask"):
        setattr(module, name, target * getattr(module, name + "_mask"))
