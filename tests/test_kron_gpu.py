"""The Triton kernel (``fused`` on CUDA) against the dense product; skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from pathlift.kron import LAYOUTS, KSPattern, ks_multiply, random_factor, to_dense, triton_kernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def test_triton_module_imports_without_triton():
    assert isinstance(triton_kernel.available(), bool)


@pytest.mark.skipif(not triton_kernel.available(), reason="needs triton")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("pattern", [(1, 64, 64, 1), (2, 48, 192, 4), (3, 5, 7, 2),
                                     (1, 300, 70, 3)], ids=str)
def test_triton_fused_matches_dense(pattern, dtype, layout):
    p = KSPattern(*pattern)
    g = torch.Generator(device="cuda").manual_seed(0)
    w = random_factor(p, torch.float32, "cuda", g).to(dtype)
    x = torch.randn(333, p.in_features, device="cuda", generator=g).to(dtype)
    ref = x.double() @ to_dense(w.double(), p).T
    xin = x if layout == "bsf" else x.T.contiguous()
    y = ks_multiply(xin, w, p, "fused", layout)
    y = y if layout == "bsf" else y.T
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err <= TOL[dtype]


@pytest.mark.skipif(not triton_kernel.available(), reason="needs triton")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_fused_gradients_match_dense(layout):
    p = KSPattern(2, 32, 16, 3)
    w = random_factor(p, torch.float32, "cuda").requires_grad_()
    x = torch.randn(40, p.in_features, device="cuda", requires_grad=True)
    gy = torch.randn(40, p.out_features, device="cuda")
    xin = x if layout == "bsf" else x.T
    y = ks_multiply(xin, w, p, "fused", layout)
    ((y if layout == "bsf" else y.T) * gy).sum().backward()
    wd = w.detach().double().requires_grad_()
    xd = x.detach().double().requires_grad_()
    ((xd @ to_dense(wd, p).T) * gy.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), xd.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-4, atol=1e-4)
