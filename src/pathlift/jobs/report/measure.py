"""The report's numbers: a model (trained first if asked) measured end to end into a
``Report``, a plain data object that ``pathlift.jobs.report.render`` turns into pages."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pathlift import __version__
from pathlift.bounds import (
    ArchitectureConstants,
    GeneralizationBounds,
    architecture_constants,
    cross_entropy_gap_log10,
    generalization_bounds,
    loss_accuracy,
    peeling_constant,
    rademacher_peeling,
    sharpened_constant,
    sigma_from_loader,
)
from pathlift.bounds.compression import CompressionSearch, compression_bound
from pathlift.data import Split, loaders
from pathlift.data.training import train_classifier
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph import copy_model, eval_mode, graph_of, writable_copy
from pathlift.graph.outputs import classifier_output
from pathlift.graph.structure import training_mode_ops
from pathlift.jobs.prune.pipeline import data_digest
from pathlift.jobs.report.certificate import REPORT_RECIPE, certified_network, surrogate_epochs
from pathlift.jobs.sizing import Estimate, matmul_pace, training_pace
from pathlift.lift import AverageCasePathNorm, average_case_path_norm, path_norm
from pathlift.memory import check_bytes
from pathlift.prune import prune_model
from pathlift.track import PathNormTracker
from pathlift.train.recipes import compact_model

__all__ = ["DEFAULT_EPOCHS", "QS", "Report", "measure_report", "report_estimate"]

QS = (1.0, 2.0, 4.0)
DEFAULT_EPOCHS = 30
PRUNE_AMOUNTS = (0.0, 0.2, 0.5, 0.8, 0.9)
# the report's compression certificate: the network as trained, steps searched
REPORT_SEARCH = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                                  offsets=(2, 4, 6, 8, 10, 12), refine=1)
EVAL_NOTE = ("BatchNorm/Dropout layers: trained in training mode, measured in eval mode "
             "(BatchNorm as its affine map with the running statistics, Def. 2.2.2)")


@dataclass(frozen=True)
class Provenance:
    """What a report's numbers come from: the versions of pathlift, torch and Python, the
    seed, the start of the sha256 of the training and test data (``data_digest``: each
    TensorDataset's tensors), and the seconds of the whole ``run_report`` call up to
    writing its pages (``command_seconds``; None when only ``measure_report`` ran)."""

    pathlift: str
    torch: str
    python: str
    seed: int
    data_digest: tuple[str, str] | None
    command_seconds: float | None = None

    def sentence(self) -> str:
        data = "no data" if self.data_digest is None else \
            f"data sha256 {self.data_digest[0]} (train), {self.data_digest[1]} (test)"
        return (f"pathlift {self.pathlift}, torch {self.torch}, Python {self.python}; seed "
                f"{self.seed}; {data}")


def provenance(seed: int, train: Any = None, test: Any = None) -> Provenance:
    """The ``Provenance`` of a measurement now (loaders ``train``, ``test`` or None)."""
    import platform


    digest = None if train is None else (data_digest(train), data_digest(test))
    return Provenance(__version__, torch.__version__, platform.python_version(), seed, digest)


@dataclass(frozen=True, repr=False)
class Report:
    """Everything ``pathlift report`` measured, before any rendering.

    ``constants`` and the C of Thm 4.4.1 (``sharpened`` of Remark 4.4.1 when it applies);
    ``path_norm_log10``: q -> log10 ||Phi||_q (Thm 3.1.1); ``history``: one dict per epoch
    when it trained; ``bounds``: the generalisation bounds and the measured gap
    (``generalization_bounds``), ``average_case`` (Sec. 7.2.2) and ``pruning`` (one row
    per criterion and level: sparsity, accuracy, log10 ||Phi||_1, log10 bound, log10
    certificate of Lemma 3.4.1) when data was given, with ``compression`` (the Occam
    certificate of ``pathlift.bounds.compression`` for the trained network, as
    ``CompressionBound.summary()``) and ``certified`` (a network trained by the recipe
    and certified, and the model certified through it by the disagreement route:
    ``pathlift.jobs.report.certificate.certified_network``); ``samples_needed_log10``:
    without data, log10 of the n above which the cross-entropy bound drops below 1;
    ``provenance``: versions, seed, data digest and the whole command's seconds.
    ``to_dict()`` is what ``report.json`` holds.
    """

    title: str
    input_shape: tuple[int, ...]
    data: str | None
    epochs: int
    seed: int
    constants: ArchitectureConstants
    peeling_constant: float
    sharpened_constant: float | None
    path_norm_log10: dict[float, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    bounds: GeneralizationBounds | None = None
    average_case: AverageCasePathNorm | None = None
    worst_per_output_log10: tuple[float, ...] = ()
    pruning: list[dict[str, Any]] = field(default_factory=list)
    compression: dict[str, Any] | None = None
    certified: dict[str, Any] | None = None
    samples_needed_log10: float | None = None
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    provenance: Provenance | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON values (nested dataclasses as dicts, q keys as strings)."""
        out = dataclasses.asdict(self)
        out["path_norm_log10"] = {f"{q:g}": v for q, v in self.path_norm_log10.items()}
        return out

    def __repr__(self) -> str:
        gap = "" if self.bounds is None else \
            f", log10 CE bound={self.bounds.cross_entropy_log10[0]:.2f}, measured gap=" \
            f"{self.bounds.measured.cross_entropy_gap:.4f}"
        return (f"Report({self.title!r}, input_shape={self.input_shape}, epochs={self.epochs},"
                f" log10 ||Phi||_1={self.path_norm_log10[1.0]:.3f}{gap})")


class _Evaluation:
    """Callback: eval-mode train/test cross-entropy and accuracy (flags restored after)."""

    def __init__(self, train: Any, test: Any):
        self.loaders = {"train": train, "test": test}

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        with eval_mode(model):
            for split, loader in self.loaders.items():
                logs[f"eval_{split}_loss"], logs[f"eval_{split}_accuracy"] = \
                    loss_accuracy(model, loader)


def measure_report(model: nn.Module, input_shape: Sequence[int], data: Split | None = None,
                   *, epochs: int = 0, title: str = "model", data_name: str | None = None,
                   seed: int = 0, samples: int = 512, batch_size: int = 64,
                   progress: bool = False, on_estimate: Callable[[str], None] | None = None,
                   ) -> tuple[Report, nn.Module]:
    """Measure ``model`` (a copy, trained ``epochs`` epochs on ``data`` first when > 0):
    returns the ``Report`` and the measured model. ``model`` itself is not modified.

    Sized before any training (``report_estimate``): refused over the memory limit, then
    its estimate's line given to ``on_estimate`` and refused over the time limit
    (``WorkLimitError``, ``MemoryLimitError``).

    Without ``data`` only the data-free sections are measured. The model is measured in
    eval mode (BatchNorm as its affine map, Def. 2.2.2), which ``Report.notes`` says when it
    matters.
    """
    start = time.perf_counter()
    shape = tuple(int(s) for s in input_shape)
    if epochs < 0 or samples < 1:
        raise InvalidParameterError(f"need epochs >= 0 and samples >= 1, got {epochs}, "
                                    f"{samples}")
    if data is not None and tuple(data.input_shape) != shape:
        raise ShapeError(f"the data's inputs have shape {data.input_shape}, the model expects "
                         f"{shape}: give --input-shape, or data of that shape")
    if epochs and data is None:
        raise InvalidParameterError("training (epochs > 0) needs data")
    if data is not None:  # refused before training
        with eval_mode(model):
            classifier_output(graph_of(model, shape), data.num_classes)
    estimate = report_estimate(model, shape, data, epochs, batch_size)
    if on_estimate is not None:
        on_estimate(estimate.line())
    estimate.check(f"the report's {epochs:,} epochs of training and its certified network's "
                   "recipe", "fewer --epochs, a smaller --model or --data")
    net = copy_model(model)
    torch.manual_seed(seed)
    train, test = loaders(data, batch_size=batch_size, seed=seed) if data else (None, None)
    history = _train(net, shape, train, test, epochs, seed, progress) if epochs else []
    net.eval()
    graph = graph_of(net, shape)
    notes = (EVAL_NOTE,) if training_mode_ops(graph) else ()
    constants = architecture_constants(graph)
    norms = {q: path_norm(graph, q=q, r=q) for q in QS}  # ||Phi||_q, Table 7.2
    common = dict(title=title, input_shape=shape, data=data_name, epochs=epochs, seed=seed,
                  constants=constants, peeling_constant=peeling_constant(constants),
                  sharpened_constant=sharpened_constant(constants)
                  if constants.sharpened_applies else None,
                  path_norm_log10={q: n.log10 for q, n in norms.items()}, history=history,
                  worst_per_output_log10=norms[1.0].per_output_log10, notes=notes,
                  provenance=provenance(seed, train, test))
    if data is None:
        need = 2 * (math.log10(4 * math.sqrt(2) * common["peeling_constant"]) +
                    norms[1.0].log10)
        return Report(**common, samples_needed_log10=need,
                      seconds=time.perf_counter() - start), net
    bounds = generalization_bounds(net, shape, train, test)
    average = average_case_path_norm(net, shape, test, q=1.0, max_samples=samples)
    pruning = _pruning(net, shape, test, bounds)
    x, y = (torch.cat(t) for t in zip(*train, strict=True))
    compression = compression_bound(net, shape, x, y, search=REPORT_SEARCH).summary()
    test_x, test_y = data.test.tensors
    certified = certified_network(net, shape, x, y, test_x, data.num_classes, seed,
                                  test=(test_x, test_y))
    return Report(**common, bounds=bounds, average_case=average, pruning=pruning,
                  compression=compression, certified=certified,
                  seconds=time.perf_counter() - start), net


def report_estimate(model: nn.Module, shape: tuple[int, ...], data: Split | None, epochs: int,
                    batch_size: int) -> Estimate:
    """``measure_report``'s work sized before it starts, after refusing the copies of
    ``model`` it holds (the trained copy, its gradients and momentum, a pruned copy) over the
    memory limit: a lower bound of its time, ``epochs`` x the training samples at the pace
    of SGD steps of ``model`` timed on this machine (``training_pace``), and with data the
    certified network's recipe (``REPORT_RECIPE``: ``surrogate_epochs(n)`` and half as many
    epochs of its compact network) at its own pace; without data, the path-norm passes
    (one a q, ``QS``) at this machine's float64 multiply-add pace (``matmul_pace``).
    Measuring (bounds, pruning levels, certificates) comes on top."""
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    check_bytes(5 * held, "the report's copies of the model (trained, gradients, momentum, "
                "pruned)", "use a smaller --model, or ")
    if data is None:
        params = sum(p.numel() for p in model.parameters())
        pace = matmul_pace(torch.float64, threads=1)
        return Estimate(f"no training, {len(QS)} path-norm passes over {params:,} weights",
                        len(QS) * params / pace, f"at {pace / 1e9:.3g} G multiply-adds a "
                        "second (timed on this machine; tracing and constants on top)",
                        at_least=True)
    n, classes = len(data.train), data.num_classes
    kind = REPORT_RECIPE[0]
    recipe = surrogate_epochs(n) + max(surrogate_epochs(n) // 2, 1)
    own = training_pace(lambda: copy_model(model), shape, batch_size, classes) if epochs else 0.0
    theirs = training_pace(lambda: compact_model(kind, shape, classes), shape, 64, classes)
    return Estimate(f"{epochs:,} epoch(s) of training and {recipe} of the certified network "
                    f"({kind}), on {n:,} samples", n * (epochs * own + recipe * theirs),
                    f"at {own * 1e6:.3g} and {theirs * 1e6:.3g} us a sample (SGD steps timed on "
                    "this machine; bounds, pruning and certificates on top)", at_least=True)


def _train(net: nn.Module, shape: tuple[int, ...], train: Any, test: Any, epochs: int,
           seed: int, progress: bool) -> list[dict[str, Any]]:
    probe = torch.cat([x for x, _ in test])[:64]
    sigma = sigma_from_loader(train)
    # the report plots path-norms and accuracy only: no sparsity passes per epoch
    tracker = PathNormTracker(shape, probe, sigma.n, sigma.peeling, QS, sparsity=False)
    evaluation = _Evaluation(train, test)
    init: dict[str, Any] = {"epoch": 0}
    evaluation.on_epoch_end(net, 0, init)
    tracker.on_epoch_end(net, 0, init)
    train_classifier(net, train, epochs=epochs, lr=0.05, momentum=0.9,
                     callbacks=(evaluation, tracker), progress=progress, seed=seed)
    return tracker.history


def _pruning(net: nn.Module, shape: tuple[int, ...], test: Any,
             bounds: GeneralizationBounds) -> list[dict[str, Any]]:
    """One-shot global pruning of copies at each level: accuracy, ||Phi||_1, the bound of
    Thm 4.4.1 + 4.1.1 and the exact output-change certificate of Lemma 3.4.1."""
    rows = []
    for criterion in ("path-magnitude", "magnitude"):
        for amount in PRUNE_AMOUNTS:
            pruned = writable_copy(net)
            result = prune_model(pruned, shape, amount, criterion=criterion, scope="global")
            l1 = path_norm(pruned, shape).log10
            bound = rademacher_peeling(bounds.constants, bounds.sigma.peeling, l1)
            rows.append({"criterion": criterion, "sparsity": result.sparsity,
                         "accuracy": loss_accuracy(pruned, test)[1], "path_norm_log10": l1,
                         "bound_log10": cross_entropy_gap_log10(bound, bounds.n_train),
                         "certificate_log10": result.log10_path_metric})
    return rows
