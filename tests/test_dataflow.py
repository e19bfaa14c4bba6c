"""The shape-only stand-ins of validation's dataflow recorder (pathlift.graph.dataflow) give
what torch's own meta kernels give: the same shape and strides, or the same refusal."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlift.graph.dataflow import _convolution


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
