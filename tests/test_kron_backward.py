"""The fused kernel's product and backward (``multiply._FusedProduct``): Y, dX and dw
computed by the C kernel on every path it takes (GEMM, flat and phased along the output
features, along d; batch-size first and last), against autograd through the dense matrix
in float64 and against bmm's in float32, at the tile edges (b·d, c·d not multiples of the
slivers, c and the batch past the blocks of the inner dimension, rows not a multiple of
the micro-tile)."""

from __future__ import annotations

import pytest
import torch

from kron_fixtures import WIDTHS, isolated_kron_cache  # noqa: F401
from pathlift.kron import KSPattern, cpu_kernel, ks_multiply, random_factor, to_dense, vector_width
from pathlift.kron import multiply as multiply_module

# (pattern, batch): flat d in {1, 2, 4, 8} (c > 128 and batch > 128: blocks of the inner
# dimension accumulate; b·d not a multiple of 64), d a multiple of the lanes (16, 32),
# phased d in {6, 12, 24} (b·d not a multiple of 48, c past its blocks of 24), the GEMM
# (d = 3, 5; b > 32, c > 256 and > 512: its blocks), tiny b and c, one row, K's rows 4 KiB
# apart (c*d = 1024: dX packs K^T where the flat slivers are one cache line wide) and
# b*c >= 2^16 (dw by the GEMM there)
CASES = [((1, 48, 48, 1), 13), ((1, 100, 300, 1), 257), ((3, 7, 130, 2), 7),
         ((2, 130, 512, 2), 5),
         ((2, 33, 17, 4), 131), ((1, 5, 200, 8), 6), ((2, 7, 300, 16), 11),
         ((1, 13, 5, 32), 9), ((2, 33, 17, 5), 300), ((1, 40, 260, 3), 5),
         ((1, 48, 48, 24), 12), ((2, 5, 31, 6), 17), ((1, 9, 50, 12), 33),
         ((4, 2, 2, 3), 19), ((1, 1, 1, 1), 1), ((1, 20, 530, 3), 7)]


def dense_gradients(x, w, gy, p):
    """(Y, dX, dw) of sum(gy * X K^T) by autograd through the dense matrix, in float64."""
    xd = x.detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    y = xd @ to_dense(wd, p).T
    (y * gy.double()).sum().backward()
    return y.detach(), xd.grad, wd.grad


def fused_gradients(x, w, gy, p, layout, algorithm="fused"):
    """(Y, dX, dw) through ks_multiply in ``layout``, returned batch-size-first."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    xin = x if layout == "bsf" else x.T
    y = ks_multiply(xin, w, p, algorithm, layout)
    y = y if layout == "bsf" else y.T
    (y * gy).sum().backward()
    return y.detach(), x.grad, w.grad


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("bits", WIDTHS, ids=lambda b: f"{b}bit")
@pytest.mark.parametrize("layout", ["bsf", "bsl"])
@pytest.mark.parametrize("pattern,batch", CASES, ids=str)
def test_fused_gradients_match_the_dense_product_in_float64(pattern, batch, layout, bits):
    """On the kernel of every vector width this CPU runs (its own and, on x86, each
    narrower build: ``vector_width``)."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(sum(pattern) + batch)
    w = random_factor(p, torch.float64, generator=g)
    x = torch.randn(batch, p.in_features, dtype=torch.float64, generator=g)
    gy = torch.randn(batch, p.out_features, dtype=torch.float64, generator=g)
    with vector_width(bits):
        got = fused_gradients(x, w, gy, p, layout)
    ref = dense_gradients(x, w, gy, p)
    assert all(rel_err(a, b) <= 1e-12 for a, b in zip(got, ref, strict=True))


@pytest.mark.parametrize("pattern,batch", CASES, ids=str)
def test_fused_gradients_match_bmm_in_float32(pattern, batch):
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(7 * batch + sum(pattern))
    w = random_factor(p, generator=g)
    x = torch.randn(batch, p.in_features, generator=g)
    gy = torch.randn(batch, p.out_features, generator=g)
    ref = dense_gradients(x, w, gy, p)
    # both float32 results are as close to the float64 reference as float32 allows
    for algorithm in ("fused", "bmm"):
        got = fused_gradients(x, w, gy, p, "bsf", algorithm)
        assert all(rel_err(a, b) <= 1e-5 for a, b in zip(got, ref, strict=True)), algorithm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_batch_size_first_path_is_exercised(dtype):
    """The cases above run each path of this machine's kernel: the flat one (d = 1 on every
    instruction set, up to 8 floats on AVX-512), the phased one where shuffles are
    instructions (AVX, AVX-512)."""
    kernel = cpu_kernel.load_kernel(dtype)
    paths = {cpu_kernel.bsf_path(kernel, p[3], p[2]) for p, _ in CASES}
    assert {"flat", "along_d", "gemm"} <= paths
    assert ("phased" in paths) == bool(kernel.wp)
    assert kernel.bcast >= 1 and kernel.lanes % kernel.bcast == 0


def test_the_backward_runs_in_the_kernel_not_in_torch(monkeypatch):
    """dw comes from cpu_kernel.grad_factor and dX from the kernel on K^T: einsum (the
    former dw) and bmm are not called."""
    calls = []
    monkeypatch.setattr(torch, "einsum", lambda *a, **k: calls.append("einsum"))
    monkeypatch.setattr(torch, "bmm", lambda *a, **k: calls.append("bmm"))
    grad_factor = cpu_kernel.grad_factor
    monkeypatch.setattr(cpu_kernel, "grad_factor",
                        lambda *a: calls.append("grad_factor") or grad_factor(*a))
    p = KSPattern(2, 24, 16, 3)
    w = random_factor(p).requires_grad_()
    x = torch.randn(10, p.in_features, requires_grad=True)
    multiply_module.ks_multiply(x, w, p, "fused").sum().backward()
    assert calls == ["grad_factor"] and x.grad is not None and w.grad is not None


def test_half_precision_gradients_run_in_float32_and_keep_their_dtype():
    p = KSPattern(2, 16, 8, 4)
    g = torch.Generator().manual_seed(3)
    w0, x0 = random_factor(p, generator=g), torch.randn(5, p.in_features, generator=g)
    gy = torch.randn(5, p.out_features, generator=g)
    for dtype in (torch.float16, torch.bfloat16):
        w = w0.to(dtype).requires_grad_()
        x = x0.to(dtype).requires_grad_()
        (ks_multiply(x, w, p, "fused").float() * gy).sum().backward()
        assert w.grad.dtype == x.grad.dtype == dtype
        _, rx, rw = dense_gradients(x.float(), w.float(), gy, p)
        assert rel_err(x.grad, rx) <= 2e-2 and rel_err(w.grad, rw) <= 2e-2


@pytest.mark.parametrize("layout", ["bsf", "bsl"])
@pytest.mark.parametrize("pattern,batch", [((1, 100, 300, 1), 257), ((3, 7, 130, 2), 300),
                                           ((2, 33, 17, 5), 300), ((1, 9, 50, 12), 600),
                                           ((2, 7, 300, 16), 40), ((1, 48, 48, 24), 300)],
                         ids=str)
def test_two_threads_give_the_numbers_of_one(pattern, batch, layout):
    """Products large enough for the kernel's OpenMP team (B·abcd >= 2^18) give the same
    Y, dX and dw, bit for bit, with two threads as with one: every output is one task's."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(11)
    w = random_factor(p, generator=g)
    x = torch.randn(batch, p.in_features, generator=g)
    gy = torch.randn(batch, p.out_features, generator=g)
    assert batch * p.nnz >= 1 << 18
    previous = torch.get_num_threads()
    try:
        one = fused_gradients(x, w, gy, p, layout)
        torch.set_num_threads(2)
        two = fused_gradients(x, w, gy, p, layout)
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
