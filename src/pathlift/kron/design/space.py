"""The search space of ``design`` (step 1 of ``pathlift.kron.design``): factor options,
width sequences, the hand-designed families of thesis Table 5.1, and the chains listed in
order of predicted time."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from pathlift.errors import InvalidParameterError
from pathlift.kron.design.cost import CostModel
from pathlift.kron.pattern import (
    VIT_PATTERNS_DOWN,
    VIT_PATTERNS_NN,
    VIT_PATTERNS_UP,
    KSPattern,
    block_butterfly,
    check_chain,
    dense_support,
    kaleidoscope,
    monarch,
    square_dyadic_butterfly,
)
from pathlift.memory import check_bytes

__all__ = ["candidates", "check_sizes", "factor_options", "hand_families", "named_families",
           "options_within"]

_SPREAD_PROBES = 64  # chains tried after each spread position until a dense one is found


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@functools.lru_cache(maxsize=256)
def factor_options(rows: int, cols: int) -> tuple[KSPattern, ...]:
    """Every pattern (a, b, c, d) of a rows × cols factor with b, c >= 2: a·d divides
    gcd(rows, cols), b = rows/(ad), c = cols/(ad) (Def. 5.1.1)."""
    out = []
    for t in _divisors(math.gcd(rows, cols)):
        b, c = rows // t, cols // t
        if b >= 2 and c >= 2:
            out += [KSPattern(a, b, c, t // a) for a in _divisors(t)]
    return tuple(out)


def _width_sequences(n_out: int, n_in: int, length: int) -> list[tuple[int, ...]]:
    """(n_out, w_1, ..., w_{L-1}, n_in) with each w in {n_out, n_in}, moving monotonically
    from n_out to n_in (widening then narrowing again only costs)."""
    out = []
    for inner in itertools.product(sorted({n_out, n_in}), repeat=length - 1):
        dims = (n_out, *inner, n_in)
        steps = [b - a for a, b in itertools.pairwise(dims)]
        if all(s >= 0 for s in steps) or all(s <= 0 for s in steps):
            out.append(dims)
    return out


def hand_families(n_in: int, n_out: int) -> dict[str, tuple[KSPattern, ...]]:
    """The hand-designed chains of thesis Table 5.1 and Sec. 5.5 that exist for n_out × n_in:
    Monarch with p the largest divisor of gcd(n_out, n_in) with p^2 <= min(n_out, n_in)
    (blocks of about √n, the largest p whose support product is dense), and for square
    powers of two the square dyadic butterfly, the kaleidoscope and the block butterflies
    (t = 2^k, four factors or more); the thesis' ViT-S/16 chains for 384 × 384,
    1536 × 384 and 384 × 1536."""
    out: dict[str, tuple[KSPattern, ...]] = {}
    r = min(n_in, n_out)
    divisors = [p for p in _divisors(math.gcd(n_in, n_out)) if p > 1 and p * p <= r]
    if divisors:  # p^2 <= r keeps the support product dense (c_1 c_2 = rN/p^2 >= N)
        p = max(divisors)
        out[f"monarch p={p}"] = monarch(n_out, n_in, p)
    if n_in == n_out and n_in >= 4 and n_in & (n_in - 1) == 0:
        out["square dyadic butterfly"] = square_dyadic_butterfly(n_in)
        out["kaleidoscope"] = kaleidoscope(n_in)
        t = 2
        while n_in // t >= 16:
            out[f"block butterfly t={t}"] = block_butterfly(n_in, t)
            t *= 2
    thesis = {(384, 384): VIT_PATTERNS_NN, (1536, 384): VIT_PATTERNS_UP,
              (384, 1536): VIT_PATTERNS_DOWN}
    if (n_out, n_in) in thesis:
        out["thesis ViT-S/16"] = check_chain(thesis[(n_out, n_in)])
    return out


def check_sizes(n_in: int, n_out: int, budget: float, lengths: Iterable[int]) -> tuple:
    for name, n in (("n_in", n_in), ("n_out", n_out)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise InvalidParameterError(f"{name} must be an int >= 2, got {n!r}")
    if not 0 < budget <= 1:
        raise InvalidParameterError(
            f"budget is a fraction of the n_out*n_in dense parameters in (0, 1], got {budget}")
    lengths = tuple(sorted(set(lengths)))
    if not lengths or lengths[0] < 2:
        raise InvalidParameterError(f"lengths must be numbers of factors >= 2, got {lengths}")
    return lengths


def _options_for(dims: Sequence[int]) -> list[tuple[KSPattern, ...]]:
    return [factor_options(r, c) for r, c in itertools.pairwise(dims)]


def _dense_chain(pools: list, which: np.ndarray, row: np.ndarray, pos: int
                 ) -> tuple[KSPattern, ...] | None:
    """The chain at ``pos`` of the merged pools if its support product is dense."""
    options, index, _ = pools[which[pos]]
    chain = tuple(options[k][i] for k, i in enumerate(index[row[pos]]))
    return chain if dense_support(chain) else None


def candidates(n_in: int, n_out: int, budget: float, model: CostModel,
               lengths: Iterable[int] = (2, 3), per_length: int = 32
               ) -> list[tuple[KSPattern, ...]]:
    """The searched chains (module docstring, step 1): all dense two-factor chains within
    the budget; for each longer length the ``per_length`` dense ones of smallest predicted
    time (exact: chains are visited in order of predicted time), and ``per_length`` more
    spread evenly over the predicted times of the others, so that the whole range of the
    space is represented (and the ranking can be checked on it)."""
    lengths = check_sizes(n_in, n_out, budget, lengths)
    max_params = budget * n_in * n_out
    found: list[tuple[KSPattern, ...]] = []
    for length in lengths:
        pools = []  # per width sequence: (options, kept option indices, predicted times)
        for dims in _width_sequences(n_out, n_in, length):
            options = _options_for(dims)
            if any(not o for o in options):
                continue
            # every combination's option indices (meshgrid's grids, their flat copies and
            # the stack: 3 int64 a factor), then a few masks and costs over them
            check_bytes(math.prod(map(len, options)) * (3 * len(options) + 4) * 8,
                        f"listing the {length}-factor chains of a {n_out} x {n_in} weight",
                        "use fewer factors (kron-design --factors), or ")
            grids = np.meshgrid(*[np.arange(len(o)) for o in options], indexing="ij")
            index = np.stack([g.reshape(-1) for g in grids], axis=1)

            def total(values: Callable[[KSPattern], float], reduce: Callable,
                      options: list = options, index: np.ndarray = index) -> np.ndarray:
                return reduce([np.array([values(p) for p in o], dtype=np.float64)[index[:, k]]
                               for k, o in enumerate(options)], axis=0)

            # a row of the product reaches at most prod(c) columns, a column prod(b) rows
            keep = ((total(lambda p: p.nnz, np.sum) <= max_params)
                    & (total(lambda p: p.c, np.prod) >= n_in)
                    & (total(lambda p: p.b, np.prod) >= n_out))
            index = index[keep]
            cost = sum(model.factor_times(o)[index[:, k]] for k, o in enumerate(options))
            pools.append((options, index, np.asarray(cost, dtype=np.float64)))
        if not pools:
            continue
        cost = np.concatenate([pool[2] for pool in pools])
        which = np.concatenate([np.full(len(pool[2]), k) for k, pool in enumerate(pools)])
        row = np.concatenate([np.arange(len(pool[2])) for pool in pools])
        order = np.argsort(cost, kind="stable")  # cheapest predicted first
        chains = functools.partial(_dense_chain, pools, which[order], row[order])
        limit = len(order) if length == 2 else per_length
        pos, kept = 0, []
        while pos < len(order) and len(kept) < limit:
            if (chain := chains(pos)) is not None:
                kept.append(chain)
            pos += 1
        if length > 2:  # and as many spread over the predicted times of the others
            for start in np.linspace(pos, len(order), per_length, endpoint=False).astype(int):
                for probe in range(start, min(start + _SPREAD_PROBES, len(order))):
                    if (chain := chains(probe)) is not None and chain not in kept:
                        kept.append(chain)
                        break
        found += kept
    return found


def named_families(n_in: int, n_out: int, max_params: float) -> dict[tuple[KSPattern, ...], str]:
    return {chain: name for name, chain in hand_families(n_in, n_out).items()
            if sum(p.nnz for p in chain) <= max_params}



def options_within(n_in: int, n_out: int, max_params: float, lengths: Iterable[int]
                   ) -> set[KSPattern]:
    """Every factor of the searched chains with at most ``max_params`` parameters."""
    return {p for length in lengths for dims in _width_sequences(n_out, n_in, length)
            for opts in _options_for(dims) for p in opts if p.nnz <= max_params}
