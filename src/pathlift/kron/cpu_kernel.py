"""The fused CPU kernel of Algorithm 5.1.1: a small C GEMM compiled once with the system C
compiler for the machine it runs on, and called through ctypes.

For every pair (i, j) of Algorithm 5.1.1 it multiplies X[:, col] by K^T[col, row] reading X
and writing Y in place through their strides (col and row are spaced by d), so neither of
the two permutation passes of bmm (Algorithm 5.1.2, lines 1 and 3) goes through memory.
The product is the classic register-blocked GEMM (Goto & van de Geijn 2008; the tile sizes
are those of the BLIS micro-kernels for each instruction set): an MR × NR tile of Y lives
in MR·NR/LANES vector registers; per step of the inner dimension the micro-kernel loads
NR/LANES vectors of one operand and broadcasts MR scalars of the other. Both operands of
the micro-kernel are contiguous: the weights are packed once (``pack``) into slivers of
NR columns (batch-size-first) or MR rows (batch-size-last), and the strided block
X[rows, col] of batch-size-first is packed into MR-row slivers per block of 256 columns,
a copy that stays in the L2 cache.

The vector width and the tile come from the instruction set the compiler targets
(``-march=native`` unless ``PATHLIFT_KRON_CFLAGS`` adds flags such as ``-mno-avx512f``):

    AVX-512   64-byte vectors, 32 registers: MR = 12, NR = 2 vectors (24 accumulators)
    AVX2/AVX  32-byte vectors, 16 registers: MR = 6,  NR = 2 vectors (12 accumulators)
    NEON      16-byte vectors, 32 registers: MR = 12, NR = 2 vectors (24 accumulators)
    SSE2 and anything else: 16-byte vectors, MR = 6, NR = 2 vectors

so the accumulators, the loaded vectors and a broadcast fit in the register file (the
earlier kernel hard-coded 64-byte vectors and a 6 × 2 tile: 24 registers' worth of
accumulators, which spill on AVX2's 16 and made it 20-50x slower than bmm there).

The shared objects are built on first use (``gcc -O3 -march=native -fopenmp``, about a
second each) into ``$PATHLIFT_CACHE_DIR`` (default ``~/.cache/pathlift``), keyed by a hash
of the source, the compiler, the flags and the CPU, so a fresh machine builds its own and
nothing prebuilt ships. ``load_kernel`` returns None (and warns once) when no compiler
works; the caller then runs einsum.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pathlift.kron.machine import cache_dir, cpu_features

__all__ = ["CpuKernel", "build_flags", "fused_bsf", "fused_bsl", "load_kernel", "pack"]

SOURCE = r"""
#include <stdlib.h>
#include <string.h>

/* real is float or double (-Dreal=...). The vector width, the register file and thus the
   micro-tile MR x NR come from the instruction set the compiler targets. */
#if defined(__AVX512F__)
#define VBYTES 64
#define MR 12
#define DR 4
#define DK 6
#define ISA "avx512"
#elif defined(__AVX2__)
#define VBYTES 32
#define MR 6
#define DR 2
#define DK 6
#define ISA "avx2"
#elif defined(__AVX__)
#define VBYTES 32
#define MR 6
#define DR 2
#define DK 6
#define ISA "avx"
#elif defined(__ARM_NEON) || defined(__aarch64__)
#define VBYTES 16
#define MR 12
#define DR 4
#define DK 6
#define ISA "neon"
#elif defined(__SSE2__)
#define VBYTES 16
#define MR 6
#define DR 2
#define DK 6
#define ISA "sse2"
#else
#define VBYTES 16
#define MR 6
#define DR 2
#define DK 6
#define ISA "generic"
#endif

typedef real vec __attribute__((vector_size(VBYTES), aligned(sizeof(real))));

/* Keep a loaded vector in a register: without it GCC folds the load into each of the DR
   multiply-adds that use it, which makes the loop load-bound. */
#if defined(__x86_64__) || defined(__i386__)
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#elif defined(__aarch64__)
#define IN_REGISTER(v) __asm__("" : "+w"(v))
#else
#define IN_REGISTER(v) (void)0
#endif
#define LANES ((long)(VBYTES / sizeof(real)))
#define NV 2
#define NR (NV * LANES)
#ifndef KC
#define KC 256
#endif

static inline long lmin(long x, long y) { return x < y ? x : y; }

const char *ks_isa(void) { return ISA; }

void ks_tile(long *out) { out[0] = VBYTES; out[1] = MR; out[2] = NR; out[3] = DR; out[4] = DK; }

/* C[r*cr + t*cc] (+)= sum_{l < kc} Ap[l*MR + r] * Bp[l*bk + t] for r < mr, t < nr; the
   operands hold a full MR x NR tile (zero-padded). */
static inline void micro(long kc, const real *restrict Ap, const real *restrict Bp, long bk,
                         real *C, long cr, long cc, long mr, long nr, int accumulate)
{
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = (vec){0};
    for (long l = 0; l < kc; l++) {
        vec bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = *(const vec *)(Bp + l * bk + v * LANES);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const real s = Ap[l * MR + r];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] += s * bv[v];
        }
    }
    if (cc == 1 && nr == NR) {
        for (long r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                vec *cv = (vec *)(C + r * cr + v * LANES);
                if (accumulate) *cv += acc[r][v]; else *cv = acc[r][v];
            }
        return;
    }
    for (long r = 0; r < mr; r++)
        for (long t = 0; t < nr; t++) {
            const real v = acc[r][t / LANES][t % LANES];
            real *dst = C + r * cr + t * cc;
            *dst = accumulate ? *dst + v : v;
        }
}

/* Ap[m0 * kc + l * MR + r] = A[(m0 + r) * ar + l * ak]: MR-row slivers, zero-padded. */
static void pack_rows(long m, long kc, const real *A, long ar, long ak, real *Ap)
{
    for (long m0 = 0; m0 < m; m0 += MR) {
        const long mr = lmin(MR, m - m0);
        real *dst = Ap + m0 * kc;
        for (long l = 0; l < kc; l++) {
            long r = 0;
            for (; r < mr; r++) dst[l * MR + r] = A[(m0 + r) * ar + l * ak];
            for (; r < MR; r++) dst[l * MR + r] = 0;
        }
    }
}

/* Bp[n0 * kc + l * NR + t] = B[l * bk + n0 + t]: NR-column slivers, zero-padded. */
static void pack_cols(long n, long kc, const real *B, long bk, real *Bp)
{
    for (long n0 = 0; n0 < n; n0 += NR) {
        const long nr = lmin(NR, n - n0);
        real *dst = Bp + n0 * kc;
        for (long l = 0; l < kc; l++) {
            const real *src = B + l * bk + n0;
            if (nr == NR) {
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++)
                    *(vec *)(dst + l * NR + v * LANES) = *(const vec *)(src + v * LANES);
            } else {
                long t = 0;
                for (; t < nr; t++) dst[l * NR + t] = src[t];
                for (; t < NR; t++) dst[l * NR + t] = 0;
            }
        }
    }
}

/* Batch-size-first: x (B, a, c, d), y (B, a, b, d); ws (a, d, ceil(b/NR), c, NR) with
   ws[i, j, s, l, t] = w[i, s*NR + t, l, j]. Tasks: blocks of mc rows of the batch x a. */
int ks_bsf(const real *x, const real *ws, real *y, long B, long a, long b, long c, long d,
           long mc, int threads)
{
    const long N = a * c * d, M = a * b * d, nb = (B + mc - 1) / mc, nsl = (b + NR - 1) / NR;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        real *Ap = malloc(sizeof(real) * ((mc + MR - 1) / MR) * MR * KC);
        if (!Ap) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(dynamic)
        for (long t = 0; t < nb; t++)
            for (long i = 0; i < a; i++) {
                if (!Ap) continue;
                const long n0 = t * mc, rows = lmin(mc, B - n0);
                for (long j = 0; j < d; j++) {
                    const real *A = x + n0 * N + i * c * d + j;
                    const real *W = ws + (i * d + j) * nsl * c * NR;
                    real *C = y + n0 * M + i * b * d + j;
                    for (long k0 = 0; k0 < c; k0 += KC) {
                        const long kc = lmin(KC, c - k0);
                        pack_rows(rows, kc, A + k0 * d, N, d, Ap);
                        for (long s = 0; s < nsl; s++)
                            for (long m0 = 0; m0 < rows; m0 += MR)
                                micro(kc, Ap + m0 * kc, W + (s * c + k0) * NR, NR,
                                      C + m0 * M + s * NR * d, M, d, lmin(MR, rows - m0),
                                      lmin(NR, b - s * NR), k0 > 0);
                    }
                }
            }
        free(Ap);
    }
    return failed;
}

/* Y[r*yn + q*yk + t] (+)= sum_{l < kc} X[r*xn + l*xl + t] * W[l*wl + q*LANES + t] for
   r < nr, q < kr, t < LANES: a DR x DK tile of vectors along the contiguous index j. */
static inline void micro_d(long kc, const real *X, long xn, long xl, const real *restrict W,
                           long wl, real *Y, long yn, long yk, long nr, long kr,
                           int accumulate)
{
    vec acc[DR][DK];
    const real *rows[DR];
#pragma GCC unroll 8
    for (int r = 0; r < DR; r++) {
        rows[r] = X + (r < nr ? r : 0) * xn;
#pragma GCC unroll 8
        for (int q = 0; q < DK; q++) acc[r][q] = (vec){0};
    }
    for (long l = 0; l < kc; l++) {
        vec xv[DR];
#pragma GCC unroll 8
        for (int r = 0; r < DR; r++) xv[r] = *(const vec *)(rows[r] + l * xl);
#pragma GCC unroll 8
        for (int q = 0; q < DK; q++) {
            vec wq = *(const vec *)(W + l * wl + q * LANES);
            IN_REGISTER(wq);
#pragma GCC unroll 8
            for (int r = 0; r < DR; r++) acc[r][q] += xv[r] * wq;
        }
    }
    for (long r = 0; r < nr; r++)
        for (long q = 0; q < kr; q++) {
            vec *dst = (vec *)(Y + r * yn + q * yk);
            if (accumulate) *dst += acc[r][q]; else *dst = acc[r][q];
        }
}

/* Batch-size-first with d a multiple of LANES: the vectors run along j, the contiguous
   index of both X and Y, so nothing is gathered or scattered. wv (a, d/LANES,
   ceil(b/DK), c, DK, LANES) zero-padded, wv[i, v, s, l, q, t] = w[i, s*DK + q, l,
   v*LANES + t]: the weights of one tile step are contiguous. KCD steps of the inner
   dimension keep a tile's weights (KCD x DK vectors) in the L1 cache. Tasks: blocks of
   mc batch rows x a x d/LANES. */
#define KCD (24576 / (DK * VBYTES))
int ks_bsf_d(const real *x, const real *wv, real *y, long B, long a, long b, long c, long d,
             long mc, int threads)
{
    const long N = a * c * d, M = a * b * d, nv = d / LANES, nb = (B + mc - 1) / mc;
    const long nks = (b + DK - 1) / DK;
    #pragma omp parallel for collapse(3) schedule(dynamic) num_threads(threads)
    for (long t = 0; t < nb; t++)
        for (long i = 0; i < a; i++)
            for (long v = 0; v < nv; v++) {
                const long n0 = t * mc, rows = lmin(mc, B - n0);
                const real *W = wv + (i * nv + v) * nks * c * DK * LANES;
                const real *X = x + n0 * N + i * c * d + v * LANES;
                real *Y = y + n0 * M + i * b * d + v * LANES;
                for (long l0 = 0; l0 < c; l0 += KCD)
                    for (long s = 0; s < nks; s++)
                        for (long m0 = 0; m0 < rows; m0 += DR)
                            micro_d(lmin(KCD, c - l0), X + m0 * N + l0 * d, N, d,
                                    W + (s * c + l0) * DK * LANES, DK * LANES,
                                    Y + m0 * M + s * DK * d, M, d, lmin(DR, rows - m0),
                                    lmin(DK, b - s * DK), l0 > 0);
            }
    return 0;
}

/* Batch-size-last: x (a, c, d, B), y (a, b, d, B); wr (a, d, ceil(b/MR), c, MR) with
   wr[i, j, s, l, r] = w[i, s*MR + r, l, j]. Tasks: (i, j) x blocks of nc batch columns;
   the block X[col, batch block] is packed into NR-column slivers (rows of X are d*B apart,
   a stride that maps them to few cache sets). */
int ks_bsl(const real *x, const real *wr, real *y, long B, long a, long b, long c, long d,
           long nc, int threads)
{
    const long nb = (B + nc - 1) / nc, msl = (b + MR - 1) / MR;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        real *Bp = malloc(sizeof(real) * ((nc + NR - 1) / NR) * NR * KC);
        if (!Bp) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(3) schedule(dynamic)
        for (long i = 0; i < a; i++)
            for (long j = 0; j < d; j++)
                for (long t = 0; t < nb; t++) {
                    if (!Bp) continue;
                    const long n0 = t * nc, cols = lmin(nc, B - n0);
                    const real *X = x + (i * c * d + j) * B + n0;
                    const real *W = wr + (i * d + j) * msl * c * MR;
                    real *C = y + (i * b * d + j) * B + n0;
                    for (long k0 = 0; k0 < c; k0 += KC) {
                        const long kc = lmin(KC, c - k0);
                        pack_cols(cols, kc, X + k0 * d * B, d * B, Bp);
                        for (long s0 = 0; s0 < cols; s0 += NR)
                            for (long m0 = 0; m0 < b; m0 += MR)
                                micro(kc, W + (m0 / MR * c + k0) * MR, Bp + s0 * kc, NR,
                                      C + m0 * d * B + s0, d * B, 1, lmin(MR, b - m0),
                                      lmin(NR, cols - s0), k0 > 0);
                    }
                }
        free(Bp);
    }
    return failed;
}
"""

_BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
_TYPES = {torch.float32: "float", torch.float64: "double"}
_BSL_BATCH_TILE = 256  # batch columns per task (bsl): X block 256 x 256 in L2


def build_flags() -> tuple[str, ...]:
    """Compiler flags: ``-O3 -march=native -fopenmp ...`` then ``$PATHLIFT_KRON_CFLAGS``
    (e.g. ``-mno-avx512f`` to build the AVX2 kernel on an AVX-512 machine)."""
    return _BASE_FLAGS + tuple(shlex.split(os.environ.get("PATHLIFT_KRON_CFLAGS", "")))


def _compiler() -> str | None:
    return os.environ.get("CC") or _compiler_on_path(os.environ.get("PATH", os.defpath))


@functools.cache
def _compiler_on_path(path: str) -> str | None:
    # searched once per PATH: KSLinear asks for the machine fingerprint on every forward
    return shutil.which("gcc", path=path) or shutil.which("cc", path=path)


@dataclass(frozen=True)
class CpuKernel:
    """A compiled kernel: its library, the instruction set it was built for and its tiles
    (MR x NR scalars for the GEMM, DR x DK vectors along d for ``ks_bsf_d``)."""

    @property
    def lanes(self) -> int:
        return self.vector_bytes // self.dtype.itemsize


    lib: ctypes.CDLL
    dtype: torch.dtype
    isa: str
    vector_bytes: int
    mr: int
    nr: int
    dr: int
    dk: int
    compiler: str
    flags: tuple[str, ...]

    def describe(self) -> str:
        """E.g. 'avx2, 32-byte vectors, 6 x 16 torch.float32 tile (gcc -O3 ...)'."""
        return (f"{self.isa}, {self.vector_bytes}-byte vectors, {self.mr} x {self.nr} "
                f"{str(self.dtype).removeprefix('torch.')} tile "
                f"({Path(self.compiler).name} {' '.join(self.flags)})")


def _compile(ctype: str, compiler: str, flags: tuple[str, ...]) -> Path:
    key = hashlib.sha256("\0".join(
        (SOURCE, ctype, compiler, *flags, platform.machine(), platform.processor(),
         cpu_features())).encode()).hexdigest()[:16]
    target = cache_dir() / f"ks_fused_{ctype}_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "ks_fused.c"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        try:
            proc = subprocess.run([compiler, *flags, f"-Dreal={ctype}", str(src), "-o", str(out)],
                                  capture_output=True, text=True, check=False)
        except OSError as err:
            raise RuntimeError(f"cannot run the C compiler {compiler!r}: {err}") from err
        if proc.returncode:
            raise RuntimeError(f"{compiler} failed:\n{proc.stderr[-2000:]}")
        os.replace(out, target)  # atomic: concurrent builders agree on one file
    return target


@functools.cache
def _load(dtype: torch.dtype, compiler: str | None, flags: tuple[str, ...]) -> CpuKernel | None:
    try:
        if compiler is None:
            raise RuntimeError("no C compiler found (set CC or install gcc)")
        lib = ctypes.CDLL(str(_compile(_TYPES[dtype], compiler, flags)))
    except (RuntimeError, OSError) as err:
        warnings.warn(f"pathlift.kron: the fused CPU kernel could not be built ({err}); "
                      "falling back to the einsum algorithm", RuntimeWarning, stacklevel=4)
        return None
    long, ptr = ctypes.c_long, ctypes.c_void_p
    for fn in (lib.ks_bsf, lib.ks_bsf_d, lib.ks_bsl):
        fn.argtypes = [ptr, ptr, ptr, *[long] * 6, ctypes.c_int]
        fn.restype = ctypes.c_int
    lib.ks_isa.restype = ctypes.c_char_p
    tile = (ctypes.c_long * 5)()
    lib.ks_tile(tile)
    return CpuKernel(lib, dtype, lib.ks_isa().decode(), *tile, compiler, flags)


def load_kernel(dtype: torch.dtype) -> CpuKernel | None:
    """The kernel for float32 or float64 built with the current ``build_flags()``, or None
    (with a warning) if it cannot be built; other dtypes give None without a warning."""
    if dtype not in _TYPES:
        return None
    return _load(dtype, _compiler(), build_flags())


def _slivers(w: torch.Tensor, width: int) -> torch.Tensor:
    """(a, d, ceil(b/width), c, width) with [i, j, s, l, t] = w[i, s*width + t, l, j]."""
    a, b, c, d = w.shape
    padded = F.pad(w.permute(0, 3, 2, 1), (0, -(-b // width) * width - b))  # (a, d, c, bpad)
    return padded.reshape(a, d, c, -1, width).permute(0, 1, 3, 2, 4).contiguous()


def pack(w: torch.Tensor, kernel: CpuKernel) -> dict[str, torch.Tensor]:
    """The factor w (a, b, c, d) in the kernel's storage for each layout: output features in
    slivers of NR (batch-size-first) or MR (batch-size-last), zero-padded; and when d is a
    multiple of the vector lanes, (a, d/LANES, ceil(b/DK), c, DK, LANES) for ``ks_bsf_d``."""
    out = {"bsf": _slivers(w, kernel.nr), "bsl": _slivers(w, kernel.mr)}
    a, b, c, d = w.shape
    lanes, dk = kernel.lanes, kernel.dk
    if d % lanes == 0:
        wv = F.pad(w.permute(0, 3, 2, 1), (0, -(-b // dk) * dk - b))  # (a, d, c, bpad)
        wv = wv.reshape(a, d // lanes, lanes, c, -1, dk).permute(0, 1, 4, 3, 5, 2)
        out["bsf_d"] = wv.contiguous()
    return out


def _tile(batch: int, limit: int, multiple: int, tasks_per_tile: int, threads: int) -> int:
    """Batch rows (or columns) per task: at most ``limit``, a multiple of the micro-tile,
    and small enough that every thread gets about two tasks."""
    wanted = -(-2 * threads // tasks_per_tile) if threads > 1 else 1  # tiles for the team
    size = -(-batch // max(1, wanted))
    return max(multiple, min(limit, -(-size // multiple) * multiple))


def _threads(batch: int, shape: tuple[int, ...]) -> int:
    """One thread for small products: waking an OpenMP team costs more than it saves."""
    return torch.get_num_threads() if batch * math.prod(shape) >= 1 << 18 else 1


def _check(status: int) -> None:
    if status:
        raise MemoryError("pathlift.kron: the fused kernel could not allocate its packing "
                          "buffer; free memory or use algorithm='bmm'")


def fused_bsf(kernel: CpuKernel, x: torch.Tensor, packed: dict[str, torch.Tensor],
              shape: tuple[int, ...]) -> torch.Tensor:
    """Y (B, abd) from x (B, acd) contiguous and packed = pack(w): along d when d is a
    multiple of the vector lanes (``ks_bsf_d``), else the GEMM on packed rows."""
    a, b, c, d = shape
    batch = x.shape[0]
    y = torch.empty(batch, a * b * d, dtype=x.dtype)
    threads = _threads(batch, shape)
    if "bsf_d" in packed:
        tile, tasks, fn, w = kernel.dr, a * d // kernel.lanes, kernel.lib.ks_bsf_d, "bsf_d"
        row_bytes = c * kernel.vector_bytes  # X[row, i, :, one vector of j]
    else:
        tile, tasks, fn, w = kernel.mr, a, kernel.lib.ks_bsf, "bsf"
        row_bytes = c * d * x.element_size()  # X[row, i, :, :]
    # rows of one task: the task's block of X should stay in the L2 cache
    l2_rows = (512 * 1024) // max(1, row_bytes)
    rows = _tile(batch, max(tile, min(20 * tile, l2_rows)), tile, tasks, threads)
    _check(fn(x.data_ptr(), packed[w].data_ptr(), y.data_ptr(), batch, a, b, c, d, rows,
              threads))
    return y


def fused_bsl(kernel: CpuKernel, x: torch.Tensor, packed: dict[str, torch.Tensor],
              shape: tuple[int, ...]) -> torch.Tensor:
    """Y (abd, B) from x (acd, B) contiguous and packed = pack(w)."""
    a, b, c, d = shape
    batch = x.shape[1]
    y = torch.empty(a * b * d, batch, dtype=x.dtype)
    threads = _threads(batch, shape)
    cols = _tile(batch, _BSL_BATCH_TILE, kernel.nr, a * d, threads)
    _check(kernel.lib.ks_bsl(x.data_ptr(), packed["bsl"].data_ptr(), y.data_ptr(), batch, a, b,
                             c, d, cols, threads))
    return y
