"""Apply neuron-wise factors to the parameters of a model in place (thesis Def. 2.4.1).

``grow[i]`` multiplies the incoming weights and bias of neuron id i, ``shrink[i]`` its
outgoing weights. A rescaling has shrink = 1/grow; Algorithm 3.2.1 also needs shrink = 0
(outgoing weights of an input-dead neuron set to zero). Id 0 (the input) keeps 1 and 1.
Only the module copies handed in are modified; each layer's handler does the arithmetic
(float64), so every layer type rescales the way its own handler says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from pathlift.errors import ShapeError, UnsupportedModelError
from pathlift.graph.channels import Producer


@runtime_checkable
class RescalableLayer(Protocol):
    """What rescaling and normalisation (Def. 2.4.1, Alg. 3.2.1) ask of a layer: how many
    input channels it reads, its incoming rows (theta^{->v}, b_v), and the in-place
    rescaling of a copy. ``AffineHandler`` implements it."""

    def in_channels(self, module: nn.Module) -> int: ...

    def incoming_rows(self, module: nn.Module) -> Tensor: ...

    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None: ...


def _layer(p: Producer) -> RescalableLayer:
    return p.handler


def apply_(module: nn.Module, p: Producer, grow: Tensor, shrink: Tensor) -> None:
    """Multiply incoming weights/bias of p's neurons by grow, weights from its inputs by
    shrink (per neuron id), through the layer's handler."""
    s = shrink[p.inputs]
    expected = _layer(p).in_channels(module)
    if expected != s.numel():
        raise ShapeError(f"layer '{p.name}' expects {expected} input channels, the traced "
                         f"graph feeds {s.numel()}")
    _layer(p).rescale_(module, grow[p.neurons], s)


def apply_all_(model: nn.Module, producers: Iterable[Producer], grow: Tensor,
               shrink: Tensor) -> None:
    """``apply_`` on every producer, its module looked up in ``model`` (``module_in``)."""
    for p in producers:
        apply_(p.module_in(model), p, grow, shrink)


def incoming_norms(module: nn.Module, p: Producer, q: float) -> Tensor:
    """||(theta^{->v}, b_v)||_q of each output channel v (all kernel entries of a channel)."""
    rows = _layer(p).incoming_rows(module).abs()
    top = rows.amax(dim=1)
    if q == float("inf"):
        return top
    unit = torch.where(top > 0, top, torch.ones_like(top))[:, None]  # |row|^q never overflows
    return (rows / unit).pow(q).sum(dim=1).pow(1 / q) * unit[:, 0]


def tied_layers(model: nn.Module, names: Sequence[str], among: Sequence[str] | None = None
                ) -> list[tuple[str, str, str]]:
    """(layer, other layer, parameter name) for each of ``names`` holding a parameter tensor
    that another module of ``model`` (one of ``among`` if given) holds too: tied weights of
    distinct layers. One module reachable under two names is one layer, not two."""
    owners: dict[int, dict[int, str]] = {}  # parameter -> {module id: a name of it}
    holders = model.named_modules() if among is None else \
        ((n, model.get_submodule(n)) for n in among)
    for name, module in holders:
        for t in module.parameters(recurse=False):
            owners.setdefault(id(t), {}).setdefault(id(module), name)
    tied = []
    for name in names:
        module = model.get_submodule(name)
        others = [(other, pname) for pname, t in module.named_parameters(recurse=False)
                  for key, other in owners.get(id(t), {}).items() if key != id(module)]
        if others:
            tied.append((name, *others[0]))
    return tied


def refuse_shared_parameters(model: nn.Module, producers: Iterable[Producer]) -> None:
    """UnsupportedModelError when two layers hold one parameter tensor: a factor applied to
    one would silently apply to the other."""
    names = [p.name for p in producers]
    for name, other, pname in tied_layers(model, names, among=names)[:1]:
        first, second = sorted((name, other))
        raise UnsupportedModelError(
            f"layers '{first}' and '{second}' share the parameter '{pname}' (tied "
            "weights of distinct layers); pathlift cannot transform one without the "
            "other. Untie them, or call the one layer twice instead")


def as_factors(values: float | Sequence[float] | Tensor, channels: int, name: str) -> Tensor:
    """A float64 vector of ``channels`` factors from a scalar, a sequence or a tensor."""
    t = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    if t.dim() == 0:
        t = t.expand(channels)
    if t.shape != (channels,):
        raise ShapeError(f"layer '{name}' has {channels} output channels; got factors of "
                         f"shape {tuple(t.shape)}")
    return t.clone()
