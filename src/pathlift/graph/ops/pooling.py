"""Pooling: max-pool neurons (thesis Def. 2.2.2: 1-max-pool, weights 1, bias 0; Thm 3.1.1
replaces them by window sums), average pools and ``mean`` (identity neurons with fixed
weights 1/|window|).

``FixedLinear`` is the protocol of every parameter-free op whose neurons have fixed
weights (pooling here, resampling and padding in ``resample.py``): ``abs_pow`` applies the
map with every weight w replaced by |w|^q, divided by a constant returned in log space
(so (1/K)^q never underflows), and ``antecedent_max`` takes the max over each neuron's
antecedents (the max-product pass of Def. 3.3.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pathlift.graph.ops.base import VALUES_OF, Call, Handler, Kind, register


class FixedLinear(Handler):
    """An op whose neurons have fixed (parameter-free) weights."""

    kind = Kind.POOL
    fixed_l1_exceeds_one = None
    creates_neurons = True
    layer_on_path = True
    family = "pooling"
    elementwise = False  # trait: each output reads exactly the input at its own position

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        """(|P|^q x / c, ln c) for the op's weight map P, a non-negative input ``x`` and a
        constant c > 0 of the op's choosing (typically the largest |w|^q); the tensor is
        a fresh one (the pass may scale it in place)."""
        raise NotImplementedError

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        """For each neuron the op creates, the largest value of ``x`` over its antecedents."""
        raise NotImplementedError


class ZeroOneMap(FixedLinear):
    """A fixed map S whose weights are all 0 or 1 (copies, im2col, prefix sums): |S|^q = S,
    so the |theta|^q pass of Thm 3.1.1 applies the op itself."""

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        return call.run(x), 0.0


def _pads(kernel, stride, padding, dilation, spatial, out_spatial) -> list[int]:
    """F.pad amounts (last dim first): ``padding`` on the left and on the right as much as
    a plain strided window needs to produce ``out_spatial`` (which encodes ceil_mode)."""
    pad: list[int] = []
    for k, s, p, d, n, o in zip(kernel, stride, padding, dilation, spatial, out_spatial,
                                strict=True):
        pad = [p, max((o - 1) * s + d * (k - 1) + 1 - (n + p), p), *pad]
    return pad


_SMALL_WINDOW_SUM = 2 ** 15


def window_sum(x: Tensor, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
               ) -> Tensor:
    """Sum of each pooling window of x (zero padding, so padding is excluded from the sum),
    cropped to the ``out_spatial`` size the pooling produces."""
    dims = len(kernel)
    pads = _pads(kernel, stride, padding, dilation, x.shape[2:], out_spatial)
    if any(d != 1 for d in dilation) or (x.dtype == torch.float32 and x.device.type == "cpu"
                                         and x.numel() > _SMALL_WINDOW_SUM):
        # a depthwise convolution with a kernel of ones: dilated windows, and float32 on
        # the CPU, where oneDNN's runs 2-15x faster than the sum pool, backward included
        # (benchmarks/bench_window_sum.py), but for its set-up (~150 us a call forward and
        # backward): below 2^15 numbers (a training step's batch-1 pass of a small CNN)
        # the sum pool is 2-5x faster; zero padding inside it when it is symmetric
        inside = pads == [p for p in reversed(padding) for _ in (0, 1)]
        if any(pads) and not inside:
            x = F.pad(x, pads)
        conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
        ones = x.new_ones((x.shape[1], 1, *kernel))
        out = conv(x, ones, None, list(stride), list(padding) if inside else 0, list(dilation),
                   x.shape[1])
    else:  # a sum pool (faster than the convolution in float64)
        if any(pads):  # no copy (nor autograd node) for windows that tile the input
            x = F.pad(x, pads)
        if dims == 1:
            out = F.avg_pool2d(x.unsqueeze(2), (1, kernel[0]), (1, stride[0]),
                               divisor_override=1).squeeze(2)
        else:
            pool = F.avg_pool2d if dims == 2 else F.avg_pool3d
            out = pool(x, list(kernel), list(stride), divisor_override=1)
    if tuple(out.shape[2:]) == tuple(out_spatial):
        return out
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


class _Pooling(FixedLinear):
    def __init__(self, name: str, dims: int, adaptive: bool):
        super().__init__(name)
        self.dims, self.adaptive = dims, adaptive

    def geometry(self, call: Call) -> PoolGeometry:
        return PoolGeometry(call, self.dims, self.kind is Kind.MAXPOOL)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        out_spatial = call.node.meta["tensor_meta"].shape[2:]
        if self.adaptive:
            return _adaptive("max", x, out_spatial)
        return self.geometry(call).max(x, out_spatial)


class MaxPoolHandler(_Pooling):
    """k-max-pool neurons with k = 1 (Def. 2.2.2); Thm 3.1.1 replaces them by window sums."""

    kind = Kind.MAXPOOL
    maxpool = True
    fixed_l1_exceeds_one = True  # k inputs of weight 1

    def problem(self, call: Call) -> str | None:
        indices = (call.module.return_indices if call.module is not None
                   else call.arg(6 if not self.adaptive else 2, "return_indices", False))
        if indices:
            return "max-pooling with return_indices=True (unpooling) is not a DAG neuron op"
        if not self.adaptive and self._window_in_padding(call):
            return ("a pooling window lies entirely in the padding (its output is -inf); "
                    "reduce the padding or the dilation")
        return None

    def _window_in_padding(self, call: Call) -> bool:
        """Whether some window holds only padding. A window is a product of one interval
        per dimension, so it does iff its interval along some dimension does: probed one
        dimension at a time on a line of real zeros (as many numbers as that dimension,
        never the input's size); the output size comes from the op run on meta tensors."""
        spatial = tuple(call.args[0].shape[2:])
        out = call.run(torch.empty((1, 1, *spatial), device="meta")).shape[2:]
        g = self.geometry(call)
        return any(bool(torch.isinf(window_max(
            torch.zeros((1, 1, n)), [g.kernel[i]], [g.stride[i]], [g.padding[i]],
            [g.dilation[i]], [o])).any()) for i, (n, o) in enumerate(zip(spatial, out,
                                                                         strict=True)))

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        out_spatial = call.node.meta["tensor_meta"].shape[2:]
        if self.adaptive:
            return _adaptive("avg", x, out_spatial) * adaptive_counts(x.shape[2:],
                                                                       out_spatial, x), 0.0
        return self.geometry(call).sum(x, out_spatial), 0.0



class AvgPoolHandler(_Pooling):
    """Average-pool neurons: identity activation, incoming weights 1/|window| (Def. 2.2.2)."""

    kind = Kind.POOL

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        """sum(x over window o) * w_o^q / w_max^q, with w_max^q returned in log space."""
        y = call.run(x)
        out_spatial = y.shape[2:]
        if self.adaptive:  # window o holds counts_o inputs, weight 1/counts_o
            counts = adaptive_counts(x.shape[2:], out_spatial, x)
            low = float(counts.min())
            return y * counts * (low / counts).pow(q), -q * math.log(low)
        # weight of window o is w_o = avg(1)_o / sum(1)_o; |avg|^q x = sum(x) * w^q
        geometry = self.geometry(call)
        ones = torch.ones_like(x[:1, :1])
        weight = call.run(ones) / geometry.sum(ones, out_spatial)
        top = float(weight.max())
        return geometry.sum(x, out_spatial) * (weight / top).pow(q), q * math.log(top)



class MeanHandler(FixedLinear):
    """``mean`` over non-batch dims: identity neurons with weights 1/N."""

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

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        """(sum of x, ln (1/N)^q): the mean's weights are all 1/N."""
        count = math.prod(x.shape[d] for d in self._dims(call, x.dim()))
        return call.run(x) * float(count), -q * math.log(count)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=self._dims(call, x.dim()), keepdim=bool(call.arg(2, "keepdim")))


class _Reduction(FixedLinear):
    """A reduction over feature dims ``dim`` (never the batch): its neurons read every
    input of one fibre."""

    def dims(self, call: Call) -> tuple[int, ...] | None:
        """The reduced dims (non-negative), None when the call gives none (all dims)."""
        dim = call.arg(1, "dim")
        if dim is None or dim == ():
            return None
        ndim = call.args[0].dim()
        return tuple(d % ndim for d in ((dim,) if isinstance(dim, int) else dim))

    def keepdim(self, call: Call) -> bool:
        return bool(call.arg(2, "keepdim", False))

    def problem(self, call: Call) -> str | None:
        dims = self.dims(call)
        if dims is None or 0 in dims:
            return (f"{self.name} over the batch dimension mixes samples; reduce over "
                    "feature dims only (dim=...)")
        return None

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=self.dims(call), keepdim=self.keepdim(call))

    def abs_pow(self, x: Tensor, q: float, call: Call) -> tuple[Tensor, float]:
        """(the sum over each fibre, 0): weights 1 (Thm 3.1.1 sums a max-pool's window)."""
        return x.sum(dim=self.dims(call), keepdim=self.keepdim(call)), 0.0


class ReduceMaxHandler(_Reduction):
    """``amax`` / ``max(x, dim).values`` over feature dims: 1-max-pool neurons, weights 1,
    bias 0 (Def. 2.2.2), each over one fibre (``nn.AdaptiveMaxPool1d(1)`` over the last
    dim is the same op)."""

    kind = Kind.MAXPOOL
    maxpool = True
    fixed_l1_exceeds_one = True


class SumHandler(_Reduction):
    """``sum`` over feature dims: identity neurons with fixed weights 1."""

    fixed_l1_exceeds_one = True


class CumsumHandler(ZeroOneMap):
    """``cumsum`` along a feature dim: identity neurons y_i = x_1 + ... + x_i, a 0/1
    lower-triangular S (Def. 2.2.2), so |S|^q = S in the |theta|^q pass (Thm 3.1.1)."""

    fixed_l1_exceeds_one = True

    def dim(self, call: Call) -> int:
        return call.arg(1, "dim") % max(call.args[0].dim(), 1)

    def problem(self, call: Call) -> str | None:
        if self.dim(call) == 0:
            return "cumsum over the batch dimension mixes samples; sum along a feature dim"
        return None

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return torch.cummax(x, self.dim(call)).values


def max_values(input: Tensor, dim: int | Sequence[int], keepdim: bool = False) -> Tensor:
    """``torch.max(input, dim, keepdim).values``: what a traced ``torch.max(h, dim)`` whose
    users only read its values (``.values``, ``[0]``) becomes (``pathlift.graph.
    functional.select_values``), so that it runs the user's own op."""
    return torch.max(input, dim, keepdim).values


def min_values(input: Tensor, dim: int | Sequence[int], keepdim: bool = False) -> Tensor:
    """``torch.min(input, dim, keepdim).values``, as ``max_values``."""
    return torch.min(input, dim, keepdim).values


REDUCE_MAX = ReduceMaxHandler("amax")
register(REDUCE_MAX, functions=[torch.amax, max_values], methods=["amax"],
         note="over features (and the values of torch's maximum over a dim)")
# min(x) = -max(-x): 1-max-pool neurons with incoming weights -1, their output edges of
# weight -1 (Def. 2.2.2). Every |w|^q is 1, so the |theta|^q pass (Thm 3.1.1) and the
# max-product pass (Def. 3.3.1) treat it as amax; the other passes run the op itself
# (monotone, positively homogeneous, linear at each point where its argmin is unique).
register(ReduceMaxHandler("amin"), functions=[torch.amin, min_values], methods=["amin"],
         note="over features (and the values of torch's minimum over a dim): -amax(-x)")
VALUES_OF.update({torch.max: max_values, "max": max_values, torch.min: min_values,
                  "min": min_values})
register(SumHandler("sum"), functions=[torch.sum], methods=["sum"], note="over features")
register(CumsumHandler("cumsum"), functions=[torch.cumsum], methods=["cumsum"],
         note="along features")
for _d in (1, 2, 3):
    register(MaxPoolHandler(f"MaxPool{_d}d", _d, False),
             modules=[getattr(nn, f"MaxPool{_d}d")], functions=[getattr(F, f"max_pool{_d}d")])
    register(MaxPoolHandler(f"AdaptiveMaxPool{_d}d", _d, True),
             modules=[getattr(nn, f"AdaptiveMaxPool{_d}d")],
             functions=[getattr(F, f"adaptive_max_pool{_d}d")])
    register(AvgPoolHandler(f"AvgPool{_d}d", _d, False),
             modules=[getattr(nn, f"AvgPool{_d}d")], functions=[getattr(F, f"avg_pool{_d}d")])
    register(AvgPoolHandler(f"AdaptiveAvgPool{_d}d", _d, True),
             modules=[getattr(nn, f"AdaptiveAvgPool{_d}d")],
             functions=[getattr(F, f"adaptive_avg_pool{_d}d")])
register(MeanHandler("mean"), functions=[torch.mean], methods=["mean"], note="over features")
