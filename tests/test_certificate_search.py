"""The compression search: estimated code lengths, progress, a time budget, and the early
stop when no candidate can beat chance (issue 39)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds import compression_bound
from pathlift.bounds.code import (
    BIT_LENGTHS,
    ENUMERATIVE,
    architecture_of,
    encode,
    estimated_length,
)
from pathlift.bounds.compression import CompressionSearch
from pathlift.bounds.kl import kl_inverse
from random_nets import random_network
from test_bounds_code import _random_coded


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_estimated_length_is_the_written_length_within_three_bits(seed):
    """Every part but the arithmetic-coded symbols is exact; those are the KT ideal length
    + 2, at most 3 bits above and never below what the coder writes. The enumerative
    scheme's estimate is exact, so the default (the shorter scheme) is within 3 bits too."""
    model, shape = random_network(seed)
    family = [architecture_of(nn.Sequential(nn.Linear(3, 2)), (3,)),
              architecture_of(model, shape)]
    coded = _random_coded(family[1], 1, seed)
    exact = encode(coded, family, BIT_LENGTHS).length
    guess = estimated_length(coded, family, BIT_LENGTHS)
    for part in ("architecture", "header", "signs", "mantissas", "constants", "choice"):
        assert getattr(exact, part) == getattr(guess, part)
    assert 0 <= guess.symbols - exact.symbols <= 3
    assert estimated_length(coded, family, ENUMERATIVE) == encode(coded, family,
                                                                  ENUMERATIVE).length
    shortest = encode(coded, family).length.total
    assert 0 <= estimated_length(coded, family).total - shortest <= 3


def _trained(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, 6, generator=g) * 3
    y = torch.randint(0, 3, (600,), generator=g)
    x = centers[y] + torch.randn(600, 6, generator=g)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.Adam(net.parameters(), lr=0.03)
    for _ in range(200):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net, x, y


def test_progress_is_reported_and_the_certificate_counts_exact_bits():
    net, x, y = _trained()
    calls = []
    search = CompressionSearch(offsets=(2, 5, 8), refine=1)
    cert = compression_bound(net, (6,), x, y, search=search,
                             progress=lambda done, planned: calls.append((done, planned)))
    assert [d for d, _ in calls] == list(range(1, len(calls) + 1))
    planned = 2 * 2 * (3 + 2 * 4 * 1)  # rescalings x fractions x (offsets + 2 moves x 4)
    assert all(p == planned for _, p in calls) and len(calls) <= planned
    assert cert.length == encode(cert.coded, [architecture_of(net, (6,))]).length
    assert not cert.stopped and cert.value < 0.9 and cert.beats_chance


def test_time_budget_stops_the_search_with_a_valid_certificate():
    net, x, y = _trained()
    calls = []
    cert = compression_bound(net, (6,), x, y, time_budget=0.0,
                             progress=lambda done, planned: calls.append(done))
    assert len(calls) == 1  # one candidate, then the budget is spent
    assert cert.stopped.startswith("time budget of 0 s spent after 1 candidates")
    assert cert.value == kl_inverse(cert.occam.empirical, cert.occam.budget)


def test_no_search_when_no_candidate_can_beat_chance():
    """An untrained network errs on ~2/3 of a 3-class sample: every event holds there, so
    every bound is >= kl^-1(its training error, (ln T + ln 1/delta)/n) >= chance; one
    candidate is tried, and its certificate is indeed not below chance."""
    _, x, y = _trained()
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    calls = []
    cert = compression_bound(net, (6,), x, y, progress=lambda d, p: calls.append(d))
    assert len(calls) == 1 and cert.stopped.startswith("no candidate can beat chance")
    chance = 1 - int(torch.bincount(y).max()) / len(y)
    floor = kl_inverse(cert.train_error, (math.log(283) + math.log(20)) / len(x))
    assert cert.value >= floor >= chance
    assert "not informative" in cert.verdict() and not cert.beats_chance
