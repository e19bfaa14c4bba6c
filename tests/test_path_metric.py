"""l1 path-metric: two passes vs explicit path enumeration (Lemma 3.4.1, paper 002 F.3)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import ArchitectureMismatchError
from pathlift.lift import path_metric, path_norm
from pathlift.lift.path_metric import enumerated_path_metric
from pathlift.symmetry import random_rescale
from random_nets import random_network
from test_rescale import assert_bit_identical, snapshot


def masked(model: nn.Module, keep: float, seed: int) -> nn.Module:
    """A copy with Linear/Conv weights and biases randomly zeroed (pruning: |theta'| <= |theta|)."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for m in out.modules():
            if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
                for p in m.parameters(recurse=False):
                    p.mul_((torch.rand(p.shape, generator=g) < keep).to(p.dtype))
    return out


def rounded_towards_zero(model: nn.Module, step: float) -> nn.Module:
    out = copy.deepcopy(model)
    with torch.no_grad():
        for m in out.modules():
            if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
                for p in m.parameters(recurse=False):
                    p.copy_(torch.trunc(p / step) * step)
    return out


def noisy(model: nn.Module, scale: float, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return out


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), keep=st.sampled_from([0.3, 0.7, 0.95]))
def test_exact_case_equals_enumeration(seed, keep):
    model, shape = random_network(seed)
    model = model.double()
    pruned = masked(model, keep, seed)
    before = snapshot(model)
    result = path_metric(model, pruned, shape)
    expected = enumerated_path_metric(model, pruned, shape)
    if result.exact:
        assert math.isclose(result.lower, expected, rel_tol=1e-9, abs_tol=1e-12)
        assert result.upper_log10 == result.lower_log10
        assert result.relative_accuracy < 1e-6 or expected < 1e-12
    else:  # BatchNorm (a, c) pairs can break dominance, or d is lost to cancellation
        assert result.lower <= expected * (1 + 1e-9) + 1e-12
        assert expected <= result.upper * (1 + 1e-9) + 1e-12
    assert_bit_identical(model, before)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_interval_contains_enumeration(seed):
    model, shape = random_network(seed)
    model = model.double()
    other = noisy(model, 0.3, seed)
    result = path_metric(model, other, shape)
    expected = enumerated_path_metric(model, other, shape)
    assert result.lower <= expected * (1 + 1e-9) + 1e-12
    assert expected <= result.upper * (1 + 1e-9) + 1e-12
    if not result.exact:
        assert result.case == "interval" and result.reason


def test_quantisation_towards_zero_is_exact():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                          nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    q = rounded_towards_zero(model, 0.05)
    result = path_metric(model, q, (2, 4, 4))
    assert result.exact
    assert math.isclose(result.lower, enumerated_path_metric(model, q, (2, 4, 4)), rel_tol=1e-10)
    # symmetric: the dominating model may come second
    assert math.isclose(path_metric(q, model, (2, 4, 4)).lower, result.lower, rel_tol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_finite_upper_bound_of_lemma_f3_contains_enumeration(seed):
    """No max-pool nor residual sum: Lemma F.3's premise holds and the bound is finite."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv1d(1, 3, 3, padding=1), nn.ReLU(), nn.AvgPool1d(2),
                          nn.Flatten(), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    other = noisy(model, 0.2, seed)
    result = path_metric(model, other, (1, 4))
    expected = enumerated_path_metric(model, other, (1, 4))
    assert not result.exact and math.isfinite(result.upper_log10)
    assert result.lower <= expected * (1 + 1e-9) <= result.upper
    # invariant: a random rescaling of either model gives the same interval
    again = path_metric(random_rescale(model, seed=seed, input_shape=(1, 4)), other, (1, 4))
    assert math.isclose(again.upper, result.upper, rel_tol=1e-7)
    assert math.isclose(again.lower, result.lower, rel_tol=1e-7)


def test_rescaled_copy_is_at_distance_zero_up_to_rounding():
    model, shape = random_network(7)
    model = model.double()
    result = path_metric(model, random_rescale(model, seed=1, input_shape=shape), shape)
    assert result.lower <= 1e-12 * max(path_norm(model, shape).value, 1.0)


@pytest.mark.parametrize("seed", range(6))
def test_a_network_and_its_rescaling_are_at_distance_zero(seed):
    """d = 0 (exact: the normalised parameters agree, Alg. 3.2.1 + Thm 2.4.1), not an
    interval from rounding noise to inf, on networks with max-pool, BatchNorm and sums;
    enumeration agrees to the rounding of the rescaled weights."""
    model, shape = random_network(seed)
    for dtype in (torch.float32, torch.float64):
        net = copy.deepcopy(model).to(dtype)
        rescaled = random_rescale(net, seed=seed, input_shape=shape)
        result = path_metric(net, rescaled, shape)
        assert result.exact and result.lower == result.upper == 0.0, result
        assert "rescalings of each other" in result.reason or "dominates" in result.reason
        scale = path_norm(net, shape).value
        assert enumerated_path_metric(net.double(), rescaled.double(), shape) <= 1e-5 * scale


def test_a_lower_end_within_rounding_is_zero_and_the_upper_end_finite():
    """Two networks whose l1 path-norms agree to their precision but which are not
    rescalings of each other: the certified lower end is 0 (not the rounding noise), the
    upper end finite (the triangle inequality where Lemma F.3 does not apply)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Unflatten(1, (1, 4)), nn.MaxPool1d(2),
                          nn.Flatten(), nn.Linear(2, 2)).double()
    other = copy.deepcopy(model)
    with torch.no_grad():  # one output weight of the opposite sign: same ||Phi||_1
        other[5].weight[0, 0] *= -1
    result = path_metric(model, other, (3,))
    expected = enumerated_path_metric(model, other, (3,))
    assert result.lower == 0.0 < expected <= result.upper < math.inf
    assert "triangle" in result.reason


def test_deep_network_stays_in_log_space():
    """||Phi||_1 ~ 1e430 overflows float64 (random signs keep the forward pass finite, about
    1e275); the metric of a pruned copy stays finite in log10."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(150):
        lin = nn.Linear(64, 64)
        with torch.no_grad():
            lin.weight.copy_(12.0 * torch.sign(torch.randn(64, 64)))
        layers += [lin, nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, 1)).double()
    pruned = masked(model, 0.9, 0)
    result = path_metric(model, pruned, (64,))
    assert result.exact and result.norm_a_log10 > 400
    assert math.isinf(result.value) and math.isfinite(result.lower_log10)
    assert result.norm_b_log10 < result.lower_log10 < result.norm_a_log10 + 1e-9


def test_different_architectures_are_refused():
    a = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    b = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    with pytest.raises(ArchitectureMismatchError):
        path_metric(a, b, (3,))
    c = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.ReLU())
    with pytest.raises(ArchitectureMismatchError, match="operations"):
        path_metric(a, c, (3,))
