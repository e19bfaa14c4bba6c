"""``pathlift report``: measure a network end to end and write report/ (Markdown, HTML, PNGs).

Default: train ``small_cnn`` on the embedded digits while tracking path-norms, then report
architecture constants, path-norms, the generalisation bounds against the measured gap,
margins, the average-case path-norm and, if ``pathlift.prune`` is there, a pruning summary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader

from pathlift.bounds import (
    ArchitectureConstants,
    Sigma,
    architecture_constants,
    cross_entropy_gap_log10,
    default_quantile,
    margin_bound,
    margins,
    peeling_constant,
    rademacher_covering,
    rademacher_peeling,
    sharpened_constant,
    sigma_from_loader,
)
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph import copy_model, eval_mode, graph_of
from pathlift.lift import average_case_path_norm, path_norm
from pathlift.logspace import format_log10
from pathlift.report import plots
from pathlift.report.document import Document
from pathlift.track import PathNormTracker

QS = (1.0, 2.0, 4.0)
DEFAULT_EPOCHS = 30


@dataclass(frozen=True)
class ReportResult:
    """Where the report went, the reported (trained) model and its headline numbers (None
    where data was needed)."""

    model: nn.Module
    out_dir: Path
    markdown: Path
    html: Path
    plots: tuple[Path, ...]
    seconds: float
    constants: ArchitectureConstants
    path_norm_log10: dict[float, float]
    test_accuracy: float | None
    bound_ce_log10: float | None
    measured_ce_gap: float | None


@dataclass(frozen=True)
class _Data:
    train: DataLoader
    test: DataLoader
    n_train: int


class _Evaluation:
    """Callback: eval-mode train/test cross-entropy and accuracy (flags restored after)."""

    def __init__(self, data: _Data):
        self.data = data

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        with eval_mode(model):
            for split, loader in (("train", self.data.train), ("test", self.data.test)):
                loss, acc = _loss_accuracy(model, loader)
                logs[f"eval_{split}_loss"], logs[f"eval_{split}_accuracy"] = loss, acc


def _loss_accuracy(net: nn.Module, loader: DataLoader) -> tuple[float, float]:
    total, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = net(x)
            total += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
    return total / seen, correct / seen


def run_report(out_dir: str | Path = "report", model: str | None = None,
               input_shape: Sequence[int] | None = None, data: str | None = None,
               epochs: int | None = None, seed: int = 0, samples: int = 512,
               progress: bool = True) -> ReportResult:
    """Write ``out_dir``/report.md, report.html and PNG plots; returns the headline numbers.

    With no ``model``: ``small_cnn`` trained ``epochs`` (default 30) epochs on the embedded
    digits. With ``model`` (a reference name or checkpoint, see pathlift.models.load_model)
    the given weights are reported, trained first only if ``data`` and ``epochs`` > 0 are
    given. Data-dependent sections (margins, average case, bounds vs gap) need ``data``.
    Runs torch single-threaded and deterministic (``pathlift.data.training.reproducible``,
    restored afterwards): the small default network is several times faster so on a shared
    CPU, and one seed gives the same numbers on any core count. The caller's global RNG
    state is restored too.
    """
    from pathlift.data.training import reproducible

    with reproducible(), torch.random.fork_rng(devices=[]):  # caller's RNG state kept
        return _run(Path(out_dir), model, input_shape, data, epochs, seed, samples, progress)


def _run(out: Path, model: str | None, input_shape: Sequence[int] | None, data: str | None,
         epochs: int | None, seed: int, samples: int, progress: bool) -> ReportResult:
    start = time.perf_counter()
    console = Console(quiet=not progress)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    net, shape, title = _model(model, input_shape)
    if model is None:
        data = data or "digits"
    epochs = (DEFAULT_EPOCHS if model is None else 0) if epochs is None else epochs
    if epochs < 0 or samples < 1:
        raise InvalidParameterError(f"need epochs >= 0 and samples >= 1, got {epochs}, "
                                    f"{samples}")
    loaded = _data(data, shape, seed) if data else None
    doc = Document(f"pathlift report: {title}")
    doc.para(f"Input shape {tuple(shape)}; data: {data or 'none'}; epochs: {epochs}; "
             f"seed: {seed}. Theorem numbers refer to Gonon's thesis unless stated.")
    figures: list[Path] = []
    history: list[dict[str, Any]] = []
    sigma = sigma_from_loader(loaded.train) if loaded else None
    if loaded and epochs > 0:
        console.log(f"training {title} for {epochs} epochs on {data}")
        history = _train(net, shape, loaded, sigma, epochs, seed, progress)
    net = net.eval()
    graph = graph_of(net, shape)
    constants = architecture_constants(graph)
    console.log("path-norms and architecture constants")
    norms = {q: path_norm(graph, q=q, r=q) for q in QS}  # ||Phi||_q, Table 7.2
    _constants_section(doc, constants)
    _path_norm_section(doc, norms)
    result: dict[str, Any] = {"test_accuracy": None, "bound_ce_log10": None,
                              "measured_ce_gap": None}
    if loaded is None:
        _no_data_section(doc, constants, norms[1.0].log10)
    else:
        if history:
            figures += _training_section(doc, history, out)
        console.log("margins, average-case path-norm, bounds")
        result = _data_sections(doc, net, shape, loaded, sigma, constants, norms, samples,
                                out, figures)
        console.log("pruning summary")
        _pruning_section(doc, net, shape, loaded, sigma, constants, out, figures)
    seconds = time.perf_counter() - start
    doc.para(f"Report written in {seconds:.1f} s.")
    md, page = doc.write(out)
    console.log(f"wrote {md} and {page} with {len(figures)} plots")
    return ReportResult(net, out, md, page, tuple(figures), seconds, constants,
                        {q: n.log10 for q, n in norms.items()}, **result)


def _model(spec: str | None, input_shape: Sequence[int] | None
           ) -> tuple[nn.Module, tuple[int, ...], str]:
    if spec is None:
        from pathlift.models import small_cnn

        return small_cnn(), (1, 8, 8), "small_cnn on digits"
    from pathlift.models import load_model

    net, shape = load_model(spec, input_shape)
    return net, tuple(shape), spec


def _data(name: str, shape: tuple[int, ...], seed: int) -> _Data:
    from pathlift.data import load_digits, loaders

    if name != "digits":
        raise InvalidParameterError(f"unknown data {name!r}; the embedded data set is 'digits'")
    digits = load_digits(seed=seed)
    if tuple(digits.input_shape) != shape:
        raise ShapeError(f"digits inputs have shape {digits.input_shape}, the model expects "
                         f"{shape}; pass a model for 8x8 single-channel inputs")
    train, test = loaders(digits, batch_size=64, seed=seed)
    return _Data(train, test, len(digits.train))


def _train(net: nn.Module, shape: tuple[int, ...], data: _Data, sigma: Sigma, epochs: int,
           seed: int, progress: bool) -> list[dict[str, Any]]:
    from pathlift.data.training import train_classifier

    probe = torch.cat([x for x, _ in data.test])[:64]
    # the report plots path-norms and accuracy only: no sparsity passes per epoch
    tracker = PathNormTracker(shape, probe, data.n_train, sigma.peeling, QS, sparsity=False)
    evaluation = _Evaluation(data)
    init: dict[str, Any] = {"epoch": 0}
    evaluation.on_epoch_end(net, 0, init)
    tracker.on_epoch_end(net, 0, init)
    train_classifier(net, data.train, epochs=epochs, lr=0.05, momentum=0.9,
                     callbacks=(evaluation, tracker), progress=progress, seed=seed)
    return tracker.history


def _fmt(log10: float) -> str:
    return format_log10(log10, digits=2)


def _constants_section(doc: Document, c: ArchitectureConstants) -> None:
    doc.heading("Architecture constants (read from the traced graph)")
    rows = [
        ("D, depth of Thm 4.4.1 (identity neurons merged)", c.depth),
        ("D before merging identity neurons (Def. 2.2.2)", c.depth_unrefined),
        ("D without max-pool layers (Remark 4.4.1, Appendix E.1 convention)",
         c.depth_without_maxpool),
        ("M, max-pool layers on a path", c.maxpool_layers),
        ("K, largest max-pool kernel", c.kernel),
        ("P, distinct k of k-max-pooling", c.pool_types),
        ("d_in", c.d_in), ("d_out", c.d_out),
        ("#params, weight sharing counted once", c.num_params),
        ("#params of the unrolled DAG (Thm 4.3.1)", c.num_params_unshared),
        ("Remark 4.4.1 applies", "yes" if c.sharpened_applies else "no"),
    ]
    doc.table(["constant", "value"], rows)
    line = f"C of Thm 4.4.1 = {peeling_constant(c):.3f}"
    if c.sharpened_applies:
        line += f"; C_sharpened of Remark 4.4.1 = {sharpened_constant(c):.3f}"
    doc.para(line + ".")


def _path_norm_section(doc: Document, norms: dict) -> None:
    doc.heading("Path-norms (thesis Thm 3.1.1, one forward pass each)")
    doc.table(["q", "||Phi||_q", "log10"],
              [(f"{q:g}", _fmt(n.log10), f"{n.log10:.3f}") for q, n in norms.items()])


def _no_data_section(doc: Document, c: ArchitectureConstants, l1_log10: float) -> None:
    doc.heading("Generalisation bounds")
    need = 2 * (math.log10(4 * math.sqrt(2) * peeling_constant(c)) + l1_log10)
    doc.para("No data given (--data): margins, the average-case path-norm and the measured "
             "gap need inputs. With inputs in [-1, 1], the bound 4 sqrt(2) sigma C r / n on "
             "the expected cross-entropy gap (Thm 4.1.1 + Thm 4.4.1, sigma = sqrt(n)) drops "
             f"below 1 only for n >= 10^{need:.1f} training samples.")


def _training_section(doc: Document, history: list[dict[str, Any]], out: Path) -> list[Path]:
    doc.heading("During training")
    first, last = history[0], history[-1]
    doc.para(f"From initialisation to epoch {last['epoch']}, log10 ||Phi||_1 went from "
             f"{first['path_norm_log10_q1']:.2f} to {last['path_norm_log10_q1']:.2f}, the "
             f"average-case path-norm from {first['average_case']:.3g} to "
             f"{last['average_case']:.3g}, and test accuracy from "
             f"{first['eval_test_accuracy']:.3f} to {last['eval_test_accuracy']:.3f}.")
    figs = [plots.training_curves(history, QS, out / "path_norms_during_training.png"),
            plots.accuracy_curves(history, out / "accuracy_during_training.png"),
            plots.bound_during_training(history, out / "bound_during_training.png")]
    captions = ["Path-norms (log10) per epoch, with the average-case path-norm.",
                "Top-1 accuracy and cross-entropy per epoch (eval mode).",
                "The cross-entropy bound (log10) against the measured gap per epoch."]
    for f, cap in zip(figs, captions, strict=True):
        doc.figure(f, cap)
    return figs


def _data_sections(doc: Document, net: nn.Module, shape: tuple[int, ...], data: _Data,
                   sigma: Sigma, c: ArchitectureConstants, norms: dict, samples: int,
                   out: Path, figures: list[Path]) -> dict[str, Any]:
    train_loss, train_acc = _loss_accuracy(net, data.train)
    test_loss, test_acc = _loss_accuracy(net, data.test)
    ce_gap, top1_gap = test_loss - train_loss, train_acc - test_acc
    doc.heading("Measured generalisation")
    doc.table(["", "train", "test", "gap"],
              [("cross-entropy", f"{train_loss:.4f}", f"{test_loss:.4f}", f"{ce_gap:.4f}"),
               ("top-1 error", f"{1 - train_acc:.4f}", f"{1 - test_acc:.4f}",
                f"{top1_gap:.4f}")])

    l1 = norms[1.0].log10
    bounds = [rademacher_peeling(c, sigma.peeling, l1)]
    if c.sharpened_applies:
        bounds.append(rademacher_peeling(c, sigma.peeling, l1, sharpened=True))
    bounds += [rademacher_covering(c, sigma.covering, l1, weight_sharing=True),
               rademacher_covering(c, sigma.covering, l1, weight_sharing=False)]
    n = data.n_train
    ce = [cross_entropy_gap_log10(b, n) for b in bounds]
    train_m, test_m = margins(net, data.train), margins(net, data.test)
    q = default_quantile(1 - train_acc)
    top1 = margin_bound(bounds[0], train_m, q)
    doc.heading("Generalisation bounds against the measured gap")
    doc.para(f"n = {n} training samples, sigma = {sigma.peeling:.4g} (Thm 4.4.1) / "
             f"{sigma.covering:.4g} (Thm 4.3.1), max ||x||_inf = {sigma.max_abs:.3g}. "
             "Bounds on the expected cross-entropy gap: (2 sqrt(2) L / n) x Rademacher bound "
             "(Thm 4.1.1, L = sqrt(2)). Orders of magnitude = log10(bound / measured gap).")
    gap_log10 = math.log10(ce_gap) if ce_gap > 0 else math.nan
    rows = [(b.theorem, f"{b.constant:.4g}", _fmt(b.log10), _fmt(v), f"{v - gap_log10:.1f}")
            for b, v in zip(bounds, ce, strict=True)]
    rows.append((f"Thm 4.1.2 top-1 error, gamma = {top1.gamma:.3g} ({top1.quantile:.3f}-"
                 "quantile)", "", "", _fmt(top1.log10),
                 f"{top1.log10 - math.log10(max(1 - test_acc, 1 / len(test_m))):.1f}"))
    doc.table(["bound", "constant", "Rademacher bound", "bound", "orders above measured"],
              rows)
    doc.para(f"Top-1 (Thm 4.1.2, delta = 0.05): training margin loss "
             f"{top1.train_margin_loss:.3f} + complexity 10^{top1.complexity_log10:.2f} + "
             f"confidence {top1.confidence:.3f}, against a measured test error of "
             f"{1 - test_acc:.4f} (last row compares with it). Informative: "
             f"{'yes' if top1.informative else 'no'}.")
    labels = [f"{b.theorem} (cross-entropy)" for b in bounds] + ["Thm 4.1.2 (top-1 error)"]
    figures.append(plots.bounds_vs_gap(labels, [*ce, top1.log10], ce_gap,
                                       out / "bounds_vs_gap.png"))
    doc.figure(figures[-1], "Bounds and the measured cross-entropy gap on a log10 axis.")

    doc.heading("Margins")
    figures.append(plots.margins_histogram(train_m, test_m, top1.gamma, out / "margins.png"))
    doc.figure(figures[-1], "Margins R(x)_y - max_{c != y} R(x)_c on train and test.")

    avg = average_case_path_norm(net, shape, data.test, q=1.0, max_samples=samples)
    worst = norms[1.0]
    doc.heading("Average-case vs worst-case path-norm (thesis Sec. 7.2.2)")
    doc.para(f"E_x ||A(theta,x)^T Phi(theta)||_1 over {avg.n_samples} test inputs = "
             f"{avg.mean:.4g} +- {avg.std_error:.2g} (standard error), against the worst case "
             f"||Phi||_1 = {_fmt(worst.log10)}: {avg.gap_log10:.1f} orders of magnitude "
             "smaller. The average case is rescaling-invariant and never exceeds ||Phi||_1.")
    figures.append(plots.average_vs_worst(avg.per_output_mean, worst.per_output_log10,
                                          out / "average_vs_worst.png"))
    doc.figure(figures[-1], "Per output neuron: average case vs worst case (log scale).")
    return {"test_accuracy": test_acc, "bound_ce_log10": ce[0], "measured_ce_gap": ce_gap}


def _pruning_section(doc: Document, net: nn.Module, shape: tuple[int, ...], data: _Data,
                     sigma: Sigma, c: ArchitectureConstants, out: Path,
                     figures: list[Path]) -> None:
    try:
        from pathlift.prune import prune_model
    except ImportError:
        return
    doc.heading("Pruning summary (thesis Sec. 3.5)")
    rows = []
    for criterion in ("path-magnitude", "magnitude"):
        for amount in (0.0, 0.2, 0.5, 0.8, 0.9):
            pruned = copy_model(net)
            result = prune_model(pruned, shape, amount, criterion=criterion, scope="global")
            l1 = path_norm(pruned, shape).log10
            bound = cross_entropy_gap_log10(rademacher_peeling(c, sigma.peeling, l1),
                                            data.n_train)
            rows.append({"criterion": criterion, "sparsity": result.sparsity,
                         "accuracy": _loss_accuracy(pruned, data.test)[1],
                         "path_norm_log10": l1, "bound_log10": bound,
                         "certificate_log10": result.log10_path_metric})
    doc.table(["criterion", "pruned", "test acc.", "log10 ||Phi||_1", "log10 bound (CE)",
               "log10 certified output change / max(1,||x||_inf)"],
              [(r["criterion"], f"{r['sparsity']:.2f}", f"{r['accuracy']:.3f}",
                f"{r['path_norm_log10']:.2f}", f"{r['bound_log10']:.2f}",
                f"{r['certificate_log10']:.2f}") for r in rows])
    doc.para("One-shot global pruning without retraining. Pruning only lowers ||Phi||_1, so "
             "it lowers the bound; the certificate is the exact path-metric of Lemma 3.4.1.")
    figures.append(plots.pruning_curves(rows, out / "pruning.png"))
    doc.figure(figures[-1], "Test accuracy and l1 path-norm against the fraction pruned.")
