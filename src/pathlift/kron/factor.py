"""Values of Kronecker-sparse factors: dense conversion, initialisation, exact butterfly
factorisations of the Hadamard and DFT matrices, and projection of a dense matrix onto a
chain of patterns.

A factor is a tensor ``w`` of shape (a, b, c, d) for the pattern (a, b, c, d), with
K[i·bd + k·d + j, i·cd + l·d + j] = w[i, k, l, j] (see ``pathlift.kron.pattern``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron.pattern import (
    KSPattern,
    check_chain,
    log2_exact,
    square_dyadic_butterfly,
)

__all__ = [
    "ButterflyFactorization",
    "chain_to_dense",
    "dft_butterfly",
    "from_dense",
    "hadamard_butterfly",
    "project",
    "random_factor",
    "to_dense",
]


def check_factor(w: torch.Tensor, pattern: KSPattern, what: str = "factor") -> None:
    """Refuse (ShapeError) a factor ``w`` whose shape is not the pattern's (a, b, c, d)."""
    if tuple(w.shape) != pattern.as_tuple():
        raise ShapeError(f"{what} of pattern {pattern} must have shape (a, b, c, d) = "
                         f"{pattern.as_tuple()}, got {tuple(w.shape)}")


def to_dense(w: torch.Tensor, pattern: KSPattern) -> torch.Tensor:
    """The abd × acd matrix K of the factor w (Def. 5.1.1); differentiable in w."""
    check_factor(w, pattern)
    a, b, c, d = pattern.as_tuple()
    eye_a = torch.eye(a, dtype=w.dtype, device=w.device)
    eye_d = torch.eye(d, dtype=w.dtype, device=w.device)
    full = torch.einsum("iklj,ip,jq->ikjplq", w, eye_a, eye_d)
    return full.reshape(a * b * d, a * c * d)


def from_dense(matrix: torch.Tensor, pattern: KSPattern, atol: float = 0.0) -> torch.Tensor:
    """The factor w of a matrix supported in S_pi; raises InvalidParameterError if an entry
    outside the support exceeds ``atol`` in absolute value (use ``project`` to drop them)."""
    a, b, c, d = pattern.as_tuple()
    if tuple(matrix.shape) != (pattern.out_features, pattern.in_features):
        raise ShapeError(f"pattern {pattern} needs a {pattern.out_features} x "
                         f"{pattern.in_features} matrix, got {tuple(matrix.shape)}")
    w = torch.einsum("ikjilj->iklj", matrix.reshape(a, b, d, a, c, d)).clone()
    outside = (matrix - to_dense(w, pattern)).abs().max().item() if matrix.numel() else 0.0
    if outside > atol:
        raise InvalidParameterError(
            f"matrix has entries up to {outside:.3g} outside the support of pattern {pattern}; "
            "use pathlift.kron.project to project it onto the pattern")
    return w


def random_factor(pattern: KSPattern, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None,
                  generator: torch.Generator | None = None, depth: int = 1) -> torch.Tensor:
    """Entries i.i.d. uniform in [-1/sqrt(c), 1/sqrt(c)] (thesis App. D.2.1, Dao et al. 2022)
    for ``depth`` 1, the benchmarks' matrices.

    A factor of a chain of ``depth`` L > 1 is drawn with bound 3^((L-1)/(2L)) / sqrt(c), so
    that the product K_1 ⋯ K_L maps an input of variance v to outputs of variance v/3, as
    one ``nn.Linear`` at its default init does: with D.2.1's bound each factor divides the
    variance by 3, and a chain of 8 butterfly factors starts 3^7 times too small to train.
    """
    if depth < 1:
        raise InvalidParameterError(f"depth must be at least 1, got {depth}")
    bound = 3.0 ** ((depth - 1) / (2 * depth)) / math.sqrt(pattern.c)
    w = torch.rand(pattern.as_tuple(), dtype=dtype, device=device, generator=generator)
    return (2 * w - 1) * bound


def chain_to_dense(factors: Sequence[torch.Tensor], patterns: Sequence[KSPattern]) -> torch.Tensor:
    """The product K_1 ⋯ K_L as a dense matrix."""
    chain = check_chain(patterns)
    if len(factors) != len(chain):
        raise ShapeError(f"{len(factors)} factors for {len(chain)} patterns")
    out = to_dense(factors[0], chain[0])
    for w, p in zip(factors[1:], chain[1:], strict=True):
        out = out @ to_dense(w, p)
    return out


@dataclass(frozen=True)
class ButterflyFactorization:
    """W = K_1 ⋯ K_L · Pi, Pi the permutation matrix with Pi[j, permutation[j]] = 1.

    ``matrix()`` rebuilds W (column j of K_1 ⋯ K_L becomes column permutation[j] of W)."""

    factors: tuple[torch.Tensor, ...]
    patterns: tuple[KSPattern, ...]
    permutation: torch.Tensor

    def matrix(self) -> torch.Tensor:
        product = chain_to_dense(self.factors, self.patterns)
        out = torch.empty_like(product)
        out[:, self.permutation] = product
        return out


def hadamard_butterfly(n: int, dtype: torch.dtype = torch.float64) -> ButterflyFactorization:
    """H_N = H_2^{⊗L} = ∏_l I_{2^(l-1)} ⊗ H_2 ⊗ I_{2^(L-l)}: the square dyadic butterfly
    (Table 5.1) with every block equal to H_2 = [[1, 1], [1, -1]] (Sylvester order, as
    scipy.linalg.hadamard); no permutation."""
    patterns = square_dyadic_butterfly(n)
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=dtype)
    factors = tuple(h2[None, :, :, None].expand(p.as_tuple()).clone() for p in patterns)
    return ButterflyFactorization(factors, patterns, torch.arange(n))


def _bit_reversal(n: int) -> torch.Tensor:
    L = log2_exact(n, "DFT size N")
    return torch.tensor([int(format(j, f"0{L}b")[::-1], 2) for j in range(n)])


def dft_butterfly(n: int, dtype: torch.dtype = torch.complex128) -> ButterflyFactorization:
    """Radix-2 Cooley-Tukey: F_N = K_1 ⋯ K_L · Pi_bitrev with K_l = I_{2^(l-1)} ⊗ B_{N/2^(l-1)},
    B_m = [[I, Omega], [I, -Omega]], Omega = diag(exp(-2i·pi·j/m)), so K_l has the square
    dyadic butterfly pattern (2^(l-1), 2, 2, 2^(L-l)) (Table 5.1, Figure 5.1).
    F_N[p, q] = exp(-2i·pi·pq/N), the matrix of torch.fft.fft."""
    patterns = square_dyadic_butterfly(n)
    factors = []
    for p in patterns:
        half = p.d  # B_m with m = 2d
        omega = torch.exp(-2j * math.pi * torch.arange(half, dtype=torch.float64) / (2 * half))
        block = torch.stack([torch.stack([torch.ones_like(omega), omega]),
                             torch.stack([torch.ones_like(omega), -omega])])  # (k, l, j)
        factors.append(block[None].expand(p.as_tuple()).to(dtype).clone())
    return ButterflyFactorization(tuple(factors), patterns, _bit_reversal(n))


def _product_support(patterns: Sequence[KSPattern]) -> torch.Tensor:
    support = patterns[0].support().to(torch.float64)
    for p in patterns[1:]:
        support = support @ p.support().to(torch.float64)
    return support > 0


def _two_factor_projection(matrix: torch.Tensor, left: torch.Tensor, right: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Best A @ B with supp(A) ⊆ left, supp(B) ⊆ right in Frobenius norm, by one truncated SVD
    per class of identical rank-one supports (Le, Zheng et al. 2022, fixed-support matrix
    factorisation; optimal when the classes' rectangles are disjoint, which is checked)."""
    classes: dict[tuple[bytes, bytes], list[int]] = {}
    for m in range(left.shape[1]):
        rows, cols = left[:, m], right[m, :]
        if rows.any() and cols.any():
            key = (rows.numpy().tobytes(), cols.numpy().tobytes())
            classes.setdefault(key, []).append(m)
    covered = torch.zeros_like(matrix, dtype=torch.bool)
    a = torch.zeros(left.shape, dtype=matrix.dtype)
    b = torch.zeros(right.shape, dtype=matrix.dtype)
    for ms in classes.values():
        rows, cols = left[:, ms[0]], right[ms[0], :]
        block = rows[:, None] & cols[None, :]
        if (covered & block).any():
            raise InvalidParameterError(
                "the rank-one supports of this split overlap: no exact SVD projection exists "
                "for these patterns (fit the factors by gradient descent instead)")
        covered |= block
        u, s, vh = torch.linalg.svd(matrix[rows][:, cols], full_matrices=False)
        r = min(len(ms), s.numel())
        root = s[:r].sqrt()
        idx = torch.tensor(ms[:r])
        a[rows.nonzero().squeeze(1)[:, None], idx[None, :]] = u[:, :r] * root
        b[idx[:, None], cols.nonzero().squeeze(1)[None, :]] = root[:, None] * vh[:r]
    return a, b


def project(matrix: torch.Tensor, patterns: Sequence[KSPattern]) -> tuple[torch.Tensor, ...]:
    """Factors (one (a, b, c, d) tensor per pattern) of a product K_1 ⋯ K_L close to ``matrix``.

    Hierarchical butterfly factorisation (Le et al., thesis Sec. 5 intro and refs.): split the
    chain in two halves, project onto the two product supports by block SVDs, recurse. Exact
    when the matrix is such a product and the splits have disjoint rank-one supports (Monarch,
    low-rank, square dyadic and block butterflies); the projection onto two factors is optimal
    in Frobenius norm. Runs in float64 on CPU; returns factors in the matrix' dtype."""
    chain = check_chain(patterns)
    if tuple(matrix.shape) != (chain[0].out_features, chain[-1].in_features):
        raise ShapeError(f"chain maps {chain[-1].in_features} -> {chain[0].out_features} "
                         f"features, matrix has shape {tuple(matrix.shape)}")
    if matrix.is_complex():
        raise InvalidParameterError("project supports real matrices only")
    work = matrix.detach().to("cpu", torch.float64)

    def split(m: torch.Tensor, part: tuple[KSPattern, ...]) -> list[torch.Tensor]:
        if len(part) == 1:
            mask = part[0].support().to(torch.float64)
            return [from_dense(m * mask, part[0])]
        half = len(part) // 2
        a, b = _two_factor_projection(m, _product_support(part[:half]),
                                      _product_support(part[half:]))
        return split(a, part[:half]) + split(b, part[half:])

    return tuple(w.to(matrix.dtype) for w in split(work, chain))
