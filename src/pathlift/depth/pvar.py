"""Exact p-variation of a discrete path (master's thesis Def. 2.1.3, eq. 2.14).

For a path g: [0, 1] -> (R^m, Euclidean norm) and p >= 1,

    ||g||_{p-var} = ( sup over partitions pi of sum_i ||g(s_{i+1}) - g(s_i)||^p )^{1/p}.

A network of depth L gives the points x_0..x_{n-1} (n = L weights W_k). Two paths carry them:

* the **step path** g(t) = x_{floor(t n)}: any partition only sees the values x_k at
  non-decreasing indices, and every increasing index sequence is reached, so its p-variation
  is the sup over index subsequences 0 = k_0 < ... < k_r = n-1 (endpoints may be added for
  free: an extra term is >= 0);
* the **linear interpolation** through x_0..x_{n-1}: on a segment, t -> ||g(t) - a||^p is
  convex for p >= 1, so moving one partition point inside a segment to the better of the
  segment's endpoints never lowers the sum; the sup is attained on vertices.

Hence both paths have the same p-variation, the discrete one computed here (tested in
tests/test_depth_pvar.py against brute force on the refined interpolation).

Algorithm. p = 1: the triangle inequality makes the finest partition optimal (sum of
increments, O(n)). p > 1: the dynamic programme V[j] = max_{i<j} V[i] + ||x_j - x_i||^p,
V[0] = 0, answer V[n-1] — exact, O(n^2 m) time, O(n) memory, vectorised over i. For scalar
paths (m = 1) it first keeps only the endpoints and the turning points (strict local
extrema after merging repeated values): inside a monotone run, |a + b|^p >= |a|^p + |b|^p
for same-sign a, b, so dropping a point interior to a monotone run never lowers a sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathlift.errors import InvalidParameterError

__all__ = ["PVariation", "p_variation"]


@dataclass(frozen=True)
class PVariation:
    """p-variation semi-norm ``value`` = (sum over ``partition`` of ||increment||^p)^{1/p}.

    ``partition`` holds the indices of an optimal partition (increasing, first 0, last n-1).
    """

    p: float
    value: float
    partition: tuple[int, ...]


def p_variation(path: np.ndarray, p: float = 1.0) -> PVariation:
    """Exact p-variation (thesis Def. 2.1.3) of the step path through ``path``'s rows.

    ``path`` has shape (n,) or (n, ...): n points, each flattened to R^m with the Euclidean
    (Frobenius) norm. Equals the p-variation of the linear interpolation (module docstring).
    """
    if not p >= 1.0 or not np.isfinite(p):
        raise InvalidParameterError(f"p={p}: the p-variation is defined here for 1 <= p < inf")
    points = np.asarray(path, dtype=np.float64)
    if points.ndim == 0 or points.shape[0] == 0:
        raise InvalidParameterError("path must hold at least one point (shape (n, ...))")
    points = points.reshape(points.shape[0], -1)
    if not np.isfinite(points).all():
        raise InvalidParameterError("path holds NaN or inf; p-variation is undefined")
    n = points.shape[0]
    if n == 1:
        return PVariation(p, 0.0, (0,))
    if p == 1.0:
        total = float(np.linalg.norm(np.diff(points, axis=0), axis=1).sum())
        return PVariation(p, total, tuple(range(n)))
    keep = _turning_points(points[:, 0]) if points.shape[1] == 1 else np.arange(n)
    best, chosen = _dynamic_programme(points[keep], p)
    return PVariation(p, best ** (1.0 / p), tuple(int(keep[i]) for i in chosen))


def _turning_points(x: np.ndarray) -> np.ndarray:
    """Indices of the endpoints and strict local extrema of a scalar sequence."""
    n = x.shape[0]
    change = np.flatnonzero(np.diff(x) != 0.0)  # x[i] != x[i+1]
    if change.size == 0:
        return np.array([0, n - 1])
    starts = np.concatenate(([0], change + 1))  # first index of each run of equal values
    values = x[starts]
    slope = np.sign(np.diff(values))
    turning = starts[1:-1][slope[:-1] != slope[1:]]
    return np.unique(np.concatenate(([0], turning, [n - 1])))


def _dynamic_programme(points: np.ndarray, p: float) -> tuple[float, list[int]]:
    """max over index subsequences from 0 to n-1 of sum ||x_{k_{i+1}} - x_{k_i}||^p."""
    n = points.shape[0]
    value = np.zeros(n)
    previous = np.zeros(n, dtype=np.int64)
    scalar = points[:, 0] if points.shape[1] == 1 else None
    for j in range(1, n):
        if scalar is not None:
            distance = np.abs(scalar[:j] - scalar[j])
        else:
            diff = points[:j] - points[j]
            distance = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        gains = value[:j] + distance**p
        previous[j] = int(np.argmax(gains))
        value[j] = gains[previous[j]]
    chosen = [n - 1]
    while chosen[-1] != 0:
        chosen.append(int(previous[chosen[-1]]))
    return float(value[-1]), chosen[::-1]
