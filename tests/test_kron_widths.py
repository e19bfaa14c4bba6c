"""The fused kernel built for each vector width this CPU runs (``vector_width``: 512 the
CPU's own on AVX-512, 256 its AVX2 build, 128 SSE2), so the narrower builds an AVX2-only
machine runs are tested on a wider one: its tiles, and products and gradients against
bmm (and the dense product in float64) on every batch-size-first path, on random
patterns (hypothesis over (a, b, c, d), batch sizes 1 and odd ones, float32 and float64,
both layouts)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kron_fixtures import WIDTHS, X86, isolated_kron_cache  # noqa: F401
from pathlift.errors import InvalidParameterError
from pathlift.kron import (
    KSLinear,
    KSPattern,
    cache,
    cpu_kernel,
    ks_multiply,
    random_factor,
    vector_width,
)
from pathlift.kron.multiply import _cached_prepare
from test_kron_backward import CASES, dense_gradients, fused_gradients, rel_err

ISA = {512: "avx512", 256: "avx2", 128: "sse2"}
each_width = pytest.mark.parametrize("bits", WIDTHS, ids=lambda b: f"{b}bit")


@each_width
def test_each_width_builds_its_kernel_with_tiles_for_its_registers(bits):
    """32 registers (AVX-512): 12 x 2 GEMM vectors and 6 x 4 flat; 16 (AVX2, SSE2): 6 x 2
    and 6 x 2, so no tile's accumulators spill."""
    for dtype in (torch.float32, torch.float64):
        with vector_width(bits):
            kernel = cpu_kernel.current_kernel(dtype)
        assert kernel.vector_bytes * 8 == bits
        if X86:
            assert kernel.isa == ISA[bits] or (bits == 256 and kernel.isa == "avx")
        wide = bits == 512 or not X86
        assert (kernel.mr, kernel.nr) == ((12 if wide else 6), 2 * kernel.lanes)
        assert kernel.nf == (4 if wide else 2) * kernel.lanes
        assert f"{kernel.vector_bytes}-byte vectors" in kernel.describe()


@each_width
def test_the_cases_run_every_path_of_each_width(bits):
    """test_kron_backward's float64 check, run at every width, covers the flat, phased
    (where the build has shuffles), along-d and GEMM paths of each."""
    for dtype in (torch.float32, torch.float64):
        with vector_width(bits):
            kernel = cpu_kernel.current_kernel(dtype)
        paths = {cpu_kernel.bsf_path(kernel, p[3], p[2]) for p, _ in CASES}
        assert {"flat", "along_d", "gemm"} <= paths
        assert ("phased" in paths) == bool(kernel.wp)


patterns = st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 140),
                     st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32]))
batches = st.one_of(st.just(1), st.integers(1, 40).map(lambda n: 2 * n + 1),
                    st.integers(2, 300))


@each_width
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=patterns, batch=batches, dtype=st.sampled_from([torch.float32, torch.float64]),
       layout=st.sampled_from(["bsf", "bsl"]), seed=st.integers(0, 2**16))
def test_each_width_matches_bmm_forward_and_backward(bits, pattern, batch, dtype, layout,
                                                     seed):
    """Y, dX and dw of the kernel of this width against bmm's: in float64 to 1e-12, in
    float32 both within 1e-5 of the float64 dense product (and of each other)."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(seed)
    w = random_factor(p, dtype, generator=g)
    x = torch.randn(batch, p.in_features, dtype=dtype, generator=g)
    gy = torch.randn(batch, p.out_features, dtype=dtype, generator=g)
    with vector_width(bits):
        fused = fused_gradients(x, w, gy, p, layout)
        with torch.no_grad():  # the no-autograd product (a prepared, packed factor)
            y = ks_multiply(x if layout == "bsf" else x.T.contiguous(), w, p, "fused", layout)
    bmm = fused_gradients(x, w, gy, p, layout, "bmm")
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert all(rel_err(a, b) <= 2 * tol for a, b in zip(fused, bmm, strict=True))
    if dtype == torch.float32:
        ref = dense_gradients(x, w, gy, p)
        assert all(rel_err(a, b) <= tol for a, b in zip(fused, ref, strict=True))
    assert rel_err(y if layout == "bsf" else y.T, bmm[0]) <= 2 * tol


def test_prepared_factors_and_the_measurement_cache_follow_the_width():
    """A factor prepared at one width is not reused at another (``ks_multiply``'s and
    KSLinear's caches), and ``auto``'s measurements are per width (the fingerprint)."""
    if len(WIDTHS) < 2:
        pytest.skip("one vector width on this machine")
    p = KSPattern(1, 12, 10, 6)
    w = random_factor(p)
    layer = KSLinear([p], algorithm="fused")
    x = torch.randn(3, p.in_features)
    seen, prints, outputs = set(), set(), []
    for bits in WIDTHS:
        with vector_width(bits), torch.no_grad():
            seen.add(_cached_prepare(w, p, "fused")["kernel"].vector_bytes)
            seen.add(layer._prepared(0, "fused")["kernel"].vector_bytes * 10)
            prints.add(cache.fingerprint())
            outputs.append(layer(x))
    assert seen == {b // 8 for b in WIDTHS} | {b // 8 * 10 for b in WIDTHS}
    assert len(prints) == len(WIDTHS)
    assert all(rel_err(y, outputs[0]) <= 1e-5 for y in outputs)


def test_vector_width_refuses_other_widths_and_restores_the_previous_one():
    with pytest.raises(InvalidParameterError, match="choose 128, 256, 512 or None"):
        vector_width(384)
    outer = vector_width(WIDTHS[-1])
    with outer:
        with vector_width(None):
            assert cpu_kernel.width_flags() == ()
        assert cpu_kernel.current_kernel(torch.float32).vector_bytes * 8 == WIDTHS[-1]
    assert cpu_kernel.width_flags() == ()
    assert cpu_kernel.current_kernel(torch.float32) is cpu_kernel.load_kernel(torch.float32)


@pytest.mark.skipif(X86, reason="narrower builds are refused off x86")
def test_narrower_builds_are_refused_off_x86():
    with pytest.raises(InvalidParameterError, match="only x86"):
        vector_width(128)
