"""The union bound over radii and margins fixed in advance (pathlift.bounds.union): its
delta bookkeeping, its margin losses against eq. 4.13 term by term, and its position
against the fixed-class form of thesis Sec. 7.2.1 (never below, above by at most the
stated rounding and log terms)."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds import (
    architecture_constants,
    margin_loss,
    rademacher_peeling,
)
from pathlift.bounds.union import (
    PriorGrid,
    fixed_class_margin_bound,
    margin_losses,
    union_gap_bound,
    union_margin_bound,
)
from pathlift.errors import InvalidParameterError

_CONSTANTS = architecture_constants(
    nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), (4,))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(0, 400))
def test_prior_weights_sum_to_at_most_one(steps, K):
    """sum_{|k| <= K} w(k) = 1 - (4/3)/(K+2) exactly (a telescoping sum), so every finite
    window of the grid, and the whole of Z, spends at most delta; and the product prior of
    (radius, margin) pairs spends at most delta on any box of pairs."""
    grid = PriorGrid(steps)
    partial = sum((grid.weight(k) for k in range(-K, K + 1)), Fraction(0))
    assert partial == 1 - Fraction(4, 3 * (K + 2))
    box = sum((grid.weight(k) * grid.weight(j) for k in range(-K // 8, K // 8 + 1)
               for j in range(-K // 8, K // 8 + 1)), Fraction(0))
    assert box <= 1
    for k in (-K, 0, K):
        assert grid.log_inverse_weight(k) == pytest.approx(-math.log(float(grid.weight(k))))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.floats(-30, 30))
def test_ceil_index_is_the_smallest_grid_point_above(steps, log10_value):
    grid = PriorGrid(steps)
    k = grid.ceil_index(log10_value)
    assert grid.log2_value(k) * math.log10(2) >= log10_value
    assert grid.log2_value(k - 1) * math.log10(2) < log10_value


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(0, 2**31 - 1))
def test_margin_losses_are_eq_4_13_at_every_gamma(n, seed):
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 1
    m[: n // 4] = m[: n // 4].round()  # ties, zeros
    gammas = torch.cat([torch.rand(5, generator=gen, dtype=torch.float64) * 6 + 1e-3,
                        m[m > 0][:3]])
    got = margin_losses(m, gammas)
    expected = [margin_loss(m, float(g)) for g in gammas]
    assert got.tolist() == pytest.approx(expected, abs=1e-12)


def _margins(seed: int, n: int, shift: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen, dtype=torch.float64) * 2 + shift


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10**6), st.integers(20, 3000), st.floats(0.2, 8.0),
       st.floats(-2.0, 6.0), st.floats(1.0, 100.0), st.sampled_from([0.01, 0.05, 0.2]),
       st.integers(1, 8))
def test_union_bound_is_never_below_the_fixed_class_one_and_above_by_the_stated_terms(
        seed, n, shift, path_norm_log10, sigma, delta, steps):
    rad = rademacher_peeling(_CONSTANTS, sigma, path_norm_log10)
    m = _margins(seed, n, shift)
    if not (m > 0).any():
        return
    grid = PriorGrid(steps)
    union = union_margin_bound(rad, m, delta, grid)
    fixed = fixed_class_margin_bound(rad, m, delta)
    assert union.log10 >= fixed.log10 - 1e-12
    # the stated allowance: gamma* rounded down to the grid point j' costs at most
    # 1 - 2^(-1/s) of margin loss, r and 1/gamma rounded up a factor 2^(2/s) on the
    # complexity, and ln 1/w(k) + ln 1/w(j') inside the confidence term
    j = math.floor(steps * math.log2(fixed.gamma))
    while grid.value(j) > fixed.gamma:
        j -= 1
    confidence = 3 * math.sqrt((math.log(2 / delta) + grid.log_inverse_weight(
        grid.ceil_index(path_norm_log10)) + grid.log_inverse_weight(j)) / (2 * n))
    allowance = (fixed.train_margin_loss + (1 - 2 ** (-1 / steps))
                 + 10 ** fixed.complexity_log10 * 2 ** (2 / steps) + confidence)
    assert union.value <= allowance * (1 + 1e-12)
    # the terms add up, and the radius is the grid point just above ||Phi||_1
    assert union.value == pytest.approx(union.train_margin_loss + 10**union.complexity_log10
                                        + union.confidence)
    assert path_norm_log10 <= union.radius_log10 < path_norm_log10 + math.log10(2) / steps \
        + 1e-12
    assert union.train_margin_loss == pytest.approx(margin_loss(m, union.gamma))


def test_fixed_class_form_is_the_minimum_over_every_gamma():
    rad = rademacher_peeling(_CONSTANTS, math.sqrt(500), -0.8)
    m = _margins(3, 500, 3.0)
    fixed = fixed_class_margin_bound(rad, m, 0.05)
    base = 4 * math.sqrt(2) / 500 * rad.value  # complexity = base / gamma
    assert fixed.log10 < 0 and 10**fixed.complexity_log10 == pytest.approx(base / fixed.gamma)
    for gamma in torch.linspace(0.01, float(m.max()), 3000).tolist():
        assert margin_loss(m, gamma) + base / gamma >= fixed.train_margin_loss + \
            10 ** fixed.complexity_log10 - 1e-12
    assert fixed.confidence == pytest.approx(3 * math.sqrt(math.log(40) / 1000))
    with pytest.raises(InvalidParameterError, match="no training margin is positive"):
        fixed_class_margin_bound(rad, -m.abs(), 0.05)


def test_union_bound_by_hand():
    """One case written out: r_k, the chosen gamma_j, every term from the formula."""
    rad = rademacher_peeling(_CONSTANTS, 30.0, 0.5)
    m = _margins(0, 900, 4.0)
    u = union_margin_bound(rad, m, 0.05, PriorGrid(4))
    k = u.radius_index
    assert k == math.ceil(4 * 0.5 / math.log10(2))
    r_k = 2 ** (k / 4)
    gamma = 2 ** (u.gamma_index / 4)
    assert u.gamma == pytest.approx(gamma)
    complexity = 4 * math.sqrt(2) / (900 * gamma) * rad.value / 10**0.5 * r_k
    assert 10**u.complexity_log10 == pytest.approx(complexity)
    w = [Fraction(2, 3 * (abs(i) + 1) * (abs(i) + 2)) for i in (k, u.gamma_index)]
    assert u.confidence == pytest.approx(
        3 * math.sqrt(math.log(2 / (0.05 * float(w[0] * w[1]))) / 1800))
    # no other grid margin does better
    for j in range(u.gamma_index - 12, u.gamma_index + 12):
        g = 2 ** (j / 4)
        conf = 3 * math.sqrt((math.log(40) + PriorGrid(4).log_inverse_weight(k)
                              + PriorGrid(4).log_inverse_weight(j)) / 1800)
        assert margin_loss(m, g) + complexity * gamma / g + conf >= u.value - 1e-12
    assert "valid for every network of this architecture" in u.statement()
    assert repr(u).startswith("UnionMarginBound(")


def test_union_gap_bound_by_hand():
    rad = rademacher_peeling(_CONSTANTS, 30.0, -1.2)
    b = union_gap_bound(rad, 500, clip=5.0, delta=0.1)
    k = math.ceil(4 * -1.2 / math.log10(2))
    assert b.radius_index == k
    assert 10**b.complexity_log10 == pytest.approx(4 / 500 * rad.value / 10**-1.2 * 2**(k / 4))
    assert b.confidence == pytest.approx(
        3 * 5.0 * math.sqrt((math.log(20) + PriorGrid().log_inverse_weight(k)) / 1000))
    assert 10**b.log10 == pytest.approx(10**b.complexity_log10 + b.confidence)
    with pytest.raises(InvalidParameterError):
        union_gap_bound(rad, 500, clip=0.0)
    with pytest.raises(InvalidParameterError):
        union_margin_bound(rad, torch.ones(3), delta=1.5)
