"""A learnt or constant per-channel scale, and a free per-channel bias, over a module's own
tensor: ``x * self.gamma`` (timm's LayerScale), ``x * self.gamma[:, None, None]``,
``self.gamma.view(1, -1, 1, 1) * x`` (ConvNeXt), a buffer as well as a parameter, and
``x + self.beta``.

Each is a layer of identity neurons with one incoming weight (thesis Def. 2.2.2): neuron c
computes a_c x_c + b_c, with a = gamma (the fixed weight 1 for a free bias) and b = beta
(none for a scale), the diagonal affine op of ``ChannelAffine``, as an eval BatchNorm is
(x*a + c). A scale has neurons of its own: a rescaling (Def. 2.4.1) moves weight through
gamma, and its entries are coordinates of theta that path-magnitude pruning scores
(paper 002 eq. 11). A free bias has none: it follows its input channel's factor, as
BatchNorm without affine parameters does.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, fx, nn

from pathlift.graph.boundary import param, stored
from pathlift.graph.ops.affine import (
    AffineHandler,
    BatchNormHandler,
    Workspace,
    _operand,
    _scale_,
    abs_power,
    channel_view,
)
from pathlift.graph.ops.base import (
    INPUT,
    Call,
    Handler,
    Lowered,
    Operand,
    fx_constant,
    lower,
    register,
)


class ChannelAffine(nn.Module):
    """y = x * weight + bias, one entry per channel of dim ``dim`` counted from the end
    (-1: the last dim, features; -3: the channels of an image batch), either of them may
    be None: the module form of a per-channel scale or bias."""

    def __init__(self, num_features: int, dim: int = -1, weight: bool = True,
                 bias: bool = False):
        super().__init__()
        self.num_features, self.dim = num_features, dim
        self.weight = nn.Parameter(torch.ones(num_features)) if weight else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        shape = (-1,) + (1,) * (-1 - self.dim)
        if self.weight is not None:
            x = x * self.weight.reshape(shape)
        return x if self.bias is None else x + self.bias.reshape(shape)


class ChannelAffineHandler(AffineHandler):
    """The diagonal affine op of ``ChannelAffine``: identity neurons y_c = a_c x_c + b_c
    (Def. 2.2.2), a the scale (1 without one), b the bias (none without one), along the
    channel dim (1) or the last dim (``channel_dim`` -1)."""

    diagonal = True
    absorbs_folds = False

    def __init__(self, name: str, channel_dim: int = 1):
        super().__init__(name)
        self.channel_dim = channel_dim

    def resolve(self, call: Call) -> Handler:
        x = call.args[0]
        if isinstance(x, Tensor) and x.dim() + call.module.dim == x.dim() - 1:
            return _LAST
        return _CHANNELS

    def problem(self, call: Call) -> str | None:
        x, module = call.args[0], call.module
        dim = x.dim() + module.dim
        if dim not in (1, x.dim() - 1) or dim == 0:
            return (f"scales or shifts dim {dim} of a {x.dim()}-d activation by a "
                    "per-channel tensor; pathlift reads per-channel scales and biases "
                    "along dim 1 (channels) or the last dim (features)")
        if x.shape[dim] != module.num_features:
            return (f"a per-channel tensor of {module.num_features} entries broadcast over "
                    f"{x.shape[dim]} channels shares one weight between neurons; give one "
                    "entry per channel")
        return None

    def pair(self, module: nn.Module, detach: bool = True) -> tuple[Tensor, Tensor | None]:
        """(a, b): the neurons' incoming weights (ones for a free bias) and biases."""
        weight, bias = param(module, "weight", detach), param(module, "bias", detach)
        if weight is None:
            weight = torch.ones_like(bias.detach())
        return weight.reshape(-1), None if bias is None else bias.reshape(-1)

    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype,
                  workspace: Workspace | None = None, unit: float = 1.0) -> Tensor:
        """|a|^q in the shape the module stores a (a (1, C, 1, 1) layer scale's: the
        scores of its entries are those of its state_dict tensor)."""
        own = param(module, "weight")
        out = abs_power(self.pair(module)[0], q, dtype, unit=unit)
        return out if own is None else out.reshape(own.shape)

    def magnitude_in_units(self, module: nn.Module, q: float, dtype: torch.dtype,
                           workspace: Workspace | None = None, exact: bool = False
                           ) -> tuple[Tensor, tuple[float, float]]:
        found = self.units(module, exact)
        return self.magnitude(module, q, dtype, workspace, found[0]), found

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        weight, bias = weight.reshape(-1), None if bias is None else bias.reshape(-1)
        if self.channel_dim == 1:
            weight = channel_view(weight, x.dim())
            bias = None if bias is None else channel_view(bias, x.dim())
        return x * weight if bias is None else torch.addcmul(bias, x, weight)

    def bias(self, module: nn.Module) -> Tensor | None:
        return self.pair(module)[1]

    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        return self.pair(module)

    def live_parameters(self, module: nn.Module, dtype: torch.dtype
                        ) -> tuple[Tensor, Tensor | None]:
        weight, bias = self.pair(module, detach=False)
        return weight.to(dtype), None if bias is None else bias.to(dtype)

    def magnitude_gradients(self, module: nn.Module, weight: Tensor, bias: Tensor | None,
                            q: float) -> list[tuple[str, Tensor | None]]:
        own = param(module, "weight")
        return ([] if own is None else [("weight", weight.reshape(own.shape))]) + \
            [("bias", bias)]

    def own_neurons(self, module: nn.Module) -> bool:
        """A scale's neurons are its own; a free bias follows its input's channels."""
        return param(module, "weight") is not None

    # neuron c reads input channel c only: eval BatchNorm's layout (``num_features``)
    entry_channels = BatchNormHandler.entry_channels
    in_channels = BatchNormHandler.in_channels

    def incoming_rows(self, module: nn.Module) -> Tensor:
        weight, bias = self.pair(module)
        rows = [weight] if bias is None else [weight, bias]
        return torch.stack([t.to(torch.float64) for t in rows], dim=1)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x

    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        """Scale a_c times grow[c] * shrink[c] (its one incoming weight), bias b_c times
        grow[c] (Def. 2.4.1); a free bias, whose neurons are its input's, times grow."""
        weight, bias = stored(module, "weight"), stored(module, "bias")
        if weight is not None:
            _scale_(weight, (grow * shrink).reshape(weight.shape))
        if bias is not None:
            _scale_(bias, grow.reshape(bias.shape))

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        """A diagonal op: its entries follow its channels (``outputs``, else ``inputs``)."""
        index = outputs if outputs is not None else inputs
        for name in ("weight", "bias"):
            t = stored(module, name)
            if t is not None and index is not None:
                with torch.no_grad():
                    t.copy_(t.reshape(-1).index_select(0, index).reshape(t.shape))

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        return [(name, t, None) for name in ("weight", "bias")
                if (t := param(module, name)) is not None]


_CHANNELS = register(ChannelAffineHandler("per-channel scale"), modules=[ChannelAffine],
                     note="(`x * self.gamma[:, None, None]`, `x + self.beta`)")
_LAST = ChannelAffineHandler("per-channel scale", channel_dim=-1)

_VIEWS = ("view", "reshape", "unsqueeze")


def _channel_operand(arg: Any, role: str) -> Operand | None:
    """The ``Operand`` of a module tensor read as it is or reshaped by one indexing or
    view (``self.gamma``, ``self.gamma[:, None, None]``, ``self.gamma.view(1, -1, 1,
    1)``), or None."""
    if not isinstance(arg, fx.Node):
        return None
    plain = _operand(arg, role)
    if plain is not None and not plain[1].derived and not plain[1].transposed:
        return plain[1]
    if arg.op == "call_function" and arg.target is operator.getitem:
        method, args = "__getitem__", (arg.args[1],)
    elif arg.op == "call_method" and arg.target in _VIEWS:
        method, args = str(arg.target), tuple(arg.args[1:])
    else:
        return None
    source = _operand(arg.args[0], role)
    if source is None or source[1].derived or source[1].transposed or any(
            isinstance(a, fx.Node) for a in fx.node.map_aggregate(args, lambda a: a)):
        return None
    return Operand(role, method, args)


def _reader(role: str) -> Callable[[fx.Node, Callable[[fx.Node], Any]], Lowered | str | None]:
    """The lowering of an activation scaled by (``role`` weight) or added to (``bias``) a
    tensor of the module: a ``ChannelAffine`` when the tensor holds one entry per channel
    of one dim, else a one-line reason; None for anything else (two activations, a
    constant)."""
    what = "scales by" if role == "weight" else "adds"

    def read(node: fx.Node, value: Callable[[fx.Node], Any]) -> Lowered | str | None:
        if len(node.args) != 2 or node.kwargs:
            return None
        nodes = [a for a in node.args if isinstance(a, fx.Node)]
        live = [a for a in nodes if value(a) is None]
        tensors = [a for a in nodes if a not in live and isinstance(value(a), Tensor)]
        if len(live) != 1 or len(tensors) != 1:
            return None
        x, t = live[0], tensors[0]
        if fx_constant(t):
            return (f"{what} a tensor that torch.fx made a constant (a buffer indexed or "
                    "reshaped in forward, self.scale[:, None, None]); read the buffer as it "
                    "is (store it reshaped), or make it a parameter")
        operand, read_as = _channel_operand(t, role), value(t)
        if operand is None:
            return (f"{what} a tensor computed in forward from the module's tensors outside "
                    "any layer; pathlift reads a per-channel scale or bias as the module's "
                    "tensor itself or reshaped once (gamma[:, None, None], "
                    "gamma.view(1, -1, 1, 1)): compute it in __init__, or fold it into a layer")
        order = {n: i for i, n in enumerate(node.graph.nodes)}
        if t.op != "get_attr" and order[t] < order[x]:  # eager reshapes, then computes x
            return (f"{what} a module tensor reshaped before the activation it scales is "
                    "computed (self.gamma.view(1, -1, 1, 1) * self.conv(x)), an order the "
                    "layer cannot keep; write self.conv(x) * self.gamma.view(1, -1, 1, 1)")
        channels = [d for d, n in enumerate(read_as.shape) if n != 1]
        stored_as = value(t if operand.flip == "" else t.args[0])
        if len(channels) != 1 or sum(n != 1 for n in stored_as.shape) != 1:
            return (f"{what} a module tensor of shape {tuple(stored_as.shape)} read as "
                    f"{tuple(read_as.shape)}, not one entry per channel of one dim; pathlift "
                    "reads per-channel scales and biases (a vector of C entries) only")
        dim = channels[0] - read_as.dim()
        return Lowered(_CHANNELS, ChannelAffine, {x: INPUT, t: operand},
                       {"num_features": read_as.shape[channels[0]], "dim": dim,
                        ("bias" if role == "weight" else "weight"): None}, {})
    return read


lower([operator.mul, torch.mul, "mul", "__mul__", "__rmul__"], _reader("weight"))
lower([operator.add, torch.add, "add", "__add__", "__radd__"], _reader("bias"))
