"""A measured ``Report`` as pages: report.md, a self-contained report.html and the PNGs
(``pathlift.jobs.plots``). Nothing here measures anything."""

from __future__ import annotations

import math
import time
from pathlib import Path

from pathlift.bounds.verdict import verdict
from pathlift.jobs import plots
from pathlift.jobs.report.document import Document
from pathlift.jobs.report.measure import QS, Report
from pathlift.logspace import format_log10

__all__ = ["render_report"]


def _fmt(log10: float) -> str:
    return format_log10(log10, digits=2)


def render_report(report: Report, out: str | Path, started: float | None = None
                  ) -> tuple[Path, Path, tuple[Path, ...], float | None]:
    """Write ``out``/report.md, ``out``/report.html and the figures; returns their paths
    (Markdown, HTML, PNGs) and, given the ``time.perf_counter()`` at which the command
    started, its seconds up to writing the pages (also stated in them). Figures need
    matplotlib (``pathlift[plots]``)."""
    out = Path(out)
    doc = Document(f"pathlift report: {report.title}")
    doc.para(f"Input shape {report.input_shape}; data: {report.data or 'none'}; epochs: "
             f"{report.epochs}; seed: {report.seed}. Theorem numbers refer to Gonon, "
             "\"Harnessing symmetries for modern deep learning challenges: a path-lifting "
             "perspective\" (PhD thesis, 2024) unless stated.")
    if report.provenance is not None:
        doc.para(f"Computed with {report.provenance.sentence()}.")
    for note in report.notes:
        doc.para(f"Note: {note}.")
    figures: list[Path] = []
    _constants(doc, report)
    doc.heading("Path-norms (thesis Thm 3.1.1, one forward pass each)")
    doc.table(["q", "||Phi||_q", "log10"],
              [(f"{q:g}", _fmt(v), f"{v:.3f}") for q, v in report.path_norm_log10.items()])
    if report.bounds is None:
        doc.heading("Generalisation bounds")
        doc.para("No data given (--data): margins, the average-case path-norm and the measured"
                 " gap need inputs. With inputs in [-1, 1], the bound 4 sqrt(2) sigma C r / n "
                 "on the expected cross-entropy gap (Thm 4.1.1 + Thm 4.4.1, sigma = sqrt(n)) "
                 f"drops below 1 only for n >= 10^{report.samples_needed_log10:.1f} training "
                 "samples.")
    else:
        if report.history:
            _training(doc, report, out, figures)
        _bounds(doc, report, out, figures)
        _pruning(doc, report, out, figures)
    total = None if started is None else time.perf_counter() - started
    doc.para(f"Measured in {report.seconds:.1f} s" + ("." if total is None else
             f"; the whole command took {total:.1f} s (loading, training, measuring and "
             "drawing; the start of Python and the imports before it excluded)."))
    md, page = doc.write(out)
    return md, page, tuple(figures), total


def _figure(doc: Document, figures: list[Path], path: Path, caption: str) -> None:
    figures.append(path)
    doc.figure(path, caption)


def _constants(doc: Document, report: Report) -> None:
    c = report.constants
    doc.heading("Architecture constants (read from the traced graph)")
    doc.table(["constant", "value"], [
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
    ])
    line = f"C of Thm 4.4.1 = {report.peeling_constant:.3f}"
    if report.sharpened_constant is not None:
        line += f"; C_sharpened of Remark 4.4.1 = {report.sharpened_constant:.3f}"
    doc.para(line + ".")


def _training(doc: Document, report: Report, out: Path, figures: list[Path]) -> None:
    history = report.history
    first, last = history[0], history[-1]
    doc.heading("During training")
    doc.para(f"From initialisation to epoch {last['epoch']}, ||Phi||_1 went from "
             f"{_fmt(first['path_norm_log10_q1'])} to {_fmt(last['path_norm_log10_q1'])}, the "
             f"average-case path-norm from {first['average_case']:.3g} to "
             f"{last['average_case']:.3g}, and test accuracy from "
             f"{first['eval_test_accuracy']:.3f} to {last['eval_test_accuracy']:.3f}.")
    _figure(doc, figures, plots.training_curves(history, QS, out / "path_norms_during_training"
                                                ".png"),
            "Path-norms (log10) per epoch, with the average-case path-norm.")
    _figure(doc, figures, plots.accuracy_curves(history, out / "accuracy_during_training.png"),
            "Top-1 accuracy and cross-entropy per epoch (eval mode).")
    _figure(doc, figures, plots.bound_during_training(history,
                                                      out / "bound_during_training.png"),
            "The cross-entropy bound (log10) against the measured gap per epoch.")


def _certificates(doc: Document, report: Report) -> None:
    """The two bounds valid as stated, their terms and a one-line verdict each."""
    b, c = report.bounds, report.compression
    error = b.measured.test_error
    u = b.top1_union
    doc.heading("Certificates valid as stated")
    doc.para(f"With probability >= {1 - u.delta:g} over the training sample, each line bounds "
             "the top-1 test error of the trained network (its own function).")
    rows = [("Thm 4.1.2 + 4.4.1, union over radii 2^(k/4) and margins 2^(j/4)",
             f"margin loss {u.train_margin_loss:.4f} + complexity 10^"
             f"{u.complexity_log10:.2f} (r_k = 10^{u.radius_log10:.2f}, gamma_j "
             f"{u.gamma:.3g}) + confidence {u.confidence:.4f}", _fmt(u.log10),
             verdict(u.log10, error))]
    if c is not None:
        rows.append(("Occam on a coded quantised network, transferred by " + c["transfer"],
                     f"kl^-1({c['empirical']:.4f}, {c['budget']:.4f}), L = {c['bits']} bits "
                     f"({_code_parts(c)}, {c['bits_header']} header), "
                     f"{c['num_nonzero']}/{c['num_parameters']} non-zero, "
                     f"{c['events']} events", _fmt(math.log10(c["bound"])),
                     verdict(math.log10(c["bound"]), error)))
    doc.table(["certificate", "terms", "bound", "verdict"], rows)


def _code_parts(c: dict, prefix: str = "") -> str:
    """The body of a certificate's code word (keys ``prefix`` + "bits_..."), by the parts
    of its scheme."""
    def bits(part: str) -> int:
        return c[f"{prefix}bits_{part}"]

    if c.get(f"{prefix}code") == "enumerative":
        return f"enumerative: {bits('histogram')} histogram, {bits('arrangement')} arrangement"
    return f"{bits('symbols')} symbols, {bits('signs')} signs, {bits('mantissas')} mantissas"


def _certified(doc: Document, report: Report) -> None:
    """The certified network: the recipe's network and the model through it, with the
    terms and the verdict against chance of each."""
    c = report.certified
    doc.heading("The certified network")
    doc.para(f"A {c['recipe']} network trained on the same training split, certified by the "
             f"compression bound (probability >= {1 - c['recipe_delta']:g}), and the model "
             "itself certified through it by the disagreement route (Bazinet, Zantedeschi "
             "& Germain 2026, pathlift.bounds.disagreement): its top-1 error is at most the "
             "recipe network's bound plus a bound on how often the two disagree, counted on "
             f"the m = {c['m']} test inputs without their labels (probability >= "
             f"{1 - c['target_delta']:g} for both statements together). Chance: "
             f"{c['chance']:.4f}, the error of the best constant classifier on the training "
             "labels.")
    measured = {k: f"{c[k]:.4f}" if k in c else "n/a" for k in ("recipe_test_error",
                                                                  "target_test_error")}
    doc.table(["network", "terms", "bound", "test error", "verdict"], [
        (c["recipe"], f"kl^-1({c['recipe_empirical']:.4f}, {c['recipe_budget']:.4f}), L = "
         f"{c['recipe_bits']} bits ({_code_parts(c, 'recipe_')}), "
         f"{c['recipe_transfer']} transfer", f"{c['recipe_bound']:.4f}",
         measured["recipe_test_error"], c["recipe_verdict"]),
        (report.title, f"{c['recipe_bound']:.4f} + kl^-1({c['disagreement']:.4f}, "
         f"{c['disagreement_budget']:.4f}) = {c['recipe_bound']:.4f} + "
         f"{c['disagreement_bound']:.4f}", f"{c['target_bound']:.4f}",
         measured["target_test_error"], c["target_verdict"])])


def _bounds(doc: Document, report: Report, out: Path, figures: list[Path]) -> None:
    b, avg = report.bounds, report.average_case
    m = b.measured
    doc.heading("Measured generalisation")
    doc.table(["", "train", "test", "gap"],
              [("cross-entropy", f"{m.train_loss:.4f}", f"{m.test_loss:.4f}",
                f"{m.cross_entropy_gap:.4f}"),
               ("top-1 error", f"{1 - m.train_accuracy:.4f}", f"{m.test_error:.4f}",
                f"{m.train_accuracy - m.test_accuracy:.4f}")])
    _certificates(doc, report)
    if report.certified is not None:
        _certified(doc, report)
    doc.heading("Generalisation bounds against the measured gap (fixed-class form)")
    doc.para("The rows below use the class {||Phi||_1 <= r} with r the trained network's own "
             "path-norm (and gamma read off its margins): the form of thesis Sec. 7.2.1, "
             "which the theorems do not allow (Sec. 7.3.1), shown for comparison only.")
    doc.para(f"n = {b.n_train} training samples, sigma = {b.sigma.peeling:.4g} (Thm 4.4.1) / "
             f"{b.sigma.covering:.4g} (Thm 4.3.1), max ||x||_inf = {b.sigma.max_abs:.3g}. "
             "Bounds on the expected cross-entropy gap: (2 sqrt(2) L / n) x Rademacher bound "
             "(Thm 4.1.1, L = sqrt(2)). Orders of magnitude = log10(bound / measured gap).")
    rows = [(r.theorem, f"{r.constant:.4g}", _fmt(r.log10), _fmt(v), _orders(o))
            for r, v, o in zip(b.rademacher, b.cross_entropy_log10, b.orders_above_measured,
                               strict=True)]
    rows.append((f"Thm 4.1.2 top-1 error, gamma = {b.top1.gamma:.3g} ({b.top1.quantile:.3f}-"
                 "quantile)", "", "", _fmt(b.top1.log10), f"{b.top1_orders_above_measured:.1f}"))
    doc.table(["bound", "constant", "Rademacher bound", "bound", "orders above measured"],
              rows)
    doc.para(f"Top-1 (Thm 4.1.2, delta = 0.05): training margin loss "
             f"{b.top1.train_margin_loss:.3f} + complexity 10^{b.top1.complexity_log10:.2f} + "
             f"confidence {b.top1.confidence:.3f}, against a measured test error of "
             f"{m.test_error:.4f} (last row compares with it). Informative: "
             f"{'yes' if b.top1.informative else 'no'}.")
    labels = [f"{r.theorem} (cross-entropy)" for r in b.rademacher] + \
        ["Thm 4.1.2 (top-1 error)"]
    caption = "Bounds and the measured cross-entropy gap on a log10 axis."
    if m.cross_entropy_gap <= 0:
        caption += f" {_NEGATIVE_GAP.format(m.cross_entropy_gap)}"
        doc.para(_NEGATIVE_GAP.format(m.cross_entropy_gap))
    _figure(doc, figures, plots.bounds_vs_gap(labels, [*b.cross_entropy_log10, b.top1.log10],
                                              m.cross_entropy_gap, out / "bounds_vs_gap.png"),
            caption)
    doc.heading("Margins")
    _figure(doc, figures, plots.margins_histogram(b.train_margins, b.test_margins,
                                                  b.top1.gamma, out / "margins.png"),
            "Margins R(x)_y - max_{c != y} R(x)_c on train and test.")
    doc.heading("Average-case vs worst-case path-norm (thesis Sec. 7.2.2)")
    doc.para(f"E_x ||A(theta,x)^T Phi(theta)||_1 over {avg.n_samples} test inputs = "
             f"{avg.mean:.4g} +- {avg.std_error:.2g} (standard error), against the worst case "
             f"||Phi||_1 = {_fmt(report.path_norm_log10[1.0])}: {avg.gap_log10:.1f} orders of "
             "magnitude smaller. The average case is rescaling-invariant and never exceeds "
             "||Phi||_1.")
    _figure(doc, figures, plots.average_vs_worst(avg.per_output_mean,
                                                 report.worst_per_output_log10,
                                                 out / "average_vs_worst.png"),
            "Per output neuron: average case vs worst case (log scale).")


def _pruning(doc: Document, report: Report, out: Path, figures: list[Path]) -> None:
    doc.heading("Pruning summary (thesis Sec. 3.5)")
    doc.table(["criterion", "pruned", "test acc.", "log10 ||Phi||_1", "log10 bound (CE)",
               "log10 certified output change / max(1,||x||_inf)"],
              [(r["criterion"], f"{r['sparsity']:.2f}", f"{r['accuracy']:.3f}",
                f"{r['path_norm_log10']:.2f}", f"{r['bound_log10']:.2f}",
                _certificate(r["certificate_log10"])) for r in report.pruning])
    doc.para("One-shot global pruning without retraining. Pruning only lowers ||Phi||_1, so "
             "it lowers the bound; the certificate is the exact path-metric of Lemma 3.4.1.")
    _figure(doc, figures, plots.pruning_curves(report.pruning, out / "pruning.png"),
            "Test accuracy and l1 path-norm against the fraction pruned.")


_NEGATIVE_GAP = ("The measured cross-entropy gap is {:.4f} <= 0 (the test loss is not above "
                 "the training loss): a log10 axis cannot show it, and no bound is compared "
                 "with it in orders of magnitude.")


def _orders(value: float) -> str:
    """Orders of magnitude above the measured gap; none when the gap is <= 0."""
    return "n/a (gap <= 0)" if math.isnan(value) else f"{value:.1f}"


def _certificate(log10: float) -> str:
    return "0 (nothing pruned)" if math.isinf(log10) and log10 < 0 else f"{log10:.2f}"
