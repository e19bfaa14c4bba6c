"""What ``design`` returns: the candidates with their predicted and measured times, and the
choice (``Design``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pathlift.kron.design.cost import CostModel
from pathlift.kron.layer import KSLinear
from pathlift.kron.pattern import KSPattern

__all__ = ["Candidate", "Design", "spearman"]


@dataclass(frozen=True)
class Candidate:
    """One chain: its patterns, name (a family of Table 5.1, or "" if found by the search),
    parameters and their fraction of the dense n_out·n_in, predicted seconds, and, when
    timed, measured seconds, the dense layer's seconds in the same round-robin group and
    the algorithm of each factor."""

    patterns: tuple[KSPattern, ...]
    family: str
    params: int
    density: float
    predicted_s: float
    measured_s: float | None = None
    dense_s: float | None = None
    algorithms: tuple[str, ...] | None = None

    @property
    def is_dense(self) -> bool:
        """The dense layer itself (no patterns), the choice where no chain beats it."""
        return not self.patterns

    @property
    def speedup(self) -> float | None:
        """t(dense) / t(chain), both measured in the same run; None if not timed."""
        if self.measured_s is None or self.dense_s is None:
            return None
        return self.dense_s / self.measured_s

    def pace(self) -> str:
        """The measured speed against dense as a factor >= 1: "2.31x faster" or "1.43x
        slower" ("-" if not timed, or for the dense layer itself)."""
        if self.speedup is None or self.is_dense:
            return "-"
        if self.speedup >= 1:
            return f"{self.speedup:.2f}x faster"
        return f"{1 / self.speedup:.2f}x slower"

    def chain(self) -> str:
        return " ".join(str(p) for p in self.patterns) if self.patterns else "dense"


def spearman(timed: Sequence[Candidate]) -> float | None:
    """Spearman rank correlation between predicted time and measured time over the dense
    layer's time of the same round-robin group (which cancels a drift of the machine's load
    between groups); None for fewer than three candidates or constant predictions."""
    predicted = [c.predicted_s for c in timed]
    if len(timed) < 3 or len(set(predicted)) < 2:
        return None
    measured = [c.measured_s / c.dense_s for c in timed]
    from scipy.stats import spearmanr  # imported here: `import pathlift` stays light

    return float(spearmanr(predicted, measured).statistic)


@dataclass(frozen=True)
class Design:
    """What ``design`` chose. ``chosen`` is the fastest measured chain (or, among the
    finalists within 3% of it, the one with most parameters) if it is faster than the dense
    layer timed in the same run, else the dense layer itself (``chosen.is_dense``; the
    fastest chain is then ``candidates[1]``); ``candidates`` lists the choice first, the
    other measured chains (fastest first), then the others by predicted time.
    ``spearman`` is the rank correlation between predicted and measured time over the
    measured chains (None when it is not defined)."""

    n_in: int
    n_out: int
    budget: float
    batch: int
    dtype: str
    machine: str
    model: CostModel
    candidates: tuple[Candidate, ...]
    spearman: float | None

    @property
    def chosen(self) -> Candidate:
        return self.candidates[0]

    @property
    def best_chain(self) -> Candidate:
        """The fastest measured chain, chosen or not."""
        return next(c for c in self.candidates if not c.is_dense)

    def summary(self) -> str:
        """One line: what was chosen and its speed-up over the dense layer, or that the
        dense layer is kept and why."""
        best = self.best_chain
        if self.chosen.is_dense:
            return (f"dense kept: no chain within {self.budget:g} of the {self.n_out} x "
                    f"{self.n_in} parameters beats the dense layer at batch {self.batch} (the "
                    f"fastest, {best.chain()}, is {best.pace()} than dense)")
        return (f"{best.chain()} ({best.params:,} parameters, {best.pace()} than dense; "
                f"algorithms {' '.join(best.algorithms or ())})")

    def __repr__(self) -> str:
        return f"Design({self.n_out} x {self.n_in}, budget {self.budget:g}: {self.summary()})"

    def layer(self, bias: bool = True, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> nn.Module:
        """A freshly initialised layer of the choice: a ``KSLinear`` with the chosen chain
        (algorithm "auto"), or an ``nn.Linear`` where the dense layer was kept."""
        if self.chosen.is_dense:
            return nn.Linear(self.n_in, self.n_out, bias=bias, dtype=dtype, device=device)
        return KSLinear(self.chosen.patterns, bias=bias, dtype=dtype, device=device,
                        batch=self.batch)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        for cand in out["candidates"]:
            cand["patterns"] = [list(p.values()) for p in cand["patterns"]]
        return out

    @classmethod
    def from_json(cls, data: dict) -> Design:
        cands = tuple(
            Candidate(**(c | {"patterns": tuple(KSPattern(*p) for p in c["patterns"]),
                              "algorithms": None if c["algorithms"] is None
                              else tuple(c["algorithms"])}))
            for c in data["candidates"])
        model = CostModel(data["model"]["batch"], data["model"]["lanes"],
                          {k: tuple(v) for k, v in data["model"]["coefficients"].items()},
                          tuple(data["model"]["tile"]), data["model"].get("bcast", 0),
                          data["model"].get("wp", 0))
        return cls(**(data | {"candidates": cands, "model": model}))

