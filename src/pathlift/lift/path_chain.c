/* The |theta|^q pass of a chain of dense layers (thesis Thm 3.1.1) and its gradient in one
 * call: pathlift.lift.chain. Layer k maps v_k = |W_k|^q v_{k-1} + |b_k|^q (W_k of n[k+1]
 * rows and n[k] columns, row-major; b_k or NULL), v_0 = 1; T = sum_i v_L[i] and
 * ln T is written to out[0].
 *
 * Every v_k is kept in double at a scale of its own (v_k = e^{s_k} * mantissa, the largest
 * mantissa 1), so neither T nor its gradient overflows between layers. The gradient of
 * c ln T runs the chain backwards: g_L = d ln T / d v_L = 1/T, g_{k-1} = |W_k|^q^T g_k
 * (scaled the same way), d ln T / d|W_k|^q = g_k v_{k-1}^T and d ln T / d|b_k|^q = g_k.
 * mode 0: the pass alone; mode 1: c T^a d ln T / d W (d ln T / d|W|^q times
 * q |W|^{q-1} sign W) into G; mode 2: c d T / d|W|^q (the magnitudes' gradient, g_L = 1),
 * into G; mode 3: as mode 1, added to G (a training step's .grad), and only where ln T is
 * finite. G holds the same layout as P (G[2k] and G[2k+1] for W_k and b_k; NULL: not
 * written). Returns 0, or 1 when no memory is left. path_chain_scale multiplies such a G
 * by c in place (the upstream gradient).
 * Compiled with -Dreal=float or -Dreal=double (the parameters' type).
 */
#include <math.h>
#include <stdlib.h>

static inline double power(double w, double q) {
  w = fabs(w);
  return q == 1.0 ? w : q == 2.0 ? w * w : pow(w, q);
}

/* d|w|^q / dw = q |w|^{q-1} sign w (0 at w = 0, as autograd's abs) */
static inline double slope(double w, double q) {
  double sign = (w > 0) - (w < 0);
  return q == 1.0 ? sign : q == 2.0 ? 2.0 * w : q * sign * pow(fabs(w), q - 1.0);
}

/* sum_j |row_j|^q v_j, in vector lanes (the sum's order is the lanes', not j's) */
static double dot(const real* row, const double* v, long n, double q) {
  double acc = 0.0;
  if (q == 1.0) {
#pragma omp simd reduction(+ : acc)
    for (long j = 0; j < n; j++) acc += fabs((double)row[j]) * v[j];
  } else if (q == 2.0) {
#pragma omp simd reduction(+ : acc)
    for (long j = 0; j < n; j++) acc += (double)row[j] * row[j] * v[j];
  } else {
    for (long j = 0; j < n; j++) acc += power(row[j], q) * v[j];
  }
  return acc;
}

/* log of a non-negative number, -inf at 0 */
static inline double log0(double x) { return x > 0 ? log(x) : -INFINITY; }

static void forward(long L, const long* n, real* const* P, double q, double* v, double* s) {
  for (long j = 0; j < n[0]; j++) v[j] = 1.0;
  s[0] = 0.0;
  double* prev = v;
  for (long k = 0; k < L; k++) {
    long in = n[k], o = n[k + 1];
    double* cur = prev + in;
    const real* w = P[2 * k];
    const real* b = P[2 * k + 1];
    double top = 0.0, top_b = 0.0;
    for (long i = 0; i < o; i++) {
      cur[i] = dot(w + i * in, prev, in, q);
      if (cur[i] > top) top = cur[i];
      if (b && power(b[i], q) > top_b) top_b = power(b[i], q);
    }
    double from_w = s[k] + log0(top), from_b = log0(top_b);
    double scale = from_w > from_b ? from_w : from_b;
    if (scale == -INFINITY) scale = 0.0; /* the layer maps everything to 0 */
    double fw = exp(s[k] - scale), fb = exp(-scale);
    for (long i = 0; i < o; i++) cur[i] = cur[i] * fw + (b ? power(b[i], q) * fb : 0.0);
    s[k + 1] = scale;
    prev = cur;
  }
}

static void backward(long L, const long* n, real* const* P, double q, int mode, double c,
                     double a, const double* v, const double* s, double ln, double* g,
                     double* next, real* const* G) {
  long at = 0;
  for (long k = 0; k < L; k++) at += n[k];
  for (long i = 0; i < n[L]; i++) g[i] = 1.0;
  double scale = mode == 2 ? 0.0 : (a - 1.0) * ln; /* g = e^scale * mantissa */
  for (long k = L - 1; k >= 0; k--) {
    long in = n[k], o = n[k + 1];
    at -= in;
    const double* vp = v + at;
    const real* w = P[2 * k];
    const real* b = P[2 * k + 1];
    real* gw = G[2 * k];
    real* gb = G[2 * k + 1];
    double fw = c * exp(scale + s[k]), fb = c * exp(scale);
    for (long j = 0; j < in; j++) next[j] = 0.0;
    for (long i = 0; i < o; i++) {
      const real* row = w + i * in;
      real* grow = gw ? gw + i * in : 0;
      double gi = g[i], f = gi * fw;
      if (!gw)
        ;
      else if (mode == 1)
        for (long j = 0; j < in; j++) grow[j] = (real)(f * vp[j] * slope(row[j], q));
      else if (mode == 3)
        for (long j = 0; j < in; j++) grow[j] += (real)(f * vp[j] * slope(row[j], q));
      else
        for (long j = 0; j < in; j++) grow[j] = (real)(f * vp[j]);
      if (q == 1.0)
        for (long j = 0; j < in; j++) next[j] += fabs((double)row[j]) * gi;
      else
        for (long j = 0; j < in; j++) next[j] += power(row[j], q) * gi;
      if (b && gb) {
        real d = (real)(gi * fb * (mode == 2 ? 1.0 : slope(b[i], q)));
        gb[i] = mode == 3 ? gb[i] + d : d;
      }
    }
    double top = 0.0;
    for (long j = 0; j < in; j++)
      if (next[j] > top) top = next[j];
    for (long j = 0; j < in; j++) g[j] = top > 0 ? next[j] / top : 0.0;
    if (top > 0) scale += log(top);
  }
}

int path_chain(long L, const long* n, real* const* P, double q, int mode, double c,
               double a, real* const* G, double* out) {
  long total = 0, widest = 0;
  for (long k = 0; k <= L; k++) {
    total += n[k];
    if (n[k] > widest) widest = n[k];
  }
  double* work = malloc(sizeof(double) * (total + L + 1 + 2 * widest));
  if (!work) return 1;
  double *v = work, *s = v + total, *g = s + L + 1;
  forward(L, n, P, q, v, s);
  double sum = 0.0;
  for (long i = 0; i < n[L]; i++) sum += v[total - n[L] + i];
  out[0] = s[L] + log0(sum);
  if (mode && (mode != 3 || isfinite(out[0])))
    backward(L, n, P, q, mode, isfinite(out[0]) ? c : NAN, a, v, s, out[0], g, g + widest,
             G);
  free(work);
  return 0;
}

void path_chain_scale(long L, const long* n, real* const* G, double c) {
  for (long k = 0; k < L; k++) {
    long size = n[k + 1] * n[k];
    real* w = G[2 * k];
    real* b = G[2 * k + 1];
    for (long i = 0; i < size; i++) w[i] = (real)(w[i] * c);
    if (b)
      for (long i = 0; i < n[k + 1]; i++) b[i] = (real)(b[i] * c);
  }
}
