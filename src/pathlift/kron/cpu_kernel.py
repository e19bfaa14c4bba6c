"""The fused CPU kernel of Algorithm 5.1.1: a small C GEMM compiled once with the system C
compiler and called through ctypes.

For every pair (i, j) of Algorithm 5.1.1 it multiplies X[:, col] by K^T[col, row] reading X
and writing Y in place through their strides (col and row are spaced by d), so neither of
the two permutation passes of bmm (Algorithm 5.1.2, lines 1 and 3) touches memory. The
micro-kernel is the classic register-blocked one (6 rows × 2 vectors of 64 bytes; the
strided operand is broadcast scalar by scalar, the contiguous one is loaded as vectors):
batch-size-first broadcasts X and loads the packed weights, batch-size-last broadcasts the
weights and loads X along the batch.

The shared objects are built on first use (``gcc -O3 -march=native -fopenmp``, about a
second each) into ``$PATHLIFT_CACHE_DIR`` (default ``~/.cache/pathlift``), keyed by a hash
of the source, the flags and the machine, so a fresh machine builds its own and nothing
prebuilt ships. ``load_kernel`` returns None (and warns once) when no compiler works.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

__all__ = ["cache_dir", "fused_bsf", "fused_bsl", "load_kernel", "pad_to"]

SOURCE = r"""
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* real is float or double (-Dreal=...). A vector is 64 bytes, loaded unaligned. */
typedef real vec __attribute__((vector_size(64), aligned(sizeof(real))));
#define LANES ((long)(64 / sizeof(real)))
#define MR 6
#define NR (2 * LANES)
#define KC 256

static inline long lmin(long x, long y) { return x < y ? x : y; }

/* C[r, t] (+)= sum_{l < kc} A[r*ar + l*ak] * B[l*bk + t] for r < mr, t < nr; B has NR
   readable columns. */
static inline void micro(long kc, const real *A, long ar, long ak, const real *B, long bk,
                         real *C, long cr, long cc, long mr, long nr, int accumulate)
{
    vec acc[MR][2];
    const real *rows[MR];
    for (int r = 0; r < MR; r++) {
        acc[r][0] = (vec){0};
        acc[r][1] = (vec){0};
        rows[r] = A + (r < mr ? r : 0) * ar;
    }
    for (long l = 0; l < kc; l++) {
        const vec b0 = *(const vec *)(B + l * bk);
        const vec b1 = *(const vec *)(B + l * bk + LANES);
        const long off = l * ak;
        for (int r = 0; r < MR; r++) {
            const real s = rows[r][off];
            acc[r][0] += s * b0;
            acc[r][1] += s * b1;
        }
    }
    if (cc == 1 && nr == NR) {
        for (long r = 0; r < mr; r++) {
            vec *c0 = (vec *)(C + r * cr), *c1 = (vec *)(C + r * cr + LANES);
            if (accumulate) { *c0 += acc[r][0]; *c1 += acc[r][1]; }
            else { *c0 = acc[r][0]; *c1 = acc[r][1]; }
        }
        return;
    }
    for (long r = 0; r < mr; r++)
        for (long t = 0; t < nr; t++) {
            real v = acc[r][t / LANES][t % LANES];
            real *dst = C + r * cr + t * cc;
            *dst = accumulate ? *dst + v : v;
        }
}

/* C (m x n) = A (m x k, strides ar, ak) @ B (k x n, row stride bk, unit column stride,
   bcols >= n readable columns) with C strides (cr, cc). */
static void gemm(long m, long n, long k, const real *A, long ar, long ak, const real *B,
                 long bk, long bcols, real *C, long cr, long cc)
{
    real pack[KC * NR];
    for (long k0 = 0; k0 < k; k0 += KC) {
        const long kc = lmin(KC, k - k0);
        for (long n0 = 0; n0 < n; n0 += NR) {
            const long nr = lmin(NR, n - n0);
            const real *Bp = B + k0 * bk + n0;
            long bks = bk;
            if (n0 + NR > bcols) {
                memset(pack, 0, sizeof pack);
                for (long l = 0; l < kc; l++)
                    memcpy(pack + l * NR, Bp + l * bk, nr * sizeof(real));
                Bp = pack;
                bks = NR;
            }
            for (long m0 = 0; m0 < m; m0 += MR)
                micro(kc, A + m0 * ar + k0 * ak, ar, ak, Bp, bks, C + m0 * cr + n0 * cc,
                      cr, cc, lmin(MR, m - m0), nr, k0 > 0);
        }
    }
}

/* Batch-size-first: x (B, a, c, d), y (B, a, b, d), wp (a, d, c, bpad) with
   wp[i, j, l, k] = w[i, k, l, j]. Rows of the GEMM are the batch, tiled by mc. */
void ks_bsf(const real *x, const real *wp, real *y, long B, long a, long b, long c, long d,
            long bpad, long mc, int threads)
{
    const long N = a * c * d, M = a * b * d, nb = (B + mc - 1) / mc;
    #pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads)
    for (long t = 0; t < nb; t++)
        for (long i = 0; i < a; i++) {
            const long n0 = t * mc, rows = lmin(mc, B - n0);
            for (long j = 0; j < d; j++)
                gemm(rows, b, c, x + n0 * N + i * c * d + j, N, d,
                     wp + (i * d + j) * c * bpad, bpad, bpad,
                     y + n0 * M + i * b * d + j, M, d);
        }
}

/* Batch-size-last: x (a, c, d, B), y (a, b, d, B), wp (a, d, b, c) with
   wp[i, j, k, l] = w[i, k, l, j]. Columns of the GEMM are the batch, tiled by nc. */
void ks_bsl(const real *x, const real *wp, real *y, long B, long a, long b, long c, long d,
            long nc, int threads)
{
    const long nb = (B + nc - 1) / nc;
    #pragma omp parallel for collapse(3) schedule(dynamic) num_threads(threads)
    for (long i = 0; i < a; i++)
        for (long j = 0; j < d; j++)
            for (long t = 0; t < nb; t++) {
                const long n0 = t * nc;
                gemm(b, lmin(nc, B - n0), c, wp + (i * d + j) * b * c, c, 1,
                     x + (i * c * d + j) * B + n0, d * B, B - n0,
                     y + (i * b * d + j) * B + n0, d * B, 1);
            }
}
"""

_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
_TYPES = {torch.float32: "float", torch.float64: "double"}
LANES = {torch.float32: 16, torch.float64: 8}  # 64-byte vectors
NR = {dt: 2 * lanes for dt, lanes in LANES.items()}


def cache_dir() -> Path:
    """Where the compiled kernels live: $PATHLIFT_CACHE_DIR or ~/.cache/pathlift."""
    root = os.environ.get("PATHLIFT_CACHE_DIR") or Path.home() / ".cache" / "pathlift"
    return Path(root) / "kron"


def _cpu_features() -> str:
    """The model name and instruction-set flags -march=native compiles for (Linux), not the
    lines of /proc/cpuinfo that change at run time (clock speed)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return ""
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in cpuinfo.read_text().splitlines()
                             if line.startswith(wanted)}))


def _compile(ctype: str) -> Path:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    key = hashlib.sha256("\0".join(
        (SOURCE, ctype, compiler, *_FLAGS, platform.machine(), platform.processor(),
         _cpu_features())).encode()).hexdigest()[:16]
    target = cache_dir() / f"ks_fused_{ctype}_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "ks_fused.c"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        proc = subprocess.run([compiler, *_FLAGS, f"-Dreal={ctype}", str(src), "-o", str(out)],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"{compiler} failed:\n{proc.stderr[-2000:]}")
        os.replace(out, target)  # atomic: concurrent builders agree on one file
    return target


@functools.cache
def load_kernel(dtype: torch.dtype) -> ctypes.CDLL | None:
    """The compiled kernel for float32 or float64, or None (with a warning) if it cannot be
    built; the caller then falls back to the einsum algorithm."""
    try:
        lib = ctypes.CDLL(str(_compile(_TYPES[dtype])))
    except (RuntimeError, OSError) as err:
        warnings.warn(f"pathlift.kron: the fused CPU kernel could not be built ({err}); "
                      "falling back to the einsum algorithm", RuntimeWarning, stacklevel=3)
        return None
    long, ptr = ctypes.c_long, ctypes.c_void_p
    lib.ks_bsf.argtypes = [ptr, ptr, ptr, *[long] * 7, ctypes.c_int]
    lib.ks_bsl.argtypes = [ptr, ptr, ptr, *[long] * 6, ctypes.c_int]
    lib.ks_bsf.restype = lib.ks_bsl.restype = None
    return lib


def pad_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _row_tile(c: int, d: int, itemsize: int) -> int:
    """Batch rows per task (bsf): the X block of one task (rows × c × d) should stay in L2."""
    rows = (512 * 1024) // max(1, c * d * itemsize)
    return max(6, min(240, rows // 6 * 6))


def _threads(batch: int, shape: tuple[int, ...]) -> int:
    """One thread for small products: waking an OpenMP team costs more than it saves."""
    return torch.get_num_threads() if batch * math.prod(shape) >= 1 << 18 else 1


def fused_bsf(lib: ctypes.CDLL, x: torch.Tensor, wp: torch.Tensor, shape: tuple[int, ...]
              ) -> torch.Tensor:
    """Y (B, abd) from x (B, acd) contiguous and wp (a, d, c, bpad) contiguous."""
    a, b, c, d = shape
    batch = x.shape[0]
    y = torch.empty(batch, a * b * d, dtype=x.dtype)
    lib.ks_bsf(x.data_ptr(), wp.data_ptr(), y.data_ptr(), batch, a, b, c, d, wp.shape[-1],
               _row_tile(c, d, x.element_size()), _threads(batch, shape))
    return y


def fused_bsl(lib: ctypes.CDLL, x: torch.Tensor, wp: torch.Tensor, shape: tuple[int, ...]
              ) -> torch.Tensor:
    """Y (abd, B) from x (acd, B) contiguous and wp (a, d, b, c) contiguous."""
    a, b, c, d = shape
    batch = x.shape[1]
    y = torch.empty(a * b * d, batch, dtype=x.dtype)
    lib.ks_bsl(x.data_ptr(), wp.data_ptr(), y.data_ptr(), batch, a, b, c, d, 512,
               _threads(batch, shape))
    return y
