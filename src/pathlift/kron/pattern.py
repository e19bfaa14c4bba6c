"""Kronecker sparsity patterns (thesis Def. 5.1.1), chains of them and the constructors of
thesis Table 5.1.

A pattern pi = (a, b, c, d) is the support S_pi = I_a ⊗ 1_{b×c} ⊗ I_d of an abd × acd
matrix with abcd non-zeros. The values of a pi-Kronecker-sparse factor K are stored in a
tensor ``w`` of shape (a, b, c, d) with

    K[i·bd + k·d + j, i·cd + l·d + j] = w[i, k, l, j],

the storage of the thesis' einsum implementation (Sec. 5.1.2): the slice w[i, :, :, j] is
the dense block K[row, col] of Algorithm 5.1.1 for the pair (i, j).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pathlift.errors import InvalidParameterError

__all__ = [
    "KSPattern",
    "benchmark_patterns",
    "block_butterfly",
    "check_chain",
    "deformable_butterfly",
    "dense",
    "dense_support",
    "kaleidoscope",
    "low_rank",
    "monarch",
    "square_dyadic_butterfly",
]


@dataclass(frozen=True)
class KSPattern:
    """Kronecker sparsity pattern (a, b, c, d): support I_a ⊗ 1_{b×c} ⊗ I_d (Def. 5.1.1)."""

    a: int
    b: int
    c: int
    d: int

    def __post_init__(self) -> None:
        for name in "abcd":
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(
                    f"Kronecker pattern {self.as_tuple()}: '{name}' must be a positive int, got "
                    f"{value!r} (thesis Def. 5.1.1: pi in (N>0)^4)")

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.a, self.b, self.c, self.d)

    @property
    def out_features(self) -> int:
        """M = abd, the number of rows of a pi-Kronecker-sparse matrix."""
        return self.a * self.b * self.d

    @property
    def in_features(self) -> int:
        """N = acd, the number of columns."""
        return self.a * self.c * self.d

    @property
    def nnz(self) -> int:
        """abcd non-zeros: the multiplications per input vector of Algorithm 5.1.1."""
        return self.a * self.b * self.c * self.d

    @property
    def density(self) -> float:
        """abcd / (abd · acd) = 1/(ad)."""
        return 1.0 / (self.a * self.d)

    @property
    def rewrite_ratio(self) -> float:
        """(b+c)/(bc): memory rewritings per scalar multiplication of bmm (thesis eq. 5.2)."""
        return (self.b + self.c) / (self.b * self.c)

    @property
    def energy_ratio(self) -> float:
        """d(b+c)/(bc): the energy proxy of thesis Sec. 5.4 (Figure 5.9)."""
        return self.d * self.rewrite_ratio

    def transpose(self) -> KSPattern:
        """Pattern of K^T: (a, c, b, d)."""
        return KSPattern(self.a, self.c, self.b, self.d)

    def support(self) -> torch.Tensor:
        """Boolean abd × acd matrix S_pi = I_a ⊗ 1_{b×c} ⊗ I_d."""
        eye_a = torch.eye(self.a, dtype=torch.bool)
        ones = torch.ones(self.b, self.c, dtype=torch.bool)
        eye_d = torch.eye(self.d, dtype=torch.bool)
        return torch.kron(torch.kron(eye_a, ones), eye_d)

    def __str__(self) -> str:
        return f"({self.a},{self.b},{self.c},{self.d})"


def _as_pattern(p: KSPattern | Sequence[int]) -> KSPattern:
    if isinstance(p, KSPattern):
        return p
    values = tuple(p)
    if len(values) != 4:
        raise InvalidParameterError(f"a Kronecker pattern has 4 entries (a, b, c, d), got {p!r}")
    return KSPattern(*values)


def check_chain(patterns: Iterable[KSPattern | Sequence[int]]) -> tuple[KSPattern, ...]:
    """Validate a chain pi_1, ..., pi_L for W = K_1 ⋯ K_L: a_l c_l d_l = a_{l+1} b_{l+1} d_{l+1}
    (thesis Table 5.1, deformable butterfly). Returns the patterns as KSPattern."""
    chain = tuple(_as_pattern(p) for p in patterns)
    if not chain:
        raise InvalidParameterError("a chain of Kronecker patterns needs at least one pattern")
    for pos, (left, right) in enumerate(itertools.pairwise(chain)):
        if left.in_features != right.out_features:
            raise InvalidParameterError(
                f"patterns {pos} {left} and {pos + 1} {right} do not chain: K_{pos + 1} has "
                f"{left.in_features} = acd columns but K_{pos + 2} has {right.out_features} = abd "
                "rows; pick patterns with a_l c_l d_l = a_(l+1) b_(l+1) d_(l+1)")
    return chain


@functools.lru_cache(maxsize=4096)
def _class_link(left: KSPattern, right: KSPattern) -> np.ndarray:
    """(a_l d_l) x (a_r d_r) 0/1 matrix: entry (alpha, beta) is 1 when some index m of the
    space between them is a column of class alpha of S_left and a row of class beta of
    S_right. Class (i, j) -> i*d + j: column m = i*cd + l*d + j, row m = i*bd + k*d + j."""
    m = np.arange(left.in_features)
    cols = (m // (left.c * left.d)) * left.d + m % left.d
    rows = (m // (right.b * right.d)) * right.d + m % right.d
    link = np.zeros((left.a * left.d, right.a * right.d), dtype=np.float32)
    link[cols, rows] = 1.0
    return link


def dense_support(patterns: Iterable[KSPattern | Sequence[int]]) -> bool:
    """Whether S_pi1 ⋯ S_piL has no zero entry: the expressivity criterion of Dao et al.
    (2022) restated in thesis Sec. 7.4.1, decided from the patterns, not by multiplying the
    supports.

    By eq. (5.1) each S_pi is, up to permutations, the disjoint union of a·d complete
    bipartite blocks between its row class (i, j) and its column class (i, j). A row of the
    product reaches a column exactly when a chain of classes, consecutive ones sharing an
    index of the space between the factors, links their classes. So the product is dense
    iff the boolean product of the class-link matrices (sizes a_l d_l, not abd) has no zero:
    O(sum of widths + products of class counts) instead of multiplying n x n supports.
    """
    chain = check_chain(patterns)
    if len(chain) == 1:
        return chain[0].a * chain[0].d == 1
    links = [_class_link(left, right) for left, right in itertools.pairwise(chain)]
    first = links[0][:1]  # one class first: most sparse chains fail there, cheaply
    for link in links[1:]:
        first = np.minimum(first @ link, 1.0)
    if not first.all():
        return False
    reach = links[0]
    for link in links[1:]:
        reach = np.minimum(reach @ link, 1.0)
    return bool(reach.all())


def log2_exact(n: int, what: str) -> int:
    """log2(n) for a power of two n >= 2; InvalidParameterError naming ``what`` otherwise."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n & (n - 1):
        raise InvalidParameterError(f"{what} must be a power of two >= 2, got {n!r}")
    return n.bit_length() - 1


def _check_divides(p: int, n: int, what: str) -> None:
    if not isinstance(p, int) or p < 1 or n % p:
        raise InvalidParameterError(f"{what} = {n} is not divisible by p = {p!r}")


def dense(out_features: int, in_features: int) -> tuple[KSPattern, ...]:
    """Dense M × N matrix: (1, M, N, 1) (Table 5.1)."""
    return (KSPattern(1, out_features, in_features, 1),)


def low_rank(out_features: int, in_features: int, rank: int) -> tuple[KSPattern, ...]:
    """Rank-r product: (1, M, r, 1), (1, r, N, 1) (Table 5.1)."""
    return (KSPattern(1, out_features, rank, 1), KSPattern(1, rank, in_features, 1))


def square_dyadic_butterfly(n: int) -> tuple[KSPattern, ...]:
    """Square dyadic butterfly of size N = 2^L: (2^(l-1), 2, 2, 2^(L-l)), l = 1..L (Table 5.1)."""
    L = log2_exact(n, "butterfly size N")
    return tuple(KSPattern(2 ** (ell - 1), 2, 2, 2 ** (L - ell)) for ell in range(1, L + 1))


def kaleidoscope(n: int) -> tuple[KSPattern, ...]:
    """Kaleidoscope of size 2^L: the butterfly followed by its mirror (2^(L-l), 2, 2, 2^(l-1))
    (Table 5.1)."""
    L = log2_exact(n, "kaleidoscope size N")
    mirror = tuple(KSPattern(2 ** (L - ell), 2, 2, 2 ** (ell - 1)) for ell in range(1, L + 1))
    return square_dyadic_butterfly(n) + mirror


def block_butterfly(n: int, t: int) -> tuple[KSPattern, ...]:
    """Block butterfly of size N = 2^L·t: (2^(l-1), 2t, 2t, 2^(L-l)), l = 1..L (Table 5.1)."""
    _check_divides(t, n, "block butterfly size N")
    L = log2_exact(n // t, "N / t")
    return tuple(KSPattern(2 ** (ell - 1), 2 * t, 2 * t, 2 ** (L - ell)) for ell in range(1, L + 1))


def monarch(out_features: int, in_features: int, p: int) -> tuple[KSPattern, ...]:
    """Monarch M × N with p blocks: (1, M/p, min(M,N)/p, p), (p, min(M,N)/p, N/p, 1)
    (Table 5.1)."""
    r = min(out_features, in_features)
    for what, n in (("out_features M", out_features), ("in_features N", in_features)):
        _check_divides(p, n, what)
    return (KSPattern(1, out_features // p, r // p, p), KSPattern(p, r // p, in_features // p, 1))


def deformable_butterfly(patterns: Iterable[KSPattern | Sequence[int]]) -> tuple[KSPattern, ...]:
    """Deformable butterfly: any chain (a_l, b_l, c_l, d_l) with a_l c_l d_l = a_(l+1) b_(l+1)
    d_(l+1) (Table 5.1)."""
    return check_chain(patterns)


# Thesis Sec. 5.5: ViT-S/16 (N = 384) with two Kronecker-sparse factors per weight.
VIT_S_DIM = 384
VIT_PATTERNS_NN = ((1, 192, 48, 2), (2, 48, 192, 1))  # N × N
VIT_PATTERNS_UP = ((1, 768, 192, 2), (6, 64, 64, 1))  # 4N × N
VIT_PATTERNS_DOWN = ((6, 64, 64, 1), (1, 192, 768, 2))  # N × 4N: the transposed chain

# Figure D.1 of the thesis (Appendix D.2.1): the patterns of the time benchmark of Sec. 5.4.
GRID_BATCH_SIZE = 25_088
_SIZE_LIMIT = 2_147_483_647
_A_LIST = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
_BC_LIST = (48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
_D_LIST2 = (4, 16, 64)
_SKIPPED_BC = ((1024, 256), (256, 1024), (128, 512), (512, 128), (64, 256), (256, 64))


def benchmark_patterns(batch_size: int = GRID_BATCH_SIZE) -> tuple[KSPattern, ...]:
    """The pattern grid of thesis Appendix D.2.1, generated as in its Figure D.1.

    b = c, b = 4c or c = 4b; a = 1 with every d, or a > 1 with d in {4, 16, 64}, skipping six
    (b, c) pairs; B·acd, B·abd and abcd at most 2^31 - 1 for the given batch size B.
    The text announces 600 patterns; the code of Figure D.1 yields 627 at B = 25,088.
    """

    def ok(a: int, b: int, c: int, d: int) -> bool:
        return (b == c or b == 4 * c or c == 4 * b) and max(
            batch_size * a * c * d, batch_size * a * b * d, a * b * c * d) <= _SIZE_LIMIT

    grid = [(1, b, c, d) for b, c, d in itertools.product(_BC_LIST, _BC_LIST, _A_LIST)]
    grid += [(a, b, c, d) for a, b, c, d in itertools.product(_A_LIST, _BC_LIST, _BC_LIST, _D_LIST2)
             if a != 1 and (b, c) not in _SKIPPED_BC]
    return tuple(KSPattern(*p) for p in grid if ok(*p))

