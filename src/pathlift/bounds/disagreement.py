"""The disagreement route: a certificate for ANY trained network h, unmodified, through a
surrogate that pathlift's compression certificate covers (Bazinet, Zantedeschi & Germain,
"Bound to Disagree: Generalization Bounds via Certifiable Surrogates", 2026,
arXiv:2602.23128; the statement and proof below are written out here).

**Theorem (disagreement route).** Fix in advance delta_S, delta_U in (0, 1) and the family
of architectures of ``pathlift.bounds.compression``. Let S be n iid labelled samples and U
m iid inputs from the same input distribution, independent of S. Let h (the target) and
g_1, ..., g_K (the surrogates, of architectures in the family) be any functions of S
alone: trained, distilled from h, quantised copies of h; U is used for nothing but the
count below. Write err_f(x, y) = 1{m_f(x, y) <= 0} (a tie counts as an error) and
dis(h, g)(x) = 0 iff h and g both have a unique top class and it is the same one. With
probability >= 1 - delta_S - delta_U over (S, U), for every k:

    P(err_h) <= B_k + kl^-1(D_U(h, g_k), ln(K / delta_U) / m),

where B_k is the compression certificate of g_k at delta_S and D_U(h, g_k) the fraction
of U on which dis(h, g_k) = 1.

*Proof.* (1) Pointwise, err_h <= err_{g} + dis(h, g): if dis = 0 and g does not err, g's
unique top class is y and so is h's, so m_h > 0. Taking expectations, P(err_h) <=
P(err_g) + P(dis(h, g)). (2) The compression theorem holds, with probability >=
1 - delta_S over S, for every network of every architecture of the family at once, so
P(err_{g_k}) <= B_k for all k on one event of probability >= 1 - delta_S, whatever S
made the g_k. (3) Given S, h and g_k are fixed and U is independent of them, so the m
values dis(h, g_k)(u) are iid Bernoulli(p_k); the binomial Chernoff bound
(``pathlift.bounds.kl``) gives P_U(p_k > kl^-1(D_U, c)) <= exp(-m c) = delta_U / K with
c = ln(K / delta_U) / m; a union over k costs delta_U. (4) A union of the two failure
events costs delta_S + delta_U; as every k holds at once, the k of the smallest total,
picked after reading U, is paid for by the ln K.

When a surrogate is h itself (h's architecture in the family), dis = 0 and its route is
h's own compression certificate (the box or path-metric transfer) at delta_S:
``certify`` picks the smallest of all these routes, each paid for as above.

Unlabeled inputs: non-finite values are refused (a non-finite logit would count as a
disagreement, never as agreement, but a NaN input is not a draw of the distribution).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pathlift.bounds.code import Architecture, architecture_of
from pathlift.bounds.compression import (
    DEFAULT_EVENTS,
    DEFAULT_SEARCH,
    CompressionBound,
    CompressionSearch,
    EventGrid,
    compression_bound,
)
from pathlift.bounds.kl import OccamBound, occam_bound
from pathlift.bounds.sample import Batches, as_batches
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph import copy_model, unwrap
from pathlift.graph.boundary import flat_outputs

__all__ = ["DISAGREEMENT", "DisagreementBound", "RouteCertificate", "certify",
           "count_disagreements", "disagreement_bound", "disagreements"]

DISAGREEMENT = "disagreement"


def _top(net: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """(top class, whether it is the unique top) per input of one batch, on the float64
    eval copy ``net``."""
    with torch.no_grad():
        out = flat_outputs(net(x.to(torch.float64)), len(x))
    if out.shape[1] < 2:
        raise ShapeError(f"the model returns {out.shape[1]} logit per input; a "
                         "classifier needs at least 2")
    two = out.topk(2, dim=1)
    return two.indices[:, 0], two.values[:, 0] > two.values[:, 1]  # NaN: False, not unique


def _disagree(target: nn.Module, surrogate: nn.Module, x: Tensor) -> Tensor:
    """dis(h, g) on one batch, the networks float64 eval copies."""
    top_h, unique_h = _top(target, x)
    top_g, unique_g = _top(surrogate, x)
    return ~(unique_h & unique_g & (top_h == top_g))


def _float64(model: nn.Module) -> nn.Module:
    return copy_model(unwrap(model)).double().eval()


def disagreements(target: nn.Module, surrogate: nn.Module, x: Tensor,
                  batch: int = 4096) -> Tensor:
    """dis(h, g)(x) per input (module docstring): True unless both networks have a unique
    top class on x and it is the same one. Both run as float64 eval-mode copies; neither
    model is modified. Raises InvalidParameterError for non-finite inputs."""
    if not len(x):
        raise InvalidParameterError("the unlabeled inputs are empty")
    if not bool(torch.isfinite(x).all()):
        raise InvalidParameterError(_NON_FINITE)
    h, g = _float64(target), _float64(surrogate)
    return torch.cat([_disagree(h, g, xb) for xb in x.split(batch)])


_NON_FINITE = ("the unlabeled inputs hold NaN or inf values: remove those rows (they are "
               "not draws of the input distribution)")


def count_disagreements(target: nn.Module, surrogate: nn.Module,
                        unlabeled: Tensor | Batches) -> tuple[int, int]:
    """(the number of inputs of ``unlabeled`` where dis(h, g) = 1, the number of inputs):
    a fold over its batches (a tensor, or ``Batches(..., labels=False)`` and what it
    takes), exact counts all-reduced over the ranks of a sharded sample. Raises
    InvalidParameterError for non-finite or no inputs."""
    data = as_batches(unlabeled, labels=False)
    h, g = _float64(target), _float64(surrogate)
    bad, dis = data.count(lambda x, _: torch.stack([
        (~torch.isfinite(x.reshape(len(x), -1)).all(1)).sum(),
        _disagree(h, g, x).sum()]), 2)
    if bad:
        raise InvalidParameterError(_NON_FINITE)
    if not data.n:
        raise InvalidParameterError("the unlabeled inputs are empty")
    return dis, data.n


@dataclass(frozen=True, repr=False)
class DisagreementBound:
    """The route of the module docstring through one surrogate: with probability >=
    1 - ``delta`` (= the surrogate certificate's delta_S + ``disagreement.delta``), the
    target's top-1 error is at most ``value`` = ``surrogate_bound`` + ``disagreement``.

    ``surrogate``: the surrogate's compression certificate (its own terms inside);
    ``disagreement``: kl^-1(D_U, (ln K + ln 1/delta_U) / m) as an ``OccamBound`` (n = m
    unlabeled inputs, 0 bits, ``events`` = K surrogates); ``name``: the surrogate's name.
    """

    surrogate: CompressionBound
    disagreement: OccamBound
    name: str = "surrogate"

    hypothesis_class = ("the target network as trained (any architecture), through a "
                        "surrogate of the compression family")
    paid_by = ("delta_S for every compression certificate of the family at once, delta_U "
               "split over the K surrogates compared on the unlabeled inputs (ln K)")

    @property
    def value(self) -> float:
        return min(1.0, self.surrogate.value + self.disagreement.value)

    @property
    def delta(self) -> float:
        return self.surrogate.delta + self.disagreement.delta

    @property
    def log10(self) -> float:
        return math.log10(self.value) if self.value > 0 else -math.inf

    @property
    def route(self) -> str:
        return DISAGREEMENT

    def terms(self) -> dict[str, float]:
        """Every term of the bound, by name."""
        return {"surrogate bound": self.surrogate.value,
                "surrogate L (bits)": self.surrogate.length.total,
                "surrogate empirical": self.surrogate.occam.empirical,
                "n": self.surrogate.n, "delta_S": self.surrogate.delta,
                "disagreement (unlabeled)": self.disagreement.empirical,
                "m": self.disagreement.n, "K": self.disagreement.events,
                "delta_U": self.disagreement.delta,
                "disagreement budget": self.disagreement.budget,
                "disagreement bound": self.disagreement.value, "bound": self.value}

    def summary(self) -> dict[str, float | int | str]:
        """The certificate as plain numbers."""
        out: dict[str, float | int | str] = {"route": DISAGREEMENT, "surrogate": self.name}
        out.update(self.terms())
        out.update({f"surrogate_{k}": v for k, v in self.surrogate.summary().items()})
        return out

    def statement(self) -> str:
        return (f"with probability >= {1 - self.delta:g} over the n = {self.surrogate.n} "
                f"training samples and the m = {self.disagreement.n} held-out unlabeled "
                f"inputs, the trained network's top-1 error is at most {self.value:.4f} "
                f"(route: disagreement with the surrogate {self.name}, certified at "
                f"{self.surrogate.value:.4f} by its {self.surrogate.transfer} transfer, "
                f"disagreement {self.disagreement.empirical:.4f} measured, at most "
                f"{self.disagreement.value:.4f}); valid for {self.hypothesis_class}, the "
                "unlabeled inputs unused by training and by the choice of surrogates; "
                f"paid by {self.paid_by}")

    def __repr__(self) -> str:
        return (f"DisagreementBound({self.value:.4f} = {self.surrogate.value:.4f} "
                f"({self.name}, {self.surrogate.transfer}, {self.surrogate.length.total} "
                f"bits, n {self.surrogate.n}) + kl^-1({self.disagreement.empirical:.4f}, "
                f"{self.disagreement.budget:.4f}) = {self.disagreement.value:.4f} (m "
                f"{self.disagreement.n}, K {self.disagreement.events}); delta {self.delta:g})")


def disagreement_bound(target: nn.Module, surrogate: nn.Module,
                       surrogate_certificate: CompressionBound,
                       unlabeled: Tensor | Batches, *,
                       delta_unlabeled: float = 0.025, candidates: int = 1,
                       name: str = "surrogate") -> DisagreementBound:
    """The target's top-1 bound through ``surrogate`` (module docstring): its compression
    certificate (computed on the training sample, at that certificate's delta_S) plus the
    kl upper confidence bound on P(dis(target, surrogate)) from the held-out ``unlabeled``
    inputs (a tensor, or in batches: ``count_disagreements``), at ``delta_unlabeled``
    split over ``candidates`` surrogates compared on them.

    Neither model is modified. Raises InvalidParameterError for non-finite or empty
    ``unlabeled`` inputs, ``candidates`` < 1, or delta_S + delta_U >= 1.
    """
    if candidates < 1:
        raise InvalidParameterError(f"candidates must be >= 1, got {candidates}")
    if not 0 < delta_unlabeled < 1 - surrogate_certificate.delta:
        raise InvalidParameterError(
            f"delta_unlabeled must lie in (0, 1 - delta_S = "
            f"{1 - surrogate_certificate.delta:g}), got {delta_unlabeled}")
    dis, m = count_disagreements(target, surrogate, unlabeled)
    occam = occam_bound(dis / m, m, 0, candidates, delta_unlabeled)
    return DisagreementBound(surrogate_certificate, occam, name)


@dataclass(frozen=True, repr=False)
class RouteCertificate:
    """The tightest certificate of the target among its routes: its own compression
    certificate (``direct``: the box or path-metric transfer) and the disagreement route
    through each surrogate (``through``), all paid for in one ``delta`` (module docstring).
    ``route`` names the winner: "box", "path-metric" or "disagreement"."""

    delta: float
    direct: CompressionBound | None
    through: tuple[DisagreementBound, ...] = field(default=())

    @property
    def best(self) -> CompressionBound | DisagreementBound:
        routes: list[CompressionBound | DisagreementBound] = list(self.through)
        if self.direct is not None:
            routes.insert(0, self.direct)
        return min(routes, key=lambda r: r.value)

    @property
    def value(self) -> float:
        return self.best.value

    @property
    def route(self) -> str:
        best = self.best
        return best.route if isinstance(best, DisagreementBound) else best.transfer

    def routes(self) -> dict[str, float]:
        """Every route tried and its bound."""
        out = {} if self.direct is None else {f"direct ({self.direct.transfer})":
                                              self.direct.value}
        out.update({f"disagreement via {d.name}": d.value for d in self.through})
        return out

    def statement(self) -> str:
        return (f"{self.best.statement()} [route picked among {len(self.routes())}, all "
                f"paid for in delta = {self.delta:g}]")

    def __repr__(self) -> str:
        tried = ", ".join(f"{k} {v:.4f}" for k, v in self.routes().items())
        return f"RouteCertificate({self.value:.4f} by {self.route}; tried: {tried})"


def certify(target: nn.Module, input_shape: Sequence[int], x: Tensor | Batches,
            y: Tensor | None = None, *, unlabeled: Tensor | Batches | None = None,
            surrogates: Sequence[nn.Module] | dict[str, nn.Module] = (),
            direct: bool = True, delta: float = 0.05, unlabeled_share: float = 0.5,
            family: Sequence[Architecture] | None = None,
            events: EventGrid = DEFAULT_EVENTS,
            search: CompressionSearch = DEFAULT_SEARCH) -> RouteCertificate:
    """The tightest certificate of ``target`` trained on (x, y), over its routes (module
    docstring): its own compression certificate when ``direct``, and, given held-out
    ``unlabeled`` inputs, the disagreement route through each of ``surrogates`` (chosen
    on (x, y) only, never on ``unlabeled``). Both samples may come in batches, sharded
    over torchrun's ranks (``compression_bound``, ``count_disagreements``). Without
    unlabeled inputs the whole ``delta`` goes to the compression certificates; with them,
    delta_U = ``unlabeled_share`` * delta and delta_S = the rest. ``family``: the
    architectures fixed in advance (default: those of the target, when ``direct``, and of
    the surrogates).

    Neither the target nor the surrogates are modified. Raises InvalidParameterError when
    no route is asked for, the surrogates come without unlabeled inputs, or the
    arguments are out of range.
    """
    named = dict(surrogates) if isinstance(surrogates, dict) else {
        f"surrogate {i + 1}": s for i, s in enumerate(surrogates)}
    if named and unlabeled is None:
        raise InvalidParameterError("surrogates need held-out unlabeled inputs (unlabeled=)")
    if not direct and not named:
        raise InvalidParameterError("no route: give surrogates and unlabeled inputs, or "
                                    "direct=True")
    if not 0 < delta < 1 or not 0 < unlabeled_share < 1:
        raise InvalidParameterError(f"need delta and unlabeled_share in (0, 1), got {delta}, "
                                    f"{unlabeled_share}")
    shape = tuple(input_shape)
    if family is None:
        family = []
        for net in ([target] if direct else []) + list(named.values()):
            arch = architecture_of(net, shape)
            if arch not in family:
                family.append(arch)
    delta_u = delta * unlabeled_share if named else 0.0
    delta_s = delta - delta_u

    def compress(net: nn.Module) -> CompressionBound:
        return compression_bound(net, shape, x, y, family=family, delta=delta_s,
                                 events=events, search=search)

    own = compress(target) if direct else None
    through = tuple(disagreement_bound(target, net, compress(net), unlabeled,
                                       delta_unlabeled=delta_u, candidates=len(named),
                                       name=name) for name, net in named.items())
    return RouteCertificate(delta, own, through)
