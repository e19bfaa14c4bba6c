"""Path-norm bounds valid as stated: a union bound over radii and margins fixed in advance.

Thesis Thm 4.1.2 (eq. 4.14) holds for a class F and a margin gamma chosen *before* the
sample S is drawn; applying it with F = {theta: ||Phi(theta)||_1 <= r}, r the trained
network's own path-norm, and gamma read off its training margins (thesis Sec. 7.2.1,
App. E.1) makes both depend on S, which the theorem does not allow (the thesis says so
itself, Sec. 7.3.1). This module proves and evaluates the standard repair.

**Theorem (union over a grid fixed in advance).** Fix before seeing S: the architecture
G, delta in (0, 1) and an integer s >= 1; let r_k = 2^(k/s), gamma_j = 2^(j/s) for k, j
in Z, and w(k) = (2/3) / ((|k|+1)(|k|+2)), so that sum_{k in Z} w(k) = 1. With
probability at least 1 - delta over S of n iid samples, for EVERY parameter theta of G
and every j in Z, with k = k(theta) = ceil(s log2 ||Phi(theta)||_1),

    P(argmax R_theta(x) != y) <= L_{gamma_j}(theta, S) + 4 sqrt(2) / (n gamma_j) * B(S) r_k
                                 + 3 sqrt((ln(2/delta) + ln 1/w(k) + ln 1/w(j)) / (2n)),

where L_gamma is the training gamma-margin loss (eq. 4.13) and B(S) r is the bound on
the empirical Rademacher complexity R(F_r, S) of F_r = {theta: ||Phi(theta)||_1 <= r}:
sqrt(2) sigma(S) C r of Thm 4.4.1 (or Thm 4.3.1 / C.2.2).

*Proof.* (1) For fixed k, j, eq. 4.14 for F_{r_k} at gamma_j with confidence
delta_kj = delta w(k) w(j) holds with the *empirical* Rademacher complexity [Bartlett et
al. 2017, Lemma 3.1; Mohri et al. 2018, Thm 3.3 with the 3 sqrt(ln(2/delta)/2n) term;
Maurer 2016 for the vector contraction, thesis Thm 4.1.1]. (2) The proofs of Thm 4.4.1
(App. C.5: "I condition on S") and Thm 4.3.1 (Dudley's integral on the empirical metric)
bound R(F_r, S) for every fixed S by sqrt(2) sigma(S) C r with sigma(S) =
max(n, max_u sum_i x_{i,u}^2)^(1/2) (resp. their covering form) before taking the
expectation, so sigma measured on S is legitimate here. (3) ln(2/delta_kj) = ln(2/delta)
+ ln 1/w(k) + ln 1/w(j) and sum_{k,j} delta_kj = delta, so by the union bound all the
statements hold at once with probability >= 1 - delta. (4) theta lies in F_{r_k(theta)}
since r_k(theta) >= ||Phi(theta)||_1, whatever S made theta; j may then be chosen freely.

The cross-entropy version (``union_gap_bound``) bounds the expected cross-entropy clipped
at a level M fixed in advance, min(CE, M) in [0, M] being sqrt(2)-Lipschitz (Example
4.1.1): E min(CE, M) <= its training mean + 4 B(S) r_k / n + 3 M sqrt((ln(2/delta) +
ln 1/w(k)) / (2n)), same proof with the bounded-loss form of Thm 4.1.1.

The *fixed-class* form (thesis Sec. 7.2.1: r = ||Phi(theta)||_1 and gamma chosen after
seeing S; ``fixed_class_margin_bound``) stays available for comparison and is labelled as
such: it is what the union bound would be if r and gamma had been fixed in advance at the
values that turned out best, and it is never above the union bound (tested). In both,
gamma ranges over (0, largest training margin].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from pathlift.bounds.rademacher import RademacherBound
from pathlift.bounds.risk import MarginBound
from pathlift.errors import InvalidParameterError
from pathlift.logspace import power10

__all__ = ["DEFAULT_GRID", "PriorGrid", "UnionGapBound", "UnionMarginBound",
           "fixed_class_margin_bound", "margin_losses", "union_gap_bound", "union_margin_bound"]

_LOG10_2 = math.log10(2.0)


@dataclass(frozen=True)
class PriorGrid:
    """The grid 2^(k/steps), k in Z, with the prior w(k) = (2/3) / ((|k|+1)(|k|+2)) (sum 1).

    Radii and margins of ``union_margin_bound`` are points of this grid; a grid point costs
    ln 1/w(k) ~ 2 ln |k| nats inside the confidence term, and rounding to it costs a factor
    at most 2^(1/steps).
    """

    steps: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise InvalidParameterError(f"grid steps must be a positive int, got {self.steps!r}")

    def log2_value(self, k: int) -> float:
        """log2 of the grid point k."""
        return k / self.steps

    def value(self, k: int) -> float:
        return 2.0 ** self.log2_value(k)

    def weight(self, k: int) -> Fraction:
        """w(k), exactly."""
        return Fraction(2, 3 * (abs(k) + 1) * (abs(k) + 2))

    def log_inverse_weight(self, k: int) -> float:
        """ln 1/w(k), what the grid point k costs inside the confidence term (nats)."""
        return math.log(1.5 * (abs(k) + 1) * (abs(k) + 2))

    def ceil_index(self, log10_value: float) -> int:
        """The smallest k with 2^(k/steps) >= 10^log10_value."""
        k = math.ceil(self.steps * log10_value / math.log10(2.0))
        while self.log2_value(k - 1) * math.log10(2.0) >= log10_value:  # float guard
            k -= 1
        while self.log2_value(k) * math.log10(2.0) < log10_value:
            k += 1
        return k


DEFAULT_GRID = PriorGrid()


def margin_losses(train_margins: torch.Tensor, gammas: torch.Tensor) -> torch.Tensor:
    """The training gamma-margin loss of eq. 4.13 at each gamma > 0 of ``gammas``, in
    O((n + len(gammas)) log n): mean of 1 for m <= 0, 1 - m/gamma on (0, gamma), 0 above."""
    m = torch.sort(train_margins.to(torch.float64).reshape(-1)).values
    n = len(m)
    cumulative = torch.cat([m.new_zeros(1), torch.cumsum(m, 0)])
    g = gammas.to(torch.float64)
    nonpositive = torch.searchsorted(m, m.new_zeros(1), right=True)  # m <= 0
    below = torch.searchsorted(m, g)  # m < gamma
    inside = (below - nonpositive).clamp(min=0)
    mass = cumulative[below] - cumulative[nonpositive.expand_as(below)]
    return (nonpositive + inside - torch.where(inside > 0, mass / g, 0.0)) / n


@dataclass(frozen=True)
class UnionMarginBound:
    """The top-1 risk bound of the union theorem (module docstring), its terms laid out.

    With probability >= 1 - ``delta`` over S, simultaneously for every network of the
    architecture: P(error) <= ``train_margin_loss`` + 10^``complexity_log10`` +
    ``confidence``, at the radius r_k >= ||Phi(theta)||_1 and margin gamma_j of the grid.
    """

    n: int
    delta: float
    steps: int
    theorem: str
    path_norm_log10: float
    radius_index: int
    gamma_index: int
    gamma: float
    train_margin_loss: float
    complexity_log10: float
    confidence: float
    log_inverse_weights: tuple[float, float]

    hypothesis_class = ("every network of this architecture, through the classes "
                        "{||Phi||_1 <= 2^(k/s)}, k in Z")
    paid_by = ("union over radii 2^(k/s) and margins 2^(j/s) fixed in advance, delta_kj = "
               "delta w(k) w(j): ln 1/w(k) + ln 1/w(j) inside the confidence term")

    @property
    def radius_log10(self) -> float:
        """log10 r_k, the grid radius the network is certified in."""
        return self.radius_index / self.steps * _LOG10_2

    @property
    def log10(self) -> float:
        """log10 of the bound on the top-1 error."""
        rest = self.train_margin_loss + self.confidence
        top = max(self.complexity_log10, math.log10(rest))
        return top + math.log10(10 ** (self.complexity_log10 - top) + 10 ** (
            math.log10(rest) - top))

    @property
    def value(self) -> float:
        return power10(self.log10)

    @property
    def informative(self) -> bool:
        return self.log10 < 0

    def statement(self) -> str:
        """The bound in one sentence, with what it holds for and how it was paid."""
        return (f"with probability >= {1 - self.delta:g} over the n = {self.n} training "
                f"samples, the top-1 error is at most {_fmt(self.log10)}: valid for "
                f"{self.hypothesis_class} (s = {self.steps}); paid by {self.paid_by} "
                f"(here {self.log_inverse_weights[0]:.2f} + {self.log_inverse_weights[1]:.2f}"
                " nats)")

    def __repr__(self) -> str:
        return (f"UnionMarginBound({_fmt(self.log10)}, {self.theorem}, log10 ||Phi||_1 "
                f"{self.path_norm_log10:.3f} <= r_k = 10^{self.radius_log10:.3f}, gamma_j "
                f"{self.gamma:.4g}, margin loss {self.train_margin_loss:.4f}, complexity "
                f"10^{self.complexity_log10:.3f}, confidence {self.confidence:.4f}, n "
                f"{self.n}, delta {self.delta:g})")


def _fmt(log10: float) -> str:
    return f"{power10(log10):.4g}" if log10 < 3 else f"10^{log10:.2f}"


def _check(delta: float, n: int) -> None:
    if not 0 < delta < 1:
        raise InvalidParameterError(f"delta must lie in (0, 1), got {delta}")
    if n <= 0:
        raise InvalidParameterError("the bound needs at least one training sample")


def _complexity_log10(rademacher: RademacherBound, radius_log10: float, n: int) -> float:
    """log10 of 4 sqrt(2) / n * (Rademacher bound at the radius), without gamma."""
    return math.log10(4 * math.sqrt(2) / n) + rademacher.log10 - rademacher.path_norm_log10 \
        + radius_log10


def union_margin_bound(rademacher: RademacherBound, train_margins: torch.Tensor,
                       delta: float = 0.05, grid: PriorGrid = DEFAULT_GRID) -> UnionMarginBound:
    """The top-1 bound of the union theorem (module docstring) for the network whose
    path-norm and Rademacher bound ``rademacher`` holds (at r = ||Phi(theta)||_1) and whose
    training margins are ``train_margins``: r rounded up to the grid, the margin gamma_j
    of the grid that minimises the bound among those up to the largest training margin
    (beyond it the margin loss only trades against the complexity term above 1). Valid
    as stated, whatever produced the network.
    """
    n = len(train_margins)
    _check(delta, n)
    k = grid.ceil_index(rademacher.path_norm_log10)
    base = _complexity_log10(rademacher, k / grid.steps * math.log10(2.0), n)
    m = train_margins.to(torch.float64)
    positive = m[m > 0]
    if positive.numel():  # gamma_j in (0, largest margin], as the fixed-class form
        low = math.floor(grid.steps * math.log2(float(positive.min())))
        high = math.floor(grid.steps * math.log2(float(positive.max())))
        while grid.value(high) > float(positive.max()):
            high -= 1
        low = min(low, high)
    else:  # every margin <= 0: the margin loss is 1 at every gamma
        low = high = 0
    js = list(range(low, high + 1))
    gammas = torch.tensor([grid.value(j) for j in js], dtype=torch.float64)
    losses = margin_losses(m, gammas)
    ln_k = grid.log_inverse_weight(k)
    best = None
    for j, gamma, loss in zip(js, gammas.tolist(), losses.tolist(), strict=True):
        ln_j = grid.log_inverse_weight(j)
        confidence = 3 * math.sqrt((math.log(2 / delta) + ln_k + ln_j) / (2 * n))
        candidate = UnionMarginBound(
            n, delta, grid.steps, rademacher.theorem, rademacher.path_norm_log10, k, j,
            gamma, loss, base - math.log10(gamma), confidence, (ln_k, ln_j))
        if best is None or candidate.log10 < best.log10:
            best = candidate
    return best


def fixed_class_margin_bound(rademacher: RademacherBound, train_margins: torch.Tensor,
                             delta: float = 0.05) -> MarginBound:
    """Thm 4.1.2 (eq. 4.14) in the *fixed-class* form of thesis Sec. 7.2.1: the class
    {||Phi||_1 <= r} with r = ||Phi(theta)||_1 and the margin gamma > 0 that minimises the
    bound, both read off the trained network and its sample. It is valid only if r and
    gamma had been fixed before S was drawn: a comparison, not a certificate.

    gamma ranges over (0, largest training margin], as in ``union_margin_bound``; between
    two consecutive margins the bound is a + b/gamma, monotone, so the minimum is at a
    positive training margin: exact, not a grid search."""
    n = len(train_margins)
    _check(delta, n)
    m = train_margins.to(torch.float64)
    candidates = torch.unique(m[m > 0])
    confidence = 3 * math.sqrt(math.log(2 / delta) / (2 * n))
    base = _complexity_log10(rademacher, rademacher.path_norm_log10, n)
    if not candidates.numel():
        raise InvalidParameterError("no training margin is positive: Thm 4.1.2 needs "
                                    "gamma > 0 and certifies nothing here")
    losses = margin_losses(m, candidates)
    totals = losses + torch.pow(10.0, base - torch.log10(candidates))
    i = int(torch.argmin(totals))
    gamma = float(candidates[i])
    return MarginBound(quantile=float((m <= gamma).double().mean()), gamma=gamma,
                       train_margin_loss=float(losses[i]),
                       complexity_log10=base - math.log10(gamma), confidence=confidence)


@dataclass(frozen=True)
class UnionGapBound:
    """The clipped cross-entropy bound of the union theorem: with probability >= 1 -
    ``delta``, E min(CE, ``clip``) - mean_S min(CE, ``clip``) <= 10^``complexity_log10``
    + ``confidence``, for every network of the architecture (radius r_k >= ||Phi||_1)."""

    n: int
    delta: float
    steps: int
    clip: float
    theorem: str
    path_norm_log10: float
    radius_index: int
    complexity_log10: float
    confidence: float

    @property
    def log10(self) -> float:
        """log10 of the bound on the clipped cross-entropy gap."""
        top = max(self.complexity_log10, math.log10(self.confidence))
        return top + math.log10(10 ** (self.complexity_log10 - top)
                                + 10 ** (math.log10(self.confidence) - top))

    def __repr__(self) -> str:
        return (f"UnionGapBound(log10 {self.log10:.3f} on E min(CE, {self.clip:g}) - train, "
                f"{self.theorem}, radius 10^{self.radius_index / self.steps * _LOG10_2:.3f}, "
                f"n {self.n}, delta {self.delta:g})")


def union_gap_bound(rademacher: RademacherBound, n: int, clip: float = 10.0,
                    delta: float = 0.05, grid: PriorGrid = DEFAULT_GRID) -> UnionGapBound:
    """The clipped cross-entropy bound of the union theorem (module docstring): Thm 4.1.1
    with L = sqrt(2) for min(CE, clip) in [0, clip], the radius rounded up to the grid."""
    _check(delta, n)
    if not clip > 0:
        raise InvalidParameterError(f"the clipping level must be positive, got {clip}")
    k = grid.ceil_index(rademacher.path_norm_log10)
    radius_log10 = k / grid.steps * math.log10(2.0)
    complexity = math.log10(4.0 / n) + rademacher.log10 - rademacher.path_norm_log10 \
        + radius_log10
    confidence = 3 * clip * math.sqrt((math.log(2 / delta) + grid.log_inverse_weight(k))
                                      / (2 * n))
    return UnionGapBound(n, delta, grid.steps, clip, rademacher.theorem,
                         rademacher.path_norm_log10, k, complexity, confidence)
