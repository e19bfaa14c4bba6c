"""Results of the prune-rewind-retrain protocol, and the folder a killed run resumes from.

``RunFolder`` holds ``config.json`` (the settings, checked on resume), ``runs.csv`` (one
row per finished run, appended as each run ends, never rewritten) and ``dense/`` (the
trained and rewind weights of each seed's dense network, safetensors), and ``models/``
when asked (each run's final pruned network). Only rank 0 of a distributed run touches it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from pathlift.errors import InvalidParameterError
from pathlift.graph.boundary import cpu_state

__all__ = ["DenseStates", "RunFolder", "RunKey", "RunRecord"]


class RunKey(NamedTuple):
    """One point of the grid: which seed, whether the trained network was randomly
    rescaled before pruning, which fraction, which method."""

    seed: int
    rescaled: bool
    amount: float
    method: str


@dataclass(frozen=True)
class RunRecord:
    """One prune-rewind-retrain run: a row of ``runs.csv``.

    ``sparsity`` is the final fraction of zeroed prunable coordinates; ``pruned_accuracy``
    the accuracy right after the first pruning (before retraining); ``log10_path_metric``
    and ``log10_bound`` the certificate of that first pruning (thesis eq. 3.19, Lemma
    3.4.1); ``overlap`` is 100 |S & S_mag| / |S| between the first mask and magnitude
    pruning's at the same scope on the same network (thesis Table 3.1); ``mask_digest``
    starts the sha256 of the final masks, which every rank checked it holds;
    ``world_size`` and ``spread`` say how the run was computed.
    """

    seed: int
    method: str
    rescaled: bool
    amount: float
    rounds: int
    sparsity: float
    dense_accuracy: float
    pruned_accuracy: float
    accuracy: float
    log10_path_metric: float
    log10_bound: float
    overlap: float
    mask_digest: str
    world_size: int
    spread: str

    @property
    def key(self) -> RunKey:
        return RunKey(self.seed, self.rescaled, self.amount, self.method)

    @classmethod
    def from_row(cls, row: dict[str, str]) -> RunRecord:
        """Parse a CSV row (every field a string)."""
        types = {"int": int, "float": float, "str": str, "bool": lambda v: v == "True"}
        return cls(**{f.name: types[str(f.type)](row[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class DenseStates:
    """One seed's dense network: trained weights, the weights after ``rewind_epoch`` epochs
    (the lottery-ticket rewind point) and its test accuracy. Tensors on the CPU."""

    seed: int
    trained: dict[str, Tensor]
    rewind: dict[str, Tensor]
    accuracy: float


class RunFolder:
    """A results folder that a killed run resumes from (rank 0 only).

    Example::

        folder = RunFolder("runs/prune-digits")
        result = prune_rewind_retrain(..., folder=folder)   # resumes if it was killed
        folder.records()                                     # every finished run
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.csv = self.path / "runs.csv"

    def open(self, settings: dict[str, Any]) -> dict[RunKey, RunRecord]:
        """Create the folder, or check that it holds runs made with the same ``settings``;
        returns the runs already finished there."""
        self.path.mkdir(parents=True, exist_ok=True)
        config = self.path / "config.json"
        settings = json.loads(json.dumps(settings))  # tuples -> lists, as read back
        if config.is_file():
            saved = json.loads(config.read_text())
            changed = sorted(k for k in saved.keys() | settings.keys()
                             if saved.get(k) != settings.get(k))
            if changed:
                raise InvalidParameterError(
                    f"'{self.path}' holds runs made with other settings ({', '.join(changed)}"
                    f": {[saved.get(k) for k in changed]} there, "
                    f"{[settings.get(k) for k in changed]} now); resume with the same "
                    "options or choose another output folder")
        else:
            _atomic_write(config, lambda tmp: tmp.write_text(json.dumps(settings, indent=1)))
        return {r.key: r for r in self.records()}

    def records(self) -> list[RunRecord]:
        """Every run in ``runs.csv``, in the order they finished (a line cut short by a
        kill is skipped)."""
        if not self.csv.is_file():
            return []
        names = [f.name for f in fields(RunRecord)]
        with self.csv.open(newline="") as f:
            return [RunRecord.from_row(row) for row in csv.DictReader(f)
                    if list(row) == names and None not in row.values()
                    and "" not in row.values()]

    def append(self, record: RunRecord) -> None:
        """Add one row to ``runs.csv`` (the header first if the file is new), flushed to
        disk before returning."""
        names = [f.name for f in fields(RunRecord)]
        new = not self.csv.is_file()
        with self.csv.open("a", newline="") as f:
            if not new and self.csv.stat().st_size and not _ends_with_newline(self.csv):
                f.write("\n")  # a row cut short by a kill stays alone on its line
            writer = csv.DictWriter(f, names)
            if new:
                writer.writeheader()
            writer.writerow(asdict(record))
            f.flush()
            os.fsync(f.fileno())

    def dense_path(self, seed: int, part: str = "trained") -> Path:
        return self.path / "dense" / f"seed{seed}-{part}.safetensors"

    def save_dense(self, states: DenseStates) -> None:
        """Write one seed's trained and rewind weights (plain state_dicts, loadable with
        ``pathlift.models.load_model(<arch>, weights=...)``); the accuracy goes in the
        metadata. Each file is written whole or not at all."""
        for part, state in (("rewind", states.rewind), ("trained", states.trained)):
            meta = {"seed": str(states.seed), "accuracy": repr(states.accuracy)}
            _atomic_write(self.dense_path(states.seed, part),
                          lambda tmp, s=state, m=meta: save_file(cpu_state(s), str(tmp), m))

    def load_dense(self, seed: int) -> DenseStates | None:
        """The seed's dense states, or None when they were not saved (completely)."""
        paths = [self.dense_path(seed, part) for part in ("trained", "rewind")]
        if not all(p.is_file() for p in paths):
            return None
        states, accuracy = [], math.nan
        for p in paths:
            with safe_open(str(p), framework="pt") as f:
                states.append({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
                accuracy = float((f.metadata() or {}).get("accuracy", accuracy))
        return DenseStates(seed, states[0], states[1], accuracy)

    def save_model(self, state: dict[str, Tensor], record: RunRecord) -> Path:
        """A run's final (pruned) network: its state_dict with the masks
        (``weight_orig``/``weight_mask``; ``load_model`` re-attaches them)."""
        tag = f"seed{record.seed}-{record.method}-{'rescaled-' if record.rescaled else ''}" \
              f"{record.amount:g}"
        path = self.path / "models" / f"{tag}.safetensors"
        _atomic_write(path, lambda tmp: save_file(cpu_state(state), str(tmp)))
        return path


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _atomic_write(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename onto ``path``: a kill leaves the old file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
