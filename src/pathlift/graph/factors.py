"""Apply neuron-wise factors to the parameters of a model in place (thesis Def. 2.4.1).

``grow[i]`` multiplies the incoming weights and bias of neuron id i, ``shrink[i]`` its
outgoing weights. A rescaling has shrink = 1/grow; Algorithm 3.2.1 also needs shrink = 0
(outgoing weights of an input-dead neuron set to zero). Id 0 (the input) keeps 1 and 1.
Only the module copies handed in are modified; the arithmetic is float64.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from pathlift.errors import ShapeError
from pathlift.graph import param
from pathlift.graph.channels import BATCHNORM, CONV, CONV_TRANSPOSE, LINEAR, Producer


def raw(module: nn.Module, name: str) -> Tensor | None:
    """The stored tensor behind parameter ``name`` (``name_orig`` under a pruning mask)."""
    orig = getattr(module, name + "_orig", None)
    return orig if orig is not None else getattr(module, name, None)


def _scale_(tensor: Tensor, factor: Tensor) -> None:
    with torch.no_grad():
        tensor.copy_((tensor.to(torch.float64) * factor).to(tensor.dtype))


def in_channel_index(p: Producer, weight: Tensor) -> tuple[Tensor, Tensor]:
    """For weight entry [a, b, ...]: (output-channel index, input-channel index) grids."""
    a, b = weight.shape[0], weight.shape[1]
    rows = torch.arange(a)[:, None].expand(a, b)
    cols = torch.arange(b)[None, :].expand(a, b)
    if p.kind == LINEAR:
        return rows, cols
    if p.kind == CONV:  # weight (out, in/groups, k...)
        per_out = a // p.groups
        return rows, (rows // per_out) * b + cols
    # ConvTranspose weight (in, out/groups, k...)
    per_in = a // p.groups
    return (rows // per_in) * b + cols, rows


def apply_(module: nn.Module, p: Producer, grow: Tensor, shrink: Tensor) -> None:
    """Multiply incoming weights/bias of p's neurons by grow, weights from its inputs by shrink.

    BatchNorm is an affine identity neuron x -> a x + c with a = w / sqrt(var + eps) and
    c = bias - mean a (thesis, below Def. 2.2.2). With its input multiplied by s = 1/shrink
    and its output by mu = grow: mean -> s mean, w -> w mu / s, bias -> mu bias, which for
    mu = s is the thesis' Appendix E.1.2 rule (running mean and bias times lambda). When the
    input is dead (shrink = 0), a -> 0 and the constant c is kept in the bias.
    """
    g, s = grow[p.neurons], shrink[p.inputs]
    if p.kind == BATCHNORM:
        _apply_batchnorm_(module, g, s)
        return
    weight = raw(module, "weight")
    rows, cols = in_channel_index(p, weight)
    if p.kind == LINEAR and weight.shape[1] != s.numel():
        raise ShapeError(f"layer '{p.name}' expects {weight.shape[1]} features, "
                         f"the traced graph feeds {s.numel()}")
    factor = g[rows] * s[cols]
    _scale_(weight, factor.reshape(factor.shape + (1,) * (weight.dim() - 2)))
    bias = raw(module, "bias")
    if bias is not None:
        _scale_(bias, g)


def _apply_batchnorm_(bn: nn.Module, g: Tensor, s: Tensor) -> None:
    mean = bn.running_mean
    if not bn.affine:  # pass-through: its output ids are its input ids, so g = 1/s
        _scale_(mean, torch.where(s > 0, 1 / s.clamp_min(1e-300), torch.ones_like(s)))
        return
    dead = s == 0
    weight, bias = raw(bn, "weight"), raw(bn, "bias")
    a = param(bn, "weight").detach().to(torch.float64) * torch.rsqrt(
        bn.running_var.to(torch.float64) + bn.eps)
    new_bias = torch.where(dead, g * (bias.detach().to(torch.float64)
                                      - mean.to(torch.float64) * a),
                           g * bias.detach().to(torch.float64))
    with torch.no_grad():
        bias.copy_(new_bias.to(bias.dtype))
        mean.copy_(torch.where(dead, mean.to(torch.float64),
                               mean.to(torch.float64) / s.clamp_min(1e-300)).to(mean.dtype))
    _scale_(weight, g * s)


def apply_all_(model: nn.Module, producers: Iterable[Producer], grow: Tensor,
               shrink: Tensor) -> None:
    """``apply_`` on every producer, the modules looked up by name in ``model``."""
    for p in producers:
        apply_(model.get_submodule(p.name), p, grow, shrink)


def incoming_norms(module: nn.Module, p: Producer, q: float) -> Tensor:
    """||(theta^{->v}, b_v)||_q of each output channel v (all kernel entries of a channel)."""
    rows = _incoming(module, p)
    if q == float("inf"):
        return rows.abs().amax(dim=1)
    return rows.abs().pow(q).sum(dim=1).pow(1 / q)


def _incoming(module: nn.Module, p: Producer) -> Tensor:
    """One row per output channel: its incoming weights followed by its bias."""
    if p.kind == BATCHNORM:
        a = param(module, "weight").detach().to(torch.float64) * torch.rsqrt(
            module.running_var.to(torch.float64) + module.eps)
        c = param(module, "bias").detach().to(torch.float64) \
            - module.running_mean.to(torch.float64) * a
        return torch.stack([a, c], dim=1)
    weight = param(module, "weight").detach().to(torch.float64)
    if p.kind == CONV_TRANSPOSE:  # (in, out/groups, k...) -> rows per output channel
        per_in = weight.shape[0] // p.groups
        weight = weight.reshape(p.groups, per_in, weight.shape[1], -1)
        weight = weight.permute(0, 2, 1, 3).reshape(p.neurons.numel(), -1)
    else:
        weight = weight.reshape(weight.shape[0], -1)
    bias = param(module, "bias")
    if bias is None:
        return weight
    return torch.cat([weight, bias.detach().to(torch.float64)[:, None]], dim=1)


def as_factors(values: float | Sequence[float] | Tensor, channels: int, name: str) -> Tensor:
    """A float64 vector of ``channels`` factors from a scalar, a sequence or a tensor."""
    t = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    if t.dim() == 0:
        t = t.expand(channels)
    if t.shape != (channels,):
        raise ShapeError(f"layer '{name}' has {channels} output channels; got factors of "
                         f"shape {tuple(t.shape)}")
    return t.clone()

