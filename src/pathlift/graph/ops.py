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
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.boundary import assign_, mask, param, stored


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


class Handler:
    """Base handler: the op runs unchanged in every pass (structure only)."""

    kind: Kind = Kind.IDENTITY
    name: str = "op"

    def __init__(self, name: str, kind: Kind | None = None):
        self.name = name
        if kind is not None:
            self.kind = kind

    def problem(self, call: Call) -> str | None:
        """Why this call is outside the supported model, or None. Decided from shapes,
        module settings and non-tensor arguments only: ``call`` may hold meta tensors."""
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        """The op with every weight w replaced by |w|^q, applied to a non-negative input."""
        return call.run(x)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        """For each neuron the op creates, the largest value of ``x`` over its antecedents
        (the max-product pass of Def. 3.3.1); ops creating no neuron just move ``x``."""
        return call.run(x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.kind.value})"


# --------------------------------------------------------------------------- affine layers


class Workspace:
    """Scratch memory that the |W|^q of every layer reuses in turn (the pass of Thm 3.1.1).

    On CPU a fresh tensor the size of a layer's weights costs page faults, and a
    convolution with a freshly allocated weight runs several times slower than with a
    reused one, so |W|^q is written into one buffer, reused from pass to pass.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._buffer: Tensor | None = None

    def take(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialised tensor of ``shape`` inside the buffer (grown when needed)."""
        numel = math.prod(shape)
        buffer = self._buffer
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype \
                or buffer.device != device:
            buffer = self._buffer = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)


def abs_power(t: Tensor, q: float, dtype: torch.dtype, workspace: Workspace | None = None
              ) -> Tensor:
    """|t|^q in ``dtype``, detached: in the workspace if given, else in one fresh tensor."""
    source = t.detach()
    if workspace is not None:
        magnitude = workspace.take(source.shape, dtype, source.device).copy_(source).abs_()
    else:
        magnitude = source.to(dtype)
        magnitude = magnitude.abs() if magnitude is source else magnitude.abs_()
    return magnitude if q == 1 else magnitude.pow_(q)


def _all_finite(t: Tensor) -> bool:
    """No NaN or inf in ``t``: its min and max propagate both, and need no mask of t's size
    (allocating one costs more than reading t for large layers)."""
    if not t.numel():
        return True
    low, high = torch.aminmax(t.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def _channel_view(v: Tensor, ndim: int) -> Tensor:
    return v.reshape((1, -1) + (1,) * (ndim - 2)) if ndim > 1 else v


class AffineHandler(Handler):
    """Layers with parameters: y = W x + b, one output channel per neuron group.

    ``channel_dim`` is the activation dim holding channels (-1 for Linear), ``out_dim``
    the weight dim holding output channels (the other of dims 0, 1 holds the input
    channels of a group). ``scored``: its weights and bias are coordinates of theta that
    pruning may zero. Everything pathlift does to a layer's parameters (the |theta|^q
    pass, rescaling, normalisation, permutation, quantisation) asks these methods.
    """

    kind = Kind.AFFINE
    channel_dim = 1
    out_dim = 0
    diagonal = False
    scored = True

    # ---- the |theta|^q network (Thm 3.1.1)
    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype,
                  workspace: Workspace | None = None) -> Tensor:
        """|W|^q: the layer's weight in the |theta|^q network (Thm 3.1.1), a fresh tensor
        or one inside ``workspace``."""
        return abs_power(param(module, "weight"), q, dtype, workspace)

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        """The layer's linear map with ``weight`` in place of W, plus ``bias`` if given."""
        raise NotImplementedError

    def weight_part(self, x: Tensor, q: float, call: Call, bias: Tensor | None = None,
                    workspace: Workspace | None = None) -> Tensor:
        """|W|^q x (+ ``bias``, one entry per output channel), |W|^q in ``workspace``."""
        return self.apply(x, self.magnitude(call.module, q, x.dtype, workspace), call, bias)

    def rank_one_input(self, x: Tensor) -> Tensor | None:
        """v with d<g, apply(x, W)>/dW = g v^T for every output gradient g, when the
        weight gradient is that outer product (a Linear layer on one row), else None.
        Lets a caller scale a huge weight by its gradient without forming it."""
        return None

    def bias(self, module: nn.Module) -> Tensor | None:
        """The bias vector b (one entry per output channel), or None."""
        return param(module, "bias")

    # ---- the layer as DAG parameters (Def. 2.2.2)
    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        """(weights, bias) of the layer's neurons in the DAG of Def. 2.2.2."""
        return param(module, "weight"), self.bias(module)

    def groups(self, module: nn.Module) -> int:
        return getattr(module, "groups", 1)

    def own_neurons(self, module: nn.Module) -> bool:
        """Whether its output channels are neurons of their own (rescalable)."""
        return True

    def entry_channels(self, module: nn.Module) -> tuple[Tensor, Tensor]:
        """For weight entry [i, j, ...]: its (output-channel, input-channel) indices, as two
        grids that broadcast to weight.shape[:2] (groups of a convolution included)."""
        weight = param(module, "weight")
        a, b = weight.shape[0], weight.shape[1]
        major = torch.arange(a)[:, None]
        g = self.groups(module)
        minor = torch.arange(b)[None, :] if g == 1 else (major // (a // g)) * b + torch.arange(b)
        return (major, minor) if self.out_dim == 0 else (minor, major)

    def in_channels(self, module: nn.Module) -> int:
        """Number of input channels (features of a Linear layer) the layer reads."""
        shape = param(module, "weight").shape
        return shape[1] * self.groups(module) if self.out_dim == 0 else shape[0]

    def incoming_rows(self, module: nn.Module) -> Tensor:
        """One float64 row per output channel: its incoming weights (every kernel entry),
        then its bias: the vector (theta^{->v}, b_v) of Alg. 3.2.1."""
        weight = param(module, "weight").to(torch.float64)
        if self.out_dim == 1:  # (in, out/groups, k...) -> (out, in/groups * k)
            g = self.groups(module)
            weight = weight.reshape(g, weight.shape[0] // g, weight.shape[1], -1)
            weight = weight.permute(0, 2, 1, 3).reshape(g * weight.shape[2], -1)
        else:
            weight = weight.reshape(weight.shape[0], -1)
        bias = self.bias(module)
        if bias is None:
            return weight
        return torch.cat([weight, bias.to(torch.float64)[:, None]], dim=1)

    # ---- transformations of the parameters, in place on a copy
    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        """Incoming weights and bias of output channel c times grow[c]; weights reading
        input channel i times shrink[i] (Def. 2.4.1 with shrink = 1/grow; Alg. 3.2.1 also
        uses shrink = 0 for an input-dead neuron). Float64 arithmetic."""
        rows, cols = self.entry_channels(module)
        weight = stored(module, "weight")
        step = max(1, _BLOCK_BYTES // (8 * weight[0].numel()))  # float64 rows per block
        for start in range(0, weight.shape[0], step):  # never a float64 copy of W whole
            part = slice(start, start + step)
            factor = grow[rows[part] if len(rows) > 1 else rows] * \
                shrink[cols[part] if len(cols) > 1 else cols]
            block = weight[part]
            _scale_(block, factor.reshape(factor.shape + (1,) * (block.dim() - 2)))
        bias = stored(module, "bias")
        if bias is not None:
            _scale_(bias, grow)

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        """New output channel c = old ``outputs[c]``; new input column i reads old column
        ``inputs[i]`` (layers without groups). Pruning masks move along."""
        for name, dim, index in (("weight", self.out_dim, outputs),
                                 ("weight", 1 - self.out_dim, inputs), ("bias", 0, outputs)):
            if index is None:
                continue
            for t in (stored(module, name), mask(module, name)):
                if t is not None:
                    with torch.no_grad():
                        t.copy_(t.index_select(dim, index))

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        """(name, effective value, per-channel dim) of every tensor quantisation rounds."""
        out = [("weight", param(module, "weight"), self.out_dim)]
        bias = param(module, "bias")
        return out + ([("bias", bias, None)] if bias is not None else [])

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        """Make the layer compute with the rounded ``values`` of ``quantizable``."""
        for name, value in values.items():
            assign_(module, name, value)

    def value_problem(self, module: nn.Module) -> str | None:
        """Why the layer's values make it unusable (NaN or inf), or None."""
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if tensor.is_floating_point() and not _all_finite(tensor):
                return f"parameter '{name}' holds NaN or inf; fix or reload the weights"
        return None


def _scale_(tensor: Tensor, factor: Tensor) -> None:
    with torch.no_grad():
        tensor.copy_((tensor.to(torch.float64) * factor).to(tensor.dtype))


class LinearHandler(AffineHandler):
    channel_dim = -1

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        return F.linear(x, weight, bias)

    def weight_part(self, x: Tensor, q: float, call: Call, bias: Tensor | None = None,
                    workspace: Workspace | None = None) -> Tensor:
        """|W|^q x by blocks of rows of W, each made non-negative in a cache-sized buffer:
        a large classifier is read once, never copied whole."""
        weight = param(call.module, "weight")
        rows = max(1, _BLOCK_BYTES // (weight.shape[1] * x.element_size()))
        if rows >= weight.shape[0]:
            return super().weight_part(x, q, call, bias, workspace)
        out = x.new_empty((*x.shape[:-1], weight.shape[0]))
        buffer = (workspace or Workspace()).take((rows, weight.shape[1]), x.dtype, x.device)
        for start in range(0, weight.shape[0], rows):
            block = weight[start:start + rows]
            part = buffer[:len(block)]
            part.copy_(block).abs_()
            if q != 1:
                part.pow_(q)
            torch.matmul(x, part.t(), out=out[..., start:start + len(block)])
        return out if bias is None else out.add_(bias)

    def rank_one_input(self, x: Tensor) -> Tensor | None:
        rows = x.reshape(-1, x.shape[-1])
        return rows.reshape(-1).detach() if rows.shape[0] == 1 else None

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=-1, keepdim=True)  # every output reads every input feature


_BLOCK_BYTES = 1 << 20  # a block of |W| that stays in the L2 cache


class ConvHandler(AffineHandler):
    def problem(self, call: Call) -> str | None:
        if call.module.padding_mode != "zeros":
            return (
                f"padding_mode='{call.module.padding_mode}' ties several kernel entries to one "
                "edge of the DAG; only zero padding is supported"
            )
        return None

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        return call.module._conv_forward(x, weight, bias)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        conv = call.module
        if isinstance(conv.padding, str):
            raise UnsupportedModelError(
                f"string padding '{conv.padding}' of a convolution is not supported here; "
                "give explicit padding")
        dims = x.dim() - 2
        out_spatial = call.node.meta["tensor_meta"].shape[2:]
        pooled = window_max(x, conv.kernel_size, conv.stride, conv.padding[:dims],
                            conv.dilation, out_spatial)
        groups = conv.groups
        pooled = pooled.reshape(1, groups, -1, *out_spatial).amax(dim=2)
        return pooled.repeat_interleave(conv.out_channels // groups, dim=1)


class ConvTransposeHandler(ConvHandler):
    out_dim = 1

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        m = call.module
        dims = x.dim() - 2
        output_size = call.arg(1, "output_size")
        output_padding = m._output_padding(
            x, output_size, m.stride, m.padding, m.kernel_size, dims, m.dilation
        )
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
        return fn(x, weight, bias, m.stride, m.padding, output_padding, m.groups, m.dilation)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        raise UnsupportedModelError(
            f"'{call.node.target}' (ConvTranspose): the max over antecedents of a transposed "
            "convolution is not implemented")


def batchnorm_affine(bn: nn.modules.batchnorm._BatchNorm, dtype: torch.dtype | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Eval-mode BatchNorm as the affine identity neuron x*a + c (thesis, below Def 2.2.2):
    a = weight / sqrt(running_var + eps), c = bias - running_mean * a.

    ``dtype`` (default: the buffers' dtype) is the precision of the fold: folding float32
    statistics in float32 loses ~1e-7 relative, more than a float64 path-norm tolerates.
    """
    var, mean = bn.running_var.detach().to(dtype), bn.running_mean.detach().to(dtype)
    a = torch.rsqrt(var + bn.eps)
    weight, bias = param(bn, "weight"), param(bn, "bias")
    if weight is not None:
        a = a * weight.to(dtype)
    c = -mean * a
    if bias is not None:
        c = c + bias.to(dtype)
    return a, c


class BatchNormHandler(AffineHandler):
    """Eval BatchNorm: the affine identity neuron x*a + c, one antecedent per neuron (its
    input channel). Its parameters are statistics and an affine pair, so it is never
    pruned (``scored`` False); without affine parameters it has no neurons of its own."""

    diagonal = True
    scored = False

    def problem(self, call: Call) -> str | None:
        bn = call.module
        if bn.training:
            return ("BatchNorm in training mode normalises by batch statistics; call "
                    "model.eval(), or measure inside `with pathlift.graph.eval_mode(model):`")
        if bn.running_mean is None:
            return "BatchNorm without running statistics (track_running_stats=False) is not affine"
        return None

    def value_problem(self, module: nn.Module) -> str | None:
        found = super().value_problem(module)
        if found is None and not bool((module.running_var.detach() + module.eps > 0).all()):
            return ("running_var + eps is not positive for some channel, so x*a + c is "
                    "undefined; fix the statistics (running_var >= 0, eps > 0)")
        return found

    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype,
                  workspace: Workspace | None = None) -> Tensor:
        return abs_power(batchnorm_affine(module, dtype)[0], q, dtype)

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        a = _channel_view(weight, x.dim())
        return x * a if bias is None else torch.addcmul(_channel_view(bias, x.dim()), x, a)

    def bias(self, module: nn.Module) -> Tensor | None:
        return batchnorm_affine(module, torch.float64)[1]

    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        return batchnorm_affine(module)

    def own_neurons(self, module: nn.Module) -> bool:
        return module.affine

    def entry_channels(self, module: nn.Module) -> tuple[Tensor, Tensor]:
        channels = torch.arange(module.num_features)
        return channels, channels

    def in_channels(self, module: nn.Module) -> int:
        return module.num_features

    def incoming_rows(self, module: nn.Module) -> Tensor:
        return torch.stack(batchnorm_affine(module, torch.float64), dim=1)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x

    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        """Input times s = 1/shrink, output times mu = grow: mean -> s mean, weight ->
        weight mu / s, bias -> mu bias; for mu = s this is the thesis' Appendix E.1.2 rule
        (running mean and bias times lambda). A dead input (shrink = 0) makes a = 0 and
        keeps the constant c in the bias. Without affine parameters, grow = 1/shrink."""
        mean = module.running_mean
        if not module.affine:
            _scale_(mean, torch.where(shrink > 0, 1 / shrink.clamp_min(1e-300),
                                      torch.ones_like(shrink)))
            return
        dead = shrink == 0
        c = batchnorm_affine(module, torch.float64)[1]
        bias = param(module, "bias").to(torch.float64)
        assign_(module, "bias", torch.where(dead, grow * c, grow * bias))
        with torch.no_grad():
            mean.copy_(torch.where(dead, mean.to(torch.float64),
                                   mean.to(torch.float64) / shrink.clamp_min(1e-300)))
        _scale_(stored(module, "weight"), grow * shrink)

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        """Its affine pair follows ``outputs``, its statistics (which read the input
        channels) follow ``inputs``."""
        if outputs is not None and module.affine:
            super().permute_(module, outputs)
        if inputs is not None:
            with torch.no_grad():
                for buf in (module.running_mean, module.running_var):
                    buf.copy_(buf.index_select(0, inputs))

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        a, c = batchnorm_affine(module)
        return [("weight", a, None), ("bias", c, None)]

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        """The module becomes x * Q(a) + Q(c) exactly: running mean 0, variance 1, eps 0."""
        with torch.no_grad():
            module.running_mean.zero_()
            module.running_var.fill_(1.0)
        module.eps = 0.0
        for name, value in values.items():
            if param(module, name) is None:
                setattr(module, name, nn.Parameter(value.clone()))
            else:
                assign_(module, name, value)
        module.affine = True


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

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x


# --------------------------------------------------------------------------- pooling


def _pads(kernel, stride, padding, dilation, spatial, out_spatial) -> list[int]:
    """F.pad amounts (last dim first): ``padding`` on the left and on the right as much as
    a plain strided window needs to produce ``out_spatial`` (which encodes ceil_mode)."""
    pad: list[int] = []
    for k, s, p, d, n, o in zip(kernel, stride, padding, dilation, spatial, out_spatial,
                                strict=True):
        pad = [p, max((o - 1) * s + d * (k - 1) + 1 - (n + p), p), *pad]
    return pad


def window_sum(x: Tensor, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
               ) -> Tensor:
    """Sum of each pooling window of x (zero padding, so padding is excluded from the sum),
    cropped to the ``out_spatial`` size the pooling produces."""
    dims = len(kernel)
    x = F.pad(x, _pads(kernel, stride, padding, dilation, x.shape[2:], out_spatial))
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


def window_max(x: Tensor, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
               ) -> Tensor:
    """Max over each window, padding excluded (padded with -inf), cropped to out_spatial."""
    x = F.pad(x, _pads(kernel, stride, padding, dilation, x.shape[2:], out_spatial),
              value=-math.inf)
    fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[len(kernel) - 1]
    out = fn(x, list(kernel), list(stride), 0, list(dilation))
    return out[(slice(None), slice(None), *(slice(0, o) for o in out_spatial))]


def _tuple(v: int | Sequence[int] | None, dims: int) -> tuple[int, ...]:
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

    def max(self, x: Tensor, out_spatial: Sequence[int]) -> Tensor:
        return window_max(x, self.kernel, self.stride, self.padding, self.dilation, out_spatial)


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


def _adaptive(fn: str, x: Tensor, out_spatial: Sequence[int]) -> Tensor:
    return getattr(F, f"adaptive_{fn}_pool{len(out_spatial)}d")(x, tuple(out_spatial))


class _Pooling(Handler):
    def __init__(self, name: str, dims: int, adaptive: bool):
        super().__init__(name)
        self.dims, self.adaptive = dims, adaptive

    def geometry(self, call: Call) -> PoolGeometry:
        return PoolGeometry(call, self.dims, self.kind is Kind.MAXPOOL)


class MaxPoolHandler(_Pooling):
    """k-max-pool neurons with k = 1 (Def. 2.2.2); Thm 3.1.1 replaces them by window sums."""

    kind = Kind.MAXPOOL

    def problem(self, call: Call) -> str | None:
        indices = (call.module.return_indices if call.module is not None
                   else call.arg(6 if not self.adaptive else 2, "return_indices", False))
        if indices:
            return "max-pooling with return_indices=True (unpooling) is not a DAG neuron op"
        x = call.args[0]
        if not self.adaptive:  # probe one channel of real zeros: only the geometry matters
            probe = call.run(torch.zeros((1, 1, *x.shape[2:]), dtype=torch.float32))
            if torch.isinf(probe).any():
                return ("a pooling window lies entirely in the padding (its output is -inf); "
                        "reduce the padding or the dilation")
        return None

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        out_spatial = call.node.meta["tensor_meta"].shape[2:]
        if self.adaptive:
            return _adaptive("avg", x, out_spatial) * adaptive_counts(x.shape[2:],
                                                                       out_spatial, x)
        return self.geometry(call).sum(x, out_spatial)


class AvgPoolHandler(_Pooling):
    """Average-pool neurons: identity activation, incoming weights 1/|window| (Def. 2.2.2)."""

    kind = Kind.POOL

    def abs_pow(self, x: Tensor, q: float, call: Call) -> Tensor:
        y = call.run(x)
        out_spatial = y.shape[2:]
        if self.adaptive:
            counts = adaptive_counts(x.shape[2:], out_spatial, x)
            return y * counts.pow(1 - q)
        # weight of window o is w_o = avg(1)_o / sum(1)_o; |avg|^q x = sum(x) * w^q
        geometry = self.geometry(call)
        ones = torch.ones_like(x[:1, :1])
        weight = call.run(ones) / geometry.sum(ones, out_spatial)
        return geometry.sum(x, out_spatial) * weight.pow(q)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        out_spatial = call.node.meta["tensor_meta"].shape[2:]
        if self.adaptive:
            return _adaptive("max", x, out_spatial)
        return self.geometry(call).max(x, out_spatial)


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

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=self._dims(call, x.dim()), keepdim=bool(call.arg(2, "keepdim")))


class UpsampleHandler(Handler):
    """Nearest-neighbour upsampling: each output neuron copies one input (weight 1)."""

    kind = Kind.POOL

    def problem(self, call: Call) -> str | None:
        mode = call.module.mode if call.module is not None else call.arg(3, "mode", "nearest")
        if mode not in ("nearest", "nearest-exact"):
            return f"upsampling mode '{mode}' is not supported; use mode='nearest'"
        return None


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
