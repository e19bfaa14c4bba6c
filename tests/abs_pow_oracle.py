"""An independent |theta|^q pass (thesis Thm 3.1.1) on the model's own eager forward, the
way the path-norm papers' scripts compute it, written without pathlift's engine.

A float64 copy of the model gets every layer's weight and bias replaced by |.|^q, every
eval BatchNorm turned into the identity neuron a x + b of its fold (a = gamma /
sqrt(var + eps), b = beta - mean a) with |a|^q, |b|^q, every max-pool into a sum-pool
(weights 1), every average pool into a pool of weights (1/K)^q over its own windows, and
runs its forward on the all-ones input: the outputs are o_v = ||Phi^{->v}||_q^q. ReLU is
the identity on the non-negative values of that pass; sums, concatenations, flattening and
nearest upsampling are fixed maps of weight 1 and stay as they are.

It only knows modules: a model whose pooling or normalisation is functional inside a
forward is not what it computes, and ``supported`` says so (it then raises).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: modules whose forward is the identity or already right on the |theta|^q pass
_KEPT = (nn.ReLU, nn.Identity, nn.Dropout, nn.Flatten, nn.Sequential, nn.ModuleList,
         nn.ModuleDict, nn.Upsample)


class _SumPool(nn.Module):
    """Window sums of a max-pool (every window weight 1)."""

    def __init__(self, pool: nn.Module):
        super().__init__()
        self.pool = pool

    def forward(self, x: Tensor) -> Tensor:
        p = self.pool
        if isinstance(p, (nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool1d)):
            return _adaptive_sum(x, p.output_size, q=0.0)
        dims = x.dim() - 2
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[dims - 1]
        k, s, pad = (_tuple(v, dims) for v in (p.kernel_size, p.stride or p.kernel_size,
                                                 p.padding))
        if any(d != 1 for d in _tuple(p.dilation, dims)):
            raise NotImplementedError("dilated max-pool")
        args = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=p.ceil_mode,
                    count_include_pad=True)
        if dims == 1:
            return pool(x, **args) * k[0]
        return pool(x, divisor_override=1, **args)


class _PowAvgPool(nn.Module):
    """An average pool with weights (1/K_w)^q, K_w its own divisor on each window."""

    def __init__(self, pool: nn.Module, q: float):
        super().__init__()
        self.pool, self.q = pool, q

    def forward(self, x: Tensor) -> Tensor:
        p = self.pool
        if isinstance(p, (nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool1d)):
            return _adaptive_sum(x, p.output_size, q=self.q)
        dims = x.dim() - 2
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[dims - 1]
        k, s, pad = (_tuple(v, dims) for v in (p.kernel_size, p.stride or p.kernel_size,
                                                 p.padding))
        args = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=p.ceil_mode,
                    count_include_pad=p.count_include_pad)
        if getattr(p, "divisor_override", None):
            raise NotImplementedError("divisor_override")
        if dims == 1:
            raise NotImplementedError("1-d average pool")
        ones = torch.ones_like(x[:1, :1])
        count = pool(ones, **{**args, "count_include_pad": True}, divisor_override=1)
        divisor = count / pool(ones, **args)  # each window's own divisor K_w
        return pool(x, **args) * divisor.pow(1.0 - self.q)  # sum * K_w^-q


def _adaptive_sum(x: Tensor, output_size, q: float) -> Tensor:
    """Window sums of an adaptive pool, each times (1/K_w)^q (q = 0: plain sums)."""
    dims = x.dim() - 2
    sizes = _tuple(output_size, dims)
    sizes = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(sizes))
    out = x
    for i, n in enumerate(sizes):
        axis, length = 2 + i, x.shape[2 + i]
        parts = []
        for j in range(n):
            start, end = (j * length) // n, -((-(j + 1) * length) // n)
            parts.append(out.narrow(axis, start, end - start).sum(axis, keepdim=True)
                         * float(end - start) ** -q)
        out = torch.cat(parts, axis)
    return out


def _tuple(v, n: int) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _leaf_types(model: nn.Module) -> set[str]:
    return {type(m).__name__ for m in model.modules() if not list(m.children())}


def abs_pow_copy(model: nn.Module, q: float) -> nn.Module:
    """The float64 copy of ``model`` whose forward on all-ones is the |theta|^q pass."""
    net = copy.deepcopy(model).double().eval()
    for name, module in list(net.named_modules()):
        replacement = None
        if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d,
                               nn.AdaptiveMaxPool2d)):
            replacement = _SumPool(module)
        elif isinstance(module, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                                 nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
            replacement = _PowAvgPool(module, q)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                a = module.weight / torch.sqrt(module.running_var + module.eps)
                b = module.bias - module.running_mean * a
                module.weight.copy_(a.abs().pow(q))
                module.bias.copy_(b.abs().pow(q))
                module.running_mean.zero_()
                module.running_var.fill_(1.0 - module.eps)
        elif isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            with torch.no_grad():
                module.weight.copy_(module.weight.abs().pow(q))
                if module.bias is not None:
                    module.bias.copy_(module.bias.abs().pow(q))
        if replacement is not None:
            parent, _, child = name.rpartition(".")
            setattr(net.get_submodule(parent) if parent else net, child, replacement)
    return net


def abs_pow_outputs(model: nn.Module, shape: tuple[int, ...], q: float,
                    requires_grad: bool = False) -> tuple[Tensor, nn.Module]:
    """o_v = ||Phi^{->v}||_q^q of every output neuron (one flat float64 tensor), and the
    |theta|^q copy whose parameters ``o`` depends on (for autograd)."""
    net = abs_pow_copy(model, q)
    for p in net.parameters():
        p.requires_grad_(requires_grad)
    with torch.set_grad_enabled(requires_grad):
        out = net(torch.ones((1, *shape), dtype=torch.float64))
    leaves = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) \
        else (out,)
    return torch.cat([t.flatten() for t in leaves]), net


def abs_pow_log10(model: nn.Module, shape: tuple[int, ...], q: float) -> float:
    """log10 ||Phi||_q (r = q) from the independent pass."""
    o, _ = abs_pow_outputs(model, shape, q)
    return math.log10(float(o.sum())) / q


def path_magnitude_oracle(model: nn.Module, shape: tuple[int, ...]) -> dict[str, Tensor]:
    """theta_i * d||Phi||_1/d theta_i for every Conv/Linear weight, by autograd of the
    independent q = 1 pass: the |theta| copy's |w| * d(sum o)/d|w| (sec. 3.5)."""
    o, net = abs_pow_outputs(model, shape, 1.0, requires_grad=True)
    o.sum().backward()
    return {f"{name}.weight": (m.weight * m.weight.grad).detach()
            for name, m in net.named_modules()
            if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))}
