"""Generalisation bounds for classifiers from a Rademacher bound (thesis Sec. 4.1, 7.2.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from pathlift.bounds.rademacher import RademacherBound
from pathlift.errors import InvalidParameterError
from pathlift.graph import eval_mode, unwrap
from pathlift.graph.boundary import flat_outputs, model_input

CROSS_ENTROPY_LIPSCHITZ = math.sqrt(2.0)  # thesis Example 4.1.1, Appendix C.6


def gap_bound_log10(rademacher: RademacherBound, n: int, lipschitz: float) -> float:
    """log10 of (2 sqrt(2) L / n) R(F, mu), the bound on the expected generalisation gap of
    an L-Lipschitz loss, thesis Thm 4.1.1 (eq. 4.10). With Thm 4.4.1: 4 L sigma C r / n."""
    if n <= 0 or not lipschitz > 0:
        raise InvalidParameterError(f"need n > 0 and a positive Lipschitz constant, got "
                                    f"n={n}, L={lipschitz}")
    return math.log10(2 * math.sqrt(2) * lipschitz / n) + rademacher.log10


def cross_entropy_gap_log10(rademacher: RademacherBound, n: int) -> float:
    """log10 of the bound on the expected cross-entropy gap, Thm 4.1.1 with L = sqrt(2)
    (Example 4.1.1)."""
    return gap_bound_log10(rademacher, n, CROSS_ENTROPY_LIPSCHITZ)


def margins(model: nn.Module, loader: DataLoader) -> torch.Tensor:
    """Margins R(x)_y - max_{c != y} R(x)_c over a loader (thesis Sec. 4.1, Appendix E.1).

    Runs in eval mode; the caller's training flags are restored afterwards.
    """
    net = unwrap(model)
    out = []
    with torch.no_grad(), eval_mode(net):
        for x, y in loader:
            logits = flat_outputs(net(model_input(net, x)), len(x)).to("cpu", torch.float64)
            true = logits.gather(1, y.reshape(-1, 1)).squeeze(1)
            others = logits.scatter(1, y.reshape(-1, 1), -math.inf).amax(1)
            out.append(true - others)
    if not out:
        raise InvalidParameterError("margins() got an empty loader")
    return torch.cat(out)


@dataclass(frozen=True)
class MarginBound:
    """Thm 4.1.2 (eq. 4.14): with probability >= 1 - delta, the top-1 test error is at most
    ``train_margin_loss`` + 10^``complexity_log10`` + ``confidence``.

    ``gamma`` is the ``quantile``-quantile of the training margins; ``train_margin_loss``
    the training gamma-margin loss (eq. 4.13); ``complexity_log10`` = log10 of
    (4 sqrt(2) / (n gamma)) R(F, mu); ``confidence`` = 3 sqrt(ln(2/delta) / (2n)).
    """

    quantile: float
    gamma: float
    train_margin_loss: float
    complexity_log10: float
    confidence: float

    @property
    def log10(self) -> float:
        """log10 of the whole right-hand side of eq. 4.14."""
        rest_log10 = math.log10(self.train_margin_loss + self.confidence)  # confidence > 0
        top = max(self.complexity_log10, rest_log10)
        return top + math.log10(10 ** (self.complexity_log10 - top) + 10 ** (rest_log10 - top))

    @property
    def informative(self) -> bool:
        """Whether the bound on a probability is below 1."""
        return self.log10 < 0


def margin_loss(m: torch.Tensor, gamma: float) -> float:
    """Mean gamma-margin loss of eq. 4.13: 1 if m < 0, 1 - m/gamma on [0, gamma], else 0."""
    return float((1 - m / gamma).clamp(0.0, 1.0).mean())


def default_quantile(train_error: float) -> float:
    """q = e/3 + 2/3, the margin quantile of thesis Table E.2 (e = top-1 train error)."""
    return train_error / 3 + 2 / 3


def margin_bound(rademacher: RademacherBound, train_margins: torch.Tensor,
                 quantile: float, delta: float = 0.05) -> MarginBound:
    """Top-1 risk bound of thesis Thm 4.1.2 (eq. 4.14), gamma = a training-margin quantile
    (Appendix E.1). Raises InvalidParameterError when that quantile is not positive."""
    if not 0 < quantile <= 1 or not 0 < delta < 1:
        raise InvalidParameterError(f"need quantile in (0, 1] and delta in (0, 1), got "
                                    f"{quantile}, {delta}")
    n = len(train_margins)
    gamma = float(torch.quantile(train_margins.to(torch.float64), quantile))
    if not gamma > 0:
        raise InvalidParameterError(
            f"the {quantile:.3f}-quantile of the training margins is {gamma:.3g} <= 0: Thm "
            "4.1.2 needs gamma > 0; pick a larger quantile (above the training error)")
    return MarginBound(
        quantile=quantile, gamma=gamma,
        train_margin_loss=margin_loss(train_margins, gamma),
        complexity_log10=math.log10(4 * math.sqrt(2) / (n * gamma)) + rademacher.log10,
        confidence=3 * math.sqrt(math.log(2 / delta) / (2 * n)))
