"""Kronecker-sparse layers by design: the open problem of thesis Sec. 7.4.1.

Replacing a dense n_out × n_in weight by K_1 ⋯ K_L leaves L and the patterns
(a_l, b_l, c_l, d_l) to choose. ``design`` chooses them for this machine:

1. **Search space** (``candidates``). Chains whose shapes compose to n_out × n_in, whose
   support product is dense (``dense_support``, the expressivity criterion of Dao et al.
   2022), with b, c >= 2 in every factor and at most ``budget``·n_out·n_in parameters.
   Intermediate widths are n_in or n_out (a narrower one caps the rank, a wider one only
   costs). Every such chain of two factors is listed; for three or more, the
   ``per_length`` chains of smallest predicted time and ``per_length`` spread over the
   rest (the products of factor options run into the millions for sizes such as
   384 = 2^7·3, but the cost model is a sum over factors, so they are visited in order of
   predicted time and the first dense ones kept). The families of thesis Table 5.1 that
   fit (Monarch with blocks of about √n, square dyadic butterfly, kaleidoscope, block
   butterfly) and the thesis' ViT-S/16 chains (Sec. 5.5) are added as named points.
2. **Cost model** (``CostModel``). Chapter 5 finds that the time of a pi-factor beyond its
   B·abcd multiplications is driven by the memory rewrites per multiplication
   (b+c)/(bc) (eq. 5.2) and by their stride, d(b+c)/(bc) (Sec. 5.4, Figures 5.5, 5.8,
   5.9). Per algorithm (bmm, each path of the fused kernel; dense as B·M·N) the
   predicted time is
       theta_0 + theta_1·ad + B·abcd·(theta_2 + theta_3 (b+c)/(bc) + theta_4 d(b+c)/(bc))
   (ad: the dense blocks of Algorithm 5.1.1, each a loop step), plus for the fused kernel
   theta_5·(multiplications with b padded to its register tile) + theta_6·(micro-kernel
   calls), which the Chapter 5 ratios do not see: on the 12 × 32 AVX-512 tile
   (16,32,32,1) takes about half the time of (32,16,16,1), with twice its
   multiplications. theta >= 0 fitted by
   non-negative least squares on relative errors to a few multiplications timed on this
   machine (first about 24 factors per path of the fused kernel spread over all options;
   then refitted on the factors of the chains that first fit lists, which is where the
   predictions are used); a factor costs the minimum over algorithms, a chain the sum.
3. **Measurement**. The ``top_k`` best predicted chains and the named families are timed
   for real as ``KSLinear`` layers running the algorithm each factor would run
   (``KSLinear.tune``), round-robin with the dense ``nn.Linear`` in the same run; the
   four fastest are timed again together (twice as many runs) and the fastest is kept,
   or, among those within 3% of it, the one with most parameters.
4. **Choice**. The kept chain is the choice only if it is faster than the dense layer
   timed in the same run; otherwise the dense layer is (``Design.chosen.is_dense``), and
   ``Design.summary()`` says so: a designed layer is never slower than dense.

Modules: ``space`` (step 1), ``cost`` (step 2), ``measure`` (step 3), ``result`` (what is
returned), ``search`` (``design``: the stages in order).

The result is cached on disk per (machine fingerprint, sizes, budget, batch, dtype,
search settings), so a second call is instant (``pathlift.kron.cache``).
"""

from pathlift.kron.design.cost import CostModel, calibrate, fit_cost_model
from pathlift.kron.design.measure import measure, time_factors
from pathlift.kron.design.result import Candidate, Design, spearman
from pathlift.kron.design.search import design
from pathlift.kron.design.space import candidates, factor_options, hand_families

__all__ = [
    "Candidate",
    "CostModel",
    "Design",
    "calibrate",
    "candidates",
    "design",
    "factor_options",
    "fit_cost_model",
    "hand_families",
    "measure",
    "spearman",
    "time_factors",
]
