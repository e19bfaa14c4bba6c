"""The certified top-1 error bound of a trained classifier (thesis Thm 4.1.2 with the
Rademacher bound of Thm 4.4.1), with its terms laid out: which of ||Phi||_1, C, the margin
gamma and sqrt(n) keeps it above 1."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from pathlift.bounds import (
    architecture_constants,
    default_quantile,
    margin_bound,
    margins,
    rademacher_peeling,
    sigma_of,
)
from pathlift.errors import InvalidParameterError
from pathlift.graph import eval_mode, graph_of
from pathlift.lift import path_norm

__all__ = ["CertifiedBound", "certified_top1"]


@dataclass(frozen=True)
class CertifiedBound:
    """Thm 4.1.2 (eq. 4.14, delta = 0.05, gamma the quantile e/3 + 2/3 of the training margins,
    thesis App. E.1) with R(F) <= sqrt(2) sigma C ||Phi||_1 (Thm 4.4.1).

    ``log10`` is log10 of the bound on the top-1 test error (inf when gamma <= 0). The
    complexity term is 8 C ||Phi||_1 / gamma * sigma / n; ``terms_log10`` splits its log10
    into those factors (``sigma_over_n`` ~ -log10 sqrt(n) for inputs of unit scale).
    """

    log10: float
    path_norm_log10: float
    constant: float
    sigma: float
    n: int
    gamma: float
    train_margin_loss: float
    confidence: float
    complexity_log10: float
    train_error: float

    @property
    def informative(self) -> bool:
        return self.log10 < 0

    def terms_log10(self) -> dict[str, float]:
        """log10 of each factor of the complexity term 8 C ||Phi||_1 / gamma * sigma / n."""
        return {"8": math.log10(8.0), "C": math.log10(self.constant),
                "path_norm": self.path_norm_log10,
                "1/gamma": -math.log10(self.gamma) if self.gamma > 0 else math.inf,
                "sigma/n": math.log10(self.sigma / self.n)}


def certified_top1(model: nn.Module, input_shape: Sequence[int], x: Tensor, y: Tensor,
                   delta: float = 0.05) -> CertifiedBound:
    """The top-1 risk bound of thesis Thm 4.1.2 for ``model`` trained on (x, y), with the
    Rademacher bound of Thm 4.4.1 (peeling constant C, biases included). The model is
    measured as in eval mode and not modified."""
    shape = tuple(input_shape)
    with eval_mode(model):
        graph = graph_of(model, shape)
        l1 = path_norm(graph, q=1.0).log10
        c = architecture_constants(graph)
    sigma = sigma_of(x).peeling
    rademacher = rademacher_peeling(c, sigma, l1)
    train_m = margins(model, DataLoader(TensorDataset(x, y), batch_size=1024))
    train_error = float((train_m <= 0).double().mean())
    try:
        top1 = margin_bound(rademacher, train_m, default_quantile(train_error), delta)
    except InvalidParameterError:  # gamma <= 0: Thm 4.1.2 certifies nothing
        return CertifiedBound(math.inf, l1, rademacher.constant, sigma, len(x), 0.0, 1.0,
                              math.nan, math.inf, train_error)
    return CertifiedBound(top1.log10, l1, rademacher.constant, sigma, len(x), top1.gamma,
                          top1.train_margin_loss, top1.confidence, top1.complexity_log10,
                          train_error)

