"""The shape-only stand-ins of validation's dataflow recorder (pathlift.graph.dataflow) give
what torch's own meta kernels give: the same shape and strides, or the same refusal."""

import subprocess
import sys

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlift.graph.dataflow import _FAST, _convolution


def _outcome(fn, *args):
    try:
        out = fn(*args)
    except Exception as err:  # the stand-in hands bad arguments to torch: same error type
        return type(err)
    return tuple(out.shape), out.stride(), out.dtype


@st.composite
def convolutions(draw):
    dims = draw(st.integers(1, 3))
    transposed, groups = draw(st.booleans()), draw(st.integers(1, 3))
    ints = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=dims, max_size=dims)  # noqa: E731
    stride, padding, dilation = draw(ints(1, 3)), draw(ints(0, 2)), draw(ints(1, 2))
    output_padding = [draw(st.integers(0, max(s, d) - 1))
                      for s, d in zip(stride, dilation, strict=True)] if transposed else [0] * dims
    cin = groups * draw(st.integers(1, 3)) + draw(st.sampled_from([0, 0, 0, 1]))  # or wrong
    cout = groups * draw(st.integers(1, 3))
    kernel, size = draw(ints(1, 4)), draw(ints(1, 9))
    x = torch.empty((2, cin, *size), device="meta")
    wshape = (cin, cout // groups) if transposed else (cout, max(cin // groups, 1))
    weight = torch.empty((*wshape, *kernel), device="meta")
    bias = torch.empty((cout,), device="meta") if draw(st.booleans()) else None
    return x, weight, bias, stride, padding, dilation, transposed, output_padding, groups


@settings(max_examples=300, deadline=None)
@given(convolutions())
def test_the_convolution_stand_in_is_torchs_meta_kernel(args):
    assert _outcome(_convolution, *args) == _outcome(torch.ops.aten.convolution.default, *args)


@st.composite
def max_pools(draw):
    """max_pool2d_with_indices' arguments as F.max_pool2d passes them, valid or not."""
    pair = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=1, max_size=2)  # noqa: E731
    x = torch.empty((*draw(st.sampled_from([(), (2,)])), draw(st.integers(1, 3)),
                     draw(st.integers(1, 9)), draw(st.integers(1, 9))), device="meta")
    if x.dim() == 4 and draw(st.booleans()):
        x = x.contiguous(memory_format=torch.channels_last)
    stride = draw(st.one_of(st.just([]), pair(1, 3)))
    return (x, draw(pair(1, 4)), stride, draw(pair(0, 2)), draw(pair(1, 2)),
            draw(st.booleans()))


def _pooled(fn, *args):
    try:
        values, indices = fn(*args)
    except Exception as err:
        return type(err)
    return _outcome(lambda: values), _outcome(lambda: indices)


@settings(max_examples=400, deadline=None)
@given(max_pools())
def test_the_max_pool_stand_in_is_torchs_meta_kernel(args):
    """Values and indices: shape, strides and dtype, ceil_mode and bad paddings included."""
    real = torch.ops.aten.max_pool2d_with_indices.default
    assert _pooled(_FAST[real], *args) == _pooled(real, *args)


@st.composite
def elementwise_pairs(draw):
    """Two meta tensors as a forward meets them: one shape or a broadcast one, one dtype or
    two, each contiguous, transposed, a strided slice (not dense) or a wrapped scalar."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))

    def tensor(dims: tuple[int, ...]) -> torch.Tensor:
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
        layout = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
        if layout == "sliced" and dims:
            return torch.empty((*dims[:-1], 2 * dims[-1]), dtype=dtype, device="meta")[..., ::2]
        t = torch.empty(dims, dtype=dtype, device="meta")
        if layout == "transposed" and len(dims) >= 2:
            t = t.transpose(0, 1).contiguous().transpose(0, 1)
        return t

    other = draw(st.sampled_from(["same", "broadcast", "scalar"]))
    dims = shape if other == "same" else (() if other == "scalar" else shape[1:])
    return tensor(shape), tensor(dims)


@settings(max_examples=300, deadline=None)
@given(elementwise_pairs(), st.sampled_from(["add", "mul"]))
def test_the_elementwise_stand_ins_are_torchs_meta_kernels(pair, name):
    """x + y, x * y and relu(x): the stand-in's shape, strides and dtype are the meta
    kernel's (a slice's result dense, as torch lays it out)."""
    func = getattr(torch.ops.aten, name).Tensor
    x, y = pair
    assert _outcome(_FAST[func], x, y) == _outcome(func, x, y)
    assert _outcome(_FAST[func], y, x) == _outcome(func, y, x)
    relu = torch.ops.aten.relu.default
    assert _outcome(_FAST[relu], x) == _outcome(relu, x)


def test_validating_a_pruned_residual_network_imports_no_compiler() -> None:
    """A pruned ResNet's trace and validation (prune masks times weights, residual sums,
    max-pooling) run on the stand-ins: torch._dynamo (half a second of a command's start)
    and sympy (a third) stay unimported."""
    code = """
import sys
from torch.nn.utils import prune
from pathlift.lift import path_norm
from pathlift.models import resnet18
model = resnet18(num_classes=10).eval()
prune.l1_unstructured(model.conv1, "weight", amount=0.5)
path_norm(model, (3, 32, 32))
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


@st.composite
def upsamplings(draw):
    """An interpolating upsampling's aten call as F.interpolate makes it, valid or not: the
    op, its input (contiguous, channels-last or empty) and its arguments."""
    name, dims = draw(st.sampled_from([("upsample_linear1d", 1), ("upsample_bilinear2d", 2),
                                       ("upsample_bicubic2d", 2),
                                       ("upsample_trilinear3d", 3)]))
    spatial = draw(st.lists(st.integers(0, 5), min_size=dims, max_size=dims))
    rank = dims + 2 - draw(st.sampled_from([0, 0, 0, 1]))  # or a wrong rank
    shape = (draw(st.integers(0, 2)), draw(st.integers(1, 3)), *spatial)[:rank]
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64]))
    x = torch.empty(shape, dtype=dtype, device="meta")
    if x.dim() == 4 and draw(st.booleans()):
        x = x.contiguous(memory_format=torch.channels_last)
    size = draw(st.lists(st.integers(-1, 9), min_size=dims - 1, max_size=dims + 1))
    scales = draw(st.lists(st.sampled_from([None, 0.5, 2.0]), max_size=dims))
    return getattr(torch.ops.aten, name).default, x, size, draw(st.booleans()), *scales


@settings(max_examples=300, deadline=None)
@given(upsamplings())
def test_the_upsampling_stand_ins_are_torchs_meta_kernels(call):
    """Shape, strides and dtype of linear, bilinear, bicubic and trilinear upsampling, or
    the same refusal (an empty input, a wrong rank or size, a size below 1)."""
    op, *args = call
    assert _outcome(_FAST[op], *args) == _outcome(op, *args)
