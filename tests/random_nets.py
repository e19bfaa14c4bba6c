"""Random small networks made of every supported layer, for property tests.

    from random_nets import random_network, networks
    model, input_shape = random_network(seed)          # deterministic in the seed
    @given(networks())                                  # hypothesis strategy of the same

Each network is a random DAG in eval mode, traceable by torch.fx, over a vector, 1-d or 2-d
input (rarely a 3-d volume): Linear (also on the last dim of a signal), Conv1d/2d/3d
(stride, padding, dilation, groups), ConvTranspose1d/2d/3d, eval BatchNorm with random
running statistics, ReLU (module, functional, method, in-place), MaxPool (padding,
dilation, ceil_mode, module and functional), AdaptiveMaxPool, AvgPool (count_include_pad,
ceil_mode, divisor_override), AdaptiveAvgPool, ``mean`` over spatial dims, residual ``+``
(also ``x + x`` and ``+=``), ``torch.cat``, nearest upsampling, Identity, eval Dropout,
flatten/view/reshape/permute/transpose/unsqueeze, and one to three outputs. Weights and
biases are random with mixed signs and scales; some layers have no bias.

The operations of issue 21 are drawn only when asked for, each behind a flag of
``NEW_OPS`` (``random_network(seed, new_ops={"leaky_relu", ...})``, or globally by adding
flags to ``ENABLED_OPS``): LeakyReLU (module, functional, in-place; slopes negative, small,
above 1), PReLU (one slope, one per channel), ReLU6, Hardtanh (random bounds), ``clamp`` /
``clip`` with constant bounds (min only, max only, both), slicing along non-batch dims
(``x[:, a:b]``, steps, ``chunk``, ``split``, ``narrow``, ``unbind``), shape arithmetic in
``forward`` (``x.size(1) // 2``, a channel shuffle by view/transpose), interpolation
(``F.interpolate`` linear/bilinear/bicubic/trilinear, both ``align_corners``, by size or
scale factor, ``nn.Upsample``), padding (``F.pad`` constant 0/reflect/replicate,
``ZeroPad*d``, ``ConstantPad*d(.., 0)``, ``ReflectionPad*d``, ``ReplicationPad*d``) and dict
outputs. With no flag the networks (and the random stream) are exactly those of before.
Each step records a ``tag`` naming the new op it draws, for coverage tests.

Sizes are kept small: an upper bound of the number of paths (Def. 2.3.1) is tracked while
the network grows, so that explicit enumeration (``pathlift.testing.neurons``) stays cheap.
In-place ops only ever act on a tensor that nothing else has read and that autograd does
not need, so eager PyTorch and the traced graph compute the same function and every
network can be differentiated (w.r.t. its input and its parameters).
"""

from __future__ import annotations

import math
import operator
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import Tensor, nn

MAX_PATHS = 20_000

NEW_OPS = frozenset({
    "leaky_relu", "prelu", "relu6", "hardtanh", "clamp",            # piecewise-linear
    "slice", "chunk", "split", "narrow", "unbind", "size_arith",    # slicing, shape arithmetic
    "interpolate", "pad", "dict_output",                            # fixed linear maps, outputs
})
# The flags every ``random_network`` call draws by default (``new_ops=None``): turn them on
# here as the engine supports them, and the whole fuzz and exactness suite draws them. The
# environment variable RANDOM_NETS_NEW_OPS ("all", or flags separated by commas) turns them
# on for one run without an edit.
ENABLED_OPS: set[str] = set(NEW_OPS - {"dict_output"})  # dict outputs: see test_zoo
_FROM_ENV = os.environ.get("RANDOM_NETS_NEW_OPS", "").strip()
if _FROM_ENV:
    ENABLED_OPS |= NEW_OPS if _FROM_ENV == "all" else {f.strip() for f in _FROM_ENV.split(",")}


@dataclass(frozen=True)
class Step:
    """One op of the forward: ``fn(net, *input values)``; ``view`` when it aliases its input."""

    fn: Callable[..., Tensor]
    inputs: tuple[int, ...]
    view: bool = False
    in_place: bool = False
    tag: str = ""  # the flag of NEW_OPS this step draws, "" for the original ops


class RandomNet(nn.Module):
    """A DAG of steps over a growing list of values (values[0] is the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        self.steps: list[Step] = []
        self.outputs: tuple[int, ...] = ()
        self.as_dict = False

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, ...] | dict[str, Tensor]:
        values = [x]
        for step in self.steps:
            values.append(step.fn(self, *(values[i] for i in step.inputs)))
        if self.as_dict:
            return {f"out{k}": values[i] for k, i in enumerate(self.outputs)}
        if len(self.outputs) == 1:
            return values[self.outputs[0]]
        return tuple(values[i] for i in self.outputs)


@dataclass
class _Value:
    shape: tuple[int, ...]  # without batch
    paths: int  # upper bound on the number of paths ending at one of its neurons
    fresh: bool  # produced by a non-view op and read by nothing yet: in-place is safe
    alive: bool = True  # False once an in-place op has overwritten it


class _Grower:
    def __init__(self, rng: random.Random, max_paths: int, new_ops: frozenset[str] = frozenset()):
        self.rng, self.max_paths, self.new_ops = rng, max_paths, new_ops
        self.net = RandomNet()
        self.values: list[_Value] = []

    # ------------------------------------------------------------------ bookkeeping
    def _randomise(self, m: nn.Module) -> None:
        r = self.rng
        g = torch.Generator().manual_seed(r.randrange(2**31))
        with torch.no_grad():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-1, 1, generator=g)
                m.running_var.uniform_(0.3, 2.5, generator=g)
            for p in m.parameters():
                scale = r.choice((0.3, 1.0, 2.5))
                p.uniform_(-scale, scale, generator=g)

    def shape_of(self, fn: Callable[..., Tensor], inputs: tuple[int, ...]
                 ) -> tuple[int, ...] | None:
        """The output shape of a candidate step, or None when it fails or is empty."""
        args = [torch.zeros((1, *self.values[i].shape)) for i in inputs]
        try:
            with torch.no_grad():
                out = fn(self.net, *args)
        except (RuntimeError, ValueError, NotImplementedError, IndexError):
            return None
        shape = tuple(out.shape[1:])
        if out.dim() < 2 or 0 in shape or math.prod(shape) > 64 or not out.isfinite().all():
            return None
        return shape

    def add(self, op: Callable[..., Tensor] | nn.Module, inputs: tuple[int, ...],
            fan_in: int, view: bool = False, in_place: bool = False,
            paths: int | None = None, tag: str = "") -> bool:
        """Append a step (a function of (net, *values), or a module to register) if it runs
        and keeps the path bound within budget; ``paths`` overrides the default bound."""
        fn = op
        if isinstance(op, nn.Module):
            self._randomise(op)
            index = len(self.net.layers)
            self.net.layers.append(op)

            def fn(net, v):
                return net.layers[index](v)
        shape = self.shape_of(fn, inputs)
        if paths is None:
            paths = sum(self.values[i].paths for i in inputs) * fan_in + (0 if view else 1)
        if shape is None or paths * math.prod(shape) > self.max_paths:
            if isinstance(op, nn.Module):
                del self.net.layers[-1]
            return False
        for i in inputs:
            self.values[i].fresh = False
            if in_place:
                self.values[i].alive = False
        self.net.steps.append(Step(fn, inputs, view, in_place, tag))
        self.values.append(_Value(shape, paths, fresh=not view))
        return True

    def pick(self) -> int:
        alive = [i for i, v in enumerate(self.values) if v.alive]
        return alive[-1] if self.rng.random() < 0.6 else self.rng.choice(alive)

    # ------------------------------------------------------------------ the ops
    def grow(self, i: int) -> bool:
        v = self.values[i]
        dims = len(v.shape) - 1  # 0: vector, 1: signal, 2: image, 3: volume
        ops = [self.relu, self.affine, self.add_residual, self.cat, self.structure]
        if dims >= 1:
            ops += [self.conv, self.conv, self.pool, self.pool, self.spatial]
        new = self.new_ops
        if new & {"leaky_relu", "prelu", "relu6", "hardtanh", "clamp"}:
            ops += [self.piecewise_linear, self.piecewise_linear]
        if new & {"slice", "chunk", "split", "narrow", "unbind", "size_arith"}:
            ops.append(self.slicing)
        if dims >= 1 and "interpolate" in new:
            ops.append(self.interpolate)
        if dims >= 1 and "pad" in new:
            ops.append(self.pad)
        return self.rng.choice(ops)(i, dims)

    def relu(self, i: int, dims: int) -> bool:
        r = self.rng
        if self.values[i].fresh and r.random() < 0.4:
            fn = r.choice((lambda net, x: F.relu(x, inplace=True),
                           lambda net, x: torch.relu_(x), lambda net, x: x.relu_(),
                           nn.ReLU(inplace=True)))
            return self.add(fn, (i,), 1, view=True, in_place=True)
        fn = r.choice((lambda net, x: F.relu(x), lambda net, x: torch.relu(x),
                       lambda net, x: x.relu(), nn.ReLU()))
        added = self.add(fn, (i,), 1)
        if added:  # autograd saves a ReLU's output: overwriting it would break backward
            self.values[-1].fresh = False
        return added

    def affine(self, i: int, dims: int) -> bool:
        r, shape = self.rng, self.values[i].shape
        if dims == 0 or r.random() < 0.3:  # Linear, also on the last dim of a signal/image
            n_in = shape[-1]
            layer = nn.Linear(n_in, r.randint(1, 4), bias=r.random() < 0.8)
            return self.add(layer, (i,), n_in)
        bn = (nn.BatchNorm1d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)[dims]
        layer = bn(shape[0], affine=r.random() < 0.8).eval()
        return self.add(layer, (i,), 1)

    def conv(self, i: int, dims: int) -> bool:
        r, c_in = self.rng, self.values[i].shape[0]
        c_out = r.randint(1, 3)
        groups = r.choice([g for g in (1, 2, 3) if c_in % g == 0 and c_out % g == 0])
        k = r.randint(1, 3)
        stride, dilation = r.choice((1, 1, 2)), r.choice((1, 1, 2))
        kw = {"stride": stride, "dilation": dilation, "groups": groups,
              "bias": r.random() < 0.8}
        if r.random() < 0.3:
            cls = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[dims - 1]
            kw["padding"] = r.randint(0, (dilation * (k - 1)) // 2)
            kw["output_padding"] = r.randint(0, max(stride, dilation) - 1)
            fan_in = (c_in // groups) * k**dims
        else:
            cls = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
            kw["padding"] = r.randint(0, k // 2 + dilation - 1)
            fan_in = (c_in // groups) * k**dims
        return self.add(cls(c_in, c_out, k, **kw), (i,), fan_in)

    def pool(self, i: int, dims: int) -> bool:
        r, spatial = self.rng, self.values[i].shape[1:]
        if r.random() < 0.3:  # adaptive: windows of at most ceil(n/o) + 1
            size = tuple(r.randint(1, n) for n in spatial)
            fan_in = math.prod(math.ceil(n / o) + 1 for n, o in zip(spatial, size, strict=True))
            if r.random() < 0.5:
                cls = (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)[dims - 1]
            else:
                cls = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)[dims - 1]
            return self.add(cls(size if dims > 1 else size[0]), (i,), fan_in)
        k = r.randint(2, 3)
        stride = r.choice((None, 1, 2))
        padding = r.randint(0, k // 2)
        ceil_mode = r.random() < 0.4
        fan_in = k**dims
        if r.random() < 0.5:
            dilation = r.choice((1, 2))
            if r.random() < 0.5:
                cls = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)[dims - 1]
                fn = cls(k, stride, padding, dilation, ceil_mode=ceil_mode)
            else:
                pool_f = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[dims - 1]

                def fn(net, x, pool_f=pool_f):
                    return pool_f(x, k, stride, padding, dilation, ceil_mode=ceil_mode)
            return self.add(fn, (i,), fan_in)
        include_pad = r.random() < 0.5
        if dims == 1:
            layer = nn.AvgPool1d(k, stride, padding, ceil_mode, include_pad)
        else:
            divisor = r.choice((None, None, 1, 3, 5))
            cls = (nn.AvgPool2d, nn.AvgPool3d)[dims - 2]
            layer = cls(k, stride, padding, ceil_mode, include_pad, divisor)
        if r.random() < 0.3:
            avg_f = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[dims - 1]

            def avg(net, x):
                return avg_f(x, k, stride, padding, ceil_mode, include_pad)
            return self.add(avg, (i,), fan_in)
        return self.add(layer, (i,), fan_in)

    def spatial(self, i: int, dims: int) -> bool:
        """``mean`` over spatial dims and nearest upsampling."""
        r, spatial = self.rng, self.values[i].shape[1:]
        if r.random() < 0.5:
            axes = tuple(range(2, 2 + dims))
            if dims >= 2 and r.random() < 0.4:
                axes = (r.choice((*range(2, 2 + dims), -1)),)
            keep = r.random() < 0.5
            fan_in = math.prod(spatial[a - 2] if a > 0 else spatial[-1] for a in axes)
            fn = r.choice((lambda net, x: x.mean(axes, keepdim=keep),
                           lambda net, x: torch.mean(x, dim=axes, keepdim=keep)))
            return self.add(fn, (i,), fan_in)
        if r.random() < 0.5:
            fn = nn.Upsample(scale_factor=2, mode="nearest")
        else:
            size = tuple(n + r.randint(0, 2) for n in spatial)
            fn = lambda net, x: F.interpolate(x, size=size, mode="nearest")  # noqa: E731
        return self.add(fn, (i,), 1)

    def add_residual(self, i: int, dims: int) -> bool:
        r = self.rng
        same = [j for j, v in enumerate(self.values)
                if v.alive and v.shape == self.values[i].shape]
        j = r.choice(same)  # may be i itself: x + x doubles the edges
        if self.values[i].fresh and i != j and r.random() < 0.3:
            return self.add(lambda net, a, b: operator.iadd(a, b), (i, j), 1, view=True,
                            in_place=True)
        fn = r.choice((lambda net, a, b: a + b, lambda net, a, b: torch.add(a, b),
                       lambda net, a, b: a.add(b)))
        return self.add(fn, (i, j), 1)

    def cat(self, i: int, dims: int) -> bool:
        shape = self.values[i].shape
        dim = self.rng.choice((1, -1))
        axis = 0 if dim == 1 else len(shape) - 1
        partners = [j for j, v in enumerate(self.values) if v.alive and len(v.shape) == len(shape)
                    and all(a == b for k, (a, b) in enumerate(zip(v.shape, shape, strict=True))
                            if k != axis)]
        j = self.rng.choice(partners)
        fn = self.rng.choice((lambda net, a, b: torch.cat([a, b], dim),
                              lambda net, a, b: torch.cat((b, a), dim=dim)))
        bound = max(self.values[i].paths, self.values[j].paths)  # a cat relabels, no neuron
        return self.add(fn, (i, j), 1, paths=bound)

    def structure(self, i: int, dims: int) -> bool:
        """Relabelling ops: flatten, view, permute, unsqueeze, Identity, eval Dropout."""
        r = self.rng
        choices: list[Callable[..., Tensor] | nn.Module] = [nn.Identity(),
                                                            nn.Dropout(0.5).eval()]
        if dims == 0:
            choices.append(lambda net, x: x.unsqueeze(1))
        else:
            choices += [nn.Flatten(), lambda net, x: x.flatten(1),
                        lambda net, x: torch.flatten(x, 1),
                        lambda net, x: x.contiguous().view(x.size(0), -1),
                        lambda net, x: x.reshape(x.shape[0], -1),
                        lambda net, x: x.transpose(1, -1)]
        if dims == 2:
            choices += [lambda net, x: x.permute(0, 1, 3, 2), lambda net, x: x.transpose(2, 3)]
        return self.add(r.choice(choices), (i,), 1, view=True)

    # ------------------------------------------------------------------ issue 21 ops
    def piecewise_linear(self, i: int, dims: int) -> bool:
        """LeakyReLU, PReLU, ReLU6, Hardtanh, clamp/clip: two ReLU neurons per element once
        lowered, so at most twice the paths (plus their biases)."""
        r, v = self.rng, self.values[i]
        tag = r.choice(sorted(self.new_ops & {"leaky_relu", "prelu", "relu6", "hardtanh",
                                              "clamp"}))
        in_place = False
        if tag == "leaky_relu":
            slope = r.choice((0.01, 0.2, -0.5, 1.5, 3.0, -2.0, r.uniform(-3.0, 3.0)))
            if v.fresh and slope > 0 and r.random() < 0.3:  # autograd: in-place needs a > 0
                in_place = True
                fn = r.choice((nn.LeakyReLU(slope, inplace=True),
                               lambda net, x: F.leaky_relu(x, slope, inplace=True),
                               lambda net, x: F.leaky_relu_(x, slope)))
            else:
                fn = r.choice((nn.LeakyReLU(slope), lambda net, x: F.leaky_relu(x, slope)))
        elif tag == "prelu":
            channels = v.shape[0]  # PReLU's parameters index dim 1 (features or channels)
            fn = nn.PReLU(r.choice((1, channels)))
        elif tag == "relu6":
            fn = r.choice((nn.ReLU6(), lambda net, x: F.relu6(x)))
        elif tag == "hardtanh":
            low = r.uniform(-3.0, 1.0)
            high = low + r.uniform(0.2, 4.0)
            fn = r.choice((nn.Hardtanh(low, high), lambda net, x: F.hardtanh(x, low, high)))
        else:
            low = r.uniform(-2.0, 1.0)
            high = low + r.uniform(0.2, 3.0)
            fn = r.choice((lambda net, x: x.clamp(min=low), lambda net, x: x.clamp(max=high),
                           lambda net, x: torch.clamp(x, low, high),
                           lambda net, x: x.clip(low, high),
                           lambda net, x: torch.clip(x, min=low),
                           lambda net, x: torch.clamp(x, max=high)))
        paths = 2 * v.paths + 3
        added = self.add(fn, (i,), 2, view=in_place, in_place=in_place, paths=paths, tag=tag)
        if added and not in_place:  # autograd may keep the output: no in-place on it
            self.values[-1].fresh = False
        return added

    def slicing(self, i: int, dims: int) -> bool:
        """Slices, chunk, split, narrow, unbind along non-batch dims, and shape arithmetic:
        relabellings that create no neuron."""
        r, shape = self.rng, self.values[i].shape
        tag = r.choice(sorted(self.new_ops & {"slice", "chunk", "split", "narrow", "unbind",
                                              "size_arith"}))
        dim = r.randint(1, len(shape))
        n = shape[dim - 1]
        a = r.randint(0, n - 1)
        b = r.randint(a + 1, n)
        if tag == "slice":
            index = [slice(None)] * (dim + 1)
            index[dim] = slice(a, b, r.choice((1, 1, 2)))
            index_t = tuple(index)
            if dim == len(shape) and r.random() < 0.5:
                index_t = (..., index[dim])
            fn = lambda net, x: x[index_t]  # noqa: E731
        elif tag == "chunk":
            k = r.randint(2, 3)
            j = r.randrange(k)
            fn = r.choice((lambda net, x: x.chunk(k, dim=dim)[j],
                           lambda net, x: torch.chunk(x, k, dim)[j],
                           lambda net, x: _swap_halves(x, dim)))
        elif tag == "split":
            size = r.randint(1, max(1, n - 1))
            j = r.randrange(math.ceil(n / size))
            sizes = [a, n - a] if a > 0 else [n]
            fn = r.choice((lambda net, x: x.split(size, dim)[j],
                           lambda net, x: torch.split(x, size, dim=dim)[j],
                           lambda net, x: x.split(sizes, dim)[-1]))
        elif tag == "narrow":
            fn = r.choice((lambda net, x: x.narrow(dim, a, b - a),
                           lambda net, x: torch.narrow(x, dim, a, b - a)))
        elif tag == "unbind":
            fn = r.choice((lambda net, x: x.unbind(dim)[a], lambda net, x: torch.unbind(x, dim)[a]))
        else:  # shape arithmetic evaluated in forward
            if dims >= 1 and shape[0] % 2 == 0:
                fn = r.choice((
                    lambda net, x: x[:, : x.size(1) // 2],
                    lambda net, x: x.narrow(1, x.shape[1] // 2, x.size(1) - x.size(1) // 2),
                    lambda net, x: x.reshape(x.size(0), 2, x.size(1) // 2, -1).transpose(1, 2)
                    .reshape(x.shape)))
            else:
                fn = r.choice((lambda net, x: x[:, : (x.size(1) + 1) // 2],
                               lambda net, x: x.reshape(x.size(0), x.size(1) * 1, -1)))
        return self.add(fn, (i,), 1, view=True, paths=self.values[i].paths, tag=tag)

    def interpolate(self, i: int, dims: int) -> bool:
        """Linear interpolation: identity neurons with fixed weights, 2 (bicubic: 4) inputs
        per spatial dim."""
        r, spatial = self.rng, self.values[i].shape[1:]
        if dims > 3:
            return False
        mode = r.choice({1: ("linear",), 2: ("bilinear", "bicubic"), 3: ("trilinear",)}[dims])
        align = r.random() < 0.5
        if r.random() < 0.5:
            size = tuple(max(1, m + r.randint(-1, 3)) for m in spatial)
            kw: dict = {"size": size if dims > 1 else size[0]}
        else:
            kw = {"scale_factor": r.choice((2, 1.5, 0.5, 3))}
        if r.random() < 0.3:
            fn: Callable[..., Tensor] | nn.Module = nn.Upsample(mode=mode, align_corners=align,
                                                                **kw)
        else:
            def fn(net, x):
                return F.interpolate(x, mode=mode, align_corners=align, **kw)
        fan_in = (4 if mode == "bicubic" else 2) ** dims
        return self.add(fn, (i,), fan_in, tag="interpolate")

    def pad(self, i: int, dims: int) -> bool:
        """Zero, reflection and replication padding: a relabelling with zeros or repeats."""
        r = self.rng
        if dims > 3:
            return False
        k = r.randint(1, dims)  # trailing dims padded
        pads = [r.randint(0, 2) for _ in range(2 * k)]
        kind = r.choice(("F.pad", "zero", "constant", "reflect", "replicate"))
        if kind == "F.pad":
            mode = r.choice(("constant", "reflect", "replicate"))
            if mode != "constant":
                pads = [r.randint(0, 1) for _ in range(2 * dims)]

            def fn(net, x):
                return F.pad(x, pads, mode=mode) if mode != "constant" else F.pad(x, pads)
        else:
            full = [r.randint(0, 2) for _ in range(2 * dims)]
            if kind in ("reflect", "replicate"):
                full = [r.randint(0, 1) for _ in range(2 * dims)]
            cls = {"zero": (getattr(nn, "ZeroPad1d", None), nn.ZeroPad2d,
                            getattr(nn, "ZeroPad3d", None)),
                   "constant": (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d),
                   "reflect": (nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d),
                   "replicate": (nn.ReplicationPad1d, nn.ReplicationPad2d,
                                 nn.ReplicationPad3d)}[kind][dims - 1]
            if cls is None:
                return False
            fn = cls(tuple(full), 0.0) if kind == "constant" else cls(tuple(full))
        return self.add(fn, (i,), 1, paths=self.values[i].paths, tag="pad")


def _swap_halves(x: Tensor, dim: int) -> Tensor:
    first, second = x.chunk(2, dim)
    return torch.cat([second, first], dim)


def random_network(seed: int, max_paths: int = MAX_PATHS,
                   new_ops: set[str] | frozenset[str] | None = None
                   ) -> tuple[nn.Module, tuple[int, ...]]:
    """A random small eval-mode ReLU network and its input shape (no batch), from ``seed``.

    Deterministic in ``seed`` and ``new_ops`` (the flags of ``NEW_OPS`` to draw;
    ``ENABLED_OPS`` when None). The number of paths stays below ``max_paths`` (an upper
    bound is tracked while the network grows).
    """
    flags = frozenset(ENABLED_OPS if new_ops is None else new_ops)
    unknown = flags - NEW_OPS
    if unknown:
        raise ValueError(f"unknown new ops {sorted(unknown)}; known: {sorted(NEW_OPS)}")
    rng = random.Random(seed)
    kind = rng.choice(("vector", "signal", "image", "image") * 3 + ("volume",))
    shape = {"vector": (rng.randint(1, 5),),
             "signal": (rng.randint(1, 2), rng.randint(3, 8)),
             "image": (rng.randint(1, 2), rng.randint(2, 5), rng.randint(2, 5)),
             "volume": (1, rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 3))}[kind]
    grower = _Grower(rng, max_paths, flags)
    grower.values.append(_Value(shape, 1, fresh=False))
    target = rng.randint(2, 9)
    for _ in range(40 * target):
        if len(grower.net.steps) >= target:
            break
        grower.grow(grower.pick())
    alive = [i for i, v in enumerate(grower.values) if v.alive]
    outputs = [alive[-1]]
    for _ in range(rng.choice((0, 0, 1, 2))):
        outputs.append(rng.choice(alive))
    grower.net.outputs = tuple(outputs)
    if "dict_output" in flags:
        grower.net.as_dict = rng.random() < 0.5
    return grower.net.eval(), shape


def random_input(shape: tuple[int, ...], seed: int, batch: int = 1,
                 dtype: torch.dtype = torch.float64) -> Tensor:
    """A random input of ``shape`` (no batch) with mixed signs, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *shape), generator=g, dtype=dtype) * 2


def networks(max_paths: int = MAX_PATHS, new_ops: set[str] | frozenset[str] | None = None
             ) -> st.SearchStrategy[tuple[nn.Module, tuple[int, ...]]]:
    """Hypothesis strategy of ``random_network(seed)`` for random seeds."""
    return st.integers(0, 2**31 - 1).map(lambda seed: random_network(seed, max_paths, new_ops))


def randomise_batchnorm_(model: nn.Module) -> nn.Module:
    """Give every BatchNorm of ``model`` non-trivial statistics and affine parameters, in place
    (fresh BatchNorms are the identity map); returns the model in eval mode."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
    return model.eval()
