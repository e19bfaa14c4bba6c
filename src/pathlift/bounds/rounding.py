"""A proven upper bound on the path-metric d = ||Phi(theta)||_1 - ||Phi(Q)||_1 (thesis
Lemma 3.4.1: |Q| <= |theta|, same signs) as computed in float64, in place of an allowance
guessed for its rounding.

**Derivation.** Floating point: IEEE binary64, round to nearest, every basic operation and
every exp/log/sqrt of torch or libm within 1 ulp, so each returns x (1 + e), |e| <= w =
2^-52 (twice the unit roundoff u, which also covers 1-ulp transcendental functions).

1. *Each output of the |theta| pass* (Thm 3.1.1,
   ``pathlift.lift.path_norm.log_outputs``) is o_v = sum over paths to v of products of
   non-negative numbers. Along a path the pass visits at most P nodes (P: the graph's
   operations); at each it multiplies by a non-negative weight and adds at most K + 1
   non-negative terms (K: the largest fan-in, bounded by the number of entries an
   operation reads; bias included), after at most 8 operations folding a diagonal op
   (BatchNorm) into the weight. A sum of non-negative terms computed in any order,
   blocked or fused, is off by a relative gamma_k = k w / (1 - k w) at most (Higham, Thm
   3.1 / Lemma 3.1), and the relative errors of a product of non-negative factors
   compose: the pass's mantissas are off by a relative gamma_m, m = P (K + 9). Powers of
   two that rescale mantissas are exact.
2. *The log scale.* Each node adds at most one exponent ln 2 to a scale and aligns scales
   once (a factor exp(s - t)), and ln o_v = ln(mantissa) + scale is one log and one sum:
   at most 2P + 2 operations on numbers of magnitude at most Lambda, each off by w
   relative, so absolute errors of at most (2P + 2) w Lambda on ln o_v. Lambda bounds
   every scale on the way: the sum over the quantised tensors of the largest |ln| of a
   non-zero entry, plus P ln(K + 1) (the sums), plus 745 + 12 (a subnormal mantissa; the
   drift window 2^16).
3. Together, |ln o_v(computed) - ln o_v| <= rho = (m + 2P + 2) w (1 + Lambda) / (1 - m w),
   so o_v is within a relative e^rho - 1 <= 1.01 rho (for rho <= 0.01).
4. *The difference.* With a_v, b_v the computed e^(ln o_v - T) (T the largest log, each
   within 2w relative of its exact value from the computed log), d = e^T sum_v (o_v^a -
   o_v^b) e^-T <= e^T (1 + w (|T| + 2)) [sum_v max(a_v - b_v, 0) + (1.01 rho + 2w)
   (a_v + b_v)] (1 + (N + 4) w) for the N outputs (the sums rounded as in 1); its log
   and exp, each off by w (|ln d| + 4), cost a last factor 1 + w (|ln d| + 8).

Every factor is rounded up, so ``certified_d`` never lies below the exact d of the
float64 parameters; tests compare it with exact rational arithmetic.
"""

from __future__ import annotations

import math

import torch

from pathlift.bounds.code import quantized_tensors
from pathlift.graph import LayerGraph
from pathlift.lift.path_norm import log_outputs

__all__ = ["certified_d", "log_error"]

_W = 2.0**-52


def log_error(graph: LayerGraph) -> float:
    """rho of the module docstring: a bound on |ln o_v(computed) - ln o_v| for every
    output of the |theta| pass (q = 1) of ``graph``."""
    nodes = sum(1 for _ in graph.nodes())
    # K + 1 <= the entries a node reads (each neuron's antecedents are among them) + bias
    k = max((sum(math.prod(graph.output_shape(a)) for a in n.all_input_nodes
                 if "tensor_meta" in a.meta) for n in graph.nodes()), default=1) + 1
    m = nodes * (k + 9)
    scale = nodes * math.log(k + 1) + 757.0
    for _, _, _, value in quantized_tensors(graph):
        v = value.detach().abs()
        v = v[v > 0]
        if v.numel():
            scale += max(abs(math.log(float(v.max()))), abs(math.log(float(v.min()))))
    return (m + 2 * nodes + 2) * _W * (1 + scale) / (1 - m * _W)


def certified_d(theta: LayerGraph, q: LayerGraph) -> float:
    """An upper bound, proven in the module docstring, on d = ||Phi(theta)||_1 -
    ||Phi(Q)||_1 = ||Phi(theta) - Phi(Q)||_1 (Lemma 3.4.1, which the caller checks: same
    signs and |Q| <= |theta|) for the parameters of the two graphs."""
    rho = max(log_error(theta), log_error(q))
    if rho > 0.01:
        return math.inf
    log_a, log_b = log_outputs(theta, 1.0), log_outputs(q, 1.0)
    top = float(torch.maximum(log_a.max(), log_b.max()))
    if top == -math.inf:
        return 0.0
    a, b = torch.exp(log_a - top), torch.exp(log_b - top)
    slack = 1.01 * rho + 2 * _W
    inner = float((a - b).clamp(min=0).sum()) + slack * float((a + b).sum())
    factor = (1 + _W * (abs(top) + 2)) * (1 + (len(a) + 4) * _W)
    if inner <= 0:
        return 0.0
    log_d = math.log(inner * factor) + top  # off by w (|log_d| + 2) at most, absolute
    if log_d >= 709:
        return math.inf
    return math.exp(log_d) * (1 + _W * (abs(log_d) + 8))
