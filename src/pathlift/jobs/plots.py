"""Every figure pathlift draws: the report's, the pruning experiment's and the depth lab's.

matplotlib's object API on the Agg canvas (no pyplot state, safe in threads and servers);
each function takes plain numbers or result objects and writes one PNG through ``save``,
with matplotlib's warnings silenced (``_quiet``: a figure of one seed has no error bars,
which is no news for whoever reads the run's output).
Needs matplotlib: ``pip install 'pathlift[plots]'``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol

from pathlift.files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from torch import Tensor

    from pathlift.jobs.prune.protocol import ProtocolResult

__all__ = ["accuracy_curves", "average_vs_worst", "bound_during_training", "bounds_vs_gap",
           "depth_trajectories", "margins_histogram", "pruning_curves", "pruning_experiment",
           "save", "training_curves"]


_P = ParamSpec("_P")


def _quiet(draw: Callable[_P, Path]) -> Callable[_P, Path]:
    """``draw`` with every warning raised while it draws silenced: the plots are pathlift's
    own, so matplotlib's remarks on them (an empty legend, NaN error bars) are not the
    user's to read."""
    @functools.wraps(draw)
    def quiet(*args: _P.args, **kwargs: _P.kwargs) -> Path:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return draw(*args, **kwargs)
    return quiet


def _style(ax: Any, title: str, xlabel: str, ylabel: str | None = None) -> None:
    """Title, axis labels, light grid and legend: the look shared by the line plots."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _figure(width: float, height: float) -> Figure:
    """A new matplotlib figure on the Agg canvas; matplotlib is imported here, on the first
    figure, so the jobs import without the plots extra."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def save(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG at ``path``, atomically (``pathlift.files.atomic_write``)."""
    fig.tight_layout()
    return atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))


@_quiet
def training_curves(history: Sequence[Mapping[str, Any]], qs: Sequence[float], path: Path
                    ) -> Path:
    """log10 of the l_q path-norms and of the average-case path-norm per epoch."""
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    epochs = [h["epoch"] for h in history]
    for q in qs:
        ax.plot(epochs, [h[f"path_norm_log10_q{q:g}"] for h in history], marker="o", ms=3,
                label=f"log10 ||Phi||_{q:g}")
    ax.plot(epochs, [math.log10(h["average_case"]) for h in history], marker="s", ms=3,
            ls="--", label="log10 E_x ||A^T Phi||_1 (average case)")
    _style(ax, "Path-norms during training", "epoch (0 = initialisation)", "log10")
    return save(fig, path)


@_quiet
def accuracy_curves(history: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Train/test top-1 accuracy and cross-entropy per epoch (eval mode)."""
    fig = _figure(9, 3.5)
    left, right = fig.subplots(1, 2)
    epochs = [h["epoch"] for h in history]
    for split in ("train", "test"):
        left.plot(epochs, [h[f"eval_{split}_accuracy"] for h in history], marker="o", ms=3,
                  label=split)
        right.plot(epochs, [h[f"eval_{split}_loss"] for h in history], marker="o", ms=3,
                   label=split)
    _style(left, "top-1 accuracy", "epoch")
    _style(right, "cross-entropy", "epoch")
    return save(fig, path)


@_quiet
def margins_histogram(train: Sequence[float], test: Sequence[float], gamma: float, path: Path
                      ) -> Path:
    """Histogram of the margins R(x)_y - max_{c != y} R(x)_c with the chosen gamma."""
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    lo, hi = min(*train, *test), max(*train, *test)
    bins = [lo + (hi - lo) * i / 40 for i in range(41)]
    ax.hist(list(train), bins=bins, alpha=0.6, density=True, label="train")
    ax.hist(list(test), bins=bins, alpha=0.6, density=True, label="test")
    ax.axvline(gamma, color="k", ls="--", label=f"gamma = {gamma:.3g} (Thm 4.1.2)")
    ax.axvline(0.0, color="r", lw=1, label="misclassified below 0")
    ax.set_xlabel("margin")
    ax.set_ylabel("density")
    ax.set_title("Margins")
    ax.legend(fontsize=8)
    return save(fig, path)


@_quiet
def average_vs_worst(average: Sequence[float], worst_log10: Sequence[float], path: Path
                     ) -> Path:
    """Per output neuron: E_x ||A^T Phi^{->v}||_1 against ||Phi^{->v}||_1 (log scale)."""
    fig = _figure(8, 4)
    ax = fig.add_subplot()
    idx = list(range(len(average)))
    width = 0.4
    ax.bar([i - width / 2 for i in idx], [10.0**w for w in worst_log10], width,
           label="worst case ||Phi^{->v}||_1")
    ax.bar([i + width / 2 for i in idx], list(average), width,
           label="average case E_x ||A(theta,x)^T Phi^{->v}||_1")
    ax.set_yscale("log")
    ax.set_ylim(top=30 * 10.0 ** max(worst_log10))  # room for the legend above the bars
    ax.set_xlabel("output neuron v")
    ax.set_xticks(idx)
    ax.set_title("Average-case vs worst-case path-norm per output")
    ax.legend(fontsize=8)
    return save(fig, path)


@_quiet
def bounds_vs_gap(labels: Sequence[str], bounds_log10: Sequence[float], gap: float,
                  path: Path) -> Path:
    """Bounds and the measured gap on one log10 axis: orders of magnitude at a glance."""
    fig = _figure(8, 0.6 * len(labels) + 1.8)
    ax = fig.add_subplot()
    ax.barh(list(labels), list(bounds_log10), color="tab:red", alpha=0.7)
    if gap > 0:
        ax.axvline(math.log10(gap), color="k", ls="--", label=f"measured gap = {gap:.3g}")
    else:  # said, not dropped: a log axis has no place for it
        ax.plot([], [], " ", label=f"measured gap = {gap:.3g} <= 0: not on a log axis")
    ax.axvline(0.0, color="tab:green", lw=1, label="1 (informative below)")
    ax.set_xlabel("log10")
    ax.set_title("Generalisation bounds vs measured gap")
    ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    return save(fig, path)


@_quiet
def bound_during_training(history: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """log10 of the cross-entropy bound and of the measured gap per epoch."""
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["bound_ce_log10"] for h in history], marker="o", ms=3,
            label="bound on E gap (Thm 4.1.1 + 4.4.1)")
    gaps = [h["eval_test_loss"] - h["eval_train_loss"] for h in history]
    ax.plot(epochs, [math.log10(g) if g > 0 else float("nan") for g in gaps], marker="s",
            ms=3, label="measured gap (test - train cross-entropy)")
    _style(ax, "Bound vs measured gap during training", "epoch", "log10")
    return save(fig, path)


@_quiet
def pruning_curves(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Test accuracy and log10 l1 path-norm against sparsity, per pruning criterion."""
    fig = _figure(9, 3.5)
    left, right = fig.subplots(1, 2)
    for criterion in sorted({r["criterion"] for r in rows}):
        sub = [r for r in rows if r["criterion"] == criterion]
        left.plot([r["sparsity"] for r in sub], [r["accuracy"] for r in sub], marker="o",
                  label=criterion)
        right.plot([r["sparsity"] for r in sub], [r["path_norm_log10"] for r in sub],
                   marker="o", label=criterion)
    _style(left, "test top-1 accuracy after pruning", "fraction of weights pruned")
    _style(right, "log10 ||Phi||_1 after pruning", "fraction of weights pruned")
    return save(fig, path)


@_quiet
def pruning_experiment(result: ProtocolResult, path: Path, title: str,
         scatters: dict[bool, tuple[Tensor, Tensor]] | None = None) -> Path:
    """Accuracy vs pruning level per method (solid: trained weights, dashed: after a random
    rescale), the magnitude vs Path-Mag ``scatters`` of a trained network without and with
    the rescale (Figure 3.8; panels left out without them) and each method's mask overlap
    with magnitude pruning (Table 3.1)."""
    scatters = scatters or {}
    fig = _figure(5 * (2 + len(scatters)), 4.2)
    axes = fig.subplots(1, 2 + len(scatters))
    summary = result.summary()
    methods = [m.name for m in result.config.methods]  # type: ignore[union-attr]
    for i, method in enumerate(methods):
        for rescaled in result.config.rescaled:
            rows = [r for r in summary if r["method"] == method and r["rescaled"] == rescaled]
            axes[0].errorbar([100 * r["amount"] for r in rows], [100 * r["mean"] for r in rows],
                             [100 * r["std"] for r in rows], color=f"C{i}", capsize=3,
                             linestyle="--" if rescaled else "-", marker="o",
                             label=method + (" (rescaled)" if rescaled else ""))
    axes[0].axhline(100 * result.dense_accuracy()[0], color="gray", linewidth=0.8,
                    label="dense")
    axes[0].set(xlabel="pruned (%)", ylabel="test accuracy (%)", title=title)
    axes[0].legend(fontsize=7)
    for ax, (rescaled, (mag, log_path)) in zip(axes[1:-1], sorted(scatters.items()),
                                               strict=True):
        keep = mag > 0
        ax.scatter(mag[keep].log10(), log_path[keep], s=2, alpha=0.3)
        ax.set(xlabel="log10 |theta_i|", ylabel="log10 Path-Mag(theta, i)",
               title="trained, randomly rescaled" if rescaled else "trained")
    overlaps = result.overlaps()
    for i, method in enumerate(methods):
        amounts = sorted(a for m, a in overlaps if m == method)
        if amounts:
            axes[-1].plot([100 * a for a in amounts], [overlaps[method, a] for a in amounts],
                          marker="o", color=f"C{i}", label=method)
    axes[-1].set(xlabel="pruned (%)", ylabel="overlap with magnitude pruning's mask (%)",
                 title="mask overlap (Table 3.1)", ylim=(0, 100))
    if overlaps:  # magnitude pruning alone has no overlap to draw
        axes[-1].legend(fontsize=7)
    return save(fig, path)


class Trajectory(Protocol):
    """What ``depth_trajectories`` draws of a run (``pathlift.jobs.depth.DepthRun``, which
    imports this module)."""

    model: str
    depth: int
    seed: int
    norm_path: Sequence[float]


@_quiet
def depth_trajectories(runs: Sequence[Trajectory], path: str | Path) -> Path:
    """||L^beta W_k|| against k / L for each run (thesis Figs. 4.2-4.5), saved to ``path``."""
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    for r in runs:
        k = [i / r.depth for i in range(r.depth)]
        ax.plot(k, r.norm_path, lw=0.8, label=f"{r.model} L={r.depth} seed={r.seed}")
    ax.set_xlabel("k / L")
    ax.set_ylabel(r"$\|L^\beta W_k\|$")
    ax.legend(fontsize=7)
    return save(fig, path, dpi=120)
