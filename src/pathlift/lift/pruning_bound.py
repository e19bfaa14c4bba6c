"""The certificate of a pruning (thesis Sec. 3.5.1, eq. 3.19), from path-norms and
path-magnitudes.

For a pruned theta' = s ⊙ theta (s in {0, 1}^G), theta_i theta'_i >= 0 and |theta'_i| <=
|theta_i|, so for every input x (Thm 3.4.1, Cor. 3.4.1 with the l1 norm of the outputs,
the largest of the r-norms)

    ||R_theta(x) - R_theta'(x)||_1 <= max(1, ||x||_inf) d(theta, theta'),

where d(theta, theta') = ||Phi(theta)||_1 - ||Phi(theta')||_1 exactly (Lemma 3.4.1, eq.
3.8: two |theta| passes), and d(theta, theta') <= sum over the pruned coordinates i of
Phi-Cost(theta, i) = Path-Mag(theta, i) (eq. 3.17; eq. 3.19 is the resulting bound).
Pruning in steps, the telescoping of eq. 3.17 runs over the steps: each coordinate's cost
is taken at the parameters of the step that pruned it.

``pathlift.bounds`` re-exports it with every other bound; it is defined here, below the
pruning package (``pathlift.prune``, a layer under ``pathlift.bounds``, see
docs/architecture.md), because ``prune_model`` computes it while it prunes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pathlift.logspace import log10_difference, log10_sum, power10

__all__ = ["PruningCertificate", "pruning_certificate"]


@dataclass(frozen=True)
class PruningCertificate:
    """What a pruning theta -> theta' certifies (eq. 3.19, Lemma 3.4.1), in log10 (the
    numbers exceed float64 on deep networks): ``log10_path_norm`` = log10 ||Phi(theta)||_1,
    ``log10_path_metric`` = log10 d(theta, theta') (exact), ``log10_bound`` = log10 of the
    summed Path-Mag of the pruned coordinates, an upper bound on d. For every input x,
    ||R_theta(x) - R_theta'(x)||_1 <= max(1, ||x||_inf) * path_metric <= max(1,
    ||x||_inf) * bound."""

    log10_path_norm: float
    log10_path_metric: float
    log10_bound: float

    @property
    def path_metric(self) -> float:
        return power10(self.log10_path_metric)

    @property
    def bound(self) -> float:
        return power10(self.log10_bound)


def pruning_certificate(log10_path_norm: float, log10_pruned_path_norm: float,
                        log10_step_costs: Sequence[float]) -> PruningCertificate:
    """The certificate of a pruning from log10 ||Phi(theta)||_1 before it, log10
    ||Phi(theta')||_1 after it, and for each step the log10 of the summed Path-Mag of the
    coordinates that step pruned, taken at that step's parameters (eq. 3.17 telescoped
    over the steps; ``pathlift.prune.Scores.log10_sum`` over the step's pruned mask).

    d = ||Phi(theta)||_1 - ||Phi(theta')||_1 (Lemma 3.4.1) and its bound sum the
    log-space terms exactly beyond float64 (``pathlift.logspace``)."""
    return PruningCertificate(log10_path_norm,
                              log10_difference(log10_path_norm, log10_pruned_path_norm),
                              log10_sum(log10_step_costs))
