"""Typed errors of pathlift. Each message names the offending layer and says what to do."""

from __future__ import annotations

import math
import numbers


class PathliftError(Exception):
    """Base class of every error pathlift raises on purpose."""


class UnsupportedModelError(PathliftError):
    """The model contains an operation outside the ReLU DAG model of thesis Def. 2.2.2.

    The message has one line per distinct cause (``summarise``) and, when ``supported``
    is given (the op table's summary), one last line with the supported operations."""

    def __init__(self, problems: list[Problem] | str, supported: str = ""):
        self.supported = supported
        if isinstance(problems, str):
            self.problems: list[Problem] = []
            super().__init__(problems)
            return
        self.problems = list(problems)
        head = "model is not a supported ReLU network (thesis Def. 2.2.2):"
        lines = summarise(self.problems) + ([f"supported: {supported}"] if supported else [])
        super().__init__(head + "\n  " + "\n  ".join(lines))


_NAMED = 3  # nodes named per cause


def summarise(problems: list[Problem]) -> list[str]:
    """Every distinct cause once, on one line each, with how many nodes share it and the
    first few."""
    causes: dict[str, list[Problem]] = {}
    for p in problems:
        causes.setdefault(p.reason, []).append(p)
    lines = []
    for reason, group in causes.items():
        if len(group) == 1:
            lines.append(str(group[0]))
            continue
        named = ", ".join(f"'{p.node}' ({p.op})" for p in group[:_NAMED])
        more = f" and {len(group) - _NAMED} more" if len(group) > _NAMED else ""
        lines.append(f"{len(group)} nodes, {named}{more}: {reason}")
    return lines


class ShapeError(PathliftError):
    """The example input shape does not fit the model."""


class ArchitectureMismatchError(PathliftError):
    """Two models (or a model and a state_dict) do not share one architecture."""


class InvalidParameterError(PathliftError):
    """Parameters hold NaN/inf, or an argument is out of its domain."""


class PrecisionError(PathliftError):
    """A number cannot be computed to the promised precision in the requested dtype."""


class DistributedError(PathliftError):
    """The processes of a torch.distributed run disagree (masks, weights or results that
    must be identical on every rank are not)."""


class LeadingDimensionWarning(UserWarning):
    """An input shape whose leading dimensions a Linear-first model treats as separate
    inputs: perhaps a batch size given by mistake."""


class Problem:
    """One unsupported node: where it is, what op it is, why it is refused, what to do."""

    __slots__ = ("node", "op", "reason")

    def __init__(self, node: str, op: str, reason: str):
        self.node, self.op, self.reason = node, op, reason

    def __repr__(self) -> str:
        return f"Problem(node={self.node!r}, op={self.op!r}, reason={self.reason!r})"

    def __str__(self) -> str:
        return f"node '{self.node}' ({self.op}): {self.reason}"


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an integer >= ``minimum`` (a count of samples, seeds, repeats),
    else InvalidParameterError saying so: a count of 0 once gave an empty table or a
    reduction over nothing."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_number(name: str, value: object, low: float = -math.inf, high: float = math.inf,
                 *, above: bool = False) -> float:
    """``value`` as a float if it is a finite real number in [low, high] (in (low, high]
    with ``above``), else InvalidParameterError saying so: NaN compares false with every
    bound and once passed through as a result."""
    number = float(value) if isinstance(value, numbers.Real) and \
        not isinstance(value, bool) else math.nan
    if not (math.isfinite(number) and (number > low if above else number >= low)
            and number <= high):
        domain = f"{'(' if above else '['}{low:g}, {high:g}]".replace("inf]", "inf)")
        raise InvalidParameterError(f"{name} must be a finite number in {domain}, got {value!r}")
    return number
