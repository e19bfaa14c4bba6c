"""The transpose of a recorded |theta|^q pass, written per torch call: the backward of a
tape as one reverse loop (``pathlift.lift.transpose``) instead of autograd's nodes.

Once the magnitudes A = |W|^q are fixed, the pass of Thm 3.1.1 is linear in its input
(all ones), so its transpose is a reverse replay of the same calls: linear -> its
transposed matrix, conv -> conv_transpose (``convolution_backward``), average pooling ->
its adjoint, padding -> cropping, reshape -> reshape back, add -> copy, cat -> split. The
gradient reaching a magnitude A_vu of an edge u -> v is o_u b_v, the forward vector o
times the backward one b (d||Phi||_q^q / d|w|^q, Thm 3.1.1 differentiated): the outer
product of the ``linear`` rule, the correlation of ``convolution_backward``. ``ADJOINTS``
holds one rule per torch function; a call outside it that carries a gradient keeps the
tape on autograd (``Transposed.plan`` gives None).

A rule is ``rule(args, kwargs, out, grad, wants) -> [(tensor, its gradient)]`` for the
tensors among the call's arguments whose ``id`` is in ``wants``; ``out`` and ``grad`` are
lists for a call with several outputs. A rule raises ``UncoveredError`` for arguments it
does not cover (found by the plan's trial run).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["ADJOINTS", "Rule", "UncoveredError", "adjoint_of"]

Pairs = list[tuple[Tensor, Tensor]]
Rule = Callable[[Sequence[Any], dict[str, Any], Any, Any, Container[int]], Pairs]

_aten = torch.ops.aten


class UncoveredError(Exception):
    """A call of a covered function with arguments its rule does not cover."""


def _to(grad: Tensor, like: Tensor) -> Tensor:
    """``grad`` summed over the dimensions ``like`` was broadcast along, in its dtype."""
    if grad.shape != like.shape:
        grad = grad.sum_to_size(like.shape)
    return grad if grad.dtype == like.dtype else grad.to(like.dtype)


def _arg(args: Sequence[Any], kwargs: dict[str, Any], i: int, name: str,
         default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _pair(value: Any, n: int = 2) -> list[int]:
    return [int(value)] * n if isinstance(value, int) else [int(v) for v in value]


def _add(args, kwargs, out, grad, wants):
    """a + alpha b: a copy of the gradient to each (scaled for b)."""
    a, b = args[0], _arg(args, kwargs, 1, "other")
    alpha = kwargs.get("alpha", 1)
    found = [(a, _to(grad, a))] if id(a) in wants else []
    if id(b) in wants:
        found.append((b, _to(grad if alpha == 1 else grad * alpha, b)))
    return found


def _mul(args, kwargs, out, grad, wants):
    a, b = args[0], _arg(args, kwargs, 1, "other")
    found = [(a, _to(grad * b, a))] if id(a) in wants else []
    if id(b) in wants:
        found.append((b, _to(grad * a, b)))
    return found


def _div(args, kwargs, out, grad, wants):
    """a / b: grad / b, and -grad a / b^2 = -grad out / b."""
    a, b = args[0], _arg(args, kwargs, 1, "other")
    if kwargs.get("rounding_mode") is not None:
        raise UncoveredError
    found = [(a, _to(grad / b, a))] if id(a) in wants else []
    if id(b) in wants:
        found.append((b, _to(-grad * out / b, b)))
    return found


def _addcmul(args, kwargs, out, grad, wants):
    """s + value t1 t2."""
    s, t1, t2 = args[0], _arg(args, kwargs, 1, "tensor1"), _arg(args, kwargs, 2, "tensor2")
    value = _arg(args, kwargs, 3, "value", 1)
    found = [(s, _to(grad, s))] if id(s) in wants else []
    if id(t1) in wants:
        found.append((t1, _to(grad * t2 * value, t1)))
    if id(t2) in wants:
        found.append((t2, _to(grad * t1 * value, t2)))
    return found


def _sum(args, kwargs, out, grad, wants):
    x = args[0]
    if len(args) > 1 or kwargs.keys() - {"dtype"}:
        raise UncoveredError  # a sum over some dimensions: not in the pass
    if grad.dtype != x.dtype:
        grad = grad.to(x.dtype)
    return [(x, grad.expand(x.shape))] if id(x) in wants else []


def _reshaped(args, kwargs, out, grad, wants):
    """Any call that only reshapes its first argument (reshape, view, flatten...)."""
    x = args[0]
    return [(x, grad.reshape(x.shape))] if id(x) in wants else []


def _cat(args, kwargs, out, grad, wants):
    tensors, dim = args[0], _arg(args, kwargs, 1, "dim", 0)
    parts = grad.split([t.shape[dim] for t in tensors], dim)
    return [(t, g) for t, g in zip(tensors, parts, strict=True) if id(t) in wants]


def _linear(args, kwargs, out, grad, wants):
    """y = x W^T + b: x gets grad W, W gets grad^T x (the outer product of the backward
    and forward vectors), b the sum of grad over the batch."""
    x, w = args[0], _arg(args, kwargs, 1, "weight")
    b = _arg(args, kwargs, 2, "bias")
    found = []
    if id(x) in wants:
        found.append((x, grad @ w))
    if grad.dim() != 2:
        grad, x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
    if id(w) in wants:
        found.append((w, grad.T @ x))
    if id(b) in wants:
        found.append((b, grad.sum(0)))
    return found


def _conv(dims: int, transposed: bool) -> Rule:
    """The adjoint of a convolution (``conv{dims}d``) or of its transpose
    (``conv_transpose{dims}d``): ``convolution_backward``, the transposed convolution
    for the input and the correlation of input and gradient for the kernel."""
    names = ("input", "weight", "bias", "stride", "padding") + (
        ("output_padding", "groups", "dilation") if transposed else ("dilation", "groups"))
    defaults = (None, None, None, 1, 0) + ((0, 1, 1) if transposed else (1, 1))

    def rule(args, kwargs, out, grad, wants):
        a = {n: _arg(args, kwargs, i, n, d)
             for i, (n, d) in enumerate(zip(names, defaults, strict=True))}
        if isinstance(a["padding"], str):
            raise UncoveredError  # "same"/"valid": torch works the padding out itself
        x, w, b = a["input"], a["weight"], a["bias"]
        mask = [id(x) in wants, id(w) in wants, id(b) in wants]
        found = _aten.convolution_backward(
            grad, x, w, None if b is None else list(b.shape), _pair(a["stride"], dims),
            _pair(a["padding"], dims), _pair(a["dilation"], dims), transposed,
            _pair(a.get("output_padding", 0), dims), a["groups"], mask)
        return [(t, g) for t, g, m in zip((x, w, b), found, mask, strict=True) if m]
    return rule


def _avg_pool2d(args, kwargs, out, grad, wants):
    names = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
             "divisor_override")
    x, kernel, stride, padding, ceil, include, divisor = (
        _arg(args, kwargs, i, n, d) for i, (n, d) in enumerate(zip(names, (
            None, None, None, 0, False, True, None), strict=True)))
    if id(x) not in wants:
        return []
    return [(x, _aten.avg_pool2d_backward(
        grad, x, _pair(kernel), _pair(stride) if stride else _pair(kernel), _pair(padding),
        ceil, include, divisor))]


def _adaptive_avg_pool2d(args, kwargs, out, grad, wants):
    x = args[0]
    return [(x, _aten._adaptive_avg_pool2d_backward(grad, x))] if id(x) in wants else []


def _adaptive_avg_pool1d(args, kwargs, out, grad, wants):
    """The 1-d pool as torch computes it: the 2-d pool over a unit height."""
    x = args[0]
    if id(x) not in wants:
        return []
    return [(x, _aten._adaptive_avg_pool2d_backward(grad.unsqueeze(-2), x.unsqueeze(-2))
             .squeeze(-2))]


def _pad(args, kwargs, out, grad, wants):
    """Constant padding: its adjoint crops (a negative padding)."""
    x, pad = args[0], _arg(args, kwargs, 1, "pad")
    if _arg(args, kwargs, 2, "mode", "constant") != "constant":
        raise UncoveredError
    return [(x, F.pad(grad, [-p for p in pad]))] if id(x) in wants else []


_TENSOR = torch.Tensor
ADJOINTS: dict[Any, Rule] = {}
for _names, _rule in (
        (("add",), _add), (("mul",), _mul),
        (("div",), _div), (("addcmul",), _addcmul), (("sum",), _sum),
        (("reshape", "view", "flatten", "squeeze", "unsqueeze"), _reshaped),
        (("cat",), _cat),
        (("linear",), _linear), (("conv1d",), _conv(1, False)), (("conv2d",), _conv(2, False)),
        (("conv_transpose2d",), _conv(2, True)),
        (("avg_pool2d",), _avg_pool2d),
        (("adaptive_avg_pool1d",), _adaptive_avg_pool1d),
        (("adaptive_avg_pool2d",), _adaptive_avg_pool2d), (("pad",), _pad)):
    for _name in _names:
        for _owner in (torch, _TENSOR, F, torch._C._nn):
            _func = getattr(_owner, _name, None)
            if _func is not None:
                ADJOINTS.setdefault(_func, _rule)


def adjoint_of(func: Any) -> Rule | None:
    """The rule transposing ``func``, or None."""
    return ADJOINTS.get(func)
