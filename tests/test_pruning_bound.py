"""The pruning certificate of thesis eq. 3.19 (``pathlift.lift.pruning_bound``, re-exported
by ``pathlift.bounds``): its log-space arithmetic against exact decimals far beyond float64,
and eq. 3.17's telescoping over steps, which never exceeds the costs of the same
coordinates at the unpruned parameters."""

from __future__ import annotations

import copy
import math
from decimal import Decimal, localcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import pathlift.bounds
from pathlift.lift import pruning_certificate
from pathlift.prune import path_magnitude_scores, prune_model


def _log10(value: Decimal) -> float:
    return float(value.log10()) if value > 0 else -math.inf


@settings(max_examples=50, deadline=None)
@given(st.floats(-300.0, 600.0), st.just(0.0) | st.floats(1e-6, 30.0),
       st.lists(st.floats(-400.0, 600.0), min_size=1, max_size=5))
def test_the_certificate_is_exact_in_log_space(norm: float, drop: float, costs: list[float]):
    """d = ||Phi(theta)||_1 - ||Phi(theta')||_1 and the summed costs, in log10, agree with
    decimals of 60 digits, where 10**norm would overflow float64."""
    found = pruning_certificate(norm, norm - drop, costs)
    with localcontext() as ctx:
        ctx.prec = 60
        ten = Decimal(10)
        metric = ten ** Decimal(norm) - ten ** Decimal(norm - drop)
        bound = sum(ten ** Decimal(c) for c in costs)
    assert found.log10_path_norm == norm
    if drop == 0.0:
        assert found.log10_path_metric == -math.inf
    else:
        assert found.log10_path_metric == pytest.approx(_log10(metric), rel=1e-12, abs=1e-9)
    assert found.log10_bound == pytest.approx(_log10(bound), rel=1e-12, abs=1e-9)


def test_the_bounds_package_offers_it():
    assert pathlift.bounds.pruning_certificate is pruning_certificate


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_pruning_in_steps_certifies_at_most_the_costs_at_theta(steps: int):
    """Eq. 3.17: Phi-Cost(s_{j-1} theta, i) <= Phi-Cost(theta, i), so the costs taken at the
    step that pruned each coordinate sum to at most their costs at theta, and at least d."""
    torch.manual_seed(3)
    dense = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(),
                          nn.Linear(6, 2)).double()
    at_theta = path_magnitude_scores(dense, (5,))
    pruned = copy.deepcopy(dense)
    result = prune_model(pruned, (5,), 0.6, "path-magnitude", "global", steps=steps)
    masks = {n.removesuffix("_mask"): b == 0 for n, b in pruned.named_buffers()
             if n.endswith("_mask")}
    one_shot = at_theta.log10_sum(masks)
    assert result.log10_path_metric <= result.log10_bound + 1e-9
    assert result.log10_bound <= one_shot + 1e-9
    if steps == 1:
        assert result.log10_bound == pytest.approx(one_shot, abs=1e-12)
    assert result.certificate.bound == result.bound > 0
