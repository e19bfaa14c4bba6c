"""The six algorithms of thesis Sec. 5.1.2/5.3 against the dense product X·K^T, in both
layouts and four dtypes, their gradients (torch.autograd.gradcheck in float64), and the
fused C kernel's tiling edge cases and fallback."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron import (
    ALGORITHMS,
    LAYOUTS,
    KSPattern,
    apply,
    cpu_kernel,
    ks_multiply,
    prepare,
    random_factor,
    to_dense,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def reference(x: torch.Tensor, w: torch.Tensor, p: KSPattern) -> torch.Tensor:
    """X K^T in float64 through the dense matrix (batch-size-first)."""
    return x.double() @ to_dense(w.double(), p).T


def run(x: torch.Tensor, w: torch.Tensor, p: KSPattern, algorithm: str, layout: str):
    """ks_multiply on x given batch-size-first, result returned batch-size-first."""
    if layout == "bsf":
        return ks_multiply(x, w, p, algorithm, layout)
    return ks_multiply(x.T.contiguous(), w, p, algorithm, layout).T


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5), st.integers(1, 4),
       st.integers(1, 9), st.sampled_from(sorted(TOL, key=str)), st.integers(0, 2**16))
@settings(max_examples=15, deadline=None)
def test_every_algorithm_and_layout_matches_dense(a, b, c, d, batch, dtype, seed):
    p = KSPattern(a, b, c, d)
    g = torch.Generator().manual_seed(seed)
    w = random_factor(p, torch.float32, generator=g).to(dtype)
    x = torch.randn(batch, p.in_features, generator=g).to(dtype)
    ref = reference(x, w, p)
    for algorithm in ALGORITHMS:
        for layout in LAYOUTS:
            y = run(x, w, p, algorithm, layout)
            assert y.dtype == dtype and y.shape == (batch, p.out_features)
            assert rel_err(y, ref) <= TOL[dtype], (algorithm, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("pattern", [(2, 3, 2, 2), (3, 1, 2, 2)], ids=str)
def test_gradcheck_float64(pattern, algorithm, layout):
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(1)
    w = random_factor(p, torch.float64, generator=g).requires_grad_()
    shape = (3, p.in_features) if layout == "bsf" else (p.in_features, 3)
    x = torch.randn(shape, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda u, v: ks_multiply(u, v, p, algorithm, layout), (x, w))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gradients_match_dense_in_float32(algorithm, layout):
    p = KSPattern(2, 8, 6, 3)
    g = torch.Generator().manual_seed(2)
    w0 = random_factor(p, generator=g)
    x0 = torch.randn(11, p.in_features, generator=g)
    gy = torch.randn(11, p.out_features, generator=g)
    w, x = w0.clone().requires_grad_(), x0.clone().requires_grad_()
    (run(x, w, p, algorithm, layout) * gy).sum().backward()
    wd, xd = w0.double().requires_grad_(), x0.double().requires_grad_()
    ((xd @ to_dense(wd, p).T) * gy.double()).sum().backward()
    assert rel_err(x.grad, xd.grad) <= 1e-5 and rel_err(w.grad, wd.grad) <= 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pattern,batch", [((1, 40, 300, 1), 13), ((2, 33, 17, 5), 601),
                                           ((1, 1, 1, 1), 1), ((3, 64, 16, 2), 7),
                                           ((2, 7, 300, 16), 11), ((1, 13, 5, 48), 9),
                                           ((3, 2, 2, 32), 5)], ids=str)
def test_fused_kernel_tiles(pattern, batch, dtype, layout):
    """c > 256 (K blocking accumulates), b not a multiple of the register tile, batch > 512
    (bsl batch tiles) and not a multiple of the row tiles; d a multiple of the vector lanes
    (batch-size-first runs along d, ``ks_bsf_d``), with c beyond its inner block and b not
    a multiple of its tile; x is not modified."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(4)
    w = random_factor(p, generator=g).to(dtype)
    x = torch.randn(batch, p.in_features, generator=g).to(dtype)
    before = x.clone()
    assert rel_err(run(x, w, p, "fused", layout), reference(x, w, p)) <= TOL[dtype]
    assert torch.equal(x, before)


def cpu_flags() -> set[str]:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    return {f for line in lines if line.startswith("flags") for f in line.split(":")[1].split()}


# (extra flags, instruction set the kernel reports, vector bytes, MR): each build an x86 CPU
# with these flags can run, down to SSE2.
X86_BUILDS = [("", None, None, None),
              ("-mno-avx512f", "avx2", 32, 6),
              ("-mno-avx512f -mno-avx2 -mno-fma", "avx", 32, 6),
              ("-mno-avx", "sse2", 16, 6)]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 builds")
@pytest.mark.parametrize("extra,isa,vbytes,mr", X86_BUILDS, ids=lambda v: str(v))
def test_each_instruction_set_build_has_its_tile_and_matches_dense(extra, isa, vbytes, mr,
                                                                   monkeypatch):
    """The tile follows the instruction set the compiler targets (-march=native, minus
    what PATHLIFT_KRON_CFLAGS removes): AVX-512 64-byte vectors, 12 x 32 float32 and 4 x 6
    vectors along d; AVX2/AVX 32 bytes, 6 x 16 and 2 x 6; SSE2 16 bytes, 6 x 8 and 2 x 6.
    Every build is exact, products and gradients, on every batch-size-first path (d = 16
    runs along d; d = 1, 2 flat; d = 6, 12 phased where the build has shuffles)."""
    monkeypatch.setenv("PATHLIFT_KRON_CFLAGS", extra)
    kernel = cpu_kernel.load_kernel(torch.float32)
    assert kernel is not None and [f for f in kernel.flags if f.startswith("-mno-")] == \
        extra.split()
    if isa is None:  # native: what the CPU has
        isa, vbytes, mr = (("avx512", 64, 12) if "avx512f" in cpu_flags() else
                           ("avx2", 32, 6) if "avx2" in cpu_flags() else (kernel.isa, None, None))
    if isa == "avx2" and "avx2" not in cpu_flags():
        pytest.skip("the CPU has no AVX2")
    assert kernel.isa == isa
    assert (kernel.vector_bytes, kernel.mr) == (vbytes or kernel.vector_bytes, mr or kernel.mr)
    assert kernel.nr == 2 * kernel.vector_bytes // 4
    assert (kernel.dr, kernel.dk) == ((4, 6) if kernel.vector_bytes == 64 else (2, 6))
    assert isa in kernel.describe()
    for pattern, batch in [((1, 40, 300, 1), 13), ((2, 33, 17, 5), 601), ((3, 64, 16, 2), 7),
                           ((2, 7, 300, 16), 9), ((1, 9, 50, 12), 11), ((2, 5, 31, 6), 6)]:
        p = KSPattern(*pattern)
        g = torch.Generator().manual_seed(5)
        w, x = random_factor(p, generator=g), torch.randn(batch, p.in_features, generator=g)
        gy = torch.randn(batch, p.out_features, generator=g)
        wd, xd = w.double().requires_grad_(), x.double().requires_grad_()
        ((xd @ to_dense(wd, p).T) * gy.double()).sum().backward()
        for layout in LAYOUTS:
            wf, xf = w.clone().requires_grad_(), x.clone().requires_grad_()
            y = run(xf, wf, p, "fused", layout)
            (y * gy).sum().backward()
            assert rel_err(y, reference(x, w, p)) <= 1e-5
            assert rel_err(xf.grad, xd.grad) <= 1e-5 and rel_err(wf.grad, wd.grad) <= 1e-5


@pytest.mark.parametrize("pattern,batch", [((1, 40, 300, 1), 13), ((2, 33, 17, 5), 601),
                                           ((3, 64, 16, 2), 7), ((2, 7, 301, 16), 9),
                                           ((4, 64, 64, 1), 37)])
def test_bfloat16_runs_the_bf16_kernel_with_float32_accumulation(pattern, batch):
    """bf16 operands, float32 accumulation, one rounding to bf16: every entry within half a
    bf16 unit (at most 2^-8 relative) of the float64 product of the same bf16 values (plus the
    float32 accumulation's error), c odd and over the inner block (float32 output rounded
    after the last block) or within it (rounded as stored), b past the tile, d > 1;
    the bf16 kernel (bf16 dot products) where the CPU has AVX512-BF16, the float32 kernel
    elsewhere; gradients through it match the dense product."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(6)
    w = random_factor(p, generator=g).to(torch.bfloat16).requires_grad_()
    x = torch.randn(batch, p.in_features, generator=g).to(torch.bfloat16)
    op = prepare(w, p, "fused")
    assert ("bf16" in op) == ("avx512_bf16" in cpu_flags() and platform.machine() == "x86_64")
    y = apply(x, op, p, "fused")
    ref = x.double() @ to_dense(w.detach().double(), p).T
    assert y.dtype == torch.bfloat16
    bound = 2.0**-8 * ref.abs() + 1e-5 * ref.abs().max()
    assert ((y.double() - ref).abs() <= bound).all()
    gy = torch.randn(y.shape, generator=g).to(torch.bfloat16)
    (y.float() * gy.float()).sum().backward()
    leaf = w.detach().double().requires_grad_()
    ((x.double() @ to_dense(leaf, p).T) * gy.double()).sum().backward()
    assert rel_err(w.grad, leaf.grad) <= 2e-2


def test_fused_falls_back_with_a_warning_without_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="falling back to the einsum"):
        assert cpu_kernel.load_kernel(torch.float32) is None
    p = KSPattern(2, 3, 4, 5)
    w, x = random_factor(p), torch.randn(3, p.in_features)
    assert rel_err(ks_multiply(x, w, p, "fused"), reference(x, w, p)) <= 1e-5


def test_bad_arguments_raise_typed_errors():
    p = KSPattern(2, 3, 4, 5)
    w = random_factor(p)
    x = torch.randn(3, p.in_features)
    with pytest.raises(InvalidParameterError, match="unknown algorithm"):
        ks_multiply(x, w, p, "magic")
    with pytest.raises(InvalidParameterError, match="unknown layout"):
        ks_multiply(x, w, p, "bmm", "bfs")
    with pytest.raises(ShapeError, match="N = acd = 40"):
        ks_multiply(x, w, p, "bmm", "bsl")
    with pytest.raises(ShapeError, match="shape"):
        ks_multiply(x, w[:1], p, "einsum")


def test_no_sparse_warnings_leak():
    p = KSPattern(2, 3, 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for algorithm in ("sparse", "bsr"):
            ks_multiply(torch.randn(2, p.in_features), random_factor(p), p, algorithm)


TRITON_CHECK = """
import torch
from pathlift.kron import KSPattern, random_factor, to_dense, triton_kernel
for pattern, batch in [((1, 64, 64, 1), 70), ((2, 48, 192, 4), 33), ((1, 300, 70, 3), 130)]:
    p = KSPattern(*pattern)
    w, x = random_factor(p), torch.randn(batch, p.in_features)
    ref = x.double() @ to_dense(w.double(), p).T
    for layout in ("bsf", "bsl"):
        y = triton_kernel.launch(x if layout == "bsf" else x.T.contiguous(), w, p, layout)
        y = y if layout == "bsf" else y.T
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5, (p, layout)
print("ok")
"""


def test_triton_kernel_in_interpreter_mode():
    """The Triton kernel's indexing, run by Triton's CPU interpreter (TRITON_INTERPRET=1):
    checks the GPU code path on machines without a GPU, when triton is installed."""
    pytest.importorskip("triton")
    env = os.environ | {"TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
