"""The certified top-1 error bound of a trained classifier (thesis Thm 4.1.2 with the
Rademacher bound of Thm 4.4.1), with its terms laid out: which of ||Phi||_1, C, the margin
gamma and sqrt(n) keeps it above 1.

Two forms (``pathlift.bounds.union``): ``"union"`` (the default) is valid as stated, for
every network of the architecture, the radius and margin taken from grids fixed in
advance and paid for by a union bound; ``"fixed-class"`` is the thesis' Sec. 7.2.1 use of
the theorem, with r = ||Phi(theta)||_1 and the best gamma read off the trained network,
which the theorem does not allow (Sec. 7.3.1): a comparison, never below the union form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from pathlift.bounds.constants import architecture_constants
from pathlift.bounds.entry import check_sample
from pathlift.bounds.rademacher import rademacher_peeling, sigma_of
from pathlift.bounds.risk import margins
from pathlift.bounds.union import (
    DEFAULT_GRID,
    PriorGrid,
    fixed_class_margin_bound,
    union_margin_bound,
)
from pathlift.errors import InvalidParameterError
from pathlift.graph import eval_mode, graph_of
from pathlift.lift import path_norm

__all__ = ["FORMS", "CertifiedBound", "certified_top1"]

FORMS = ("union", "fixed-class")

_VALIDITY = {
    "union": "valid as stated: every network of the architecture, radius 2^(k/s) >= "
             "||Phi||_1 and margin 2^(j/s) from grids fixed in advance, paid by a union bound",
    "fixed-class": "NOT a certificate: the class {||Phi||_1 <= r} and gamma were read off "
                   "the trained network (thesis Sec. 7.2.1); valid only had they been fixed "
                   "before seeing the data",
}


@dataclass(frozen=True)
class CertifiedBound:
    """Thm 4.1.2 (eq. 4.14) with R(F) <= sqrt(2) sigma C r (Thm 4.4.1), in one ``form``.

    ``log10`` is log10 of the bound on the top-1 test error (inf when no margin is
    positive). The complexity term is 8 C r / gamma * sigma / n with r = ``radius_log10``
    (the grid radius above ||Phi||_1 for the union form, ||Phi||_1 itself for the
    fixed-class form); ``terms_log10`` splits its log10 into those factors
    (``sigma_over_n`` ~ -log10 sqrt(n) for inputs of unit scale); ``confidence`` includes
    the union's ln 1/w terms.
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
    form: str = "union"
    radius_log10: float = math.nan
    delta: float = 0.05

    @property
    def informative(self) -> bool:
        return self.log10 < 0

    @property
    def validity(self) -> str:
        """What the bound holds for and how its data-dependent choices are paid for."""
        return _VALIDITY[self.form]

    def terms_log10(self) -> dict[str, float]:
        """log10 of each factor of the complexity term 8 C r / gamma * sigma / n."""
        return {"8": math.log10(8.0), "C": math.log10(self.constant),
                "path_norm": self.radius_log10,
                "1/gamma": -math.log10(self.gamma) if self.gamma > 0 else math.inf,
                "sigma/n": math.log10(self.sigma / self.n)}


def certified_top1(model: nn.Module, input_shape: Sequence[int], x: Tensor, y: Tensor,
                   delta: float = 0.05, form: str = "union",
                   grid: PriorGrid = DEFAULT_GRID) -> CertifiedBound:
    """The top-1 risk bound of thesis Thm 4.1.2 for ``model`` trained on (x, y), with the
    Rademacher bound of Thm 4.4.1 (peeling constant C, biases included, sigma measured on
    x: its proof bounds the empirical complexity, App. C.5), in the ``form`` "union"
    (valid as stated, ``pathlift.bounds.union``) or "fixed-class" (thesis Sec. 7.2.1, a
    comparison). The model is measured as in eval mode (its margins too) and not
    modified. InvalidParameterError when x holds NaN/inf or y is not one integer label per
    input within the network's outputs (``pathlift.bounds.entry.check_sample``)."""
    if form not in FORMS:
        raise InvalidParameterError(f"form must be one of {FORMS}, got {form!r}")
    shape = tuple(input_shape)
    with eval_mode(model):
        graph = graph_of(model, shape)
        check_sample(x, y, graph.d_out)
        l1 = path_norm(graph, q=1.0).log10
        c = architecture_constants(graph)
        train_m = margins(model, DataLoader(TensorDataset(x, y), batch_size=1024))
    sigma = sigma_of(x).peeling
    rademacher = rademacher_peeling(c, sigma, l1)
    train_error = float((train_m <= 0).double().mean())
    if form == "union":
        u = union_margin_bound(rademacher, train_m, delta, grid)
        return CertifiedBound(u.log10, l1, rademacher.constant, sigma, len(x), u.gamma,
                              u.train_margin_loss, u.confidence, u.complexity_log10,
                              train_error, form, u.radius_log10, delta)
    try:
        top1 = fixed_class_margin_bound(rademacher, train_m, delta)
    except InvalidParameterError:  # no positive margin: Thm 4.1.2 certifies nothing
        return CertifiedBound(math.inf, l1, rademacher.constant, sigma, len(x), 0.0, 1.0,
                              math.nan, math.inf, train_error, form, l1, delta)
    return CertifiedBound(top1.log10, l1, rademacher.constant, sigma, len(x), top1.gamma,
                          top1.train_margin_loss, top1.confidence, top1.complexity_log10,
                          train_error, form, l1, delta)
