"""``pathlift quantize`` as one call: plain and symmetry-aware quantisation towards zero at
several bit widths, judged on a data split or on Gaussian inputs, optionally after a random
rescaling, with its rows appended to a CSV."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from pathlift.bounds.symmetry_aware import QuantReport, compare
from pathlift.data import Split
from pathlift.errors import ShapeError, check_count
from pathlift.files import append_rows, check_appendable
from pathlift.graph import graph_of
from pathlift.graph.outputs import classifier_output
from pathlift.memory import check_samples
from pathlift.symmetry import random_rescale

__all__ = ["QuantComparison", "compare_bits"]


@dataclass(frozen=True, repr=False)
class QuantComparison:
    """The rows of ``compare_bits`` (each bit width: plain, then symmetry-aware if asked),
    how many inputs judged them, and the CSV they were appended to (if any)."""

    reports: tuple[QuantReport, ...]
    inputs: int
    csv: Path | None
    note: str | None = None

    def __repr__(self) -> str:
        worst = max((r.relative for r in self.reports), default=float("nan"))
        return (f"QuantComparison({len(self.reports)} rows, bits "
                f"{sorted({r.bits for r in self.reports})}, {self.inputs} inputs, largest "
                f"d/||Phi||_1 {worst:.4f})")


def compare_bits(model: nn.Module, input_shape: Sequence[int], bits: Sequence[int], *,
                 data: Split | None = None, samples: int = 64,
                 rescale_seed: int | None = None, per_channel: bool = False,
                 symmetry_aware: bool = False, csv: str | Path | None = None,
                 name: str = "") -> QuantComparison:
    """``compare`` at each of ``bits`` (thesis Lemma 3.4.1, Cor. 3.4.1).

    Judged on the test split of ``data`` (with accuracy), else on ``samples`` N(0, 1)
    inputs (seed 0). With ``rescale_seed``, the model is first replaced by
    ``random_rescale(model, seed=rescale_seed)`` (the given model is not modified). With
    ``csv``, one row per report is appended, with the columns model (``name``),
    random_rescale and per_channel first. Accuracy needs one logit per class of ``data``:
    for another output (several tensors, a U-Net's mask) it is left out and ``note``
    says why; the certificates hold for every output.
    """
    samples = check_count("samples", samples)
    if csv is not None:
        check_appendable(csv)  # a CSV that cannot take the rows is refused before any work
    note = None
    if data is not None:
        inputs, labels = data.test.tensors
        try:
            classifier_output(graph_of(model, input_shape), data.num_classes)
        except ShapeError:
            labels, note = None, (
                "accuracy left out: the model does not return one logit for each of the "
                f"{data.num_classes} classes of the data (the certificates hold for every "
                "output)")
    else:
        check_samples(samples, input_shape, "quantisation", 4)
        inputs, labels = torch.randn((samples, *input_shape),
                                     generator=torch.Generator().manual_seed(0)), None
    if rescale_seed is not None:
        model = random_rescale(model, seed=rescale_seed, input_shape=input_shape)
    reports = tuple(r for b in bits for r in compare(model, input_shape, b, inputs, labels,
                                                     per_channel=per_channel,
                                                     symmetry_aware=symmetry_aware))
    if csv is not None:
        append_csv(csv, reports, model=name, random_rescale=rescale_seed,
                   per_channel=per_channel)
    return QuantComparison(reports, len(inputs), None if csv is None else Path(csv), note)


def append_csv(path: str | Path, reports: Sequence[QuantReport], **context: object) -> None:
    """Append one row per report (``context`` columns first) to a CSV, header if new (the
    file replaced atomically: a kill leaves the previous rows)."""
    names = [*context, *(f.name for f in fields(QuantReport))]
    append_rows(path, names, ([*context.values(), *asdict(report).values()]
                              for report in reports))
