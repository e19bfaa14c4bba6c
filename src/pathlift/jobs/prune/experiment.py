"""The ``pathlift prune`` job: a model and data by name through the prune-rewind-retrain
protocol (thesis Sec. 3.5.2), with its results folder and figure."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from pathlift.data import load_data, loaders
from pathlift.data.training import reproducible
from pathlift.distributed import World, launched
from pathlift.errors import ShapeError
from pathlift.files import refuse_replacing
from pathlift.graph import graph_of, writable_copy
from pathlift.graph.outputs import OutputKey, classifier_output, select_output
from pathlift.graph.structure import training_mode_ops
from pathlift.jobs import plots
from pathlift.jobs.prune.pipeline import SGDTraining, scatter
from pathlift.jobs.prune.protocol import Method, ProtocolResult, PruneConfig, prune_rewind_retrain
from pathlift.jobs.prune.results import ResultsFileError, RunFolder
from pathlift.jobs.sizing import Estimate, training_pace
from pathlift.memory import check_bytes
from pathlift.models import model_factory
from pathlift.prune.methods import layer_sparsity
from pathlift.prune.scores import prunable_parameters, refuse_parametrized
from pathlift.symmetry import random_rescale

__all__ = ["PruneExperiment", "prune_experiment"]

EVAL_NOTE = ("the model has BatchNorm or Dropout: it trains in training mode and is scored, "
             "pruned and measured in eval mode (BatchNorm as its affine map, Def. 2.2.2)")


@dataclass(frozen=True, repr=False)
class PruneExperiment:
    """What ``prune_experiment`` did: the protocol's result (None on ranks other than 0),
    where it wrote, the process count, a note when eval mode was used for scoring, and
    ``layer_sparsity``: for each (method, amount), the fraction pruned of each layer
    (``pathlift.prune.layer_sparsity``) by the mask chosen on seed 0's trained network,
    not rescaled (that run's mask when ``rounds`` is 1; its first round's otherwise)."""

    result: ProtocolResult | None
    folder: Path | None
    csv: Path | None
    plot: Path | None
    world_size: int
    eval_note: str | None
    layer_sparsity: dict[tuple[str, float], dict[str, float]] = field(default_factory=dict)

    def __repr__(self) -> str:
        runs = 0 if self.result is None else len(self.result.runs)
        return (f"PruneExperiment(runs={runs}, processes={self.world_size}, "
                f"folder={self.folder})")


def prune_experiment(model: str, data: str, config: PruneConfig,
                     out: str | Path | Callable[[], Path], *,
                     weights: str | None = None, input_shape: Sequence[int] | None = None,
                     test_fraction: float = 0.25, normalize: str = "none",
                     batch_size: int = 64, lr: float = 0.05, spread: str = "data",
                     save_models: bool = False, overwrite: bool = False,
                     output: OutputKey | None = None,
                     model_kwargs: Mapping[str, Any] | None = None,
                     on_progress: Callable[[str, int, int], None] | None = None,
                     on_estimate: Callable[[str], None] | None = None) -> PruneExperiment:
    """Train ``model`` (a name, import path or checkpoint: ``pathlift.models.model_factory``)
    on ``data`` (``pathlift.data.load_data``), prune it with every method of ``config``,
    rewind and retrain (thesis Sec. 3.5.2, App. E.1), under torchrun on every process.
    ``model_kwargs``: constructor arguments of a model given by name (recorded in the
    folder's manifest: a resumed run must share them).

    Rank 0 writes ``out``/runs.csv (resumed when it holds runs of the same settings), the
    dense weights and ``out``/summary.png (accuracy against the pruning level, the
    magnitude / Path-Mag scatter of Figure 3.8 without and with a random rescale, and the
    mask overlaps of Table 3.1). ``out`` may be a callable creating a new folder: it is
    called once the model and the data have been checked, and the folder is removed if the
    run then fails before writing a result, so a refused run leaves no folder (only the
    files the run wrote are removed, then its folders once empty: anything put there
    meanwhile stays), on an error, Ctrl-C or ``SIGTERM`` (exit status 143). An existing
    ``out`` that is not a run folder to resume (no manifest.json) but holds a summary.png
    is refused unless ``overwrite``. A finished
    folder that cannot be written is read back (its summary.png kept as it is).

    Sized before any training: the seeds' dense networks and the grid's runs held in
    memory against the memory limit (``_check_memory``), then the trainings left to do (a
    resumed folder's done runs not counted) against the time limit, the estimate's line
    given to ``on_estimate`` first (on rank 0).

    Raises:
        ShapeError: the model's outputs do not match the data's classes (a model returning
            several tensors needs ``output``: the position or key of its logits).
        UnsupportedModelError: the model cannot be pruned (a layer called twice...):
            refused before any training.
        InvalidParameterError: unknown model, data, method or spread.
        OutputExistsError: ``out`` holds a summary.png of something else (``overwrite``).
    """
    with launched() as world:
        split = load_data(data, input_shape=input_shape, test_fraction=test_fraction,
                          normalize=normalize)
        make = _selected(model_factory(model, split.num_classes, weights, model_kwargs), output,
                         split.input_shape)
        probe = make().eval()  # a fresh copy: the protocol scores in eval mode too
        graph = graph_of(probe, split.input_shape)
        note = EVAL_NOTE if training_mode_ops(graph) else None
        if len(graph.outputs()) != 1:  # several tensors: which holds the logits
            classifier_output(graph, split.num_classes, data)
        if graph.d_out != split.num_classes:
            raise ShapeError(f"{model} has {graph.d_out} outputs, {data} has "
                             f"{split.num_classes} classes")
        refuse_parametrized(prunable_parameters(graph), graph)  # before any training
        _check_memory(probe, config)  # before the grid of runs is spelt out
        scatter(probe, split.input_shape)  # the figure's scores: refused now, not after
        if world.main and not callable(out) and not os.path.lexists(Path(out) / "manifest.json"):
            refuse_replacing(out, ("summary.png",), overwrite)  # not a resume: the user's
        train, test = loaders(split, batch_size=batch_size, seed=0)
        training = SGDTraining(train, test, lr)
        sizing = _sizing(make, split.input_shape, split.num_classes, len(train.dataset),
                         batch_size, config, world, on_estimate)
        folder = (RunFolder(out(), fresh=True) if callable(out) else RunFolder(out)) \
            if world.main else None
        with reproducible(), _terminate_as_exit():
            result = prune_rewind_retrain(make, split.input_shape, training.train,
                                          training.evaluate, config, spread=spread,
                                          folder=folder, save_models=save_models,
                                          on_progress=on_progress,
                                          before_training=sizing,
                                          settings={"model_kwargs": dict(model_kwargs)}
                                          if model_kwargs else None)
        if not world.main:
            return PruneExperiment(None, None, None, None, world.size, note)
        trained = make()
        states = folder.load_dense(config.seeds[0], trained.state_dict())
        if states is None:  # every run was finished, then the weights were deleted
            raise ResultsFileError(
                f"'{folder.dense_path(config.seeds[0])}' (or its rewind file) is missing: the "
                f"runs of seed {config.seeds[0]} are finished but the summary plot needs "
                "their dense network; restore the file, or delete that seed's lines from "
                f"'{folder.csv}' to train it again")
        trained.load_state_dict(states.trained)
        trained.eval()
        rescaled = random_rescale(trained, config.rescale_factors, 0, split.input_shape)
        scatters = {False: scatter(trained, split.input_shape),
                    True: scatter(rescaled, split.input_shape)}
        sparsity = {(m.name, a): _layer_sparsity(trained, m, split.input_shape, a, config)
                    for m in config.methods for a in config.amounts}
    png = folder.path / "summary.png"
    if folder.writable or not png.is_file():
        plots.pruning_experiment(result, png, f"{model} on {data}, {len(config.seeds)} "
                                 f"seeds, {world.size} process(es)", scatters)
    return PruneExperiment(result, folder.path, folder.csv, png, world.size, note, sparsity)


#: what one run of the grid holds in memory while the protocol runs (its key, its row and
#: its result: a few Python objects), an upper bound
RUN_BYTES = 1024


def _check_memory(model: nn.Module, config: PruneConfig) -> None:
    """Refuse (``MemoryLimitError``) the seeds' dense networks (trained, rewind and working
    copies of ``model``'s state) and the grid's runs (``RUN_BYTES`` each) over the memory
    limit, before either is made: ``--seeds 100000000`` once held 12 GB, silent, before
    any check."""
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    seeds = len(config.seeds)
    runs = seeds * len(config.rescaled) * len(config.amounts) * len(config.methods)
    check_bytes(3 * seeds * held + runs * RUN_BYTES,
                f"prune's {seeds:,} seeds' dense networks (trained, rewind and working copies) "
                f"and {runs:,} runs", "use fewer --seeds, --amount values or --method names, or ")


def _sizing(make: Callable[[], nn.Module], shape: Sequence[int], classes: int, samples: int,
            batch_size: int, config: PruneConfig, world: World,
            on_estimate: Callable[[str], None] | None) -> Callable[[int, int], None]:
    """The protocol's ``before_training``: refuse the ``dense`` trainings and ``runs`` left
    over the time limit, estimated as their epochs x
    ``samples`` at the pace of SGD steps of ``make()`` timed on rank 0 now
    (``training_pace``; scoring and evaluation come on top)."""
    def size(dense: int, runs: int) -> None:
        if not dense + runs:
            return
        epochs = dense * config.epochs + runs * config.rounds * (config.epochs
                                                                 - config.rewind_epoch)
        pace = world.broadcast(training_pace(make, shape, batch_size, classes)
                               if world.main else None)
        processes = f" over {world.size} processes" if world.size > 1 else ""
        estimate = Estimate(
            f"{dense} dense training(s) and {runs} run(s) of {config.rounds} round(s), "
            f"{epochs:,} epochs of {samples:,} samples", epochs * samples * pace / world.size,
            f"at {pace * 1e6:.3g} us a sample (SGD steps of {batch_size} timed on this "
            f"machine{processes}; scoring and evaluation on top)", at_least=True)
        if on_estimate is not None and world.main:
            on_estimate(estimate.line())
        estimate.check(f"prune's {dense + runs:,} trainings", "fewer --seeds, --amount values, "
                       "--method names, --rounds or --epochs")
    return size


@contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """While the protocol runs (in the main thread, where ``SIGTERM`` still has its
    default action): ``SIGTERM`` raises ``SystemExit(143)``, so that the run folder is
    closed as after Ctrl-C (only this run's own files removed when it wrote no result)
    instead of the process vanishing mid-way."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _selected(make: Callable[[], nn.Module], output: OutputKey | None,
              shape: Sequence[int]) -> Callable[[], nn.Module]:
    """``make``, or, with ``output``, a factory of ``make()`` returning only that output
    (``select_output``, the key checked once against the traced model)."""
    if output is None:
        return make
    select_output(make(), output, tuple(shape))
    return lambda: select_output(make(), output)


def _layer_sparsity(trained: nn.Module, method: Method, shape: Sequence[int], amount: float,
                    config: PruneConfig) -> dict[str, float]:
    """Per-layer sparsity of ``method``'s mask at ``amount`` on a copy of ``trained``
    (one round of the protocol: ``amount`` spread over ``config.rounds``)."""
    copy = writable_copy(trained).eval()
    per_round = 1.0 - (1.0 - amount) ** (1.0 / config.rounds)
    method.prune(copy, shape, per_round, config.last_layer_factor)
    return layer_sparsity(copy)
