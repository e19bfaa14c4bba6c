"""The domain of every argument of the ``pathlift`` command, checked while it is parsed.

One table, by parameter name (``command.name`` where a command differs), applied to the
click command tree by ``constrain``: a value outside its domain is a usage error (one
line naming the option, exit status 2) before anything is imported or computed, where it
once reached the library as a bug (``kron-bench --threads 0``, ``--dtype float8``) or
was silently dropped (``frontier --mnist1d-size -1``). A new option with one of these
names gets its check for free; tests/test_audit3_cli.py walks every parameter of every
command and fails on one that has no domain and is not listed in ``FREE``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import typer

__all__ = ["DOMAINS", "FREE", "Choice", "JsonArguments", "Number", "constrain", "domain_of"]


class Number:
    """An int or a float in [low, high] (``low`` excluded with ``above``); a float must be
    a number (never NaN) and finite unless ``infinite`` (then ``inf`` is allowed)."""

    def __init__(self, kind: type, low: float = -math.inf, high: float = math.inf, *,
                 above: bool = False, infinite: bool = False):
        self.kind, self.low, self.high = kind, low, high
        self.above, self.infinite = above, infinite

    def __str__(self) -> str:
        """``an integer >= 1``, ``a number in (0, 1]``, ``a finite number >= 0``..."""
        what = "an integer" if self.kind is int else \
            "a number" if self.infinite else "a finite number"
        low, high = (f"{v:d}" if self.kind is int and math.isfinite(v) else f"{v:g}"
                     for v in (self.low, self.high))
        if math.isinf(self.high):
            return f"{what} {'>' if self.above else '>='} {low}"
        return f"{what} in {'(' if self.above else '['}{low}, {high}]"

    def __contains__(self, value: object) -> bool:
        return isinstance(value, self.kind) and not math.isnan(value) \
            and (self.infinite or not math.isinf(value)) \
            and (value > self.low if self.above else value >= self.low) and value <= self.high


class JsonArguments:
    """A JSON object of constructor arguments whose values are plain literals (numbers,
    strings, booleans, null, and lists of them): ``'{"num_classes": 10}'``."""

    def __str__(self) -> str:
        return ("a JSON object of plain literals, e.g. '{\"num_classes\": 10, "
                "\"drop_rate\": 0.0}'")

    def __contains__(self, value: object) -> bool:
        try:
            found = json.loads(value) if isinstance(value, str) else None
        except ValueError:
            return False
        return isinstance(found, dict) and all(_literal(v) for v in found.values())


def _literal(value: object) -> bool:
    if isinstance(value, list):
        return all(_literal(v) for v in value)
    return value is None or (isinstance(value, (bool, int, float, str)) and not (
        isinstance(value, float) and not math.isfinite(value)))


class Choice:
    """One of the given names."""

    def __init__(self, *names: str):
        self.names = names

    def __str__(self) -> str:
        return "one of " + ", ".join(self.names)

    def __contains__(self, value: object) -> bool:
        return value in self.names


Domain = Number | Choice | JsonArguments

_COUNT = Number(int, 1)
_SEED = Number(int, 0, 2**63 - 1)  # numpy's generators refuse a negative seed
_POSITIVE = Number(float, 0, above=True)
_EXPONENT = Number(float, 0, above=True, infinite=True)  # q, r: inf is the max-norm

#: parameter name, or ``command.name``, -> its domain
DOMAINS: dict[str, Domain] = {
    "model_kwargs": JsonArguments(),
    # counts
    **dict.fromkeys(["seeds", "rounds", "batch_size", "samples", "depths", "repeats",
                     "top_k", "rows", "every", "batch", "vit_batch", "max_dense",
                     "n_in", "n_out", "prune.epochs", "frontier.epochs"], _COUNT),
    "threads": Number(int, 1, os.cpu_count() or 1),  # the machine's CPUs: 100000 crashed
    "report.epochs": Number(int, 0),
    "rewind_epoch": Number(int, 0),
    "lengths": Number(int, 2, 32),  # numbers of factors; numpy's arrays hold <= 32 axes
    "sizes": Number(int, 10),
    "bits": Number(int, 2, 32),
    **dict.fromkeys(["seed", "rescale_seed"], _SEED),
    # numbers
    "q": _EXPONENT, "norm.q": _POSITIVE, "r": _EXPONENT,
    "test_fraction": Number(float, 0, 1, above=True),
    "amount": Number(float, 0, 1),
    "last_layer_factor": Number(float, 0),
    **dict.fromkeys(["lr", "factors", "scale", "timeout"], _POSITIVE),
    "budget": Number(float, 0, 1, above=True),
    "x_inf": Number(float, 0),
    "tolerance": Number(float, 0),
    "time_budget": Number(float, 0),
    "max_time": _EXPONENT,  # seconds; inf: no limit
    # choices
    "normalize": Choice("none", "standard"),
    "spread": Choice("data", "runs"),
    "device": Choice("cpu", "cuda"),
    "identify.method": Choice("auto", "exact", "randomized"),
    "depth.dtype": Choice("float64", "float32"),
    "kron-bench.dtype": Choice("float32", "float16", "bfloat16"),
    "kron-design.dtype": Choice("float32", "float64"),
}

#: parameters whose values are checked where they are used, in one line before any work:
#: names or paths (a model or data spec, a file, a folder, a size string) and the names
#: the library lists (pruning and training methods, algorithms, datasets)
FREE = frozenset({"model", "model_b", "other", "data", "weights", "weights_b",
                  "other_weights", "input_shape", "out", "csv", "plot", "output",
                  "data_cache", "max_memory", "method", "algorithms", "dataset",
                  "unlabeled"})


def domain_of(command: str, name: str) -> Domain | None:
    """The domain of parameter ``name`` of ``command`` (None: free or a flag)."""
    return DOMAINS.get(f"{command}.{name}", DOMAINS.get(name))


def constrain(group: Any) -> Any:
    """``group`` (the click tree of the Typer app) with every parameter of a known name
    checked against its domain once its value is parsed (click's ``callback``, run before
    the command); returned for chaining."""
    for command in [group, *group.commands.values()]:
        for param in command.params:
            domain = domain_of(command.name or "", param.name or "")
            if domain is not None and not getattr(param, "is_flag", False):
                param.callback = _checked(domain, param.callback)
    return group


def _checked(domain: Domain, then: Callable[..., Any] | None) -> Callable[..., Any]:
    """A click parameter callback refusing a value (or an item of a list) outside
    ``domain``, then calling the parameter's own callback ``then``."""
    def check(ctx: Any, param: Any, value: Any) -> Any:
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is not None and item not in domain:
                raise typer.BadParameter(f"{item!r} is not {domain}", ctx, param)
        return value if then is None else then(ctx, param, value)
    return check
