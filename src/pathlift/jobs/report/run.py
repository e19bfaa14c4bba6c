"""``pathlift report``: measure a network end to end (``measure_report``), then write
report.md, report.html, the PNGs (``render_report``) and report.json beside them.

Default: ``small_cnn`` trained on the embedded digits while tracking path-norms. With your
model (a name, import path, checkpoint or ``nn.Module``) and your data (any
``pathlift.data.load_data`` spec or a ``Split``), the model is measured as it is, trained
first only when ``epochs`` > 0.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pathlift.bounds import ArchitectureConstants
from pathlift.data import Split, load_data
from pathlift.data.training import reproducible
from pathlift.errors import ShapeError
from pathlift.files import refuse_replacing, write_json
from pathlift.graph.outputs import OutputKey, select_output
from pathlift.jobs.report.measure import DEFAULT_EPOCHS, Report, measure_report
from pathlift.jobs.report.render import render_report
from pathlift.models import load_model, small_cnn

__all__ = ["REPORT_FILES", "ReportResult", "run_report"]

#: every file ``run_report`` may write into its folder (``render_report``'s pages and
#: figures, report.json): one already there is refused unless ``overwrite``
REPORT_FILES = ("report.md", "report.html", "report.json", "path_norms_during_training.png",
                "accuracy_during_training.png", "bound_during_training.png",
                "bounds_vs_gap.png", "margins.png", "average_vs_worst.png", "pruning.png")


@dataclass(frozen=True, repr=False)
class ReportResult:
    """The measured ``report``, the reported (trained) model, and where the files went."""

    report: Report
    model: nn.Module
    out_dir: Path
    markdown: Path
    html: Path
    json: Path
    plots: tuple[Path, ...]

    @property
    def seconds(self) -> float:
        """The whole ``run_report`` call up to writing the pages (measuring alone:
        ``report.seconds``)."""
        return self.report.provenance.command_seconds

    @property
    def constants(self) -> ArchitectureConstants:
        return self.report.constants

    @property
    def path_norm_log10(self) -> dict[float, float]:
        return self.report.path_norm_log10

    @property
    def test_accuracy(self) -> float | None:
        return None if self.report.bounds is None else self.report.bounds.measured.test_accuracy

    @property
    def bound_ce_log10(self) -> float | None:
        return None if self.report.bounds is None else self.report.bounds.cross_entropy_log10[0]

    @property
    def measured_ce_gap(self) -> float | None:
        bounds = self.report.bounds
        return None if bounds is None else bounds.measured.cross_entropy_gap

    def __repr__(self) -> str:
        return f"ReportResult({self.report!r}, markdown={str(self.markdown)!r})"


def run_report(out_dir: str | Path = "report", model: str | nn.Module | None = None,
               input_shape: Sequence[int] | None = None, data: str | Split | None = None,
               epochs: int | None = None, seed: int = 0, samples: int = 512,
               progress: bool = True, *, weights: str | None = None,
               test_fraction: float = 0.25, normalize: str = "none",
               batch_size: int = 64, outputs: OutputKey | None = None,
               overwrite: bool = False, model_kwargs: Mapping[str, Any] | None = None,
               on_estimate: Callable[[str], None] | None = None) -> ReportResult:
    """Measure a model, then write ``out_dir``/report.md, report.html, report.json and PNGs.

    Args:
        model: None (``small_cnn`` trained ``epochs``, default 30, on the digits), a model
            spec as ``pathlift.models.load_model`` takes it (with ``weights``), or an
            ``nn.Module`` (never modified; a copy is trained).
        input_shape: the model's input shape (default: from the checkpoint, the factory,
            or the data).
        data: a ``pathlift.data.load_data`` spec (split by ``test_fraction``, normalised by
            ``normalize``) or a ``Split``; the data-dependent sections need it.
        epochs: training epochs before measuring (default 0 with a model: measured as is).
        outputs: for a model returning several tensors, the one holding the class logits
            (a position or a key, ``pathlift.graph.outputs.select_output``): trained on and
            measured.
        model_kwargs: constructor arguments of a model given by name (a checkpoint file
            holds its own).
        overwrite: replace the files of ``REPORT_FILES`` already in ``out_dir``; without
            it such a folder is refused (``OutputExistsError``) before anything is measured.
        on_estimate: given the line of the work's estimate before any training
            (``measure_report``; refused over the time or memory limit).

    Runs torch single-threaded and deterministic (``pathlift.data.training.reproducible``,
    restored afterwards), and the caller's global RNG state is restored too.

    Example:
        >>> result = run_report("out", model="mymodels:relu_mlp", data="mydata.npz")
        >>> result.report.bounds
    """
    started = time.perf_counter()
    refuse_replacing(out_dir, REPORT_FILES, overwrite)
    with reproducible(), torch.random.fork_rng(devices=[]):  # caller's RNG state kept
        torch.manual_seed(seed)
        if isinstance(data, str):
            data, data_name = load_data(data, input_shape=input_shape,
                                        test_fraction=test_fraction, normalize=normalize,
                                        seed=seed), data
        else:
            data_name = None if data is None else "given Split"
        if model is None:
            net, shape, title = small_cnn(), (1, 8, 8), "small_cnn"
            data, data_name = (data, data_name) if data else (load_data("digits", seed=seed),
                                                              "digits")
            epochs = DEFAULT_EPOCHS if epochs is None else epochs
        else:
            net, shape = _model(model, input_shape, weights, data, model_kwargs)
            title = type(model).__name__ if isinstance(model, nn.Module) else str(model)
        net = select_output(net, outputs, shape)
        report, measured = measure_report(
            net, shape, data, epochs=epochs or 0, title=title, data_name=data_name, seed=seed,
            samples=samples, batch_size=batch_size, progress=progress,
            on_estimate=on_estimate)
    out = Path(out_dir)
    markdown, html, plots, total = render_report(report, out, started)
    report = dataclasses.replace(report, provenance=dataclasses.replace(
        report.provenance, command_seconds=total))
    path = write_json(out / "report.json", report.to_dict())
    return ReportResult(report, measured, out, markdown, html, path, plots)


def _model(model: str | nn.Module, input_shape: Sequence[int] | None, weights: str | None,
           data: Split | None, model_kwargs: Mapping[str, Any] | None = None
           ) -> tuple[nn.Module, tuple[int, ...]]:
    """The model and its input shape: given, else the checkpoint's, else the data's, else
    the architecture's (``load_model``'s order)."""
    shape = None if input_shape is None else tuple(input_shape)
    if isinstance(model, nn.Module):
        shape = shape or (data.input_shape if data else None)
        if shape is None:
            raise ShapeError("give input_shape (or data) with an nn.Module")
        return model, shape
    return load_model(model, shape, weights, data_shape=data.input_shape if data else None,
                      model_kwargs=model_kwargs)
