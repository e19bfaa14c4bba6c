"""The report's PNG figures (matplotlib's object API on the Agg canvas: no pyplot state)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure


def _style(ax: Any, title: str, xlabel: str, ylabel: str | None = None) -> None:
    """Title, axis labels, light grid and legend: the look shared by the line plots."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def training_curves(history: Sequence[Mapping[str, Any]], qs: Sequence[float], path: Path
                    ) -> Path:
    """log10 of the l_q path-norms and of the average-case path-norm per epoch."""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    epochs = [h["epoch"] for h in history]
    for q in qs:
        ax.plot(epochs, [h[f"path_norm_log10_q{q:g}"] for h in history], marker="o", ms=3,
                label=f"log10 ||Phi||_{q:g}")
    ax.plot(epochs, [math.log10(h["average_case"]) for h in history], marker="s", ms=3,
            ls="--", label="log10 E_x ||A^T Phi||_1 (average case)")
    _style(ax, "Path-norms during training", "epoch (0 = initialisation)", "log10")
    return _save(fig, path)


def accuracy_curves(history: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Train/test top-1 accuracy and cross-entropy per epoch (eval mode)."""
    fig = Figure(figsize=(9, 3.5))
    left, right = fig.subplots(1, 2)
    epochs = [h["epoch"] for h in history]
    for split in ("train", "test"):
        left.plot(epochs, [h[f"eval_{split}_accuracy"] for h in history], marker="o", ms=3,
                  label=split)
        right.plot(epochs, [h[f"eval_{split}_loss"] for h in history], marker="o", ms=3,
                   label=split)
    _style(left, "top-1 accuracy", "epoch")
    _style(right, "cross-entropy", "epoch")
    return _save(fig, path)


def margins_histogram(train: torch.Tensor, test: torch.Tensor, gamma: float, path: Path
                      ) -> Path:
    """Histogram of the margins R(x)_y - max_{c != y} R(x)_c with the chosen gamma."""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    lo = float(min(train.min(), test.min()))
    hi = float(max(train.max(), test.max()))
    bins = torch.linspace(lo, hi, 41).tolist()
    ax.hist(train.tolist(), bins=bins, alpha=0.6, density=True, label="train")
    ax.hist(test.tolist(), bins=bins, alpha=0.6, density=True, label="test")
    ax.axvline(gamma, color="k", ls="--", label=f"gamma = {gamma:.3g} (Thm 4.1.2)")
    ax.axvline(0.0, color="r", lw=1, label="misclassified below 0")
    ax.set_xlabel("margin")
    ax.set_ylabel("density")
    ax.set_title("Margins")
    ax.legend(fontsize=8)
    return _save(fig, path)


def average_vs_worst(average: Sequence[float], worst_log10: Sequence[float], path: Path
                     ) -> Path:
    """Per output neuron: E_x ||A^T Phi^{->v}||_1 against ||Phi^{->v}||_1 (log scale)."""
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    idx = torch.arange(len(average)).tolist()
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
    return _save(fig, path)


def bounds_vs_gap(labels: Sequence[str], bounds_log10: Sequence[float], gap: float,
                  path: Path) -> Path:
    """Bounds and the measured gap on one log10 axis: orders of magnitude at a glance."""
    fig = Figure(figsize=(8, 0.6 * len(labels) + 1.8))
    ax = fig.add_subplot()
    ax.barh(list(labels), list(bounds_log10), color="tab:red", alpha=0.7)
    gap_log10 = math.log10(gap) if gap > 0 else float("nan")
    if math.isfinite(gap_log10):
        ax.axvline(gap_log10, color="k", ls="--", label=f"measured gap = {gap:.3g}")
    ax.axvline(0.0, color="tab:green", lw=1, label="1 (informative below)")
    ax.set_xlabel("log10")
    ax.set_title("Generalisation bounds vs measured gap")
    ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    return _save(fig, path)


def bound_during_training(history: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """log10 of the cross-entropy bound and of the measured gap per epoch."""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["bound_ce_log10"] for h in history], marker="o", ms=3,
            label="bound on E gap (Thm 4.1.1 + 4.4.1)")
    gaps = [h["eval_test_loss"] - h["eval_train_loss"] for h in history]
    ax.plot(epochs, [math.log10(g) if g > 0 else float("nan") for g in gaps], marker="s",
            ms=3, label="measured gap (test - train cross-entropy)")
    _style(ax, "Bound vs measured gap during training", "epoch", "log10")
    return _save(fig, path)


def pruning_curves(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Test accuracy and log10 l1 path-norm against sparsity, per pruning criterion."""
    fig = Figure(figsize=(9, 3.5))
    left, right = fig.subplots(1, 2)
    for criterion in sorted({r["criterion"] for r in rows}):
        sub = [r for r in rows if r["criterion"] == criterion]
        left.plot([r["sparsity"] for r in sub], [r["accuracy"] for r in sub], marker="o",
                  label=criterion)
        right.plot([r["sparsity"] for r in sub], [r["path_norm_log10"] for r in sub],
                   marker="o", label=criterion)
    _style(left, "test top-1 accuracy after pruning", "fraction of weights pruned")
    _style(right, "log10 ||Phi||_1 after pruning", "fraction of weights pruned")
    return _save(fig, path)
