#include <stdlib.h>
#include <string.h>

/* real is float or double (-Dreal=...). The vector width, the register file and thus every
   micro-tile come from the instruction set the compiler targets: each tile's accumulators,
   the vectors it loads per step and a broadcast fit in the register file (32 vector
   registers with AVX-512 and NEON, 16 with AVX2, AVX and SSE2), as in the BLIS
   micro-kernels (e.g. 6 x 16 float32 for Haswell, 12 x 32 or 14 x 32 for SkylakeX).
   MR x NV vectors: ks_bsf, ks_bsl, ks_grad (GEMM); DR x DK: ks_bsf_d (along d); FR x NVF:
   ks_bsf_f, ks_grad_f (flat); FRP x NP: ks_bsf_p, ks_grad_p (phased, NP = 3).
   Measured on a Zen 4 EPYC (1 MB L2, 32 kB L1), -mno-avx512f against the native build. */
#if defined(__AVX512F__)
#define VBYTES 64
#define ISA "avx512"
#elif defined(__AVX2__)
#define VBYTES 32
#define ISA "avx2"
#elif defined(__AVX__)
#define VBYTES 32
#define ISA "avx"
#elif defined(__ARM_NEON) || defined(__aarch64__)
#define VBYTES 16
#define ISA "neon"
#elif defined(__SSE2__)
#define VBYTES 16
#define ISA "sse2"
#else
#define VBYTES 16
#define ISA "generic"
#endif
#if defined(__AVX512F__) || defined(__ARM_NEON) || defined(__aarch64__)
#define REGS32 1  /* 32 vector registers */
#else
#define REGS32 0  /* 16 */
#endif
/* -D overrides of the tiles are for experiments; the defaults are the measured ones */
#ifndef MR
#define MR (REGS32 ? 12 : 6)    /* 24 or 12 accumulators, 2 loaded vectors, a broadcast */
#endif
#ifndef DR
#define DR (REGS32 ? 4 : 2)     /* 24 or 12 accumulators, DR loaded, one weight vector */
#endif
#ifndef DK
#define DK 6
#endif
#ifndef FR
#define FR 6
#endif
#ifndef NVF
#define NVF (REGS32 ? 4 : 2)    /* 24 or 12 accumulators, NVF weights, a broadcast */
#endif
#ifndef FRP
#define FRP 4  /* 12 accumulators, 3 weights, X from L1 (8 rows, 36 kB of X with AVX-512,
                  ran 10-30% slower on a Zen 4: 32 kB L1) */
#endif

typedef real vec __attribute__((vector_size(VBYTES), aligned(sizeof(real))));
#ifndef ireal
#define ireal int  /* the integer of real's width (the float64 build sets long) */
#endif
typedef ireal ivec __attribute__((vector_size(VBYTES)));

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

/* The d values at p repeated across a vector (d*sizeof(real) = 8, 16 or 32 bytes, at most
   BC_BYTES and dividing VBYTES): the X operand of ks_bsf_f. d = 1 is a scalar broadcast on
   every instruction set. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define BC_BYTES 32
static inline vec bcast(const real *p, const int bytes)
{
    if (bytes == 8) { double t; memcpy(&t, p, 8); return (vec)_mm512_set1_pd(t); }
    if (bytes == 16) return (vec)_mm512_broadcast_f32x4(_mm_loadu_ps((const float *)p));
    return (vec)_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)p));
}
#elif defined(__AVX__)
#include <immintrin.h>
#define BC_BYTES 16
static inline vec bcast(const real *p, const int bytes)
{
    if (bytes == 8) { double t; memcpy(&t, p, 8); return (vec)_mm256_set1_pd(t); }
    return (vec)_mm256_broadcast_ps((const __m128 *)p);
}
#else
#define BC_BYTES ((int)sizeof(real))
static inline vec bcast(const real *p, const int bytes) { (void)bytes; return (vec){0} + *p; }
#endif
#define NV 2
#define NR (NV * LANES)
#define NF (NVF * LANES)  /* ks_bsf_f: sliver width; KCF steps of l per block */
#ifndef KCF
#define KCF 512  /* flat blocks of l: 128 ran d = 1 patterns with c = 192-1024 5-12% slower (both widths) */
#endif
#define NP 3              /* ks_bsf_p: vectors per sliver; KCP steps of l per block */
#define WP (NP * LANES)
#ifndef KCP
#define KCP 24  /* the expanded X of KCP steps (FRP x 3 vectors each) in half the L1 */
#endif
#ifndef KC
#define KC 256
#endif
#ifndef KCB
#define KCB 512  /* ks_bsf's steps of l per block: fewer passes of its scattered stores (d > 1)
                    than 256, 1.05-1.1x on d = 3, 6 patterns with c = 384-768 (both widths) */
#endif

static inline long lmin(long x, long y) { return x < y ? x : y; }

const char *ks_isa(void) { return ISA; }

void ks_tile(long *out)
{
    out[0] = VBYTES; out[1] = MR; out[2] = NR; out[3] = DR; out[4] = DK;
    out[5] = BC_BYTES / (long)sizeof(real);  /* the largest d of ks_bsf_f */
    out[6] = NF;
    out[7] = VBYTES >= 32 ? WP : 0;  /* ks_bsf_p, where shuffles are instructions */
}

/* C[r*cr + t*cc] = (or +=) the tile acc[r*stride + t/LANES][t%LANES] for r < mr, t < nr,
   plus bc[t*cc] where bc is given (the layer's bias, aligned with C's columns, added as the
   first block of the inner dimension is stored: no pass of its own over Y): whole vectors
   where C's row runs along t and the tile is full, else one value at a time. */
static inline __attribute__((always_inline)) void
store_tile(const vec *acc, const int stride, real *C, long cr, long cc, long mr, long nr,
           int accumulate, const real *bc, const int nv)
{
    if (cc == 1 && nr == nv * LANES) {
        vec bias[NVF > NP ? NVF : NP];  /* nv <= NV, NVF or NP */
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) bias[v] = bc ? *(const vec *)(bc + v * LANES) : (vec){0};
        for (long r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) {
                vec *cv = (vec *)(C + r * cr + v * LANES);
                if (accumulate) *cv += acc[r * stride + v];
                else *cv = acc[r * stride + v] + bias[v];
            }
        return;
    }
    for (long r = 0; r < mr; r++)
        for (long t = 0; t < nr; t++) {
            const real v = acc[r * stride + t / LANES][t % LANES];
            real *dst = C + r * cr + t * cc;
            *dst = accumulate ? *dst + v : bc ? v + bc[t * cc] : v;
        }
}

/* out[r*stride + v] = acc[r*stride + v] for r < rows, v < nv, all constants where it is
   inlined: the accumulators are then only indexed by constants, so they live in registers
   (stored once here), whereas store_tile's indexing by run-time counts would keep them in
   memory, written back at every step of the loop (GCC). */
static inline __attribute__((always_inline)) void
copy_tile(vec *restrict out, const vec *acc, const int rows, const int stride, const int nv)
{
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) out[r * stride + v] = acc[r * stride + v];
}

/* C[r*cr + t*cc] (+)= sum_{l < kc} Ap[l*MR + r] * Bp[l*bk + t] for r < mr, t < nr, with
   nv vectors per row (a constant where it is inlined); the operands hold a full MR x
   nv*LANES tile (zero-padded). */
static inline __attribute__((always_inline)) void
micro_nv(long kc, const real *restrict Ap, const real *restrict Bp, long bk, real *C,
         long cr, long cc, long mr, long nr, int accumulate, const real *bc, const int nv)
{
    vec acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[r][v] = (vec){0};
    for (long l = 0; l < kc; l++) {
        vec bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) bv[v] = *(const vec *)(Bp + l * bk + v * LANES);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const real s = Ap[l * MR + r];
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[r][v] += s * bv[v];
        }
    }
    vec out[MR][NV];
    copy_tile(&out[0][0], &acc[0][0], MR, NV, nv);
    store_tile(&out[0][0], NV, C, cr, cc, mr, nr, accumulate, bc, nv);
}

/* The MR x NR micro-kernel, or MR x LANES for a last sliver of at most LANES columns
   (b = 48 in slivers of 32: 25% fewer multiply-adds than its zero-padded full tile). */
static inline void micro(long kc, const real *restrict Ap, const real *restrict Bp, long bk,
                         real *C, long cr, long cc, long mr, long nr, int accumulate,
                         const real *bc)
{
    if (nr <= LANES)
        micro_nv(kc, Ap, Bp, bk, C, cr, cc, mr, nr, accumulate, bc, 1);
    else
        micro_nv(kc, Ap, Bp, bk, C, cr, cc, mr, nr, accumulate, bc, NV);
}

/* Ap[m0 * kc + l * MR + r] = A[(m0 + r) * ar + l * ak]: MR-row slivers, zero-padded. */
static void pack_rows(long m, long kc, const real *A, long ar, long ak, real *Ap)
{
    for (long m0 = 0; m0 < m; m0 += MR) {
        const long mr = lmin(MR, m - m0);
        real *dst = Ap + m0 * kc;
        if (ar == 1) {  /* rows contiguous: one copy per step of the inner dimension */
            for (long l = 0; l < kc; l++) {
                memcpy(dst + l * MR, A + m0 + l * ak, sizeof(real) * mr);
                memset(dst + l * MR + mr, 0, sizeof(real) * (MR - mr));
            }
            continue;
        }
        for (long l = 0; l < kc; l++) {
            long r = 0;
            for (; r < mr; r++) dst[l * MR + r] = A[(m0 + r) * ar + l * ak];
            for (; r < MR; r++) dst[l * MR + r] = 0;
        }
    }
}

/* Bp[n0 * kc + l * NR + t] = B[l * bk + (n0 + t) * bt]: NR-column slivers, zero-padded. */
static void pack_cols(long n, long kc, const real *B, long bk, long bt, real *Bp)
{
    for (long n0 = 0; n0 < n; n0 += NR) {
        const long nr = lmin(NR, n - n0);
        real *dst = Bp + n0 * kc;
        for (long l = 0; l < kc; l++) {
            const real *src = B + l * bk + n0 * bt;
            if (nr == NR && bt == 1) {
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++)
                    *(vec *)(dst + l * NR + v * LANES) = *(const vec *)(src + v * LANES);
            } else {
                long t = 0;
                for (; t < nr; t++) dst[l * NR + t] = src[t * bt];
                for (; t < NR; t++) dst[l * NR + t] = 0;
            }
        }
    }
}

/* Batch-size-first, on strided operands: X(n, i, l, j) = x[n*xs[0] + i*xs[1] + l*xs[2] +
   j*xs[3]] for n < B rows, l < c; Y(n, i, k, j) likewise with ys and k < b; ws (a, d,
   ceil(b/NR), c, NR) from ks_pack. The forward product has x (B, a, c, d) and y (B, a, b, d)
   contiguous; the gradient of the factor runs through it too (rows l, inner dimension the
   batch, ks_pack of the output gradient as the weights). Tasks: blocks of mc rows x a. */
int ks_bsf(const real *x, const real *ws, real *y, long B, long a, long b, long c, long d,
           const long *xs, const long *ys, const real *bias, long mc, int threads)
{
    const long nb = (B + mc - 1) / mc, nsl = (b + NR - 1) / NR;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        real *Ap = malloc(sizeof(real) * ((mc + MR - 1) / MR) * MR * KCB);
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
                    const real *A = x + n0 * xs[0] + i * xs[1] + j * xs[3];
                    const real *W = ws + (i * d + j) * nsl * c * NR;
                    real *C = y + n0 * ys[0] + i * ys[1] + j * ys[3];
                    const real *bj = bias ? bias + i * ys[1] + j * ys[3] : 0;
                    for (long k0 = 0; k0 < c; k0 += KCB) {
                        const long kc = lmin(KCB, c - k0);
                        pack_rows(rows, kc, A + k0 * xs[2], xs[0], xs[2], Ap);
                        for (long s = 0; s < nsl; s++)
                            for (long m0 = 0; m0 < rows; m0 += MR)
                                micro(kc, Ap + m0 * kc, W + (s * c + k0) * NR, NR,
                                      C + m0 * ys[0] + s * NR * ys[2], ys[0], ys[2],
                                      lmin(MR, rows - m0), lmin(NR, b - s * NR), k0 > 0,
                                      bj && !k0 ? bj + s * NR * ys[2] : 0);
                    }
                }
            }
        free(Ap);
    }
    return failed;
}

/* Y[r*yn + q*yk + t] (+)= sum_{l < kc} X[r*xn + l*xl + t] * W[l*wl + q*wq + t] for
   r < nr, q < kr, t < LANES: a DR x DK tile of vectors along the contiguous index j. */
static inline void micro_d(long kc, const real *X, long xn, long xl, const real *restrict W,
                           long wl, long wq, real *Y, long yn, long yk, long nr, long kr,
                           int accumulate, const real *bc)
{
    vec acc[DR][DK];
    const real *rows[DR], *cols[DK];  /* past nr rows or kr columns: repeat the first */
#pragma GCC unroll 8
    for (int q = 0; q < DK; q++) cols[q] = W + (q < kr ? q : 0) * wq;
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
            vec wv = *(const vec *)(cols[q] + l * wl);
            IN_REGISTER(wv);
#pragma GCC unroll 8
            for (int r = 0; r < DR; r++) acc[r][q] += xv[r] * wv;
        }
    }
    vec out[DR][DK];
    copy_tile(&out[0][0], &acc[0][0], DR, DK, DK);
    for (long r = 0; r < nr; r++)
        for (long q = 0; q < kr; q++) {
            vec *dst = (vec *)(Y + r * yn + q * yk);
            if (accumulate) *dst += out[r][q];
            else *dst = bc ? out[r][q] + *(const vec *)(bc + q * yk) : out[r][q];
        }
}

/* Batch-size-first with d a multiple of LANES and j contiguous (xs[3] = ys[3] = 1; strides
   as in ks_bsf): the vectors run along j, so nothing is gathered or scattered. The weights
   W(i, k, l, j) for k = s*DK + q, j = v*LANES + t are at w[i*ws[0] + v*ws[1] + s*ws[2] +
   q*ws[3] + l*ws[4] + t]: ks_pack_d's storage (a, d/LANES, ceil(b/DK), c, DK, LANES), where
   the weights of one tile step are contiguous, or an operand read in place (the output
   gradient, for the gradient of the factor). KCD steps of the inner dimension keep a tile's
   weights (KCD x DK vectors) in the L1 cache. Tasks: blocks of mc rows x a x d/LANES. */
#define KCD (24576 / (DK * VBYTES))
int ks_bsf_d(const real *x, const real *w, real *y, long B, long a, long b, long c, long d,
             const long *xs, const long *ws, const long *ys, const real *bias, long mc,
             int threads)
{
    const long nv = d / LANES, nb = (B + mc - 1) / mc, nks = (b + DK - 1) / DK;
    #pragma omp parallel for collapse(3) schedule(dynamic) num_threads(threads)
    for (long t = 0; t < nb; t++)
        for (long i = 0; i < a; i++)
            for (long v = 0; v < nv; v++) {
                const long n0 = t * mc, rows = lmin(mc, B - n0);
                const real *W = w + i * ws[0] + v * ws[1];
                const real *X = x + n0 * xs[0] + i * xs[1] + v * LANES;
                real *Y = y + n0 * ys[0] + i * ys[1] + v * LANES;
                for (long l0 = 0; l0 < c; l0 += KCD)
                    for (long s = 0; s < nks; s++)
                        for (long m0 = 0; m0 < rows; m0 += DR)
                            micro_d(lmin(KCD, c - l0), X + m0 * xs[0] + l0 * xs[2], xs[0],
                                    xs[2], W + s * ws[2] + l0 * ws[4], ws[4], ws[3],
                                    Y + m0 * ys[0] + s * DK * ys[2], ys[0], ys[2],
                                    lmin(DR, rows - m0), lmin(DK, b - s * DK), l0 > 0,
                                    bias && !l0 ? bias + i * ys[1] + v * LANES
                                                  + s * DK * ys[2] : 0);
            }
    return 0;
}

/* The gradient of the factor, dW(i, k, l, j) = sum_n G(n, i, k, j) X(n, i, l, j) (k < b,
   l < c, n < B): G and X by strides (n, i, feature, j) as in ks_bsf, dW by strides (i, k,
   l, j). Per pair (i, j), a GEMM with the batch as inner dimension, cache-blocked as the
   classic one: KC steps of the batch, X[n block, rows] packed into MR-row slivers and
   G[n block, NB columns] into NR-column slivers, both in L2, the tile accumulated in dW.
   Tasks: pairs (i, j) x blocks of nb columns. */
int ks_grad(const real *x, const real *g, real *dw, long B, long a, long b, long c, long d,
            const long *xs, const long *gs, const long *ws, long nb, int threads)
{
    const long ncb = (b + nb - 1) / nb, mc = lmin(c, 20 * MR);
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        real *Ap = malloc(sizeof(real) * ((mc + MR - 1) / MR) * MR * KC);
        real *Bp = malloc(sizeof(real) * ((nb + NR - 1) / NR) * NR * KC);
        if (!Ap || !Bp) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(3) schedule(dynamic)
        for (long i = 0; i < a; i++)
            for (long j = 0; j < d; j++)
                for (long cb = 0; cb < ncb; cb++) {
                    if (!Ap || !Bp) continue;
                    const long k0 = cb * nb, cols = lmin(nb, b - k0);
                    const real *X = x + i * xs[1] + j * xs[3];
                    const real *G = g + i * gs[1] + k0 * gs[2] + j * gs[3];
                    real *C = dw + i * ws[0] + k0 * ws[1] + j * ws[3];
                    for (long n0 = 0; n0 < B; n0 += KC) {
                        const long kc = lmin(KC, B - n0);
                        pack_cols(cols, kc, G + n0 * gs[0], gs[0], gs[2], Bp);
                        for (long l0 = 0; l0 < c; l0 += mc) {
                            const long rows = lmin(mc, c - l0);
                            pack_rows(rows, kc, X + n0 * xs[0] + l0 * xs[2], xs[2], xs[0], Ap);
                            for (long s0 = 0; s0 < cols; s0 += NR)
                                for (long m0 = 0; m0 < rows; m0 += MR)
                                    micro(kc, Ap + m0 * kc, Bp + s0 * kc, NR,
                                          C + (l0 + m0) * ws[2] + s0 * ws[1], ws[2], ws[1],
                                          lmin(MR, rows - m0), lmin(NR, cols - s0), n0 > 0,
                                          0);
                        }
                    }
                }
        free(Ap);
        free(Bp);
    }
    return failed;
}

/* Batch-size-first with d dividing the vector lanes (d = 1, 2, 4, 8 in float32 with
   AVX-512): the vectors run along the output features f = k*d + j of one block i, which
   are contiguous in Y, and for each step l the X operand x[n, i, l, 0..d) is broadcast to
   every group of d lanes, straight from X's rows: nothing is packed or scattered.
   wf (a, ceil(b*d/NF), c, NF) from ks_pack_f, wf[i, s, l, t] = w[i, k, l, j] for
   s*NF + t = k*d + j (zero past b*d). The micro-kernel holds FR rows x nv vectors (nv <= NVF)
   in registers and reads FR rows of X, nv weight vectors per step. */

static inline __attribute__((always_inline)) void
micro_f(long kc, const real *X, long xr, long xl, const real *restrict W, long wl, real *C,
        long cr, long mr, long nr, int accumulate, const real *bc, const int nv,
        const int dd)
{
    vec acc[FR][NVF];
    const real *rows[FR];
#pragma GCC unroll 8
    for (int r = 0; r < FR; r++) {
        rows[r] = X + (r < mr ? r : 0) * xr;
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[r][v] = (vec){0};
    }
    for (long l = 0; l < kc; l++) {
        vec bv[NVF];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) bv[v] = *(const vec *)(W + l * wl + v * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < FR; r++) {
            if (dd == 1) {
                const real s = rows[r][l * xl];
#pragma GCC unroll 4
                for (int v = 0; v < nv; v++) acc[r][v] += s * bv[v];
            } else {
                const vec xv = bcast(rows[r] + l * xl, dd * (int)sizeof(real));
#pragma GCC unroll 4
                for (int v = 0; v < nv; v++) acc[r][v] += xv * bv[v];
            }
        }
    }
    vec out[FR][NVF];
    copy_tile(&out[0][0], &acc[0][0], FR, NVF, nv);
    store_tile(&out[0][0], NVF, C, cr, 1, mr, nr, accumulate, bc, nv);
}

/* micro_f for the vectors a sliver needs (its last one may be partial) and this d. */
static inline __attribute__((always_inline)) void
micro_f_d(long kc, const real *X, long xr, long xl, const real *restrict W, long wl, real *C,
          long cr, long mr, long nr, int accumulate, const real *bc, const int dd)
{
    switch ((nr + LANES - 1) / LANES) {
    case 1: micro_f(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 1, dd); break;
#if NVF > 2
    case 2: micro_f(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 2, dd); break;
#endif
#if NVF > 3
    case 3: micro_f(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 3, dd); break;
#endif
    default: micro_f(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, NVF, dd);
    }
}

/* C[r*cr + t] (+)= sum_{l < kc} X[r*xr + l*xl + t%d] * W[l*wl + t] for r < mr rows,
   t < nr <= NF, the X values broadcast in groups of d lanes. */
static void micro_f_any(long kc, const real *X, long xr, long xl, const real *restrict W,
                        long wl, real *C, long cr, long mr, long nr, int accumulate,
                        const real *bc, long d)
{
    switch (d * (long)sizeof(real)) {
    case 8: micro_f_d(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 8 / sizeof(real)); break;
    case 16: micro_f_d(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 16 / sizeof(real));
        break;
    case 32: micro_f_d(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 32 / sizeof(real));
        break;
    default: micro_f_d(kc, X, xr, xl, W, wl, C, cr, mr, nr, accumulate, bc, 1);
    }
}

/* The weights of one sliver and block of kc steps, W + l*wl (l < kc), as the kernels read
   them: in place, or, for a last sliver of nr < width features of weights that are not
   zero-padded, copied into the zero-padded Wt (kc x width; nothing read past the operand). */
static inline const real *sliver(const real *W, long wl, long kc, long nr, long width,
                                 int padded, real *Wt, long *wl_out)
{
    *wl_out = wl;
    if (padded || nr == width)
        return W;
    for (long l = 0; l < kc; l++) {
        memcpy(Wt + l * width, W + l * wl, sizeof(real) * nr);
        memset(Wt + l * width + nr, 0, sizeof(real) * (width - nr));
    }
    *wl_out = width;
    return Wt;
}

/* x (B, a, c, d) and y (B, a, b, d) with rows xn and yn apart; the weights of sliver s of
   block i at step l at w + i*ws[0] + s*ws[1] + l*ws[2]: ks_pack_f's (zero-padded: padded)
   or an operand read in place (for dX = dY K, K's rows: W(i, s, k, t) = w[i, k, s*NF + t]).
   Tasks: blocks of mc rows x a; per block of KCF steps of l, the FR-row tiles of X stay
   in L1 while the slivers of the weights stream from L2. */
int ks_bsf_f(const real *x, const real *w, real *y, long B, long a, long b, long c, long d,
             long xn, long yn, const long *ws, int padded, const real *bias, long mc,
             int threads)
{
    const long nb = (B + mc - 1) / mc, f = b * d, nsl = (f + NF - 1) / NF;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        real *Wt = padded ? 0 : malloc(sizeof(real) * KCF * NF);
        if (!padded && !Wt) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(dynamic)
        for (long t = 0; t < nb; t++)
            for (long i = 0; i < a; i++) {
                if (!padded && !Wt) continue;
                const long n0 = t * mc, rows = lmin(mc, B - n0);
                for (long k0 = 0; k0 < c; k0 += KCF) {
                    const long kc = lmin(KCF, c - k0), last = nsl - 1;
                    long tl;  /* the last sliver, copied once per block where it is partial */
                    const real *tail = sliver(w + i * ws[0] + last * ws[1] + k0 * ws[2], ws[2],
                                              kc, f - last * NF, NF, padded, Wt, &tl);
                    for (long m0 = 0; m0 < rows; m0 += FR)
                        for (long s = 0; s < nsl; s++)
                            micro_f_any(kc, x + (n0 + m0) * xn + (i * c + k0) * d, xn, d,
                                        s == last ? tail : w + i * ws[0] + s * ws[1] + k0 * ws[2],
                                        s == last ? tl : ws[2],
                                        y + (n0 + m0) * yn + i * f + s * NF, yn,
                                        lmin(FR, rows - m0), lmin(NF, f - s * NF), k0 > 0,
                                        bias && !k0 ? bias + i * f + s * NF : 0, d);
                }
            }
        free(Wt);
    }
    return failed;
}

/* The gradient of the factor with d dividing the lanes, batch-size-first (x (B, a, c, d)
   and g (B, a, b, d) with rows xn and gn apart, dw (a, b, c, d)): per block i, rows k of
   dw and vectors along its features (l, j), contiguous, dw[i, k, (l, j)] = sum_n g[n, i, k,
   j] x[n, i, (l, j)], the g values broadcast in groups of d lanes and x read in place:
   nothing is packed but the last sliver of x's features (zero-padded, when c*d is not a
   multiple of NF). Tasks: blocks i x slivers of (l, j). */
int ks_grad_f(const real *x, const real *g, real *dw, long B, long a, long b, long c, long d,
              long xn, long gn, int threads)
{
    const long f = c * d, nsl = (f + NF - 1) / NF, tail = f % NF;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        real *Wt = tail ? malloc(sizeof(real) * KCF * NF) : 0;
        if (tail && !Wt) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(dynamic)
        for (long i = 0; i < a; i++)
            for (long s = 0; s < nsl; s++) {
                if (tail && !Wt) continue;
                const long nr = lmin(NF, f - s * NF);
                for (long n0 = 0; n0 < B; n0 += KCF) {
                    const long kc = lmin(KCF, B - n0);
                    long wl;
                    const real *W = sliver(x + n0 * xn + i * f + s * NF, xn, kc, nr, NF, 0, Wt,
                                           &wl);
                    for (long k0 = 0; k0 < b; k0 += FR)
                        micro_f_any(kc, g + n0 * gn + (i * b + k0) * d, d, gn, W, wl,
                                    dw + (i * b + k0) * f + s * NF, f, lmin(FR, b - k0), nr,
                                    n0 > 0, 0, d);
                }
            }
        free(Wt);
    }
    return failed;
}

/* Batch-size-first with d/gcd(d, LANES) = 3 and d <= 2 LANES (d = 3, 6, 12, 24 in float32
   with AVX-512): as ks_bsf_f, vectors along the output features f = k*d + j, contiguous
   in Y, in slivers of WP = 3 LANES = lcm(LANES, d) features, so vector v of every sliver
   needs X's d values of step l in the lanes (v*LANES + t) % d: a shuffle of them, made once
   per row and step (expand) for all the slivers. wp (a, ceil(b*d/WP), c, WP) from
   ks_pack_f. */

/* Xe[(l*FRP + r)*NP + v] = X(r, l*xl + (v*LANES + t) % d) in lane t, for r < FRP (rows past
   mr repeat the first), l < kc; X's values are read two vectors at a time where that stays
   before xend, else through a copy. */
static void expand(long kc, const real *X, long xr, long xl, long mr, long d,
                   const real *xend, const ivec *idx, vec *Xe)
{
    for (long r = 0; r < FRP; r++) {
        const real *row = X + (r < mr ? r : 0) * xr;
        for (long l = 0; l < kc; l++) {
            const real *src = row + l * xl;
            vec lo, hi;
            if (src + 2 * LANES <= xend) {
                lo = *(const vec *)src;
                hi = *(const vec *)(src + LANES);
            } else {
                real tmp[2 * LANES] = {0};
                memcpy(tmp, src, sizeof(real) * d);
                lo = *(const vec *)tmp;
                hi = *(const vec *)(tmp + LANES);
            }
            vec *dst = Xe + (l * FRP + r) * NP;
#pragma GCC unroll 4
            for (int v = 0; v < NP; v++)
                dst[v] = d <= LANES ? __builtin_shuffle(lo, idx[v])
                                    : __builtin_shuffle(lo, hi, idx[v]);
        }
    }
}

/* C[r*cr + t] (+)= sum_{l < kc} Xe[(l*FRP + r)*NP + t/LANES][t%LANES] * W[l*wl + t]. */
static inline void micro_p(long kc, const vec *restrict Xe, const real *restrict W, long wl,
                           real *C, long cr, long mr, long nr, int accumulate,
                           const real *bc)
{
    vec acc[FRP][NP];
#pragma GCC unroll 8
    for (int r = 0; r < FRP; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NP; v++) acc[r][v] = (vec){0};
    for (long l = 0; l < kc; l++) {
        vec wv[NP];
#pragma GCC unroll 4
        for (int v = 0; v < NP; v++) wv[v] = *(const vec *)(W + l * wl + v * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < FRP; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NP; v++) acc[r][v] += Xe[(l * FRP + r) * NP + v] * wv[v];
    }
    vec out[FRP][NP];
    copy_tile(&out[0][0], &acc[0][0], FRP, NP, NP);
    store_tile(&out[0][0], NP, C, cr, 1, mr, nr, accumulate, bc, NP);
}

/* idx[v][t] = (v*LANES + t) % d, the lanes of phase v; returns 0 (no failure yet). */
static int phase_index(long d, ivec *idx)
{
    for (int v = 0; v < NP; v++)
        for (int t = 0; t < LANES; t++) idx[v][t] = (ireal)((v * LANES + t) % d);
    return 0;
}

/* A phased task's buffers: the expanded X (KCP x FRP x NP vectors) and a last sliver's
   copy (KCP x WP); 0 where one could not be allocated. */
static int phased_alloc(vec **Xe, real **Wt)
{
    *Xe = aligned_alloc(VBYTES, sizeof(vec) * KCP * FRP * NP);
    *Wt = malloc(sizeof(real) * KCP * WP);
    return *Xe && *Wt;
}

/* x (B, a, c, d) and y (B, a, b, d), rows xn and yn apart, x's storage ending at xend;
   the weights as in ks_bsf_f (slivers of WP). Tasks: blocks of mc rows x a; per FRP rows
   and KCP steps of l, the expanded X (in L1) serves every sliver. */
int ks_bsf_p(const real *x, const real *w, real *y, long B, long a, long b, long c, long d,
             long xn, long yn, const real *xend, const long *ws, int padded,
             const real *bias, long mc, int threads)
{
    const long nb = (B + mc - 1) / mc, f = b * d, nsl = (f + WP - 1) / WP;
    ivec idx[NP];
    int failed = phase_index(d, idx);
    #pragma omp parallel num_threads(threads)
    {
        vec *Xe;
        real *Wt;
        if (!phased_alloc(&Xe, &Wt)) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(dynamic)
        for (long t = 0; t < nb; t++)
            for (long i = 0; i < a; i++) {
                if (!Xe || !Wt) continue;
                const long n0 = t * mc, rows = lmin(mc, B - n0);
                for (long k0 = 0; k0 < c; k0 += KCP) {
                    const long kc = lmin(KCP, c - k0), last = nsl - 1;
                    long tl;  /* the last sliver, copied once per block where it is partial */
                    const real *tail = sliver(w + i * ws[0] + last * ws[1] + k0 * ws[2], ws[2],
                                              kc, f - last * WP, WP, padded, Wt, &tl);
                    for (long m0 = 0; m0 < rows; m0 += FRP) {
                        const long mr = lmin(FRP, rows - m0);
                        expand(kc, x + (n0 + m0) * xn + (i * c + k0) * d, xn, d, mr, d, xend,
                               idx, Xe);
                        for (long s = 0; s < nsl; s++)
                            micro_p(kc, Xe,
                                    s == last ? tail : w + i * ws[0] + s * ws[1] + k0 * ws[2],
                                    s == last ? tl : ws[2], y + (n0 + m0) * yn + i * f + s * WP,
                                    yn, mr, lmin(WP, f - s * WP), k0 > 0,
                                    bias && !k0 ? bias + i * f + s * WP : 0);
                    }
                }
            }
        free(Xe);
        free(Wt);
    }
    return failed;
}

/* The gradient of the factor on the phased path, batch-size-first (x (B, a, c, d) and g
   (B, a, b, d), rows xn and gn apart, g's storage ending at gend; dw (a, b, c, d)): rows k
   of dw, vectors along its features (l, j) in slivers of WP, dw[i, k, (l, j)] = sum_n g[n,
   i, k, j] x[n, i, (l, j)], g's d values of each step n shuffled into the phases once per
   row tile and block for every sliver, x read in place (its last sliver, where partial,
   through a zero-padded copy). Tasks: blocks i x tiles of kb rows k. */
int ks_grad_p(const real *x, const real *g, real *dw, long B, long a, long b, long c, long d,
              long xn, long gn, const real *gend, long kb, int threads)
{
    const long f = c * d, nsl = (f + WP - 1) / WP, nkb = (b + kb - 1) / kb;
    ivec idx[NP];
    int failed = phase_index(d, idx);
    #pragma omp parallel num_threads(threads)
    {
        vec *Xe;
        real *Wt;
        if (!phased_alloc(&Xe, &Wt)) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(dynamic)
        for (long i = 0; i < a; i++)
            for (long t = 0; t < nkb; t++) {
                if (!Xe || !Wt) continue;
                const long k1 = lmin(b, (t + 1) * kb), last = nsl - 1;
                for (long n0 = 0; n0 < B; n0 += KCP) {
                    const long kc = lmin(KCP, B - n0);
                    const real *X = x + n0 * xn + i * f;
                    long tl;
                    const real *tail = sliver(X + last * WP, xn, kc, f - last * WP, WP, 0, Wt,
                                              &tl);
                    for (long k0 = t * kb; k0 < k1; k0 += FRP) {
                        const long mr = lmin(FRP, k1 - k0);
                        expand(kc, g + n0 * gn + (i * b + k0) * d, d, gn, mr, d, gend, idx, Xe);
                        for (long s = 0; s < nsl; s++)
                            micro_p(kc, Xe, s == last ? tail : X + s * WP, s == last ? tl : xn,
                                    dw + (i * b + k0) * f + s * WP, f, mr, lmin(WP, f - s * WP),
                                    n0 > 0, 0);
                    }
                }
            }
        free(Xe);
        free(Wt);
    }
    return failed;
}

/* ks_pack_f: out (a, ceil(b*d/width), c, width), out[i, s, l, t] = W(i, k, l, j) for
   s*width + t = k*d + j, zero past b*d, d dividing width (the weights of ks_bsf_f, width
   NF, and of ks_bsf_p, width WP). */
void ks_pack_f(const real *w, const long *st, long a, long b, long c, long d, long width,
               real *out)
{
    const long f = b * d, nsl = (f + width - 1) / width, tail = f % width;
    for (long i = 0; i < a; i++) {
        if (tail)  /* the zero padding of the last sliver */
            for (long l = 0; l < c; l++)
                memset(out + ((i * nsl + nsl - 1) * c + l) * width + tail, 0,
                       sizeof(real) * (width - tail));
        /* per sliver, blocks of 64 l: the block's lines of out stay in L1 while its width/d
           output features k (d values each: never across two slivers) are copied in, k
           or l innermost, whichever runs along W */
        for (long s = 0; s < nsl; s++)
            for (long l0 = 0; l0 < c; l0 += 64) {
                const long k0 = s * width / d, k1 = lmin(b, (s + 1) * width / d);
                const long l1 = lmin(c, l0 + 64);
                real *dst = out + (i * nsl + s) * c * width - s * width;
                const real *src = w + i * st[0];
                if (d == 1 && st[1] == 1) {  /* W's columns run along k: copies */
                    for (long l = l0; l < l1; l++)
                        memcpy(dst + l * width + k0, src + k0 + l * st[2],
                               sizeof(real) * (k1 - k0));
                } else if (st[1] < st[2]) {
                    for (long l = l0; l < l1; l++)
                        for (long k = k0; k < k1; k++)
                            for (long j = 0; j < d; j++)
                                dst[l * width + k * d + j] = src[k * st[1] + l * st[2] + j * st[3]];
                } else if (d == 1 && st[2] == 1) {
                    /* W's rows run along l (d = 1): 8 rows at a time, each step of l written
                       as 8 consecutive features (a loop over j of one value per copy ran
                       3x slower than torch's transposing copy) */
                    long k = k0;
                    for (; k + 8 <= k1; k += 8)
                        for (long l = l0; l < l1; l++)
#pragma GCC unroll 8
                            for (int q = 0; q < 8; q++)
                                dst[l * width + k + q] = src[(k + q) * st[1] + l];
                    for (; k < k1; k++)
                        for (long l = l0; l < l1; l++) dst[l * width + k] = src[k * st[1] + l];
                } else {
                    for (long k = k0; k < k1; k++)
                        for (long l = l0; l < l1; l++)
                            for (long j = 0; j < d; j++)
                                dst[l * width + k * d + j] = src[k * st[1] + l * st[2] + j * st[3]];
                }
            }
    }
}

/* The packings of a factor given through strides, W(i, k, l, j) = w[i*st[0] + k*st[1] +
   l*st[2] + j*st[3]] (the factor itself, its transpose in (k, l) for the gradient of the
   input, or the output gradient as the weights of the gradient of the factor), in one pass
   without copies in torch. ks_pack: slivers of `width` output features, out (a, d,
   ceil(b/width), c, width), out[i, j, s, l, t] = W(i, s*width + t, l, j), zero past b. */
void ks_pack(const real *w, const long *st, long a, long b, long c, long d, long width,
             real *out)
{
    const long nsl = (b + width - 1) / width;
    for (long i = 0; i < a; i++)
        for (long s = 0; s < nsl; s++) {
            const long kw = lmin(width, b - s * width);
            for (long j = 0; j < d; j++) {
                const real *src = w + i * st[0] + s * width * st[1] + j * st[3];
                real *dst = out + ((i * d + j) * nsl + s) * c * width;
                if (st[1] == 1) {  /* output features contiguous: one copy per l */
                    for (long l = 0; l < c; l++) {
                        memcpy(dst + l * width, src + l * st[2], sizeof(real) * kw);
                        memset(dst + l * width + kw, 0, sizeof(real) * (width - kw));
                    }
                    continue;
                }
                /* blocks of 16 l: each row of W is read along l, and the rows of one
                   block (often 4 kB apart, one L1 set) are not all held at once */
                for (long l0 = 0; l0 < c; l0 += 16) {
                    const long lc = lmin(16, c - l0);
                    for (long t = 0; t < width; t++)
                        for (long l = l0; l < l0 + lc; l++)
                            dst[l * width + t] = t < kw ? src[t * st[1] + l * st[2]] : 0;
                }
            }
        }
}

/* ks_pack_d: out (a, d/LANES, ceil(b/DK), c, DK, LANES), out[i, v, s, l, q, t] =
   W(i, s*DK + q, l, v*LANES + t), zero past b (the weights of ks_bsf_d). */
void ks_pack_d(const real *w, const long *st, long a, long b, long c, long d, real *out)
{
    const long nv = d / LANES, nks = (b + DK - 1) / DK;
    for (long i = 0; i < a; i++)
        for (long v = 0; v < nv; v++)
            for (long s = 0; s < nks; s++)
                for (long l = 0; l < c; l++)
                    for (long q = 0; q < DK; q++, out += LANES) {
                        const long k = s * DK + q;
                        const real *src = w + i * st[0] + k * st[1] + l * st[2]
                                          + v * LANES * st[3];
                        for (long t = 0; t < LANES; t++) out[t] = k < b ? src[t * st[3]] : 0;
                    }
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
                        pack_cols(cols, kc, X + k0 * d * B, d * B, 1, Bp);
                        for (long s0 = 0; s0 < cols; s0 += NR)
                            for (long m0 = 0; m0 < b; m0 += MR)
                                micro(kc, W + (m0 / MR * c + k0) * MR, Bp + s0 * kc, NR,
                                      C + m0 * d * B + s0, d * B, 1, lmin(MR, b - m0),
                                      lmin(NR, cols - s0), k0 > 0, 0);
                    }
                }
        free(Bp);
    }
    return failed;
}

/* The flat (phased = 0) or phased product from the factor itself, W(i, k, l, j) = w[i*st[0]
   + k*st[1] + l*st[2] + j*st[3]]: packed here (ks_pack_f) into a buffer freed on return,
   for a factor used once (a training step's forward: the optimizer changes it before the
   next), in one call. */
int ks_bsf_fw(const real *x, const real *w, const long *st, real *y, long B, long a, long b,
              long c, long d, int phased, const real *xend, const real *bias, long mc,
              int threads)
{
    const long width = phased ? WP : NF, nsl = (b * d + width - 1) / width;
    const long ws[3] = {nsl * c * width, c * width, width};
    real *packed = malloc(sizeof(real) * a * nsl * c * width);
    if (!packed)
        return 1;
    ks_pack_f(w, st, a, b, c, d, width, packed);
    const int failed = phased ? ks_bsf_p(x, packed, y, B, a, b, c, d, a * c * d, a * b * d, xend,
                                         ws, 1, bias, mc, threads)
                              : ks_bsf_f(x, packed, y, B, a, b, c, d, a * c * d, a * b * d, ws, 1,
                                         bias, mc, threads);
    free(packed);
    return failed;
}

/* Batch-size-first in bfloat16 with float32 accumulation, where the instruction set has
   bf16 dot products (AVX512-BF16: vdpbf16ps adds the products of a pair of bf16 values of
   each operand to a float32 lane). The inner dimension runs in pairs: the weights are
   packed (a, d, ceil(b/NR), ceil(c/2), NR, 2), wp[i, j, s, l, t, e] = w[i, s*NR + t,
   2l + e, j] (zero-padded), and the MR-row slivers of X hold pairs (x[2l], x[2l+1]) as one
   32-bit word to broadcast. Built with -Dreal=float -DKS_BF16. */
#if defined(KS_BF16) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <stdint.h>

int ks_has_bf16(void) { return 1; }

/* C[r*cr + t*cc] (+)= the tile in float32 (C is float*), or = the tile rounded to bf16
   (round to nearest even) when Cb is given (C is then unused: one block of the inner
   dimension, nothing to accumulate). */
static inline void micro_bf16(long kp, const uint32_t *restrict Ap, const uint16_t *restrict Bp,
                              float *C, uint16_t *Cb, long cr, long cc, long mr, long nr,
                              int accumulate)
{
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (long l = 0; l < kp; l++) {
        __m512bh bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = (__m512bh)_mm512_loadu_si512((const void *)(Bp + (l * NR + v * LANES) * 2));
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const __m512bh s = (__m512bh)_mm512_set1_epi32((int)Ap[l * MR + r]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], s, bv[v]);
        }
    }
    if (Cb) {
        for (long r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                const __m256i h = (__m256i)_mm512_cvtneps_pbh(acc[r][v]);
                if (cc == 1 && nr == NR) {
                    _mm256_storeu_si256((__m256i *)(Cb + r * cr + v * LANES), h);
                } else {
                    uint16_t lanes[LANES];
                    _mm256_storeu_si256((__m256i *)lanes, h);
                    for (long t = v * LANES; t < nr && t < (v + 1) * LANES; t++)
                        Cb[r * cr + t * cc] = lanes[t - v * LANES];
                }
            }
        return;
    }
    if (cc == 1 && nr == NR) {
        for (long r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                float *dst = C + r * cr + v * LANES;
                _mm512_storeu_ps(dst, accumulate ? _mm512_add_ps(_mm512_loadu_ps(dst),
                                                                 acc[r][v]) : acc[r][v]);
            }
        return;
    }
    for (long r = 0; r < mr; r++)
        for (long t = 0; t < nr; t++) {
            const float v = ((const float *)&acc[r][t / LANES])[t % LANES];
            float *dst = C + r * cr + t * cc;
            *dst = accumulate ? *dst + v : v;
        }
}

/* Ap[m0 * kp + l * MR + r] = (A[(m0 + r) * ar + 2l * ak], A[... (2l + 1) * ak]) as one
   32-bit word, zero-padded past m rows and kc columns. */
static void pack_rows_bf16(long m, long kc, const uint16_t *A, long ar, long ak,
                           uint32_t *Ap)
{
    const long kp = (kc + 1) / 2;
    for (long m0 = 0; m0 < m; m0 += MR) {
        const long mr = lmin(MR, m - m0);
        uint32_t *dst = Ap + m0 * kp;
        for (long l = 0; l < kp; l++) {
            long r = 0;
            for (; r < mr; r++) {
                const uint16_t *src = A + (m0 + r) * ar + 2 * l * ak;
                const uint32_t hi = 2 * l + 1 < kc ? src[ak] : 0;
                dst[l * MR + r] = (uint32_t)src[0] | hi << 16;
            }
            for (; r < MR; r++) dst[l * MR + r] = 0;
        }
    }
}

/* y is bf16 (uint16) when c <= KC (one block of the inner dimension: rounded once, as it
   is stored), else float32 (the caller rounds it after the last block). */
int ks_bsf_bf16(const uint16_t *x, const uint16_t *wp, void *y, long B, long a, long b,
                long c, long d, long mc, int threads)
{
    const int out_bf16 = c <= KC;
    const long N = a * c * d, M = a * b * d, nb = (B + mc - 1) / mc, nsl = (b + NR - 1) / NR;
    const long cp = (c + 1) / 2;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        uint32_t *Ap = malloc(sizeof(uint32_t) * ((mc + MR - 1) / MR) * MR * (KC / 2));
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
                    const uint16_t *A = x + n0 * N + i * c * d + j;
                    const uint16_t *W = wp + (i * d + j) * nsl * cp * NR * 2;
                    const long at = n0 * M + i * b * d + j;
                    float *C = out_bf16 ? 0 : (float *)y + at;
                    uint16_t *Cb = out_bf16 ? (uint16_t *)y + at : 0;
                    for (long k0 = 0; k0 < c; k0 += KC) {  /* KC even: pairs never split */
                        const long kc = lmin(KC, c - k0), kp = (kc + 1) / 2;
                        pack_rows_bf16(rows, kc, A + k0 * d, N, d, Ap);
                        for (long s = 0; s < nsl; s++)
                            for (long m0 = 0; m0 < rows; m0 += MR)
                                micro_bf16(kp, Ap + m0 * kp,
                                           W + (s * cp + k0 / 2) * NR * 2,
                                           C ? C + m0 * M + s * NR * d : 0,
                                           Cb ? Cb + m0 * M + s * NR * d : 0, M, d,
                                           lmin(MR, rows - m0), lmin(NR, b - s * NR), k0 > 0);
                    }
                }
            }
        free(Ap);
    }
    return failed;
}
#else
int ks_has_bf16(void) { return 0; }
#endif
