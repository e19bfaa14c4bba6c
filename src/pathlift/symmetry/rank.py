"""Numerical ranks of Jacobians given as functions theta -> y: exact (the dense Jacobian and
its singular values in float64) or randomized (a Gaussian sketch J Omega built from
Jacobian-vector products, Halko, Martinsson & Tropp 2011, "Finding structure with
randomness", Alg. 4.2 and Lemma 4.1 for the a posteriori error bound)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import jacrev, jvp, vmap

_EPS = float(torch.finfo(torch.float64).eps)
_CHUNK = 256  # rows (or columns) of the Jacobian per vectorised call: bounded memory


@dataclass(frozen=True)
class Rank:
    """Numerical rank of an m x P Jacobian J with what supports it.

    ``rank`` counts singular values above ``tolerance`` (sigma_max * max(m, P) * eps64,
    numpy's ``matrix_rank`` default, unless given); ``sigma_last`` is the smallest kept
    and ``sigma_next`` the largest dropped (0 when none), ``gap`` their ratio (inf when
    nothing is dropped). Randomized: the singular values are those of the sketch J Omega,
    and sigma_{rank+1}(J) <= ``error_bound`` with probability >= ``confidence``.
    """

    rank: int
    rows: int
    columns: int
    tolerance: float
    sigma_max: float
    sigma_last: float
    sigma_next: float
    method: str
    error_bound: float = 0.0
    confidence: float = 1.0

    @property
    def gap(self) -> float:
        return math.inf if self.sigma_next == 0 else self.sigma_last / self.sigma_next

    def __repr__(self) -> str:
        extra = f", sigma_(r+1) <= {self.error_bound:.2e} w.p. {self.confidence:.10g}" \
            if self.method == "randomized" else ""
        return (f"Rank({self.rank} of {self.rows}x{self.columns}, {self.method}, tol "
                f"{self.tolerance:.2e}, gap {self.gap:.2e}{extra})")


def _rank_of(singular: Tensor, rows: int, columns: int, method: str,
             rtol: float | None) -> Rank:
    top = float(singular[0]) if singular.numel() else 0.0
    tol = top * (rtol if rtol is not None else max(rows, columns) * _EPS)
    kept = int((singular > tol).sum())
    last = float(singular[kept - 1]) if kept else 0.0
    following = float(singular[kept]) if kept < singular.numel() else 0.0
    return Rank(kept, rows, columns, tol, top, last, following, method)


def dense_jacobian(f: Callable[[Tensor], Tensor], theta: Tensor, rows: int) -> Tensor:
    """The m x P Jacobian of ``f`` at ``theta``: reverse mode (one vjp per row) when
    m <= P, forward mode (one jvp per column) otherwise, vectorised by chunks."""
    if rows <= theta.numel():
        return jacrev(f, chunk_size=_CHUNK)(theta)
    return jvp_columns(f, theta, torch.eye(theta.numel(), dtype=theta.dtype))


def jvp_columns(f: Callable[[Tensor], Tensor], theta: Tensor, directions: Tensor) -> Tensor:
    """J w for every row w of ``directions``, as the columns of an m x k matrix
    (vectorised forward-mode passes, by chunks)."""
    blocks = [vmap(lambda w: jvp(f, (theta,), (w,))[1])(directions[i:i + _CHUNK])
              for i in range(0, directions.shape[0], _CHUNK)]
    return torch.cat(blocks).T


def exact_rank(jacobian: Tensor, rtol: float | None = None) -> tuple[Rank, Tensor]:
    """Rank of a dense Jacobian by its singular values (float64), and an orthonormal basis
    of its numerical kernel (P x (P - rank))."""
    jacobian = jacobian.to(torch.float64)
    rows, columns = jacobian.shape
    # every right singular vector, but never a full m x m U when m > P
    _, singular, vh = torch.linalg.svd(jacobian, full_matrices=rows < columns)
    rank = _rank_of(singular, rows, columns, "exact", rtol)
    return rank, vh[rank.rank:].T


def randomized_rank(f: Callable[[Tensor], Tensor], theta: Tensor, rows: int,
                    generator: torch.Generator, rtol: float | None = None,
                    oversample: int = 10, start: int = 64) -> Rank:
    """Rank of the Jacobian J of ``f`` at ``theta`` from a sketch Y = J Omega.

    Omega has k standard Gaussian columns, k doubling from ``start`` until Y has at
    least ``oversample`` columns beyond its numerical rank r (or k = P + oversample):
    J Omega then spans range(J) up to the error certified by HMT Lemma 4.1 on
    ``oversample`` fresh Gaussian vectors w_i: ||(I - QQ^T) J|| <= 10 sqrt(2/pi) max_i
    ||(I - QQ^T) J w_i|| with probability >= 1 - 10^-oversample, Q the top-r left singular
    vectors of Y; this bounds sigma_{r+1}(J). Costs k + oversample Jacobian-vector
    products (one forward-mode pass each) and an m x k SVD; J itself is never formed.
    """
    columns = theta.numel()

    def sketch(count: int) -> Tensor:
        omega = torch.randn((count, columns), generator=generator, dtype=theta.dtype)
        return jvp_columns(f, theta, omega)

    k = min(start, columns + oversample)
    y = sketch(k)
    while True:
        u, singular, _ = torch.linalg.svd(y, full_matrices=False)
        rank = _rank_of(singular, rows, columns, "randomized", rtol)
        if rank.rank <= y.shape[1] - oversample or y.shape[1] >= columns + oversample:
            break
        y = torch.cat([y, sketch(min(y.shape[1], columns + oversample - y.shape[1]))], dim=1)
    q = u[:, :rank.rank]
    test = sketch(oversample)
    residual = test - q @ (q.T @ test)
    bound = 10 * math.sqrt(2 / math.pi) * float(residual.norm(dim=0).max())
    return Rank(rank.rank, rows, columns, rank.tolerance, rank.sigma_max, rank.sigma_last,
                rank.sigma_next, "randomized", bound, 1 - 10.0 ** -oversample)
