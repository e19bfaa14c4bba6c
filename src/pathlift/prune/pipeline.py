"""Train -> (random rescale) -> prune -> rewind -> retrain -> evaluate (thesis Sec. 3.5.2).

The protocol of the thesis' Appendix E.1 on any classifier and DataLoaders: train the
dense network, keep a copy of its weights after ``rewind_epoch`` epochs, optionally
rescale the trained weights at random (the mask is then chosen on the rescaled network,
as Bob does in the thesis' Figure 3.6b), prune with each method, rewind the surviving
weights to their early values and retrain for the remaining epochs. With ``rounds > 1``
the prune-rewind-retrain step repeats, each round pruning the same fraction of what is
left (iterative pruning with rewinding, the lottery-ticket protocol). Every run works
on copies; the models the caller passes are never modified.
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from pathlift.errors import InvalidParameterError
from pathlift.graph.boundary import attach_masks_, prune_masks
from pathlift.prune.methods import prune_model
from pathlift.prune.scores import magnitude_scores, path_magnitude_scores

METHODS = ("magnitude-global", "magnitude-layerwise", "path-magnitude-global",
           "path-magnitude-layerwise")


@dataclass(frozen=True)
class PruneConfig:
    """Hyper-parameters of one experiment (defaults: the digits protocol of the README)."""

    amounts: tuple[float, ...] = (0.4, 0.6, 0.8)
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    epochs: int = 30
    rewind_epoch: int = 2
    rounds: int = 1
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    last_layer_factor: float = 0.5
    rescale_factors: tuple[float, ...] = (1.0, 128.0, 4096.0)

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise InvalidParameterError(f"unknown methods {sorted(unknown)}; use {METHODS}")
        if not 0 < self.rewind_epoch < self.epochs:
            raise InvalidParameterError(
                f"need 0 < rewind_epoch < epochs, got {self.rewind_epoch}, {self.epochs}")
        if self.rounds < 1 or not all(0.0 < a < 1.0 for a in self.amounts):
            raise InvalidParameterError("need rounds >= 1 and amounts in (0, 1)")


@dataclass(frozen=True)
class RunRecord:
    """One prune-rewind-retrain run: a row of the results CSV."""

    seed: int
    method: str
    rescaled: bool
    amount: float
    sparsity: float
    dense_accuracy: float
    pruned_accuracy: float
    accuracy: float
    log10_path_metric: float
    log10_bound: float


@dataclass(frozen=True)
class OverlapRecord:
    """Mask overlap 100 |S1 & S2| / |S1| of magnitude and path-magnitude (thesis Table 3.1)."""

    seed: int
    scope: str
    amount: float
    overlap: float


@dataclass(frozen=True)
class ExperimentResult:
    """Every run, the mask overlaps, and (magnitude, log10 Path-Mag) pairs of the first seed's
    trained network without and with the random rescale (thesis Figure 3.8)."""

    config: PruneConfig
    runs: tuple[RunRecord, ...]
    overlaps: tuple[OverlapRecord, ...]
    scatter: dict[bool, tuple[Tensor, Tensor]]

    def summary(self) -> list[dict[str, Any]]:
        """Mean and standard deviation over seeds of the final accuracy per method/level."""
        groups: dict[tuple[str, bool, float], list[float]] = {}
        for r in self.runs:
            groups.setdefault((r.method, r.rescaled, r.amount), []).append(r.accuracy)
        return [{"method": method, "rescaled": rescaled, "amount": amount,
                 **dict(zip(("mean", "std"), _mean_std(accs), strict=True)), "seeds": len(accs)}
                for (method, rescaled, amount), accs in sorted(groups.items())]

    def dense_accuracy(self) -> tuple[float, float]:
        """Mean and standard deviation over seeds of the dense network's test accuracy."""
        return _mean_std(list({r.seed: r.dense_accuracy for r in self.runs}.values()))

    def mean_overlaps(self) -> dict[tuple[str, float], float]:
        """Mean over seeds of the mask overlap (%) per (scope, amount) (thesis Table 3.1)."""
        groups: dict[tuple[str, float], list[float]] = {}
        for o in self.overlaps:
            groups.setdefault((o.scope, o.amount), []).append(o.overlap)
        return {key: _mean_std(values)[0] for key, values in groups.items()}

    def write_csv(self, path: Path) -> tuple[Path, Path]:
        """The runs to ``path`` and the overlaps next to it (``<stem>_overlap.csv``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        overlap = path.with_name(path.stem + "_overlap.csv")
        for target, rows, cls in ((path, self.runs, RunRecord),
                                  (overlap, self.overlaps, OverlapRecord)):
            with target.open("w", newline="") as f:
                writer = csv.DictWriter(f, [fld.name for fld in fields(cls)])
                writer.writeheader()
                writer.writerows(asdict(r) for r in rows)
        return path, overlap


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


class _Snapshot:
    """Training callback keeping a copy of the weights at the end of one epoch."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.state: dict[str, Tensor] | None = None

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        if epoch == self.epoch:
            self.state = copy.deepcopy(model.state_dict())


def _masked(model_fn: Callable[[], nn.Module], state: dict[str, Tensor],
            masks: dict[str, Tensor]) -> nn.Module:
    """A fresh model with the masks and ``state``: early weights of a dense model (the
    lottery-ticket rewind) or the state_dict of a pruned one (a copy that deepcopy cannot
    make once training has left non-leaf ``weight`` tensors on the pruned modules)."""
    model = model_fn()
    pruned = any(k.endswith("_orig") for k in state)
    if not pruned:
        model.load_state_dict(state)
    attach_masks_(model, masks)
    if pruned:
        model.load_state_dict(state)
    return model


def overlap(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """100 |S_a & S_b| / |S_a| where S are the pruned (mask 0) coordinates (Table 3.1)."""
    both = sum(int(((a[n] == 0) & (b[n] == 0)).sum()) for n in a)
    pruned = sum(int((a[n] == 0).sum()) for n in a)
    return 100.0 * both / pruned if pruned else 100.0


def _scatter(model: nn.Module, input_shape: Sequence[int]) -> tuple[Tensor, Tensor]:
    mag = magnitude_scores(model, input_shape).flat()
    path = path_magnitude_scores(model, input_shape)
    return mag, path.flat().log10() + path.log10_scale


def run_experiment(model_fn: Callable[[], nn.Module], train_loader: DataLoader,
                   test_loader: DataLoader, input_shape: Sequence[int],
                   config: PruneConfig = PruneConfig(),
                   on_run: Callable[[str], None] | None = None) -> ExperimentResult:
    """The prune-rewind-retrain protocol for every seed, rescaling, method and amount.

    ``model_fn`` builds a fresh untrained model (it is seeded by the caller's seed loop);
    ``on_run`` is called with a short description after each training (progress bars).
    Runs single-threaded and deterministic (``pathlift.data.training.reproducible``), so
    the same seeds give the same numbers run to run, whatever the core count.
    """
    from pathlift.data.training import reproducible

    with reproducible():
        return _run_experiment(model_fn, train_loader, test_loader, input_shape, config,
                               on_run)


def _run_experiment(model_fn: Callable[[], nn.Module], train_loader: DataLoader,
                    test_loader: DataLoader, input_shape: Sequence[int], config: PruneConfig,
                    on_run: Callable[[str], None] | None) -> ExperimentResult:
    from pathlift.data.training import evaluate, train_classifier
    from pathlift.symmetry import random_rescale

    def train(model: nn.Module, epochs: int, seed: int, callbacks: tuple = ()) -> None:
        train_classifier(model, train_loader, epochs, config.lr, config.momentum,
                         config.weight_decay, callbacks=callbacks, progress=False, seed=seed)

    def notify(text: str) -> None:
        if on_run is not None:
            on_run(text)

    runs, overlaps, scatter = [], [], {}
    for seed in config.seeds:
        torch.manual_seed(seed)
        dense = model_fn()
        snapshot = _Snapshot(config.rewind_epoch)
        train(dense, config.epochs, seed, (snapshot,))
        dense.eval()
        dense_acc = evaluate(dense, test_loader)
        notify(f"seed {seed}: dense {100 * dense_acc:.1f}%")
        for rescaled in (False, True):
            trained = random_rescale(dense, config.rescale_factors, seed, input_shape) \
                if rescaled else dense
            if seed == config.seeds[0]:
                scatter[rescaled] = _scatter(trained, input_shape)
            for amount in config.amounts:
                masks = {}
                for method in config.methods:
                    record, masks[method] = _prune_run(
                        trained, snapshot.state, model_fn, input_shape, config, method, amount,
                        lambda m, s=seed: train(m, config.epochs - config.rewind_epoch, s),
                        lambda m: evaluate(m, test_loader))
                    runs.append(RunRecord(seed, method, rescaled, amount, record[0], dense_acc,
                                          *record[1:]))
                    notify(f"seed {seed} {method}{' rescaled' if rescaled else ''} "
                           f"{100 * amount:.0f}%: {100 * runs[-1].accuracy:.1f}%")
                if not rescaled:
                    for scope in ("global", "layerwise"):
                        a, b = f"magnitude-{scope}", f"path-magnitude-{scope}"
                        if a in masks and b in masks:
                            overlaps.append(OverlapRecord(seed, scope, amount,
                                                          overlap(masks[a], masks[b])))
    return ExperimentResult(config, tuple(runs), tuple(overlaps), scatter)


def _prune_run(trained: nn.Module, early: dict[str, Tensor], model_fn: Callable[[], nn.Module],
               input_shape: Sequence[int], config: PruneConfig, method: str, amount: float,
               retrain: Callable[[nn.Module], None], evaluate: Callable[[nn.Module], float]
               ) -> tuple[tuple[float, float, float, float, float], dict[str, Tensor]]:
    """Rounds of prune (on a copy) -> rewind -> retrain; returns the record's numbers and the
    first round's mask. Sparsity, path-metric and bound describe the first round's pruning
    of ``trained`` (the network the mask is chosen on)."""
    criterion, scope = method.rsplit("-", 1)
    per_round = 1.0 - (1.0 - amount) ** (1.0 / config.rounds)
    current, first_mask, first = trained, None, None
    for _ in range(config.rounds):
        candidate = _masked(model_fn, current.state_dict(), prune_masks(current)).eval()
        result = prune_model(candidate, input_shape, per_round, criterion, scope,
                             last_layer_factor=config.last_layer_factor)
        masks = prune_masks(candidate)
        if first is None:
            first, first_mask = result, masks
            pruned_acc = evaluate(candidate)
        current = _masked(model_fn, early, masks)
        retrain(current)
        current.eval()
    sparsity = 1.0 - sum(float(m.sum()) for m in masks.values()) / first.total
    return (sparsity, pruned_acc, evaluate(current), first.log10_path_metric,
            first.log10_bound), first_mask


def plot(result: ExperimentResult, path: Path, title: str) -> Path:
    """Accuracy vs pruning level per method (solid: trained weights, dashed: after a random
    rescale), magnitude vs Path-Mag scatter (Figure 3.8) and the mask overlaps (Table 3.1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    summary = result.summary()
    for i, method in enumerate(result.config.methods):
        for rescaled in (False, True):
            rows = [r for r in summary if r["method"] == method and r["rescaled"] == rescaled]
            axes[0].errorbar([100 * r["amount"] for r in rows], [100 * r["mean"] for r in rows],
                             [100 * r["std"] for r in rows], color=f"C{i}", capsize=3,
                             linestyle="--" if rescaled else "-", marker="o",
                             label=method + (" (rescaled)" if rescaled else ""))
    dense = [r.dense_accuracy for r in result.runs]
    axes[0].axhline(100 * sum(dense) / len(dense), color="gray", linewidth=0.8, label="dense")
    axes[0].set(xlabel="pruned (%)", ylabel="test accuracy (%)", title=title)
    axes[0].legend(fontsize=7)
    for ax, rescaled in zip(axes[1:3], (False, True), strict=True):
        mag, log_path = result.scatter[rescaled]
        keep = mag > 0
        ax.scatter(mag[keep].log10(), log_path[keep], s=2, alpha=0.3)
        ax.set(xlabel="log10 |theta_i|", ylabel="log10 Path-Mag(theta, i)",
               title="trained, randomly rescaled" if rescaled else "trained")
    for scope, marker in (("global", "o"), ("layerwise", "s")):
        rows = [o for o in result.overlaps if o.scope == scope]
        amounts = sorted({o.amount for o in rows})
        means = [sum(o.overlap for o in rows if o.amount == a) /
                 max(1, sum(1 for o in rows if o.amount == a)) for a in amounts]
        axes[3].plot([100 * a for a in amounts], means, marker=marker, label=scope)
    axes[3].set(xlabel="pruned (%)", ylabel="overlap magnitude / Path-Mag masks (%)",
                title="mask overlap (Table 3.1)", ylim=(0, 100))
    axes[3].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

