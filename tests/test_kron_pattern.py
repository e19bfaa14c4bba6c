"""Kronecker sparsity patterns, constructors of thesis Table 5.1, butterfly factorisations of
the Hadamard and DFT matrices, and the projection onto a chain of patterns."""

from __future__ import annotations

import itertools

import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron import (
    KSPattern,
    benchmark_patterns,
    block_butterfly,
    chain_to_dense,
    check_chain,
    deformable_butterfly,
    dense,
    dft_butterfly,
    from_dense,
    hadamard_butterfly,
    kaleidoscope,
    low_rank,
    monarch,
    project,
    random_factor,
    square_dyadic_butterfly,
    to_dense,
)

small = st.integers(1, 4)


def support_by_algorithm_5_1_1(p: KSPattern) -> torch.Tensor:
    """S_pi rebuilt from the row/col sets of Algorithm 5.1.1, lines 3-4."""
    a, b, c, d = p.as_tuple()
    M, N = p.out_features, p.in_features
    s = torch.zeros(M, N, dtype=torch.bool)
    for i, j in itertools.product(range(a), range(d)):
        col = [i * N // a + j + ell * d for ell in range(c)]
        row = [i * M // a + j + k * d for k in range(b)]
        s[torch.tensor(row)[:, None], torch.tensor(col)[None, :]] = True
    return s


@given(small, small, small, small)
@settings(max_examples=30, deadline=None)
def test_support_matches_algorithm_5_1_1_and_counts(a, b, c, d):
    p = KSPattern(a, b, c, d)
    s = p.support()
    assert torch.equal(s, support_by_algorithm_5_1_1(p))
    assert s.shape == (a * b * d, a * c * d)
    assert int(s.sum()) == p.nnz == a * b * c * d
    assert p.density == pytest.approx(p.nnz / s.numel())
    assert p.transpose().support().equal(s.T)


@given(small, small, small, small)
@settings(max_examples=20, deadline=None)
def test_factor_dense_round_trip_and_support(a, b, c, d):
    p = KSPattern(a, b, c, d)
    w = random_factor(p, torch.float64, generator=torch.Generator().manual_seed(a + 7 * b))
    k = to_dense(w, p)
    assert torch.equal(k != 0, p.support())  # uniform entries are almost surely non-zero
    assert torch.equal(from_dense(k, p), w)
    assert w.abs().max() <= 1 / c**0.5


def test_heuristics_of_equation_5_2():
    p = KSPattern(2, 48, 192, 4)
    assert p.rewrite_ratio == pytest.approx((48 + 192) / (48 * 192))
    assert p.energy_ratio == pytest.approx(4 * (48 + 192) / (48 * 192))
    # eq. 5.2: (BN + BM) / (B · nnz) for any batch size B
    batch = 7
    assert p.rewrite_ratio == pytest.approx(
        (batch * p.in_features + batch * p.out_features) / (batch * p.nnz))


@pytest.mark.parametrize("bad", [(0, 1, 1, 1), (1, -2, 1, 1), (1, 1, 1.5, 1), (True, 1, 1, 1)])
def test_invalid_patterns_raise(bad):
    with pytest.raises(InvalidParameterError, match="positive int"):
        KSPattern(*bad)


def test_from_dense_refuses_entries_outside_the_support():
    p = KSPattern(2, 2, 2, 2)
    k = torch.ones(p.out_features, p.in_features)
    with pytest.raises(InvalidParameterError, match="outside the support"):
        from_dense(k, p)
    with pytest.raises(ShapeError):
        from_dense(torch.ones(3, 3), p)


def test_chains_of_table_5_1():
    assert dense(6, 5) == (KSPattern(1, 6, 5, 1),)
    assert low_rank(6, 5, 2) == (KSPattern(1, 6, 2, 1), KSPattern(1, 2, 5, 1))
    assert square_dyadic_butterfly(8) == (KSPattern(1, 2, 2, 4), KSPattern(2, 2, 2, 2),
                                          KSPattern(4, 2, 2, 1))
    assert kaleidoscope(4) == (KSPattern(1, 2, 2, 2), KSPattern(2, 2, 2, 1),
                               KSPattern(2, 2, 2, 1), KSPattern(1, 2, 2, 2))
    assert block_butterfly(16, 4) == (KSPattern(1, 8, 8, 2), KSPattern(2, 8, 8, 1))
    assert monarch(12, 8, 2) == (KSPattern(1, 6, 4, 2), KSPattern(2, 4, 4, 1))
    for chain, (m, n) in [(low_rank(6, 5, 2), (6, 5)), (square_dyadic_butterfly(32), (32, 32)),
                          (kaleidoscope(16), (16, 16)), (block_butterfly(24, 3), (24, 24)),
                          (monarch(12, 8, 2), (12, 8)), (monarch(8, 12, 4), (8, 12))]:
        check_chain(chain)
        assert (chain[0].out_features, chain[-1].in_features) == (m, n)


def test_invalid_chains_raise():
    with pytest.raises(InvalidParameterError, match="do not chain"):
        deformable_butterfly([(1, 4, 4, 1), (1, 3, 4, 1)])
    with pytest.raises(InvalidParameterError, match="power of two"):
        square_dyadic_butterfly(12)
    with pytest.raises(InvalidParameterError, match="divisible"):
        monarch(10, 8, 4)
    with pytest.raises(InvalidParameterError):
        check_chain([])


def test_benchmark_grid_of_figure_d_1():
    grid = benchmark_patterns()
    assert len(grid) == len(set(grid)) == 627  # the code of Figure D.1; the text says 600
    limit = 2**31 - 1
    for p in grid:
        assert p.b == p.c or p.b == 4 * p.c or p.c == 4 * p.b
        assert 25_088 * max(p.in_features, p.out_features) <= limit and p.nnz <= limit
        assert p.a == 1 or p.d in (4, 16, 64)
    assert KSPattern(1, 1024, 1024, 64) in grid  # 25,088 · 65,536 < 2^31
    assert KSPattern(1, 1024, 1024, 96) not in grid  # 25,088 · 98,304 > 2^31
    assert KSPattern(2, 1024, 256, 4) not in grid  # a skipped (b, c) pair
    assert len(benchmark_patterns(batch_size=1)) > len(grid)  # the size limit binds


@pytest.mark.parametrize("n", [2, 8, 64, 256])
def test_hadamard_butterfly_is_exact(n):
    fact = hadamard_butterfly(n, torch.float32)
    assert fact.patterns == square_dyadic_butterfly(n)
    expected = torch.tensor(scipy.linalg.hadamard(n), dtype=torch.float32)
    torch.testing.assert_close(fact.matrix(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4, 16, 128])
def test_dft_butterfly_is_exact(n):
    fact = dft_butterfly(n, torch.complex64)
    expected = torch.fft.fft(torch.eye(n, dtype=torch.complex128), dim=0)
    err = (fact.matrix().to(torch.complex128) - expected).abs().max().item()
    assert err <= 1e-5 * n**0.5
    assert sorted(fact.permutation.tolist()) == list(range(n))


@pytest.mark.parametrize("chain", [monarch(16, 8, 4), monarch(8, 16, 2), low_rank(9, 7, 3),
                                   square_dyadic_butterfly(16), block_butterfly(16, 2)],
                         ids=str)
def test_projection_recovers_exact_products(chain):
    g = torch.Generator().manual_seed(3)
    factors = [random_factor(p, torch.float64, generator=g) for p in chain]
    target = chain_to_dense(factors, chain)
    recovered = chain_to_dense(project(target, chain), chain)
    torch.testing.assert_close(recovered, target, rtol=1e-9, atol=1e-9)


def test_projection_of_hadamard_onto_butterfly_is_exact():
    h = torch.tensor(scipy.linalg.hadamard(32), dtype=torch.float64)
    chain = square_dyadic_butterfly(32)
    torch.testing.assert_close(chain_to_dense(project(h, chain), chain), h)


def test_two_factor_projection_is_a_projection():
    """Projecting a matrix, then its projection, changes nothing (idempotence), and the
    projection is at least as close as the support-restricted starting point of any
    rank-matched product (here: the product of random factors)."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(12, 8, dtype=torch.float64, generator=g)
    chain = monarch(12, 8, 2)
    first = chain_to_dense(project(target, chain), chain)
    second = chain_to_dense(project(first, chain), chain)
    torch.testing.assert_close(second, first)
    for _ in range(5):
        other = chain_to_dense([random_factor(p, torch.float64, generator=g) for p in chain],
                               chain)
        assert (first - target).norm() <= (other - target).norm()
