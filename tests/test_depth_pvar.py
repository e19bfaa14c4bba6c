"""p-variation (thesis Def. 2.1.3): the exact algorithm against brute force over partitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pathlift.depth.pvar import _dynamic_programme, p_variation
from pathlift.errors import InvalidParameterError

P_VALUES = (1.0, 1.5, 2.0, 3.0)


def brute_force(points: np.ndarray, p: float) -> float:
    """Sup over every partition (every subset of the interior points, endpoints kept)."""
    points = points.reshape(points.shape[0], -1)
    n = points.shape[0]
    best = 0.0
    for r in range(n - 1):
        for interior in itertools.combinations(range(1, n - 1), r):
            idx = (0, *interior, n - 1)
            steps = np.diff(points[list(idx)], axis=0)
            best = max(best, float((np.linalg.norm(steps, axis=1) ** p).sum()))
    return best ** (1.0 / p)


finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=40, deadline=None)
@given(
    path=st.integers(2, 12).flatmap(
        lambda n: arrays(np.float64, st.sampled_from([(n,), (n, 3), (n, 2, 2)]), elements=finite)
    ),
    p=st.sampled_from(P_VALUES),
)
def test_equals_brute_force_on_short_paths(path: np.ndarray, p: float) -> None:
    result = p_variation(path, p)
    assert result.value == pytest.approx(brute_force(path, p), rel=1e-12, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(path=arrays(np.float64, st.integers(2, 60), elements=finite), p=st.sampled_from(P_VALUES))
def test_partition_attains_the_value(path: np.ndarray, p: float) -> None:
    result = p_variation(path, p)
    idx = list(result.partition)
    assert idx[0] == 0 and idx[-1] == len(path) - 1 and idx == sorted(set(idx))
    attained = (np.abs(np.diff(path[idx])) ** p).sum() ** (1 / p)
    assert attained == pytest.approx(result.value, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("p", P_VALUES)
def test_turning_point_reduction_is_exact_on_long_scalar_paths(p: float) -> None:
    rng = np.random.default_rng(int(10 * p))
    path = np.cumsum(rng.standard_normal(400))
    path[100:110] = path[100]  # a flat run must not break the reduction
    full, _ = _dynamic_programme(path[:, None], p)
    assert p_variation(path, p).value == pytest.approx(full ** (1 / p), rel=1e-12)


@pytest.mark.parametrize("p", P_VALUES)
def test_linear_interpolation_has_the_step_path_value(p: float) -> None:
    """Refining the interpolated path (points inside segments) never raises the p-variation."""
    rng = np.random.default_rng(3)
    for dim in (1, 2):
        vertices = rng.standard_normal((6, dim))
        t = np.linspace(0, 1, 4)[:-1, None, None]  # 3 points per segment, vertex included
        inner = (1 - t) * vertices[None, :-1] + t * vertices[None, 1:]
        refined = np.concatenate([inner.transpose(1, 0, 2).reshape(-1, dim), vertices[-1:]])
        assert brute_force(refined, p) == pytest.approx(p_variation(vertices, p).value, rel=1e-12)


def test_monotone_path_and_p1_closed_forms() -> None:
    path = np.array([0.0, 1.0, 3.0, 3.0, 7.0])
    for p in P_VALUES:  # a monotone scalar path has p-variation |end - start|
        assert p_variation(path, p).value == pytest.approx(7.0)
    zigzag = np.array([0.0, 1.0, 0.0, 1.0])
    assert p_variation(zigzag, 1.0).value == 3.0
    assert p_variation(zigzag, 2.0).value == pytest.approx(np.sqrt(3.0))


def test_invalid_input_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="1 <= p"):
        p_variation(np.zeros(3), 0.5)
    with pytest.raises(InvalidParameterError, match="NaN"):
        p_variation(np.array([0.0, np.nan]), 2.0)
    with pytest.raises(InvalidParameterError, match="at least one point"):
        p_variation(np.zeros((0, 2)), 2.0)
