"""The dispatch-mode dataflow recorder of validation (``pathlift.graph.validate``): the aten
operations of a run and, for each tensor they read, the operation that last wrote it, on
meta tensors, with shape-only stand-ins for the meta kernels that cost most."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


def _shape_only(func, output):
    """``func`` run on meta tensors as ``output(*args)``: torch's meta kernels for these
    ops are Python references costing more than the rest of the validation together (and
    the first call of one imports torch._dynamo, about 1 s)."""
    def run(x, *args, **kwargs):
        first = x[0] if isinstance(x, (list, tuple)) and x else x  # cat takes a list
        if isinstance(first, Tensor) and first.is_meta:
            return output(x, *args, **kwargs)
        return func(x, *args, **kwargs)
    return run


def _like(x: Tensor) -> Tensor:
    """An uninitialised tensor of x's shape and dtype, laid out as torch.empty_like lays
    it out (x's strides where x is dense and non-overlapping, else contiguous: a slice
    x[:, ::2] gives a dense result) without its meta kernel, a Python reference that
    imports sympy (0.7 s) on its first call."""
    if x.is_contiguous() or not _dense(x):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)


def _dense(x: Tensor) -> bool:
    """Whether x's elements fill a block of its storage, each once (any dimension order)."""
    expected = 1
    for size, stride in sorted(zip(x.shape, x.stride(), strict=True), key=lambda d: d[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def _empty(x: Tensor, shape: Any) -> Tensor:
    """An uninitialised contiguous tensor of ``shape`` with x's dtype and device: what
    ``x.new_empty(shape)`` gives, without its meta kernel's Python reference (3x the cost
    of torch.empty's C++ one, and these stand-ins run for most operations of a trace and
    of both validation runs)."""
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _batch_norm_outputs(x: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    return _like(x), _empty(x, (0,)), _empty(x, (0,))


def _elementwise(func):
    """x + y or x * y of two tensors of one shape, dtype and layout: like x (a prune mask
    times its weight, a residual sum); any other pair by the op itself (broadcasting,
    type promotion)."""
    def run(x: Tensor, y: Any, *args, **kwargs) -> Tensor:
        if not isinstance(y, Tensor) or y.shape != x.shape or y.dtype != x.dtype \
                or y.stride() != x.stride():
            return func(x, y, *args, **kwargs)
        return _like(x)
    return run


def _addmm(bias: Tensor, x: Tensor, weight: Tensor, *args, **kwargs) -> Tensor:
    """Linear's bias + x @ W^T, whose meta kernel (a decomposition into references) also
    imports torch._dynamo on its first call (about 1 s)."""
    if not (bias.dtype == x.dtype == weight.dtype and x.dim() == weight.dim() == 2
            and x.shape[1] == weight.shape[0] and bias.shape in ((weight.shape[1],),
                                                                 (1, weight.shape[1]))):
        return torch.ops.aten.addmm.default(bias, x, weight, *args, **kwargs)  # or its error
    return _empty(x, (x.shape[0], weight.shape[1]))


def _cat(tensors: list[Tensor], dim: int = 0) -> Tensor:
    first = tensors[0]
    dim %= max(first.dim(), 1)
    others = [s for d, s in enumerate(first.shape) if d != dim]
    if any(t.dtype != first.dtype or t.dim() != first.dim()
           or [s for d, s in enumerate(t.shape) if d != dim] != others for t in tensors):
        return torch.ops.aten.cat.default(tensors, dim)  # or its error
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return _empty(first, shape)


def _mean(x: Tensor, dim: list[int] | None, keepdim: bool = False, **kwargs) -> Tensor:
    if not dim or kwargs.get("dtype") not in (None, x.dtype):
        return torch.ops.aten.mean.dim(x, dim, keepdim, **kwargs)
    reduced = {d % x.dim() for d in dim}
    shape = [1 if d in reduced else n for d, n in enumerate(x.shape) if keepdim or d not in reduced]
    return _empty(x, shape)


def _convolution(x: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int],
                 padding: list[int], dilation: list[int], transposed: bool,
                 output_padding: list[int], groups: int) -> Tensor:
    """A convolution's output, contiguous as torch's meta kernel makes it (a Python
    reference costing a tenth of the validation); anything it would check goes to it."""
    dims = x.dim() - 2
    out_channels = weight.shape[1] * groups if transposed else weight.shape[0]
    in_channels = weight.shape[0] if transposed else weight.shape[1] * groups
    if dims >= 1 and weight.dim() == x.dim() and x.shape[1] == in_channels > 0 \
            and groups > 0 and weight.shape[0] % groups == 0 and x.dtype == weight.dtype \
            and (bias is None or (bias.shape == (out_channels,) and bias.dtype == x.dtype)) \
            and len(stride) == len(padding) == len(dilation) == len(output_padding) == dims:
        spatial = [(n - 1) * s - 2 * p + d * (k - 1) + o + 1 if transposed
                   else (n + 2 * p - d * (k - 1) - 1) // s + 1
                   for n, k, s, p, d, o in zip(x.shape[2:], weight.shape[2:], stride, padding,
                                               dilation, output_padding, strict=True)]
        if min(spatial) > 0:
            return _empty(x, (x.shape[0], out_channels, *spatial))
    return torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation,
                                              transposed, output_padding, groups)


def _max_pool2d(x: Tensor, kernel_size: list[int], stride: list[int] = (),
                padding: list[int] = (0,), dilation: list[int] = (1,), ceil_mode: bool = False
                ) -> tuple[Tensor, Tensor]:
    """A 2-d max-pool's values and indices, contiguous as torch's meta kernel makes them
    (a Python reference whose first check imports sympy, about 0.3 s); any argument it
    would check goes to it."""
    pairs = [tuple(v) * (3 - len(v)) if len(v) in (1, 2) else None
             for v in (kernel_size, stride or kernel_size, padding, dilation)]
    if x.dim() in (3, 4) and x.is_contiguous() and x.numel() and None not in pairs:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pairs
        out = [_pooled(n, k, s, p, d, ceil_mode)
               for n, k, s, p, d in ((x.shape[-2], kh, sh, ph, dh), (x.shape[-1], kw, sw, pw, dw))]
        if min(kh, kw, sh, sw, dh, dw) > 0 and 0 <= ph <= kh // 2 and 0 <= pw <= kw // 2 \
                and min(out) > 0:
            shape = (*x.shape[:-2], *out)
            return _empty(x, shape), torch.empty(shape, dtype=torch.int64, device=x.device)
    return torch.ops.aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding,
                                                          dilation, ceil_mode)


def _pooled(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """The pooled length of n (ATen's pooling_output_shape): with ``ceil_mode`` the last
    window must start inside the input or its left padding."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    return out - 1 if ceil_mode and (out - 1) * s >= n + p else out


def _interpolated(func):
    """A linear, bilinear, bicubic or trilinear upsampling to ``output_size``: contiguous
    like a contiguous input, as torch's meta kernels make it (Python decompositions that
    compute on meta tensors: bicubic 36 ms a call, bilinear 5 ms); anything else, or an
    argument they would refuse, goes to the op."""
    def run(x: Tensor, output_size: list[int], *args, **kwargs) -> Tensor:
        if x.dim() == len(output_size) + 2 and x.is_contiguous() and x.numel() \
                and min(output_size) > 0:
            return _empty(x, (*x.shape[:2], *output_size))
        return func(x, output_size, *args, **kwargs)
    return run


def _relu(x: Tensor) -> Tensor:
    return _like(x)


def _relu_(x: Tensor) -> Tensor:
    return x  # in place: the same tensor, so the recorder sees the overwrite


_FAST = {
    torch.ops.aten.cat.default: _cat,
    torch.ops.aten.mean.dim: _mean,
    torch.ops.aten.relu.default: _relu,
    torch.ops.aten.relu_.default: _relu_,
    torch.ops.aten.native_batch_norm.default: _batch_norm_outputs,
    torch.ops.aten._native_batch_norm_legit_no_training.default: _batch_norm_outputs,
    torch.ops.aten.add.Tensor: _elementwise(torch.ops.aten.add.Tensor),
    torch.ops.aten.mul.Tensor: _elementwise(torch.ops.aten.mul.Tensor),
    torch.ops.aten.addmm.default: _addmm,
    torch.ops.aten.convolution.default: _convolution,
    torch.ops.aten.max_pool2d_with_indices.default: _max_pool2d,
    **{op: _interpolated(op) for op in (torch.ops.aten.upsample_linear1d.default,
                                        torch.ops.aten.upsample_bilinear2d.default,
                                        torch.ops.aten.upsample_bicubic2d.default,
                                        torch.ops.aten.upsample_trilinear3d.default)},
}
_FAST = {op: _shape_only(op, output) for op, output in _FAST.items()}


def _on_meta(func):
    """A tensor factory of a shape-only run (``torch.zeros(C, dtype=h.dtype)`` in a
    forward, the bound of a ReLU written as ``torch.maximum``) made on the meta device, so
    that it meets the run's meta tensors as it meets the model's own on its device."""
    def run(*args, **kwargs):
        return func(*args, **{**kwargs, "device": torch.device("meta")})
    return run


#: shape-only runs of recorded ops: ``_FAST`` and the factories on meta (not the tracer's
#: own calls, which make the constants of a forward that torch.fx keeps as they are)
_FAST_RUN = {**_FAST, **{op: _on_meta(op) for op in (torch.ops.aten.zeros.default,
                                                    torch.ops.aten.ones.default,
                                                    torch.ops.aten.full.default)}}


def _flat(values: Any, into: list | None = None) -> list:
    """The arguments of an aten call, lists and tuples opened (what aten ops take)."""
    into = [] if into is None else into
    for v in values:
        if isinstance(v, (list, tuple)):
            _flat(v, into)
        else:
            into.append(v)
    return into


_SCALARS = frozenset({int, float, bool, str, type(None)})
_NAMES: dict[Any, str] = {}  # an aten overload's name, in-place and out-of-place alike


def _storage(t: Tensor) -> int:
    return t.untyped_storage()._cdata


class ShapeOnly(TorchDispatchMode):
    """Runs every aten operation, the costly meta kernels replaced by their shape-only
    stand-ins (``_FAST``): the tracer's meta values (``pathlift.graph.trace``) under it cost
    what validation's runs cost, not torch's Python references (eval BatchNorm's
    decomposition alone was most of a first call on timm's models). While ``running`` (the
    tracer runs a recorded op on meta values), tensor factories make meta tensors too;
    otherwise they make what the forward asks (torch.fx keeps those as constants)."""

    running = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return (_FAST_RUN if self.running else _FAST).get(func, func)(*args, **(kwargs or {}))


class Dataflow(TorchDispatchMode):
    """Records the aten operations of a run: each one's name (in-place and out-of-place
    variants alike) and, for each tensor it reads, which earlier operation last wrote that
    tensor's storage and where the tensor sits in it. Two runs with equal records compute
    the same function of their common leaves (input, parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.writer: dict[int, int] = {}
        self.paused = False

    def describe(self, value: Any) -> Any:
        """A value an operation reads or returns: a scalar as itself, a tensor as (the
        operation that last wrote its storage, or that storage as a leaf; offset, shape,
        strides, dtype), anything else (a list too) by its type's name."""
        if isinstance(value, (list, tuple)):
            return type(value).__name__
        return self._describe((value,), [])[0]

    def _describe(self, values: Any, into: list) -> list:
        """``describe`` of every value in ``values``, lists and tuples opened (what aten
        ops take), appended to ``into``: one loop, as every operation of both runs asks."""
        writer = self.writer
        for v in values:
            if type(v) in _SCALARS:
                into.append(v)
            elif isinstance(v, Tensor):
                storage = v.untyped_storage()._cdata
                source = writer.get(storage)
                into.append((("leaf", storage) if source is None else source,
                             v.storage_offset(), v.shape, v.stride(), v.dtype))
            elif isinstance(v, (list, tuple)):
                self._describe(v, into)
            else:
                into.append(v if isinstance(v, (int, float, bool, str)) else type(v).__name__)
        return into

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.paused:  # a handler's probe: its factories make what it asks
            return _FAST.get(func, func)(*args, **(kwargs or {}))
        out = _FAST_RUN.get(func, func)(*args, **(kwargs or {}))
        reads = self._describe(args, [])
        if kwargs:
            self._describe(kwargs.values(), reads)
        reads = tuple(reads)
        name = _NAMES.get(func)
        if name is None:
            name = _NAMES[func] = func.overloadpacket.__name__.rstrip("_")
        self.ops.append((name, reads))
        index = len(self.ops) - 1
        for t in (out,) if isinstance(out, Tensor) else _flat(
                out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, Tensor):
                self.writer[_storage(t)] = index
        return out


# TorchDispatchMode wraps every __torch_dispatch__ in torch._disable_dynamo, whose first call
# imports torch._dynamo (about 1 s at start-up): the recorders never run under
# torch.compile, so they are marked as already disabled and pathlift's commands that compile
# nothing never import it.
for _mode in (ShapeOnly, Dataflow):
    _dispatch = getattr(_mode.__torch_dispatch__, "__wrapped__", None)
    if _dispatch is not None:
        setattr(_dispatch, "__dynamo_disable", _dispatch)
