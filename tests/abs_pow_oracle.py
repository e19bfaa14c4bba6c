"""An independent |theta|^q pass (thesis Thm 3.1.1) on the model's own eager forward, the
way the path-norm papers' scripts compute it, written without pathlift's engine.

A float64 copy of the model gets every layer's weight and bias (and every floating tensor
another module holds itself: a functional layer's, a per-channel scale's) replaced by
|.|^q and every
eval BatchNorm turned into the identity neuron a x + b of its fold (a = gamma /
sqrt(var + eps), b = beta - mean a) with |a|^q, |b|^q; its forward runs on the all-ones
input under a torch-function mode that turns every max-pool (module or functional) into a
sum-pool (weights 1; its -inf padding entering as zeros), every ``amax`` and ``amin``
into a sum over its dims, every average pool and mean into
weights (1/K)^q over its own windows, ReLU6 and LeakyReLU into the passes of their
two-ReLU sub-DAGs, and a product with a Python number c (a constant scale) into the
product with |c|^q: the outputs are
o_v = ||Phi^{->v}||_q^q. ReLU is the identity on the non-negative values of that pass;
sums, concatenations, flattening, channel shuffles and nearest upsampling are fixed maps
of weight 1 and stay as they are. An op it does not know runs as it is, so the comparison
then fails loudly rather than passing by accident.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode


def _sum_pool(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              return_indices=False) -> Tensor:
    """Window sums of a max-pool (every window weight 1)."""
    dims = x.dim() - 2
    if return_indices or any(d != 1 for d in _tuple(dilation, dims)) or dims == 1:
        raise NotImplementedError("max-pool with indices, dilation or in 1-d")
    pool = (F.avg_pool2d, F.avg_pool3d)[dims - 2]
    return pool(x, kernel_size, stride or kernel_size, padding, ceil_mode,
                count_include_pad=True, divisor_override=1)


def _pow_avg_pool(q: float, x: Tensor, kernel_size, stride=None, padding=0, ceil_mode=False,
                  count_include_pad=True, divisor_override=None) -> Tensor:
    """An average pool with weights (1/K_w)^q, K_w its own divisor on each window."""
    dims = x.dim() - 2
    if divisor_override or dims == 1:
        raise NotImplementedError("average pool with divisor_override or in 1-d")
    pool = (F.avg_pool2d, F.avg_pool3d)[dims - 2]
    args = (kernel_size, stride or kernel_size, padding, ceil_mode)
    ones = torch.ones_like(x[:1, :1])
    count = pool(ones, *args, count_include_pad=True, divisor_override=1)
    divisor = count / pool(ones, *args, count_include_pad=count_include_pad)  # K_w
    return pool(x, *args, count_include_pad=count_include_pad) * divisor.pow(1.0 - q)


class _AbsPowMode(TorchFunctionMode):
    """The |theta|^q pass of the fixed maps and activations, functional or in modules:
    max-pools sum their windows, average pools and means weigh by (1/K)^q, ReLU6 (Hardtanh
    on [0, M]) is the pass of ReLU(z) - ReLU(z - M) (DESIGN.md): 2x + M^q."""

    def __init__(self, q: float):
        super().__init__()
        self.q = q

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        q = self.q
        if name in ("max_pool2d", "max_pool3d", "_max_pool2d", "_max_pool3d"):
            return _sum_pool(*args, **kwargs)
        if name in ("avg_pool2d", "avg_pool3d"):
            return _pow_avg_pool(q, *args, **kwargs)
        if name.lstrip("_") in ("adaptive_max_pool1d", "adaptive_max_pool2d",
                                "adaptive_avg_pool1d", "adaptive_avg_pool2d"):
            size = args[1] if len(args) > 1 else kwargs["output_size"]
            return _adaptive_sum(args[0], size, q if "avg" in name else 0.0)
        if name == "mean" and (len(args) > 1 or "dim" in kwargs):
            x, dim = args[0], kwargs.get("dim", args[1] if len(args) > 1 else None)
            dims = [dim] if isinstance(dim, int) else list(dim)
            size = math.prod(x.shape[d] for d in dims)
            return func(*args, **kwargs) * float(size) ** (1.0 - q)
        if name in ("amax", "amin"):  # max-pool neurons (min: -max(-x)), weights of |1|^q
            dim = args[1] if len(args) > 1 else kwargs["dim"]
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            return torch.sum(args[0], dim, keepdim)
        if name == "hardtanh":
            x = args[0]
            low = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
            high = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
            if low != 0:
                raise NotImplementedError("Hardtanh with a non-zero minimum")
            return 2 * x + float(high) ** q
        if name in ("relu6",):
            return 2 * args[0] + 6.0**q
        if name == "pad" and (args[3] if len(args) > 3 else kwargs.get("value")) == -math.inf:
            # -inf before a max-pool ("same" max-pooling): entries no path reaches
            return F.pad(args[0], args[1] if len(args) > 1 else kwargs["pad"])
        if name in ("leaky_relu", "leaky_relu_"):  # ReLU(z) - a ReLU(-z): (1 + |a|^q) x
            slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
            return args[0] * (1.0 + abs(float(slope)) ** q)
        if name in ("mul", "__mul__", "__rmul__", "mul_", "__imul__", "div", "__truediv__") \
                and len(args) == 2 and isinstance(args[1], (int, float)):
            c = args[1] if "mul" in name else 1.0 / args[1]
            return func(args[0], abs(float(c)) ** q)  # a constant scale: weights |c|^q
        return func(*args, **kwargs)


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


def _standardised(v: Tensor, eps: float) -> Tensor:
    """Weight standardisation written out: each output channel's row minus its mean, over
    the square root of its (biased) variance plus eps."""
    rows = v.reshape(v.shape[0], -1)
    mean = rows.sum(1, keepdim=True) / rows.shape[1]
    var = ((rows - mean) ** 2).sum(1, keepdim=True) / rows.shape[1]
    return ((rows - mean) / torch.sqrt(var + eps)).reshape(v.shape)


#: effective weight of each weight-standardised convolution class (by class name: timm's,
#: and the tests' own), written without the class's forward
STANDARDISED = {
    "StdConv2d": lambda m: _standardised(m.weight, m.eps),
    "ScaledStdConv2d": lambda m: _standardised(m.weight, m.eps) * m.gain * m.scale,
}


def plain_twin(model: nn.Module) -> nn.Module:
    """A float64 copy of ``model`` whose weight-standardised convolutions
    (``STANDARDISED``) are plain ``nn.Conv2d`` holding their effective weight: the network
    of neurons they compute (Def. 2.2.2), for the independent pass."""
    net = copy.deepcopy(model).double().eval()
    for name, module in list(net.named_modules()):
        effective = STANDARDISED.get(type(module).__name__)
        if effective is None:
            continue
        w, groups = module.weight, getattr(module, "groups", 1)
        conv = nn.Conv2d(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]),
                         getattr(module, "stride", 1), getattr(module, "padding", 0),
                         getattr(module, "dilation", 1), groups, module.bias is not None,
                         dtype=torch.float64)
        with torch.no_grad():
            conv.weight.copy_(effective(module))
            if module.bias is not None:
                conv.bias.copy_(module.bias)
        parent, _, leaf = name.rpartition(".")
        setattr(net.get_submodule(parent), leaf, conv)
    return net


def abs_pow_copy(model: nn.Module, q: float) -> nn.Module:
    """The float64 copy of ``model`` with |theta|^q parameters (BatchNorm folded first,
    weight-standardised convolutions as their effective weight, ``plain_twin``); run it
    under ``_AbsPowMode(q)`` on all-ones for the |theta|^q pass."""
    net = plain_twin(model)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                a = module.weight / torch.sqrt(module.running_var + module.eps)
                b = module.bias - module.running_mean * a
                module.weight.copy_(a.abs().pow(q))
                module.bias.copy_(b.abs().pow(q))
                module.running_mean.zero_()
                module.running_var.fill_(1.0 - module.eps)
            elif isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
                module.weight.copy_(module.weight.abs().pow(q))
                if module.bias is not None:
                    module.bias.copy_(module.bias.abs().pow(q))
            else:  # a functional layer's or a per-channel scale's own tensors, whatever
                # their names, buffers too (timm's BlurPool2d filter `filt`): edge weights
                for t in (*module._parameters.values(), *module._buffers.values()):
                    if t is not None and t.is_floating_point():
                        t.copy_(t.abs().pow(q))
    return net


def abs_pow_outputs(model: nn.Module, shape: tuple[int, ...], q: float,
                    requires_grad: bool = False) -> tuple[Tensor, nn.Module]:
    """o_v = ||Phi^{->v}||_q^q of every output neuron (one flat float64 tensor), and the
    |theta|^q copy whose parameters ``o`` depends on (for autograd)."""
    net = abs_pow_copy(model, q)
    for p in net.parameters():
        p.requires_grad_(requires_grad)
    with torch.set_grad_enabled(requires_grad), _AbsPowMode(q):
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
