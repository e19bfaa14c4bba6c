"""The registry of supported operations: one handler per op kind (thesis Def. 2.2.2).

Every node of a traced model is matched to exactly one handler. A handler says which kind
of DAG neurons the op creates (``Kind``), why a particular instance is refused, and how the
op acts on the non-negative |theta|^q network of Thm 3.1.1 (the path-norm pass). Adding a
supported layer means adding one handler to ``MODULE_HANDLERS``, ``FUNCTION_HANDLERS`` or
``METHOD_HANDLERS`` below; nothing else in pathlift needs to change.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn


class Kind(Enum):
    """How an op maps to the neurons of Def. 2.2.2."""

    AFFINE = "affine"  # identity neurons with parameters: Linear, Conv, ConvTranspose, BatchNorm
    RELU = "relu"  # the ReLU activation of the neurons it follows
    MAXPOOL = "maxpool"  # 1-max-pool neurons, weights 1, bias 0
    POOL = "pool"  # parameter-free identity neurons with fixed non-negative weights
    ADD = "add"  # residual sum: skip edges with weight 1
    CAT = "cat"  # concatenation along a non-batch dim (U-Net skips)
    RESHAPE = "reshape"  # relabelling of neurons (view, flatten, permute, ...)
    IDENTITY = "identity"  # no neuron at all (Identity, eval Dropout, contiguous)
    SHAPE = "shape"  # python-level shape arithmetic (size, getattr shape, getitem on sizes)


@dataclass(frozen=True)
class Call:
    """One concrete call of a node: its fx node, submodule (if any), and unwrapped args."""

    node: fx.Node
    module: nn.Module | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self, *args: Any) -> Any:
        """Run the original op, with ``args`` replacing the leading positional arguments."""
        new_args = tuple(args) + tuple(self.args[len(args) :])
        if self.module is not None:
            return self.module(*new_args, **self.kwargs)
        if self.node.op == "call_method":
            return getattr(new_args[0], self.node.target)(*new_args[1:], **self.kwargs)
        return self.node.target(*new_args, **self.kwargs)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """A call argument given either positionally or by keyword."""
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(name, default)


def param(module: nn.Module, name: str) -> Tensor | None:
    """The effective parameter ``name``, honouring torch.nn.utils.prune masks.

    A pruned module stores ``name_orig`` and ``name_mask``; its plain ``name`` attribute is
    only refreshed by a forward pre-hook and may be stale, so the product is recomputed.
    """
    orig = getattr(module, name + "_orig", None)
    mask = getattr(module, name + "_mask", None)
    if orig is not None and mask is not None:
        return orig * mask
    return getattr(module, name, None)


def batchnorm_affine(bn: nn.modules.batchnorm._BatchNorm, dtype: torch.dtype | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Eval-mode BatchNorm as the affine identity neuron x*a + c (thesis, below Def 2.2.2).

    ``dtype`` (default: the buffers' dtype) is the precision of the fold: folding float32
    statistics in float32 loses ~1e-7 relative, more than a float64 path-norm tolerates.
    """
    var, mean = bn.running_var.to(dtype), bn.running_mean.to(dtype)
    a = torch.rsqrt(var + bn.eps)
    weight, bias = param(bn, "weight"), param(bn, "bias")
    weight = None if weight is None else weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    if weight is not None:
        a = a * weight
    c = -mean * a
    if bias is not None:
        c = c + bias
    return a, c


class Handler:
    """Base handler: the op runs unchanged in every pass (structure only)."""

    kind: Kind = Kind.IDENTITY
    name: str = "op"

    def __init__(self, name: str, kind: Kind | None = None):
        self.name = name
        if kind is not None:
            self.kind = kind

    def problem(self, call: Call) -> str | None:
        """Why this particular call is outside the supported model, or None."""
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        """The op with every weight w replaced by |w|^q, applied to a non-negative input."""
        return call.run(x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.kind.value})"


# --------------------------------------------------------------------------- affine layers


class AffineHandler(Handler):
    """Layers with parameters: y = W x + b, bias broadcast along ``channel_dim``."""

    kind = Kind.AFFINE
    channel_dim = 1

    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype) -> Tensor:
        """|W|^q, a fresh tensor: the layer's weight in the |theta|^q network (Thm 3.1.1)."""
        return abs_power(param(module, "weight"), q, dtype)

    def apply(self, x: Tensor, weight: Tensor, call: Call) -> Tensor:
        """The layer's linear map with ``weight`` in place of W, without the bias."""
        raise NotImplementedError

    def weight_part(self, x: Tensor, q: float, call: Call) -> Tensor:
        """|W|^q x, without the bias."""
        return self.apply(x, self.magnitude(call.module, q, x.dtype), call)

    def rank_one_grad(self, x: Tensor, grad_y: Tensor) -> tuple[Tensor, Tensor] | None:
        """(u, v) with d<grad_y, apply(x, W)>/dW = u v^T when that gradient is an outer
        product the layer can name without forming it (a Linear layer on one row), else
        None. Lets a caller scale a huge weight by its gradient in place."""
        return None

    def bias(self, module: nn.Module) -> Tensor | None:
        """The bias vector b (one entry per output channel), or None."""
        return param(module, "bias")

    def problem(self, call: Call) -> str | None:
        return _nonfinite_problem(call.module)


def _nonfinite_problem(module: nn.Module | None) -> str | None:
    if module is None:
        return None
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if tensor.is_floating_point() and tensor.numel() and not _all_finite(tensor.detach()):
            return f"parameter '{name}' holds NaN or inf; fix or reload the weights"
    return None


def _all_finite(t: Tensor) -> bool:
    """No NaN or inf in ``t``: its min and max propagate both, and need no mask of t's size
    (allocating one costs more than reading t for large layers)."""
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def abs_power(t: Tensor, q: float, dtype: torch.dtype) -> Tensor:
    """|t|^q in ``dtype``, detached, in one fresh tensor (no copy beyond the result: the
    weights of large layers cost more to allocate than to read)."""
    source = t.detach()
    magnitude = source.to(dtype)
    magnitude = magnitude.abs() if magnitude is source else magnitude.abs_()
    return magnitude if q == 1 else magnitude.pow_(q)


class LinearHandler(AffineHandler):
    channel_dim = -1

    def apply(self, x: Tensor, weight: Tensor, call: Call) -> Tensor:
        return F.linear(x, weight)

    def rank_one_grad(self, x: Tensor, grad_y: Tensor) -> tuple[Tensor, Tensor] | None:
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] != 1:
            return None
        return grad_y.reshape(-1), rows.reshape(-1)


class ConvHandler(AffineHandler):
    def problem(self, call: Call) -> str | None:
        if call.module.padding_mode != "zeros":
            return (
                f"padding_mode='{call.module.padding_mode}' ties several kernel entries to one "
                "edge of the DAG; only zero padding is supported"
            )
        return super().problem(call)

    def apply(self, x: Tensor, weight: Tensor, call: Call) -> Tensor:
        return call.module._conv_forward(x, weight, None)


class ConvTransposeHandler(ConvHandler):
    def apply(self, x: Tensor, weight: Tensor, call: Call) -> Tensor:
        m = call.module
        dims = x.dim() - 2
        output_size = call.arg(1, "output_size")
        output_padding = m._output_padding(
            x, output_size, m.stride, m.padding, m.kernel_size, dims, m.dilation
        )
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
        return fn(x, weight, None, m.stride, m.padding, output_padding, m.groups, m.dilation)


class BatchNormHandler(AffineHandler):
    def problem(self, call: Call) -> str | None:
        bn = call.module
        if bn.training:
            return "BatchNorm in training mode normalises by batch statistics; call model.eval()"
        if bn.running_mean is None:
            return "BatchNorm without running statistics (track_running_stats=False) is not affine"
        return super().problem(call)

    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype) -> Tensor:
        return abs_power(batchnorm_affine(module, dtype)[0], q, dtype)

    def apply(self, x: Tensor, weight: Tensor, call: Call) -> Tensor:
        return x * _channel_view(weight, x.dim())

    def bias(self, module: nn.Module) -> Tensor | None:
        return batchnorm_affine(module, torch.float64)[1]


def _channel_view(v: Tensor, ndim: int) -> Tensor:
    return v.reshape((1, -1) + (1,) * (ndim - 2)) if ndim > 1 else v


# --------------------------------------------------------------------------- activations


class ReluHandler(Handler):
    kind = Kind.RELU

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        return x  # the |theta|^q network is fed non-negative values: ReLU is the identity


class TrainingModeHandler(Handler):
    """Identity in eval mode (Dropout); refused in training mode, where it is random."""

    def problem(self, call: Call) -> str | None:
        if call.module is not None and call.module.training:
            return f"{type(call.module).__name__} in training mode is random; call model.eval()"
        if call.module is None and call.arg(2, "training", True):
            return "functional dropout with training=True is random; pass training=False"
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        return x


# --------------------------------------------------------------------------- pooling


def window_sum(x: Tensor, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
               ) -> Tensor:
    """Sum of each pooling window of x (zero padding, so padding is excluded from the sum).

    ``out_spatial`` is the spatial size the pooling produces (it encodes ceil_mode); the
    input is zero-padded, on the right as much as needed for a plain strided sum to yield
    that size.
    """
    dims = len(kernel)
    pad: list[int] = []
    for k, s, p, d, n, o in reversed(list(zip(kernel, stride, padding, dilation, x.shape[2:],
                                              out_spatial, strict=True))):
        pad += [p, max((o - 1) * s + d * (k - 1) + 1 - (n + p), p)]
    x = F.pad(x, pad)
    if all(d == 1 for d in dilation):  # a sum pool (several times faster than the conv)
        if dims == 1:
            out = F.avg_pool2d(x.unsqueeze(2), (1, kernel[0]), (1, stride[0]),
                               divisor_override=1).squeeze(2)
        else:
            pool = F.avg_pool2d if dims == 2 else F.avg_pool3d
            out = pool(x, list(kernel), list(stride), divisor_override=1)
    else:  # dilated windows: a depthwise convolution with a kernel of ones
        conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
        ones = x.new_ones((x.shape[1], 1, *kernel))
        out = conv(x, ones, None, list(stride), 0, list(dilation), x.shape[1])
    return out[(slice(None), slice(None), *(slice(0, o) for o in out_spatial))]


def _tuple(v: int | Sequence[int] | None, dims: int, default: int | None = None
           ) -> tuple[int, ...]:
    if v is None:
        v = default
    if isinstance(v, int):
        return (v,) * dims
    return tuple(int(e) for e in v)


class PoolGeometry:
    """Window geometry of a fixed-size pooling call (module or functional)."""

    def __init__(self, call: Call, dims: int, has_dilation: bool):
        if call.module is not None:
            m = call.module
            k, s, p = m.kernel_size, m.stride, m.padding
            d = getattr(m, "dilation", 1)
        else:
            k = call.arg(1, "kernel_size")
            s = call.arg(2, "stride")
            p = call.arg(3, "padding", 0)
            d = call.arg(4, "dilation", 1) if has_dilation else 1
        self.kernel = _tuple(k, dims)
        self.stride = _tuple(s if s not in (None, ()) else k, dims)
        self.padding = _tuple(p, dims)
        self.dilation = _tuple(d, dims)

    def sum(self, x: Tensor, out_spatial: Sequence[int]) -> Tensor:
        return window_sum(x, self.kernel, self.stride, self.padding, self.dilation, out_spatial)


def adaptive_counts(in_spatial: Sequence[int], out_spatial: Sequence[int],
                    like: Tensor) -> Tensor:
    """Number of inputs in each adaptive-pooling window (torch's start/end index rule)."""
    counts = like.new_ones(())
    for n, o in zip(in_spatial, out_spatial, strict=True):
        idx = torch.arange(o, dtype=torch.float64)
        start = torch.floor(idx * n / o)
        end = torch.ceil((idx + 1) * n / o)
        c = (end - start).to(like.dtype)
        counts = counts.unsqueeze(-1) * c
    return counts


class MaxPoolHandler(Handler):
    """k-max-pool neurons with k = 1 (Def. 2.2.2); Thm 3.1.1 replaces them by window sums."""

    kind = Kind.MAXPOOL

    def __init__(self, name: str, dims: int, adaptive: bool):
        super().__init__(name)
        self.dims, self.adaptive = dims, adaptive

    def problem(self, call: Call) -> str | None:
        indices = (call.module.return_indices if call.module is not None
                   else call.arg(6 if not self.adaptive else 2, "return_indices", False))
        if indices:
            return "max-pooling with return_indices=True (unpooling) is not a DAG neuron op"
        if torch.isinf(call.run(torch.zeros_like(call.args[0]))).any():
            return ("a pooling window lies entirely in the padding (its output is -inf); "
                    "reduce the padding or the dilation")
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        out_spatial = call.run(x).shape[2:]
        if self.adaptive:
            return _adaptive_avg(x, out_spatial) * adaptive_counts(x.shape[2:], out_spatial, x)
        return PoolGeometry(call, self.dims, True).sum(x, out_spatial)


def _adaptive_avg(x: Tensor, out_spatial: Sequence[int]) -> Tensor:
    fn = (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d)[len(out_spatial) - 1]
    return fn(x, tuple(out_spatial))


class AvgPoolHandler(Handler):
    """Average-pool neurons: identity activation, incoming weights 1/|window| (Def. 2.2.2)."""

    kind = Kind.POOL

    def __init__(self, name: str, dims: int, adaptive: bool):
        super().__init__(name)
        self.dims, self.adaptive = dims, adaptive

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        y = call.run(x)
        out_spatial = y.shape[2:]
        if self.adaptive:
            counts = adaptive_counts(x.shape[2:], out_spatial, x)
            return y * counts.pow(1 - q)
        # weight of window o is w_o = avg(1)_o / sum(1)_o; |avg|^q x = sum(x) * w^q
        geometry = PoolGeometry(call, self.dims, False)
        ones = torch.ones_like(x[:1, :1])
        weight = call.run(ones) / geometry.sum(ones, out_spatial)
        return geometry.sum(x, out_spatial) * weight.pow(q)


class MeanHandler(Handler):
    """``mean`` over non-batch dims: identity neurons with weights 1/N."""

    kind = Kind.POOL

    def _dims(self, call: Call, ndim: int) -> tuple[int, ...] | None:
        dim = call.arg(1, "dim")
        if dim is None:
            return None
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        return tuple(d % ndim for d in dims)

    def problem(self, call: Call) -> str | None:
        x = call.args[0]
        dims = self._dims(call, x.dim())
        if dims is None or 0 in dims:
            return "mean over the batch dimension mixes samples; average over features only"
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        count = math.prod(x.shape[d] for d in self._dims(call, x.dim()))
        return call.run(x) * float(count) ** (1 - q)


class UpsampleHandler(Handler):
    """Nearest-neighbour upsampling: each output neuron copies one input (weight 1)."""

    kind = Kind.POOL

    def problem(self, call: Call) -> str | None:
        mode = call.module.mode if call.module is not None else call.arg(3, "mode", "nearest")
        if mode not in ("nearest", "nearest-exact"):
            return f"upsampling mode '{mode}' is not supported; use mode='nearest'"
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        return call.run(x)


# --------------------------------------------------------------------------- structure


class AddHandler(Handler):
    kind = Kind.ADD

    def problem(self, call: Call) -> str | None:
        if len(call.args) < 2 or not all(isinstance(a, Tensor) for a in call.args[:2]):
            return "adding a constant is a bias outside any layer; put it in a layer's bias"
        if call.kwargs.get("alpha", 1) != 1:
            return "torch.add with alpha != 1 is not supported; scale inside a layer instead"
        if call.args[0].shape != call.args[1].shape:
            return "residual addition with broadcasting is not supported; shapes must match"
        return None


class CatHandler(Handler):
    kind = Kind.CAT

    def problem(self, call: Call) -> str | None:
        tensors = call.arg(0, "tensors")
        dim = call.arg(1, "dim", 0)
        if dim % tensors[0].dim() == 0:
            return "concatenation along the batch dimension mixes samples"
        return None


class ReshapeHandler(Handler):
    """Relabels neurons; refused if it moves data across the batch dimension."""

    kind = Kind.RESHAPE


class ShapeHandler(Handler):
    kind = Kind.SHAPE


class UnsupportedHandler(Handler):
    """An op known to be outside Def. 2.2.2, refused with a specific reason."""

    def __init__(self, name: str, reason: str):
        super().__init__(name)
        self.reason = reason

    def problem(self, call: Call) -> str | None:
        return self.reason


# --------------------------------------------------------------------------- the registry

_AFFINE: dict[type, Handler] = {nn.Linear: LinearHandler("Linear")}
for _d in (1, 2, 3):
    _AFFINE[getattr(nn, f"Conv{_d}d")] = ConvHandler(f"Conv{_d}d")
    _AFFINE[getattr(nn, f"ConvTranspose{_d}d")] = ConvTransposeHandler(f"ConvTranspose{_d}d")
    _AFFINE[getattr(nn, f"BatchNorm{_d}d")] = BatchNormHandler(f"BatchNorm{_d}d")

MODULE_HANDLERS: dict[type, Handler] = {
    **_AFFINE,
    nn.ReLU: ReluHandler("ReLU"),
    nn.Identity: Handler("Identity"),
    nn.Flatten: ReshapeHandler("Flatten"),
    nn.Unflatten: ReshapeHandler("Unflatten"),
    nn.Upsample: UpsampleHandler("Upsample"),
    nn.UpsamplingNearest2d: UpsampleHandler("UpsamplingNearest2d"),
    **{getattr(nn, n): TrainingModeHandler(n)
       for n in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d")},
}
for _d in (1, 2, 3):
    MODULE_HANDLERS[getattr(nn, f"MaxPool{_d}d")] = MaxPoolHandler(f"MaxPool{_d}d", _d, False)
    MODULE_HANDLERS[getattr(nn, f"AdaptiveMaxPool{_d}d")] = MaxPoolHandler(
        f"AdaptiveMaxPool{_d}d", _d, True)
    MODULE_HANDLERS[getattr(nn, f"AvgPool{_d}d")] = AvgPoolHandler(f"AvgPool{_d}d", _d, False)
    MODULE_HANDLERS[getattr(nn, f"AdaptiveAvgPool{_d}d")] = AvgPoolHandler(
        f"AdaptiveAvgPool{_d}d", _d, True)

_NOT_HOMOGENEOUS = "is not positively homogeneous, so the path-lifting does not describe it"
_UNSUPPORTED_MODULES: dict[type, str] = {
    nn.ReLU6: "ReLU6 clips at 6 and " + _NOT_HOMOGENEOUS + "; replace it by nn.ReLU",
    nn.GELU: "GELU " + _NOT_HOMOGENEOUS + "; replace it by nn.ReLU",
    nn.SiLU: "SiLU " + _NOT_HOMOGENEOUS + "; replace it by nn.ReLU",
    nn.Sigmoid: "sigmoid " + _NOT_HOMOGENEOUS,
    nn.Tanh: "tanh " + _NOT_HOMOGENEOUS,
    nn.Softmax: "softmax " + _NOT_HOMOGENEOUS + "; path-norms apply to the logits",
    nn.LogSoftmax: "log-softmax " + _NOT_HOMOGENEOUS + "; path-norms apply to the logits",
    nn.LeakyReLU: "leaky ReLU is outside the ReLU/identity/max-pool model of Def. 2.2.2",
    nn.ELU: "ELU " + _NOT_HOMOGENEOUS,
    nn.Hardswish: "hardswish " + _NOT_HOMOGENEOUS,
    nn.Hardtanh: "hardtanh " + _NOT_HOMOGENEOUS,
    nn.LayerNorm: "LayerNorm divides by a data-dependent norm; it is not an affine neuron",
    nn.GroupNorm: "GroupNorm divides by a data-dependent norm; it is not an affine neuron",
    nn.MultiheadAttention: "attention multiplies activations together; it is not a DAG of "
                           "ReLU/identity/max-pool neurons",
    nn.Embedding: "embeddings are lookups, not neurons; feed the embedded input instead",
}
for _cls, _reason in _UNSUPPORTED_MODULES.items():
    MODULE_HANDLERS[_cls] = UnsupportedHandler(_cls.__name__, _reason)

_RELU = ReluHandler("relu")
_ADD = AddHandler("add")
_RESHAPE = ReshapeHandler("reshape")
_SHAPE = ShapeHandler("shape")

FUNCTION_HANDLERS: dict[Callable[..., Any], Handler] = {
    F.relu: _RELU, torch.relu: _RELU, torch.relu_: _RELU, F.relu_: _RELU,
    operator.add: _ADD, operator.iadd: _ADD, torch.add: _ADD,
    torch.cat: CatHandler("cat"), torch.concat: CatHandler("cat"),
    torch.flatten: _RESHAPE, torch.reshape: _RESHAPE, torch.permute: _RESHAPE,
    torch.transpose: _RESHAPE, torch.squeeze: _RESHAPE, torch.unsqueeze: _RESHAPE,
    torch.mean: MeanHandler("mean"),
    F.interpolate: UpsampleHandler("interpolate"),
    F.dropout: TrainingModeHandler("dropout"),
    operator.getitem: _SHAPE, getattr: _SHAPE,
    F.gelu: UnsupportedHandler("gelu", "GELU " + _NOT_HOMOGENEOUS + "; use ReLU"),
    torch.sigmoid: UnsupportedHandler("sigmoid", "sigmoid " + _NOT_HOMOGENEOUS),
    torch.tanh: UnsupportedHandler("tanh", "tanh " + _NOT_HOMOGENEOUS),
    F.softmax: UnsupportedHandler("softmax", "softmax " + _NOT_HOMOGENEOUS),
    F.relu6: UnsupportedHandler("relu6", "ReLU6 " + _NOT_HOMOGENEOUS + "; use relu"),
    F.layer_norm: UnsupportedHandler("layer_norm", "layer_norm is not an affine neuron"),
    F.scaled_dot_product_attention: UnsupportedHandler(
        "scaled_dot_product_attention", "attention multiplies activations together"),
    torch.matmul: UnsupportedHandler("matmul", "a product of two activations is not a neuron"),
    operator.mul: UnsupportedHandler("mul", "multiplication inside forward is not supported; "
                                            "put constant scales in a layer's weights"),
}
for _d in (1, 2, 3):
    FUNCTION_HANDLERS[getattr(F, f"max_pool{_d}d")] = MaxPoolHandler(f"max_pool{_d}d", _d, False)
    FUNCTION_HANDLERS[getattr(F, f"adaptive_max_pool{_d}d")] = MaxPoolHandler(
        f"adaptive_max_pool{_d}d", _d, True)
    FUNCTION_HANDLERS[getattr(F, f"avg_pool{_d}d")] = AvgPoolHandler(f"avg_pool{_d}d", _d, False)
    FUNCTION_HANDLERS[getattr(F, f"adaptive_avg_pool{_d}d")] = AvgPoolHandler(
        f"adaptive_avg_pool{_d}d", _d, True)

METHOD_HANDLERS: dict[str, Handler] = {
    "relu": _RELU, "relu_": _RELU,
    "add": _ADD, "add_": _ADD, "__add__": _ADD,
    "mean": MeanHandler("mean"),
    "size": _SHAPE, "dim": _SHAPE,
    "contiguous": Handler("contiguous"),
    **{m: _RESHAPE for m in ("view", "reshape", "flatten", "permute", "transpose",
                            "squeeze", "unsqueeze")},
}


def handler_for(node: fx.Node, module: nn.Module | None) -> Handler | None:
    """The registered handler of a node, or None when the op is unknown."""
    if node.op == "call_module":
        for cls in type(module).__mro__:
            if cls in MODULE_HANDLERS:
                return MODULE_HANDLERS[cls]
        return None
    if node.op == "call_function":
        return FUNCTION_HANDLERS.get(node.target)
    if node.op == "call_method":
        return METHOD_HANDLERS.get(node.target)
    return None
