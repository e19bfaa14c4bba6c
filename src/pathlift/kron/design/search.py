"""``design``: the stages of ``pathlift.kron.design`` run in order, each a function: the
calibration of the cost model, the search, the timing of the best predicted chains beside
the dense layer, and the choice (a chain only if it beats the dense layer)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from pathlift.errors import InvalidParameterError, check_count
from pathlift.kron import cache
from pathlift.kron.design.cost import CostModel, calibrate, fit_cost_model
from pathlift.kron.design.measure import measure, time_factors
from pathlift.kron.design.result import Candidate, Design, spearman
from pathlift.kron.design.space import candidates, check_sizes, named_families, options_within
from pathlift.kron.pattern import KSPattern

__all__ = ["design"]

_FINALISTS = 4  # fastest timed chains timed again before the choice
_TIE = 0.03  # finalists this much slower than the fastest count as as fast
# a cached design is reused only by the code that made it (every module of the package)
_CODE = hashlib.sha256(b"".join(
    f.read_bytes() for f in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()[:12]

Chain = tuple[KSPattern, ...]
Timed = dict[int, tuple[float, float, tuple[str, ...]]]  # chain index -> (s, dense s, algs)


def _fit(n_in: int, n_out: int, budget: float, batch: int, dtype: torch.dtype,
         lengths: tuple[int, ...], per_length: int, repeats: int,
         step: Callable[[], None]) -> tuple[CostModel, list[Chain], dict[Chain, str]]:
    """Stages 1-2: calibrate on factors spread over every option, list the candidates,
    refit on the factors the candidates are made of (a spread over every option weighs
    the fit where no candidate lies: on the 384 x 1536 candidates of the design benchmark,
    rank correlation 0.89 against the measured times, refitted 0.91) and list again."""
    max_params = budget * n_in * n_out
    options = options_within(n_in, n_out, max_params, lengths)
    if not options:
        raise InvalidParameterError(
            f"no Kronecker-sparse factor of a {n_out} x {n_in} chain has at most "
            f"{max_params:.0f} parameters; raise the budget")
    model = calibrate(sorted(options, key=KSPattern.as_tuple), batch, dtype, repeats,
                      on_step=step)
    named = named_families(n_in, n_out, max_params)
    found = [*candidates(n_in, n_out, budget, model, lengths, per_length), *named]
    if not found:  # nothing to refit on (kron-design 8 8 once ended in an internal error)
        raise InvalidParameterError(
            f"no chain of {lengths} factors with a dense support product fits "
            f"{budget:g} of the {n_out} x {n_in} parameters; raise the budget or allow more "
            "factors (lengths)")
    used = list(dict.fromkeys(p for chain in found for p in chain))
    model = fit_cost_model(time_factors(used, batch, dtype, repeats, step), batch,
                           model.lanes, model.tile, model.bcast, model.wp)
    chains = list(dict.fromkeys([*candidates(n_in, n_out, budget, model, lengths, per_length),
                                 *named]))
    return model, chains, named


def _time(chains: list[Chain], predicted: list[float], named: dict[Chain, str], batch: int,
          dtype: torch.dtype, top_k: int, repeats: int,
          report: Callable[[str, int], None]) -> tuple[Timed, list[int]]:
    """Stage 3: the ``top_k`` best predicted chains and the named families timed beside
    the dense layer; then the fastest few again, together and twice as often (the minimum
    of noisy timings favours lucky ones, a second look keeps the choice reproducible).
    Returns the timings by chain index and the finalists."""
    order = sorted(range(len(chains)), key=predicted.__getitem__)
    timed = list(dict.fromkeys([*order[:top_k], *(i for i, c in enumerate(chains)
                                                  if c in named)]))
    seconds, dense_s, algs = measure([chains[i] for i in timed], batch, dtype, repeats,
                                     on_group=lambda n: report("timing", n))
    result = dict(zip(timed, zip(seconds, dense_s, algs, strict=True), strict=True))
    finalists = sorted(result, key=lambda i: result[i][0])[:_FINALISTS]
    seconds, dense_s, algs = measure([chains[i] for i in finalists], batch, dtype,
                                     2 * repeats, group=len(finalists))
    result |= dict(zip(finalists, zip(seconds, dense_s, algs, strict=True), strict=True))
    return result, finalists


def _choose(cands: list[Candidate], final: set[Chain], n_in: int, n_out: int,
            model: CostModel) -> list[Candidate]:
    """Stage 4: the measured chains, fastest first, led by the choice. Among the finalists
    as fast as the fastest (within the noise of one timing) the one that spends most of
    the budget (more parameters cost nothing there, and the choice no longer flips between
    near-ties); and if even that one is not faster than the dense layer timed in the same
    run, the dense layer itself leads: a designed layer is never slower than dense."""
    measured = sorted((c for c in cands if c.measured_s is not None),
                      key=lambda c: c.measured_s)
    ties = [measured[0], *(c for c in measured[1:] if c.patterns in final
                           and c.measured_s <= (1 + _TIE) * measured[0].measured_s)]
    chosen = max(ties, key=lambda c: (c.params, -c.measured_s))
    measured = [chosen, *(c for c in measured if c is not chosen)]
    if chosen.speedup is not None and chosen.speedup <= 1:
        dense = Candidate((), "dense", n_in * n_out, 1.0, model.dense_time(n_in, n_out),
                          chosen.dense_s, chosen.dense_s, ("dense",))
        measured.insert(0, dense)
    return measured


def design(n_in: int, n_out: int, budget: float = 0.25, batch: int = 256,
           dtype: torch.dtype = torch.float32, lengths: Iterable[int] = (2, 3),
           top_k: int = 8, per_length: int = 32, repeats: int = 5, use_cache: bool = True,
           progress: Callable[[str, int], None] | None = None) -> Design:
    """The fastest Kronecker-sparse chain K_1 ⋯ K_L for a dense n_out × n_in weight on this
    machine (thesis Sec. 7.4.1; method in ``pathlift.kron.design``), among chains with a
    dense support product and at most ``budget``·n_out·n_in parameters, or the dense layer
    itself when no such chain is faster than it in the same run.

    Args:
        n_in, n_out: the dense layer's input and output features.
        budget: largest parameter count as a fraction of n_out·n_in.
        batch: rows of the input the layer will see (tokens × sequences for a transformer).
        dtype: float32 or float64.
        lengths: numbers of factors L to search.
        top_k: how many of the best predicted chains to time (named families are always
            timed when they fit the budget).
        per_length: chains per length L >= 3 of smallest predicted time, and as many
            spread over the others.
        repeats: round-robin rounds per timing (medians).
        use_cache: reuse (and store) the result for this machine.
        progress: called with (stage, steps done) while calibrating and timing.

    Returns:
        A ``Design``; ``design(...).layer()`` builds the layer (an ``nn.Linear`` when
        ``design(...).chosen.is_dense``), ``summary()`` says what was chosen and why.

    Raises:
        InvalidParameterError: bad sizes or budget, or no chain fits the budget.

    Example:
        >>> d = design(384, 1536, budget=0.25, batch=1568)  # doctest: +SKIP
        >>> d.chosen.patterns, d.chosen.speedup  # doctest: +SKIP
    """
    lengths = check_sizes(n_in, n_out, budget, lengths)
    for name, count in (("batch", batch), ("top_k", top_k), ("per_length", per_length)):
        check_count(name, count)
    if dtype not in (torch.float32, torch.float64):
        raise InvalidParameterError(f"design times float32 or float64, got {dtype}")
    key = (f"{n_in}|{n_out}|{budget}|{batch}|{dtype}|{lengths}|{top_k}|{per_length}|"
           f"{repeats}|{_CODE}")
    if use_cache and (hit := _cached(key)) is not None:
        return hit
    report = progress or (lambda stage, steps: None)
    model, chains, named = _fit(n_in, n_out, budget, batch, dtype, lengths, per_length,
                                repeats, functools.partial(report, "calibrating", 1))
    predicted = [model.chain_time(c) for c in chains]
    result, finalists = _time(chains, predicted, named, batch, dtype, top_k, repeats, report)
    cands = []
    for i, chain in enumerate(chains):
        params = sum(p.nnz for p in chain)
        cands.append(Candidate(chain, named.get(chain, ""), params, params / (n_in * n_out),
                               predicted[i], *result.get(i, (None, None, None))))
    measured = _choose(cands, {chains[i] for i in finalists}, n_in, n_out, model)
    others = sorted((c for c in cands if c.measured_s is None), key=lambda c: c.predicted_s)
    out = Design(n_in, n_out, budget, batch, str(dtype), cache.machine_description(dtype),
                 model, tuple(measured + others), spearman([c for c in measured
                                                            if not c.is_dense]))
    if use_cache:
        cache.store("design", key, out.to_json())
    return out


def _cached(key: str) -> Design | None:
    """The stored design, or None (also for a malformed entry: it is designed again)."""
    hit = cache.lookup("design", key)
    try:
        return None if hit is None else Design.from_json(hit)
    except (KeyError, TypeError, ValueError, AttributeError, InvalidParameterError):
        return None
