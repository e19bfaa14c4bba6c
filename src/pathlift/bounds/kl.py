"""The binary relative entropy and its inverse, and the Occam bound they give.

``kl_inverse(q, c)`` = sup {p in [q, 1]: kl(q || p) <= c}. For one event E of probability
p, the Chernoff bound on the binomial lower tail, P(q_hat <= t) <= exp(-n kl(t || p)) for
t <= p [Langford 2005, Thm 3.3], gives P(p > kl_inverse(q_hat, c)) <= exp(-n c).

**Occam bound** (``occam_bound``). Let a countable set of events E_h be indexed by the
words h of a prefix code (sum_h 2^-|h| <= 1, Kraft) and a finite list of T variants
fixed in advance. With probability >= 1 - delta over n iid samples, for every h and
variant t: P(E_{h,t}) <= kl_inverse(q_hat(E_{h,t}), (|h| ln 2 + ln T + ln 1/delta) / n).
*Proof*: apply the Chernoff statement to each (h, t) with c_{h,t} chosen so that
exp(-n c_{h,t}) = delta 2^-|h| / T, and sum: sum_{h,t} delta 2^-|h| / T <= delta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pathlift.errors import InvalidParameterError

__all__ = ["OccamBound", "kl_bernoulli", "kl_inverse", "occam_bound"]

_LN2 = math.log(2.0)


def kl_bernoulli(q: float, p: float) -> float:
    """kl(q || p) = q ln(q/p) + (1-q) ln((1-q)/(1-p)) in nats, 0 ln 0 = 0 (inf when p
    excludes an outcome q gives weight). For p close to q it is written as
    q g(x/q) + (1-q) g(-x/(1-q)) with x = p - q and g(u) = u - ln(1 + u) >= 0 (the two
    first-order terms cancel exactly), so it keeps its relative precision there."""
    if not (0 <= q <= 1 and 0 <= p <= 1):
        raise InvalidParameterError(f"kl needs q, p in [0, 1], got {q}, {p}")
    if (p == 0 and q > 0) or (p == 1 and q < 1):
        return math.inf
    if q == 0:
        return -math.log1p(-p)
    if q == 1:
        return -math.log(p)
    x = p - q
    if abs(x) < 0.1 * min(q, 1 - q):  # the terms cancel to first order: the g form
        return q * _g(x / q) + (1 - q) * _g(-x / (1 - q))
    first = q * (math.log(q) - math.log(p)) if x > q else -q * math.log1p(x / q)
    return first + (1 - q) * math.log1p(x / (1 - p))


def _g(u: float) -> float:
    """u - ln(1 + u) for u > -1, by its series sum_{k>=2} (-u)^k / k near 0."""
    if abs(u) >= 0.1:
        return u - math.log1p(u)
    total, power = 0.0, u * u
    for k in range(2, 30):
        total += power / k if k % 2 == 0 else -power / k
        power *= u
    return total


def kl_inverse(q: float, budget: float) -> float:
    """sup {p in [q, 1]: kl(q || p) <= budget}, by Newton's method from the right on the
    convex increasing p -> kl(q || p) - budget (monotone convergence to the root from
    above), the last step bisected to rounding: the p returned has kl(q || p) > budget, so
    it is never below the true inverse (up to the rounding of kl itself, ~1e-16) and
    exceeds it by an ulp or so."""
    if not 0 <= q <= 1:
        raise InvalidParameterError(f"kl_inverse needs q in [0, 1], got {q}")
    if not budget >= 0:
        raise InvalidParameterError(f"kl_inverse needs a budget >= 0, got {budget}")
    if q == 1.0 or budget == math.inf:
        return 1.0
    if budget == 0:
        return q
    # a start with kl(q || p) >= budget: Pinsker, or the (1-q) ln((1-q)/(1-p)) term alone
    if q + math.sqrt(budget / 2) < 1:
        p = q + math.sqrt(budget / 2)
    else:
        own = q * math.log(q) if q > 0 else 0.0
        p = 1 - (1 - q) * math.exp(-(budget - own) / (1 - q))
    while p < 1.0 and kl_bernoulli(q, p) <= budget:  # a start below the root (rounding)
        p += (1 - p) / 2
    if p >= 1.0:
        return 1.0
    for _ in range(200):  # invariant: kl(q || p) > budget, i.e. p above the root
        gap = kl_bernoulli(q, p) - budget
        nxt = p - gap * p * (1 - p) / (p - q)
        if not nxt < p:
            return p
        if kl_bernoulli(q, nxt) <= budget:  # the root is in [nxt, p]: bisect to rounding
            low, high = nxt, p
            while low < (mid := (low + high) / 2) < high:
                low, high = (mid, high) if kl_bernoulli(q, mid) <= budget else (low, mid)
            return high
        p = nxt
    return p


@dataclass(frozen=True)
class OccamBound:
    """kl_inverse(``empirical``, ``budget``) with budget = (``bits`` ln 2 + ln ``events``
    + ln 1/``delta``) / ``n``: with probability >= 1 - delta, the probability of the
    coded event is at most ``value`` (module docstring)."""

    n: int
    delta: float
    bits: int
    events: int
    empirical: float
    budget: float
    value: float

    def __repr__(self) -> str:
        return (f"OccamBound({self.value:.4f} = kl^-1({self.empirical:.4f}, {self.budget:.4f}); "
                f"{self.bits} bits, {self.events} events, n {self.n}, delta {self.delta:g})")


def occam_bound(empirical: float, n: int, bits: int, events: int = 1,
                delta: float = 0.05) -> OccamBound:
    """The Occam bound of the module docstring for one coded event of ``bits`` bits, one
    of ``events`` variants fixed in advance, observed with frequency ``empirical`` on n
    samples."""
    if n <= 0 or bits < 0 or events < 1 or not 0 < delta < 1:
        raise InvalidParameterError(f"need n > 0, bits >= 0, events >= 1, delta in (0, 1); "
                                    f"got {n}, {bits}, {events}, {delta}")
    budget = (bits * _LN2 + math.log(events) + math.log(1 / delta)) / n
    return OccamBound(n, delta, bits, events, empirical, budget, kl_inverse(empirical, budget))
