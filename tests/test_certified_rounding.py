"""The proven bound on the path-metric d (pathlift.bounds.rounding) against exact rational
arithmetic: never below the exact d of the float64 parameters, and close to it, on
networks with weights from 2^-30 to 2^30 and quantisations fine enough that d is a
cancellation of two nearly equal path-norms."""

from __future__ import annotations

import copy
from fractions import Fraction

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds.rounding import certified_d, log_error
from pathlift.graph import graph_of


def _exact_norm(model: nn.Sequential, length: int | None, d_in: int) -> Fraction:
    """||Phi||_1 exactly: the |theta| network on the all-ones input (Thm 3.1.1), max-pool
    replaced by sum-pool, in rationals (every float64 is one)."""
    h: list = [[Fraction(1)] * length] * d_in if length else [Fraction(1)] * d_in
    for layer in model:
        if isinstance(layer, nn.Linear):
            flat = [v for row in h for v in row] if isinstance(h[0], list) else h
            w, b = layer.weight.tolist(), layer.bias.tolist()
            h = [sum((abs(Fraction(w[i][j])) * flat[j] for j in range(len(flat))),
                     abs(Fraction(b[i]))) for i in range(len(w))]
        elif isinstance(layer, nn.Conv1d):
            w, b = layer.weight.tolist(), layer.bias.tolist()
            k = layer.kernel_size[0]
            h = [[sum((abs(Fraction(w[o][c][t])) * h[c][p + t] for c in range(len(h))
                       for t in range(k)), abs(Fraction(b[o])))
                  for p in range(len(h[0]) - k + 1)] for o in range(len(w))]
        elif isinstance(layer, nn.MaxPool1d):
            k = layer.kernel_size
            h = [[sum(row[p:p + k]) for p in range(0, len(row) - k + 1, k)] for row in h]
    return sum(h, Fraction(0))


def _truncated(model: nn.Module, exponent: int) -> nn.Module:
    """Each tensor rounded towards zero to steps 2^(floor log2 max|w| - exponent)."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for p in q.parameters():
            top = float(p.abs().max())
            if top > 0:
                step = 2.0 ** (int(torch.tensor(top).log2().floor()) - exponent)
                p.copy_(torch.trunc(p / step) * step)
    return q


def _network(seed: int, conv: bool, scales: list[int]) -> tuple[nn.Sequential, tuple]:
    torch.manual_seed(seed)
    if conv:
        layers = [nn.Conv1d(2, 3, 3), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(),
                  nn.Linear(27, 4), nn.ReLU(), nn.Linear(4, 2)]
        shape = (2, 20)
    else:
        layers = [nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)]
        shape = (5,)
    model = nn.Sequential(*layers).double()
    with torch.no_grad():
        for p, s in zip(model.parameters(), scales * 4, strict=False):
            p.mul_(2.0 ** s)
    return model, shape


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.booleans(), st.lists(st.integers(-30, 30), min_size=4,
                                                       max_size=4),
       st.integers(2, 45))
def test_certified_d_holds_against_exact_rationals(seed, conv, scales, fine):
    """d(exact) <= certified_d <= d(exact) + 1e-9 ||Phi(theta)||_1, with Q truncating
    every tensor to 2..45 bits below its largest entry (at 45 bits, d is ~1e-13 of the
    path-norms: the difference is mostly cancellation)."""
    theta, shape = _network(seed, conv, scales)
    q = _truncated(theta, fine)
    length = shape[1] if conv else None
    norm_theta = _exact_norm(theta, length, shape[0])
    exact = norm_theta - _exact_norm(q, length, shape[0])
    assert exact >= 0
    bound = certified_d(graph_of(theta, shape), graph_of(q, shape))
    assert Fraction(bound) >= exact
    assert Fraction(bound) - exact <= Fraction(1e-9) * norm_theta


def test_log_error_grows_with_the_graph_and_the_scales():
    """rho is larger for a deeper network and for weights of wider range."""
    small, shape = _network(0, False, [0, 0, 0, 0])
    wide, _ = _network(0, False, [30, -30, 30, -30])
    deep = nn.Sequential(*small, nn.ReLU(), nn.Linear(3, 3).double())
    assert log_error(graph_of(small, shape)) < log_error(graph_of(wide, shape))
    assert log_error(graph_of(small, shape)) < log_error(graph_of(deep, shape))
    assert log_error(graph_of(wide, shape)) < 1e-10
