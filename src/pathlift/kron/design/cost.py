"""The cost model of ``design`` (step 2 of ``pathlift.kron.design``): predicted seconds of a
factor from the Chapter 5 ratios and the fused kernel's register tile, fitted to factors
timed on this machine (``calibrate``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pathlift.kron import cpu_kernel
from pathlift.kron.design.measure import time_factors
from pathlift.kron.pattern import KSPattern

__all__ = ["CostModel", "calibrate", "fit_cost_model", "geometry"]


def _features(patterns: Sequence[KSPattern], batch: int, lanes: int = 0,
              tile: tuple[int, int, int, int] = (1, 1, 1, 1), bcast: int = 0,
              wp: int = 0) -> np.ndarray:
    """Rows (1, a·d, B·abcd, B·abcd·(b+c)/bc, B·abcd·d(b+c)/bc, B·abd·acd, padded
    multiplications, micro-kernel calls) per pattern. The last two are the fused kernel's
    register tile ``tile`` = (MR, NR, DR, DK) on the path that runs the pattern: the GEMM
    computes b rounded up to NR (tiles of MR batch rows), the path along d b rounded up to
    DK (tiles of DR rows, LANES of d each), the flat and phased paths b·d rounded up to
    LANES (counted in tiles of MR rows and NR features)."""
    def up(n: int, k: int) -> int:
        return -(-n // k)

    mr, nr, dr, dk = tile
    rows = []
    for p in patterns:
        variant = _fused_variant(p, lanes, bcast, wp)
        if variant == "fused_d":
            padded, calls = up(p.b, dk) * dk * p.d, up(batch, dr) * p.a * (p.d // lanes) * up(
                p.b, dk)
        elif variant in ("fused_f", "fused_p"):
            padded, calls = up(p.b * p.d, lanes) * lanes, up(batch, mr) * p.a * up(p.b * p.d, nr)
        else:
            padded, calls = up(p.b, nr) * nr * p.d, up(batch, mr) * p.a * p.d * up(p.b, nr)
        nnz = batch * p.nnz
        rows.append((1.0, p.a * p.d, nnz, nnz * p.rewrite_ratio, nnz * p.rewrite_ratio * p.d,
                     batch * p.out_features * p.in_features, batch * p.a * padded * p.c,
                     calls))
    return np.array(rows, dtype=np.float64).reshape(len(rows), 8)


_TILED = [0, 1, 2, 3, 4, 6, 7]  # every path of the fused kernel
_COLUMNS = {"dense": [0, 5], "bmm": [0, 1, 2, 3, 4], "fused": _TILED, "fused_d": _TILED,
            "fused_f": _TILED, "fused_p": _TILED}


_VARIANTS = {"along_d": "fused_d", "flat": "fused_f", "phased": "fused_p", "gemm": "fused"}


def _fused_variant(pattern: KSPattern, lanes: int, bcast: int = 0, wp: int = 0) -> str:
    """Which path of the fused CPU kernel runs this pattern (``cpu_kernel.path_of``): along
    d (``fused_d``), flat (``fused_f``) or phased (``fused_p``) along the output features,
    or the GEMM on packed rows (``fused``)."""
    return _VARIANTS[cpu_kernel.path_of(lanes, bcast, wp, pattern.d, pattern.c)]


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of one factor per algorithm (module docstring, step 2):
    ``coefficients[alg]`` are the theta of the columns ``_COLUMNS[alg]`` of the features
    (1, a·d, B·abcd, B·abcd·(b+c)/bc, B·abcd·d(b+c)/bc, B·abd·acd, padded multiplications,
    micro-kernel calls): a call, the a·d dense blocks of Algorithm 5.1.1, multiplications,
    rewrites (eq. 5.2), strided rewrites, the dense product; and for the fused kernel the
    waste of its register ``tile`` (MR, NR, DR, DK). The kernel's paths are separate
    entries (``_fused_variant``: ``fused_d`` along d, for d a multiple of ``lanes``;
    ``fused_f`` and ``fused_p`` along the output features, for d dividing ``lanes`` up to
    ``bcast`` and in phased slivers of ``wp`` features)."""

    batch: int
    lanes: int
    coefficients: dict[str, tuple[float, ...]]
    tile: tuple[int, int, int, int] = (1, 1, 1, 1)
    bcast: int = 0
    wp: int = 0

    def factor_times(self, patterns: Sequence[KSPattern]) -> np.ndarray:
        """Predicted seconds per pattern: the fastest modelled algorithm that runs it."""
        x = _features(patterns, self.batch, self.lanes, self.tile, self.bcast, self.wp)
        variant = np.array([_fused_variant(p, self.lanes, self.bcast, self.wp)
                            for p in patterns])
        per = []
        for alg, theta in self.coefficients.items():
            t = x[:, _COLUMNS[alg]] @ np.asarray(theta)
            if alg.startswith("fused"):
                t = np.where(variant == alg, t, np.inf)
            per.append(t)
        return np.min(per, axis=0)

    def chain_time(self, patterns: Sequence[KSPattern]) -> float:
        return float(self.factor_times(patterns).sum())

    def dense_time(self, n_in: int, n_out: int) -> float:
        """Predicted seconds of the dense n_out × n_in layer (inf if dense was not fitted)."""
        theta = self.coefficients.get("dense")
        if theta is None:
            return float("inf")
        return float(theta[0] + theta[1] * self.batch * n_in * n_out)


def _spread(patterns: Sequence[KSPattern], count: int) -> list[KSPattern]:
    """About ``count`` patterns spread evenly over the range of each of (b+c)/bc, d·(b+c)/bc
    and abcd among ``patterns``."""
    unique = sorted(set(patterns), key=KSPattern.as_tuple)
    if len(unique) <= count:
        return unique
    chosen: dict[KSPattern, None] = {}
    for key in (lambda p: p.rewrite_ratio, lambda p: p.energy_ratio, lambda p: p.nnz):
        ordered = sorted(unique, key=key)
        for i in np.linspace(0, len(ordered) - 1, -(-count // 3)).round().astype(int):
            chosen[ordered[i]] = None
    return list(chosen)



def geometry(dtype: torch.dtype) -> tuple[int, tuple[int, int, int, int], int, int]:
    """The fused kernel's vector lanes, register tile (MR, NR, DR, DK), largest d of its
    flat path and width of its phased slivers for ``dtype``."""
    kernel = cpu_kernel.current_kernel(dtype)
    if kernel is None:
        return 0, (1, 1, 1, 1), 0, 0
    return kernel.lanes, (kernel.mr, kernel.nr, kernel.dr, kernel.dk), kernel.bcast, kernel.wp


def _calibration_set(patterns: Sequence[KSPattern], paths: tuple[int, int, int], count: int
                     ) -> list[KSPattern]:
    groups: dict[str, list[KSPattern]] = {}
    for p in patterns:
        groups.setdefault(_fused_variant(p, *paths), []).append(p)
    return [p for group in groups.values() for p in _spread(group, count)]


def calibrate(patterns: Sequence[KSPattern], batch: int, dtype: torch.dtype = torch.float32,
              repeats: int = 5, count: int = 24,
              on_step: Callable[[], None] | None = None) -> CostModel:
    """Fit the cost model on about ``count`` of ``patterns`` for each path of the fused
    kernel (spread over their (b+c)/bc, d(b+c)/bc and sizes), timed by ``time_factors``."""
    lanes, tile, bcast, wp = geometry(dtype)
    times = time_factors(_calibration_set(patterns, (lanes, bcast, wp), count), batch, dtype,
                         repeats, on_step)
    return fit_cost_model(times, batch, lanes, tile, bcast, wp)


def fit_cost_model(times: dict[KSPattern, dict[str, float]], batch: int, lanes: int,
                   tile: tuple[int, int, int, int] = (1, 1, 1, 1), bcast: int = 0,
                   wp: int = 0) -> CostModel:
    """Non-negative least squares on relative errors: for each of dense, bmm and the
    fused path of each pattern (``_fused_variant``), theta >= 0 minimising sum over its
    patterns of (features·theta / seconds - 1)^2. ``times`` maps patterns to {"bmm",
    "fused" and optionally "dense": seconds}."""
    from scipy.optimize import nnls  # imported here: `import pathlift` stays light

    coefficients = {}
    for alg in ("dense", "bmm", *_VARIANTS.values()):
        fitted = [p for p in times if (alg in times[p] if alg in ("dense", "bmm")
                                       else _fused_variant(p, lanes, bcast, wp) == alg)]
        if not fitted:
            continue
        t = np.array([times[p]["fused" if alg.startswith("fused") else alg] for p in fitted])
        x = _features(fitted, batch, lanes, tile, bcast, wp)[:, _COLUMNS[alg]]
        theta, _ = nnls(x / t[:, None], np.ones_like(t))
        coefficients[alg] = tuple(float(v) for v in theta)
    return CostModel(batch, lanes, coefficients, tile, bcast, wp)
