"""The disagreement route (pathlift.bounds.disagreement): the pointwise inequality behind
it on tied logits, the coverage of its unlabeled term where the true disagreement is
known, the full statement where the target's risk is known, the route picking, bad input,
and a CNN trained with plain Adam certified without retraining."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds.compression import CompressionSearch, compression_bound
from pathlift.bounds.disagreement import (
    DisagreementBound,
    certify,
    disagreement_bound,
    disagreements,
)
from pathlift.bounds.kl import kl_inverse
from pathlift.errors import InvalidParameterError
from pathlift.train.recipes import fit
from pathlift.train.surrogate import distil_surrogate, predictions

QUICK = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(2, 4, 6, 8),
                          refine=0)


class Threshold(nn.Module):
    """Class 1 where x > a, class 0 below, on x in [0, 1] (logits x - a, a - x)."""

    def __init__(self, a: float):
        super().__init__()
        self.lin = nn.Linear(1, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[-1.0], [1.0]]))
            self.lin.bias.copy_(torch.tensor([a, -a]))

    def forward(self, x):
        return self.lin(x)


class FixedLogits(nn.Module):
    """Returns row i of a table for input i (the input is the row index)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, x):
        return self.table[x.reshape(-1).long()]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 4))
def test_pointwise_error_below_surrogate_error_plus_disagreement_with_ties(seed, classes):
    """err_h <= err_g + dis(h, g) on logits drawn from {0, 1, 2} (ties everywhere): the
    step (1) of the proof, with the tie conventions of both sides."""
    gen = torch.Generator().manual_seed(seed)
    n = 64
    h = torch.randint(0, 3, (n, classes), generator=gen).double()
    g = torch.randint(0, 3, (n, classes), generator=gen).double()
    y = torch.randint(classes, (n,), generator=gen)
    x = torch.arange(n, dtype=torch.float64)[:, None]
    dis = disagreements(FixedLogits(h), FixedLogits(g), x)

    def errs(logits):  # m(x, y) <= 0: a tie at the top counts as an error
        true = logits.gather(1, y[:, None]).squeeze(1)
        return true <= logits.scatter(1, y[:, None], -math.inf).amax(1)

    assert bool((errs(h) <= errs(g) | dis).all())
    # dis is symmetric and 0 against itself only where the top class is unique
    assert torch.equal(dis, disagreements(FixedLogits(g), FixedLogits(h), x))
    top2 = h.topk(2, 1).values
    assert torch.equal(disagreements(FixedLogits(h), FixedLogits(h), x),
                       top2[:, 0] == top2[:, 1])


def _fake_certificate(value: float, delta: float):
    """A CompressionBound stand-in carrying only what the route reads (value, delta)."""
    class Stub:
        pass
    stub = Stub()
    stub.value, stub.delta, stub.n, stub.transfer = value, delta, 1, "box"
    return stub


@pytest.mark.parametrize("a,b,m", [(0.3, 0.35, 400), (0.2, 0.5, 200), (0.5, 0.51, 1000)])
def test_unlabeled_term_covers_the_true_disagreement(a, b, m):
    """Thresholds a and b on x ~ U[0, 1] disagree with probability exactly |a - b|: over
    400 independent draws of the m unlabeled inputs, the kl upper bound falls below it in
    at most a delta_U share of them (binomial slack of 3 standard deviations); the
    empirical rate alone would fall below it about half the time."""
    delta_u, draws = 0.1, 400
    p = abs(a - b)
    h, g = Threshold(a), Threshold(b)
    cert = _fake_certificate(0.0, 0.05)
    gen = torch.Generator().manual_seed(0)
    below, naive = 0, 0
    for _ in range(draws):
        u = torch.rand(m, 1, generator=gen)
        d = disagreement_bound(h, g, cert, u, delta_unlabeled=delta_u).disagreement
        below += d.value < p
        naive += d.empirical < p
    slack = 3 * math.sqrt(draws * delta_u * (1 - delta_u))
    assert below <= draws * delta_u + slack
    assert naive > draws * 0.3  # the test can fail: the bound is needed


def test_disagreement_term_is_the_kl_inverse_of_the_count():
    """Against an independent count and kl_inverse: D_U = |a - b|'s empirical share, the
    budget (ln K + ln 1/delta_U) / m."""
    u = torch.rand(500, 1, generator=torch.Generator().manual_seed(3))
    h, g = Threshold(0.4), Threshold(0.6)
    d = disagreement_bound(h, g, _fake_certificate(0.1, 0.02), u, delta_unlabeled=0.03,
                           candidates=3)
    share = float(((u > 0.4) & (u <= 0.6)).double().mean())
    budget = (math.log(3) + math.log(1 / 0.03)) / 500
    assert d.disagreement.empirical == pytest.approx(share, abs=0)
    assert d.disagreement.budget == pytest.approx(budget, rel=1e-12)
    assert d.disagreement.value == kl_inverse(share, budget)
    assert d.value == pytest.approx(0.1 + d.disagreement.value, rel=1e-15)
    assert d.delta == pytest.approx(0.05)


@pytest.mark.parametrize("seed", range(3))
def test_certificate_holds_where_the_risk_is_known(seed):
    """y = 1{x > 0.5} on x ~ U[0, 1]; the target thresholds at 0.62 (true error 0.12
    exactly), the surrogate is a one-layer network trained on S to copy it. The route's
    bound is above 0.12, and its disagreement term above the surrogate's true
    disagreement (computed exactly from its threshold)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(3000, 1, generator=gen)
    y = (x[:, 0] > 0.5).long()
    u = torch.rand(2000, 1, generator=gen)
    target = Threshold(0.62)
    torch.manual_seed(seed)
    g = nn.Sequential(nn.Linear(1, 2))
    labels = predictions(target, x)
    fit(g, x, labels, torch.optim.Adam(g.parameters(), 0.05),
        lambda a, b: F.cross_entropy(g(a), b), 30, 256, torch.Generator().manual_seed(seed))
    cert = certify(target, (1,), x, y, unlabeled=u, surrogates=[g], direct=False,
                   search=QUICK)
    w, b = g[0].weight.detach().double(), g[0].bias.detach().double()
    # g picks class 1 where (w1 - w0) x + b1 - b0 > 0: a threshold t (or none)
    slope, offset = float(w[1, 0] - w[0, 0]), float(b[1] - b[0])
    assert slope > 0  # trained to copy an increasing threshold
    true_dis = abs(min(max(-offset / slope, 0.0), 1.0) - 0.62)
    via = cert.through[0]
    assert via.disagreement.value >= true_dis
    assert cert.value >= 0.12
    assert cert.route == "disagreement" and isinstance(cert.best, DisagreementBound)


def test_route_picking_pays_every_choice_and_takes_the_smallest():
    """certify with the target itself as a surrogate (a copy: disagreement 0) and a worse
    one: each route equals its independent computation at delta_S = delta / 2 with the
    family of both architectures, and the best is their minimum."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2000, 1, generator=gen)
    y = (x[:, 0] > 0.5).long()
    u = torch.rand(1000, 1, generator=gen)
    target, worse = Threshold(0.5), nn.Sequential(nn.Linear(1, 2))
    with torch.no_grad():
        worse[0].weight.copy_(torch.tensor([[-1.0], [1.0]]))
        worse[0].bias.copy_(torch.tensor([0.7, -0.7]))
    cert = certify(target, (1,), x, y, unlabeled=u,
                   surrogates={"copy": copy.deepcopy(target), "worse": worse}, search=QUICK)
    from pathlift.bounds.code import architecture_of
    family = [architecture_of(target, (1,)), architecture_of(worse, (1,))]
    direct = compression_bound(target, (1,), x, y, family=family, delta=0.025, search=QUICK)
    assert cert.direct.value == direct.value
    assert cert.through[0].disagreement.empirical == 0.0
    assert cert.through[0].disagreement.budget == pytest.approx(math.log(2 / 0.025) / 1000)
    assert cert.through[1].disagreement.empirical == pytest.approx(
        float(((u > 0.5) & (u <= 0.7)).double().mean()), abs=0)
    values = list(cert.routes().values())
    assert cert.value == min(values) and len(values) == 3
    assert cert.route in ("box", "path-metric")  # the direct route is the tightest here
    assert "route picked among 3" in cert.statement()


def test_bad_input_is_refused_in_one_line_and_models_are_untouched():
    x = torch.rand(200, 1)
    y = (x[:, 0] > 0.5).long()
    target, g = Threshold(0.5).train(), Threshold(0.4)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    bad = torch.rand(50, 1)
    bad[3, 0] = math.nan
    with pytest.raises(InvalidParameterError, match="NaN or inf"):
        disagreements(target, g, bad)
    with pytest.raises(InvalidParameterError, match="unlabeled inputs"):
        certify(target, (1,), x, y, surrogates=[g])
    with pytest.raises(InvalidParameterError, match="no route"):
        certify(target, (1,), x, y, direct=False)
    with pytest.raises(InvalidParameterError, match="delta_unlabeled"):
        disagreement_bound(target, g, _fake_certificate(0.1, 0.5), x, delta_unlabeled=0.6)
    with pytest.raises(InvalidParameterError, match="empty"):
        disagreements(target, g, x[:0])
    disagreements(target, g, x)
    assert target.training
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def signals(n: int, gen: torch.Generator, classes: int = 4, length: int = 40):
    """MNIST-1D-like signals: a bump whose position (and width) gives the class, shifted
    by up to 3 steps, under Gaussian noise of 0.4."""
    y = torch.randint(classes, (n,), generator=gen)
    t = torch.arange(length, dtype=torch.float32)
    centre = 6 + 9 * y + torch.randint(-3, 4, (n,), generator=gen)
    width = 1.5 + y % 2
    x = torch.exp(-((t - centre[:, None]) / width[:, None]) ** 2 / 2)
    return (x + 0.4 * torch.randn(n, length, generator=gen))[:, None, :], y


class UserCNN(nn.Module):
    """A CNN written the way users write one: functional ReLU and max-pool in forward."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.c1 = nn.Conv1d(1, 16, 5, padding=2)
        self.c2 = nn.Conv1d(16, 16, 5, padding=2)
        self.fc = nn.Linear(160, classes)

    def forward(self, x):
        x = F.max_pool1d(F.relu(self.c1(x)), 2)
        x = F.max_pool1d(F.relu(self.c2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def test_plain_adam_cnn_is_certified_without_retraining():
    """A 2,964-parameter CNN trained with plain Adam on MNIST-1D-like signals (n = 6,000),
    certified through an mlp-small surrogate distilled from its predictions and 2,000
    held-out unlabeled signals: below chance (0.75 for 4 balanced classes) and above its
    error on 5,000 fresh test signals; the target is unchanged."""
    gen = torch.Generator().manual_seed(0)
    x, y = signals(6000, gen)
    u, _ = signals(2000, gen)
    x_test, y_test = signals(5000, gen)
    torch.manual_seed(0)
    target = UserCNN()
    fit(target, x, y, torch.optim.Adam(target.parameters(), 1e-3),
        lambda a, b: F.cross_entropy(target(a), b), 3, 128, torch.Generator().manual_seed(0))
    before = copy.deepcopy(target.state_dict())
    surrogate = distil_surrogate(target, x, 4, kind="mlp-small", epochs=4, seed=0)
    cert = certify(target, (1, 40), x, y, unlabeled=u, surrogates={"mlp-small": surrogate},
                   direct=False, search=QUICK)
    test_error = float((predictions(target, x_test) != y_test).double().mean())
    assert test_error < cert.value < 0.75
    assert cert.route == "disagreement"
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
