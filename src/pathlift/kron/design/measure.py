"""The measurements of ``design`` (step 3 of ``pathlift.kron.design``): factors timed for the
cost model's calibration, chains timed as layers beside the dense layer in the same run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pathlift.kron.factor import random_factor
from pathlift.kron.layer import KSLinear
from pathlift.kron.multiply import apply, prepare
from pathlift.kron.pattern import KSPattern
from pathlift.kron.timing import round_robin

__all__ = ["MODELLED", "measure", "time_factors"]

MODELLED = ("dense", "bmm", "fused")


def time_factors(patterns: Sequence[KSPattern], batch: int,
                 dtype: torch.dtype = torch.float32, repeats: int = 5,
                 on_step: Callable[[], None] | None = None
                 ) -> dict[KSPattern, dict[str, float]]:
    """Seconds of each pattern with bmm and fused (and every fourth with dense: its time
    is B·M·N up to a constant) round-robin at this batch size, fastest of ``repeats``."""
    g = torch.Generator().manual_seed(0)
    times: dict[KSPattern, dict[str, float]] = {}
    with torch.no_grad():
        for i, p in enumerate(patterns):
            w = random_factor(p, dtype, generator=g)
            x = torch.randn(batch, p.in_features, generator=g).to(dtype)
            algs = MODELLED if i % 4 == 0 else ("bmm", "fused")
            ops = {alg: prepare(w, p, alg) for alg in algs}
            fns = {alg: functools.partial(apply, x, ops[alg], p, alg) for alg in algs}
            # samples of back-to-back calls, as ``measure`` times the chains: the sum of
            # single-call factor times ranks the 512 x 512 chains at a rank correlation of
            # 0.72 against their measured times, of back-to-back samples at 0.97
            runs = round_robin(fns, repeats)
            times[p] = {alg: min(ts) for alg, ts in runs.items()}
            if on_step is not None:
                on_step()
    return times


def measure(chains: Sequence[Sequence[KSPattern]], batch: int,
            dtype: torch.dtype = torch.float32, repeats: int = 5, group: int = 16,
            on_group: Callable[[int], None] | None = None
            ) -> tuple[list[float], list[float], list[tuple[str, ...]]]:
    """Forward time of each chain as a bias-free ``KSLinear`` with the algorithm each factor
    would run (``KSLinear.tune``), and of the dense ``nn.Linear`` of the same shape,
    round-robin in groups of ``group`` chains with the dense layer in every group; each the
    fastest of ``repeats`` runs.

    Returns (seconds per chain, dense seconds of each chain's group, algorithms per chain).
    """
    if not chains:
        return [], [], []
    n_out, n_in = chains[0][0].out_features, chains[0][-1].in_features
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, n_in, generator=g).to(dtype)
    dense = nn.Linear(n_in, n_out, bias=False, dtype=dtype)
    seconds: list[float] = []
    dense_s: list[float] = []
    algorithms: list[tuple[str, ...]] = []
    with torch.no_grad():
        for start in range(0, len(chains), group):
            part = chains[start:start + group]
            layers = [KSLinear(chain, bias=False, dtype=dtype) for chain in part]
            algorithms += [layer.tune(batch) for layer in layers]
            fns: dict[object, Callable[[], object]] = {"dense": functools.partial(dense, x)}
            fns |= {k: functools.partial(layer, x) for k, layer in enumerate(layers)}
            times = {k: min(v) for k, v in round_robin(fns, repeats).items()}
            seconds += [times[k] for k in range(len(part))]
            dense_s += [times["dense"]] * len(part)
            if on_group is not None:
                on_group(len(part))
    return seconds, dense_s, algorithms

