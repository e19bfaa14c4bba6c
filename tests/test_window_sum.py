"""``window_sum`` (the max-pool neurons' sums of Thm 3.1.1's |theta|^q network) gives the sum
over each pooling window of the zero-padded input, cropped as the pooling crops, whichever
kernel computes it: float32 on the CPU (a depthwise convolution) against float64 (a sum
pool) and against an explicit loop over the windows."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlift.graph.ops.pooling import window_sum


def _explicit(x, kernel, stride, padding, dilation, out_spatial):
    """Sum of every window by enumeration of its positions (padding counts as zero)."""
    out = x.new_zeros((*x.shape[:2], *out_spatial))
    for o in itertools.product(*(range(n) for n in out_spatial)):
        for k in itertools.product(*(range(n) for n in kernel)):
            at = [oi * s - p + ki * d for oi, s, p, ki, d
                  in zip(o, stride, padding, k, dilation, strict=True)]
            if all(0 <= a < n for a, n in zip(at, x.shape[2:], strict=True)):
                out[(slice(None), slice(None), *o)] += x[(slice(None), slice(None), *at)]
    return out


@st.composite
def pools(draw):
    dims = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(dims)]
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    stride = [draw(st.integers(1, 3)) for _ in range(dims)]
    dilation = [draw(st.sampled_from([1, 1, 2])) for _ in range(dims)]
    spatial = [draw(st.integers(max(d * (k - 1) + 1 - 2 * p, 1), 7))
               for k, p, d in zip(kernel, padding, dilation, strict=True)]
    ceil = draw(st.booleans())
    x = torch.rand((1, draw(st.integers(1, 3)), *spatial), dtype=torch.float64,
                   generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[dims - 1]
    out_spatial = pool(x, kernel, stride, padding, dilation, ceil_mode=ceil).shape[2:]
    return x, kernel, stride, padding, dilation, tuple(out_spatial)


@settings(max_examples=150, deadline=None)
@given(pools())
def test_window_sums_are_the_enumerated_sums_in_float32_and_float64(case):
    x, *geometry = case
    expected = _explicit(x, *geometry)
    torch.testing.assert_close(window_sum(x, *geometry), expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(window_sum(x.float(), *geometry), expected.float(),
                               rtol=1e-6, atol=0)


def test_float32_windows_above_the_small_size_take_the_convolution_and_agree() -> None:
    """Above 2^15 numbers float32 on the CPU sums by the depthwise convolution (below, by
    the sum pool, as float64 always): both agree with float64 on every window, ceil_mode's
    uneven right padding included."""
    x = torch.rand((1, 2, 129, 131), dtype=torch.float64,
                   generator=torch.Generator().manual_seed(0))
    for kernel, stride, padding, ceil in (((3, 3), (2, 2), (1, 1), True),
                                          ((2, 2), (2, 2), (0, 0), False)):
        out = F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil).shape[2:]
        geometry = (kernel, stride, padding, (1, 1), tuple(out))
        expected = window_sum(x, *geometry)
        assert x.numel() > 2 ** 15
        torch.testing.assert_close(window_sum(x.float(), *geometry), expected.float(),
                                   rtol=1e-6, atol=0)
        small = x[:, :, :40, :40]
        out = F.max_pool2d(small, kernel, stride, padding, ceil_mode=ceil).shape[2:]
        torch.testing.assert_close(
            window_sum(small.float(), kernel, stride, padding, (1, 1), tuple(out)),
            _explicit(small, kernel, stride, padding, (1, 1), tuple(out)).float(),
            rtol=1e-6, atol=0)
