"""Generalisation bounds: Thm 4.4.1 against a Monte Carlo Rademacher complexity, sigma,
margins and Thm 4.1.2, the covering numbers of the functional-equivalence slides."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pathlift.bounds import (
    architecture_constants,
    covering_deep,
    covering_shallow,
    cross_entropy_gap_log10,
    margin_bound,
    margin_loss,
    margins,
    peeling_constant,
    rademacher_covering,
    rademacher_peeling,
    sigma_from_loader,
    sigma_of,
)
from pathlift.errors import InvalidParameterError
from pathlift.lift import path_norm


def _forward(params, x):
    """Batched MLPs: params = [(W (B, out, in), b (B, out))], x (n, d_in) -> (B, n)."""
    h = x.expand(params[0][0].shape[0], *x.shape)
    for k, (W, b) in enumerate(params):
        h = h @ W.transpose(1, 2) + b.unsqueeze(1)
        if k < len(params) - 1:
            h = h.clamp(min=0)
    return h[..., 0]


def _l1_path_norm(params, d_in):
    """||Phi||_1 of each batched MLP by the |theta| forward pass of Thm 3.1.1."""
    v = torch.ones(params[0][0].shape[0], d_in, dtype=torch.float64)
    for W, b in params:
        v = (W.abs() @ v.unsqueeze(-1)).squeeze(-1) + b.abs()
    return v.sum(-1)


def _sup_correlation(x, eps, hidden, restarts=4, steps=250, seed=0):
    """For each sign vector eps_k: a lower estimate of sup_{||Phi||_1 <= 1} <eps_k, R_theta(S)>
    by gradient ascent on <eps, R_theta(S)> / ||Phi(theta)||_1 (scale-free: multiplying the
    last layer by t multiplies both by t), plus the single-neuron candidates."""
    m, d_in = len(eps), x.shape[1]
    widths = [d_in, *hidden, 1]
    gen = torch.Generator().manual_seed(seed)
    params = [(torch.randn(m * restarts, o, i, generator=gen, dtype=torch.float64),
               torch.randn(m * restarts, o, generator=gen, dtype=torch.float64) * 0.1)
              for i, o in itertools.pairwise(widths)]
    flat = [t.requires_grad_() for pair in params for t in pair]
    opt = torch.optim.Adam(flat, lr=0.05)
    signs = eps.repeat_interleave(restarts, 0)
    for _ in range(steps):
        value = (signs * _forward(params, x)).sum(-1) / _l1_path_norm(params, d_in)
        opt.zero_grad()
        (-value.sum()).backward()
        opt.step()
    with torch.no_grad():
        value = (signs * _forward(params, x)).sum(-1) / _l1_path_norm(params, d_in)
        best = value.reshape(m, restarts).amax(1)
        # feasible simple points: the output bias alone, one neuron relu(+-x_u)
        simple = [eps.sum(1).abs()] + [(eps @ (s * x[:, u]).clamp(min=0)).abs()
                                       for u in range(d_in) for s in (1.0, -1.0)]
        return torch.maximum(best, torch.stack(simple).amax(0))


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 10), st.integers(1, 3),
       st.floats(0.2, 4.0), st.sampled_from([(6,), (4, 4)]))
def test_thm_4_4_1_bounds_a_monte_carlo_rademacher_complexity(seed, n, d_in, scale, hidden):
    """E_eps sup_{||Phi||_1 <= r} sum_i eps_i R_theta(x_i) <= sqrt(2) sigma(S) C r: the sup
    approximated from below by optimisation on tiny ReLU networks, the expectation by
    Monte Carlo over 48 sign draws; C from the traced graph of the same architecture."""
    gen = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(n, d_in, generator=gen, dtype=torch.float64)
    eps = torch.randint(0, 2, (48, n), generator=gen).to(torch.float64) * 2 - 1
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise([d_in, *hidden]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    arch = nn.Sequential(*layers, nn.Linear(hidden[-1], 1))
    c = architecture_constants(arch, (d_in,))
    assert (c.depth, c.pool_types, c.kernel) == (len(hidden) + 1, 0, 1)
    r = 3.0
    estimate = r * float(_sup_correlation(x, eps, hidden).mean())
    bound = rademacher_peeling(c, sigma_of(x).peeling, math.log10(r))
    assert estimate <= bound.value
    assert estimate >= bound.value / 6  # not vacuous: observed ratios 0.24 to 0.34


def test_batched_path_norm_helper_matches_pathlift():
    """The test's own ||Phi||_1 (used as the constraint above) equals pathlift's."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.ReLU(),
                        nn.Linear(2, 1)).double()
    params = [(m.weight.detach()[None], m.bias.detach()[None]) for m in net
              if isinstance(m, nn.Linear)]
    assert float(_l1_path_norm(params, 3)) == pytest.approx(path_norm(net, (3,)).value,
                                                            rel=1e-12)
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(_forward(params, x)[0], net(x)[:, 0].detach())


def test_sigma_from_loader_matches_the_definitions():
    x = torch.randn(37, 2, 3, generator=torch.Generator().manual_seed(0)) * 1.7
    loader = DataLoader(TensorDataset(x, torch.zeros(37)), batch_size=8)
    s = sigma_from_loader(loader)
    flat = x.reshape(37, -1).double()
    peeling = math.sqrt(max([37.0] + [float((flat[:, u] ** 2).sum()) for u in range(6)]))
    covering = math.sqrt(sum(max(1.0, float(row.abs().max()) ** 2) for row in flat))
    assert (s.n, s.peeling, s.covering) == (37, pytest.approx(peeling),
                                            pytest.approx(covering))
    whole = sigma_of(x)  # batched and whole-tensor sums may round differently
    assert s.n == whole.n
    assert (s.peeling, s.covering, s.max_abs) == pytest.approx(
        (whole.peeling, whole.covering, whole.max_abs), rel=1e-12)
    assert s.max_abs == pytest.approx(float(x.abs().max()))
    small = sigma_of(torch.full((9, 4), 0.1))
    assert small.peeling == pytest.approx(3.0) and small.covering == pytest.approx(3.0)


def test_gap_bound_is_4_l_sigma_c_r_over_n_even_beyond_float64():
    """Thm 4.1.1 x Thm 4.4.1 = 4 L sigma C r / n (thesis Sec. 7.2.1), in log space."""
    c = architecture_constants(nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2)),
                               (5,))
    sigma, n = 12.0, 100
    for log_r in (0.5, 400.0):
        log10 = cross_entropy_gap_log10(rademacher_peeling(c, sigma, log_r), n)
        direct = math.log10(4 * math.sqrt(2) * sigma * peeling_constant(c) / n) + log_r
        assert log10 == pytest.approx(direct, abs=1e-12)
    big = rademacher_peeling(c, sigma, 400.0)
    assert big.value == math.inf and math.isfinite(big.log10)
    cov = rademacher_covering(c, sigma, 0.0, weight_sharing=False)
    assert cov.value == pytest.approx(144 * sigma * 2 * math.sqrt(5 * 3 + 3 + 3 * 2 + 2))


def test_margins_and_margin_loss():
    logits = torch.tensor([[2.0, 0.5, 1.0], [0.0, 3.0, -1.0], [1.0, 1.0, 4.0]])
    y = torch.tensor([0, 2, 2])
    net = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.eye(3))
    m = margins(net, DataLoader(TensorDataset(logits, y), batch_size=2))
    torch.testing.assert_close(m, torch.tensor([1.0, -4.0, 3.0], dtype=torch.float64))
    # eq. 4.13 piecewise: margin 1 with gamma 2 -> 0.5; -4 -> 1; 3 -> 0
    assert margin_loss(m, 2.0) == pytest.approx((0.5 + 1 + 0) / 3)


def test_margin_bound_thm_4_1_2():
    c = architecture_constants(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2)),
                               (2,))
    rad = rademacher_peeling(c, 10.0, 0.0)
    m = torch.linspace(-1.0, 9.0, 101, dtype=torch.float64)
    b = margin_bound(rad, m, quantile=0.5, delta=0.1)
    assert b.gamma == pytest.approx(4.0)
    assert b.train_margin_loss == pytest.approx(margin_loss(m, 4.0))
    assert 10**b.complexity_log10 == pytest.approx(4 * math.sqrt(2) / (101 * 4.0) * rad.value)
    assert b.confidence == pytest.approx(3 * math.sqrt(math.log(20) / 202))
    total = b.train_margin_loss + 10**b.complexity_log10 + b.confidence
    assert 10**b.log10 == pytest.approx(total) and b.informative == (total < 1)
    with pytest.raises(InvalidParameterError, match="quantile"):
        margin_bound(rad, m, quantile=0.05)  # the 5% quantile is negative


def test_covering_numbers_of_the_slides_against_exact_integers():
    """Theorem 3 with d_0 = 4 (sqrt(d_0) = 2), B = B_x = eps = rho = 1: base 64 d_1, so
    N <= (64 d_1)^S / d_1! is an integer ratio computed exactly in Python."""
    d0, d1 = 4, 7
    got = covering_shallow(d0, d1, B=1.0, B_x=1.0, eps=1.0)
    S = d0 * d1 + 2 * d1 + 1
    assert got.num_params == S
    assert got.log10 == pytest.approx(math.log10((64 * d1) ** S / math.factorial(d1)))
    assert got.discount_log10 == pytest.approx(math.log10(math.factorial(d1)))
    # slides: a shallow ReLU network with d_1 = 128 gains about 10^215
    assert int(covering_shallow(10, 128, 1.0, 1.0, 0.1).discount_log10) == 215
    widths = (3, 5, 4)
    deep = covering_deep(widths, B=1.0, B_x=1.0, eps=1.0)
    S = 3 * 5 + 5 + 5 * 4 + 4 + 4 * 1 + 1
    base = 4 * 3 * 2 * 2**4 * (3 * 5 * 4)  # 4(L+1)(B_x+1)(2B)^{L+2} prod d_j
    exact = base**S // (math.factorial(5) * math.factorial(4))
    assert (deep.num_params, deep.log10) == (S, pytest.approx(math.log10(exact)))
    with pytest.raises(InvalidParameterError):
        covering_deep((3,), 1.0, 1.0, 1.0)
