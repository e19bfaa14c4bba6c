"""Train -> (random rescale) -> prune -> rewind -> retrain -> evaluate, with your own
training, on one process or many (thesis Sec. 3.5.2, Appendix E.1).

The protocol of the thesis' Appendix E.1 (the lottery-ticket protocol of Frankle et al.):
train the dense network for ``epochs`` epochs, keeping its weights after ``rewind_epoch``
epochs; optionally rescale the trained weights at random (every hidden neuron times a
factor drawn from {1, 128, 4096}, Appendix E.1.2: the mask is then chosen on the rescaled
network, as Bob does in the thesis' Figure 3.6b); prune with each method; rewind the
surviving weights to their early values; retrain for the remaining epochs; evaluate.
With ``rounds > 1`` prune-rewind-retrain repeats, each round pruning the same fraction of
what is left (iterative pruning with rewinding).

Training and evaluation are yours: ``train(model, epochs, phase)`` and
``evaluate(model) -> float``. ``pathlift.jobs.prune.pipeline.SGDTraining`` is the digits
default. Under ``torchrun`` (``pathlift.distributed``), ``spread="data"`` runs every
training with DistributedDataParallel over the world: rank 0 chooses each mask and
broadcasts it, and every rank checks, by an all-reduced hash, that it holds the same
masks, rewind weights, trained weights and accuracies (``DistributedError`` if not).
``spread="runs"`` instead gives the independent runs of the grid to the ranks, one run
per rank at a time, each trained on its own process: for models small enough that one
process trains them well. Only rank 0 writes (``RunFolder``). The caller's models are
never modified.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler

from pathlift import __version__
from pathlift.distributed import World, ddp, fingerprint, shard
from pathlift.errors import InvalidParameterError
from pathlift.graph import copy_model, graph_of, unwrap
from pathlift.graph.boundary import attach_masks_, cpu_state, prune_masks
from pathlift.graph.input_shape import as_input_shape
from pathlift.jobs.prune.results import DenseStates, RunFolder, RunKey, RunRecord
from pathlift.prune.methods import Criterion, PruningResult, Scope, ScoreFunction, prune_model
from pathlift.symmetry.rescale import random_rescale

__all__ = ["METHODS", "Method", "Phase", "ProtocolResult", "PruneConfig", "check_prunable",
           "manifest",
           "mask_overlap", "prune_rewind_retrain"]

METHODS = ("magnitude-global", "magnitude-layerwise", "path-magnitude-global",
           "path-magnitude-layerwise")
Spread = Literal["data", "runs"]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Method:
    """A pruning method of the protocol: ``prune_model`` with a criterion and a scope.

    Args:
        name: the name written in the results.
        criterion: "magnitude", "path-magnitude" (thesis Sec. 3.5.1) or your own
            ``ScoreFunction`` ``(model, input_shape) -> scores``, smallest pruned.
        scope: "global" ranks every layer together; "layerwise" prunes the fraction of
            each layer, ``last_layer_factor`` times it of the last (thesis App. E.1).
        steps: prune in that many equal steps, re-scoring after each.

    Example::

        def squared(model, input_shape):             # your criterion: theta_i ** 2
            scores = magnitude_scores(model, input_shape)
            return {name: s ** 2 for name, s in scores.tensors.items()}

        PruneConfig(methods=("path-magnitude-global", Method("squared-global", squared)))
    """

    name: str
    criterion: Criterion | ScoreFunction = "path-magnitude"
    scope: Scope = "global"
    steps: int = 1

    @classmethod
    def named(cls, name: str) -> Method:
        """One of ``METHODS``: "<criterion>-<scope>"."""
        if name not in METHODS:
            raise InvalidParameterError(f"unknown method {name!r}; use one of {METHODS} or a "
                                        "pathlift.jobs.prune.Method with your score function")
        criterion, _, scope = name.rpartition("-")
        return cls(name, criterion, scope)  # type: ignore[arg-type]

    @property
    def reference(self) -> Method:
        """Magnitude pruning at the same scope: what ``overlap`` compares masks with."""
        return Method(f"magnitude-{self.scope}", "magnitude", self.scope)

    def prune(self, model: nn.Module, input_shape: Sequence[int], amount: float,
              last_layer_factor: float = 1.0) -> PruningResult:
        """Prune ``amount`` of what is left of ``model``, IN PLACE (torch.nn.utils.prune)."""
        return prune_model(model, input_shape, amount, self.criterion, self.scope, self.steps,
                           last_layer_factor)


@dataclass(frozen=True)
class PruneConfig:
    """The grid and the protocol's settings (defaults: the digits experiment of the README).

    Runs: every seed x ``rescaled`` x amount x method. ``amounts`` are the fractions of
    the prunable coordinates pruned in the end (over all ``rounds``), as
    ``global_path_magnitude(model, shape, amount)`` prunes them: of all of them (global
    methods) or of each layer (layerwise). ``last_layer_factor=0.5`` is the thesis'
    convention instead (App. E.1: p% of each layer, p/2% of the last, and global methods
    the same total), which prunes less than ``amount`` of the weights. ``rescaled=(False,
    True)`` runs each also on the randomly rescaled trained network (factors
    ``rescale_factors``, thesis App. E.1.2). Methods are names of ``METHODS`` or
    ``Method`` objects; strings are resolved to ``Method`` here. A value repeated in
    ``amounts``, ``seeds`` or ``rescaled`` is kept once (its runs are computed once).
    """

    amounts: tuple[float, ...] = (0.4, 0.6, 0.8)
    methods: tuple[str | Method, ...] = METHODS
    seeds: tuple[int, ...] | range = (0, 1, 2)
    epochs: int = 30
    rewind_epoch: int = 2
    rounds: int = 1
    last_layer_factor: float = 1.0
    rescale_factors: tuple[float, ...] = (1.0, 128.0, 4096.0)
    rescaled: tuple[bool, ...] = (False, True)

    def __post_init__(self) -> None:
        methods = tuple(Method.named(m) if isinstance(m, str) else m for m in self.methods)
        object.__setattr__(self, "methods", methods)
        for name in ("amounts", "seeds", "rescaled"):  # a repeated value is one run
            values = getattr(self, name)  # a range (the CLI's seeds) repeats none, and is
            if not isinstance(values, range):  # sized before it is spelt out (prune_experiment)
                object.__setattr__(self, name, tuple(dict.fromkeys(values)))
        names = [m.name for m in methods]
        if len(set(names)) != len(names) or not names:
            raise InvalidParameterError(f"need at least one method, with distinct names: {names}")
        if not 0 < self.rewind_epoch < self.epochs:
            raise InvalidParameterError(
                f"need 0 < rewind_epoch < epochs, got {self.rewind_epoch}, {self.epochs}")
        if self.rounds < 1 or not self.amounts or not all(0.0 < a < 1.0 for a in self.amounts):
            raise InvalidParameterError("need rounds >= 1 and amounts in (0, 1)")
        if not self.seeds or not self.rescaled:
            raise InvalidParameterError("need at least one seed and one rescaled value")

    def grid(self) -> list[RunKey]:
        """Every run, in the order they are computed and written."""
        return [RunKey(s, r, a, m.name) for s in self.seeds for r in self.rescaled
                for a in self.amounts for m in self.methods]  # type: ignore[union-attr]

    def settings(self) -> dict[str, Any]:
        """The settings as JSON values (methods by name): what a resumed run must share."""
        out = asdict(self)
        out["methods"] = [m.name for m in self.methods]  # type: ignore[union-attr]
        out["seeds"] = list(self.seeds)
        return out


@dataclass(eq=False)
class Phase:
    """One call of your ``train(model, epochs, phase)``, and the helpers that make one loop
    right on one process and under DDP.

    - ``name``: "dense" (from initialisation) or "retrain" (after rewinding).
    - ``seed``: the run's seed, the same on every rank (model init, data order);
      ``rank_seed`` differs per rank, for dropout or augmentation.
    - ``start_epoch``: 0, or ``rewind_epoch`` when retraining: continue a learning-rate
      schedule from there; ``done``: the epochs over so far (from the dense start).
    - ``world``, ``distributed``: under DDP the model you get is wrapped in
      DistributedDataParallel, and ``loader(...)`` gives your loader over this rank's
      shard (``DistributedSampler``).

    Call ``end_epoch(e)`` after each epoch, or loop ``for epoch in phase.epochs(epochs)``:
    the protocol keeps the rewind weights there, and the samplers move to the next epoch.

    Example::

        def train(model, epochs, phase):
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            loader = phase.loader(train_loader)
            for epoch in phase.epochs(epochs):
                for x, y in loader:
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
    """

    name: str
    seed: int
    start_epoch: int
    world: World
    model: nn.Module
    rewind_epoch: int | None = None
    rewind_state: dict[str, Tensor] | None = field(default=None, init=False)
    done: int = field(default=0, init=False)
    _samplers: list[DistributedSampler] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.done = self.start_epoch

    @property
    def distributed(self) -> bool:
        return self.world.size > 1

    @property
    def rank_seed(self) -> int:
        return self.seed + self.world.rank

    def loader(self, loader: DataLoader) -> DataLoader:
        """``loader`` over this rank's shard under DDP (``pathlift.distributed.shard``,
        shuffled with ``seed``), else ``loader`` itself."""
        out = shard(loader, self.world, self.seed)
        if isinstance(out.sampler, DistributedSampler):
            out.sampler.set_epoch(self.done)
            self._samplers.append(out.sampler)
        return out

    def epochs(self, count: int) -> Iterator[int]:
        """The absolute epochs ``start_epoch .. start_epoch + count - 1``, calling
        ``end_epoch`` after each."""
        for epoch in range(self.start_epoch, self.start_epoch + count):
            yield epoch
            self.end_epoch(epoch + 1)

    def end_epoch(self, done: int) -> None:
        """Tell the protocol that ``done`` epochs (counted from the dense start) are over."""
        self.done = done
        if self.distributed:
            self.world.sync_buffers(self.model)
        for sampler in self._samplers:
            sampler.set_epoch(done)
        if done == self.rewind_epoch:
            self.rewind_state = cpu_state(unwrap(self.model).state_dict(), snapshot=True)

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        """``end_epoch`` as a ``pathlift.data.training`` callback (``epoch`` counts from
        the phase's start)."""
        self.end_epoch(self.start_epoch + epoch)


@dataclass(frozen=True)
class ProtocolResult:
    """Every run of the grid, in grid order (those of a resumed folder included)."""

    config: PruneConfig
    runs: tuple[RunRecord, ...]

    def summary(self) -> list[dict[str, Any]]:
        """Mean and standard deviation over seeds of the final accuracy per method/level."""
        groups: dict[tuple[str, bool, float], list[float]] = {}
        for r in self.runs:
            groups.setdefault((r.method, r.rescaled, r.amount), []).append(r.accuracy)
        return [{"method": method, "rescaled": rescaled, "amount": amount,
                 **dict(zip(("mean", "std"), _mean_std(accs), strict=True)), "seeds": len(accs)}
                for (method, rescaled, amount), accs in groups.items()]

    def dense_accuracy(self) -> tuple[float, float]:
        """Mean and standard deviation over seeds of the dense network's accuracy."""
        return _mean_std(list({r.seed: r.dense_accuracy for r in self.runs}.values()))

    def overlaps(self) -> dict[tuple[str, float], float]:
        """Mean over seeds of each method's mask overlap with magnitude pruning at the same
        scope, on the trained network (not rescaled), per amount (thesis Table 3.1).
        Magnitude pruning itself (100 %) is left out."""
        trivial = {m.name for m in self.config.methods  # type: ignore[union-attr]
                   if m.reference == m}
        groups: dict[tuple[str, float], list[float]] = {}
        for r in self.runs:
            if not r.rescaled and r.method not in trivial:
                groups.setdefault((r.method, r.amount), []).append(r.overlap)
        return {k: sum(v) / len(v) for k, v in groups.items()}


Train = Callable[[nn.Module, int, Phase], None]
Evaluate = Callable[[nn.Module], float]


def prune_rewind_retrain(model_fn: Callable[[], nn.Module], input_shape: Sequence[int],
                         train: Train, evaluate: Evaluate, config: PruneConfig = PruneConfig(),
                         *, spread: Spread = "data", folder: RunFolder | None = None,
                         save_models: bool = False,
                         on_progress: Callable[[str, int, int], None] | None = None,
                         settings: Mapping[str, Any] | None = None,
                         before_training: Callable[[int, int], None] | None = None
                         ) -> ProtocolResult:
    """The prune-rewind-retrain protocol (thesis Sec. 3.5.2, App. E.1) for every run of
    ``config.grid()``, with your training, on this process or all of torchrun's.

    Args:
        model_fn: builds the untrained model; called with the global RNG seeded by the run's
            seed (the caller's RNG state is left untouched).
        input_shape: the model's input shape, no batch dimension.
        train: ``train(model, epochs, phase)`` trains ``model`` IN PLACE for ``epochs``
            epochs and reports each epoch's end through ``phase`` (see ``Phase``).
        evaluate: ``evaluate(model) -> float``, e.g. test accuracy; under
            ``spread="data"`` it runs on every rank and must return the same number there.
        config: the grid and the protocol's settings.
        spread: "data" (every training DDP over all ranks) or "runs" (one run per rank).
        folder: where rank 0 appends each finished run and keeps the dense weights; a
            folder holding some runs of the same settings (``manifest``) is resumed, not
            redone. It is locked while the protocol runs; if this call fails or is
            interrupted before writing any result, the files it wrote there are removed,
            then the folders it created once empty (``RunFolder.close``).
        save_models: also write each run's final network to ``folder``/models.
        on_progress: called on rank 0 after each dense training and each run with a short
            text, the number of these done and their total (progress bars).
        settings: further JSON values that define your results (your dataset's name, your
            optimiser's settings), recorded in the folder's manifest and checked on resume.
        before_training: called on every rank as ``before_training(dense, runs)`` with the
            numbers of dense trainings and of runs left to do (a resumed folder's done
            ones not counted) once the model is checked prunable and before any training:
            where a caller sizes the work (``pathlift.jobs.sizing``) and may refuse it.

    Returns:
        ``ProtocolResult`` with one ``RunRecord`` per run, on every rank.

    Raises:
        InvalidParameterError: bad settings, a folder of other settings (naming the first
            difference), or a ``train`` that never reported the rewind epoch.
        RunFolderBusyError: another process is running into ``folder``.
        ResultsFileError: a file of ``folder`` is damaged (named, with line and column).
        FileSystemError: ``folder`` cannot be written (full disk, read-only, ...).
        DistributedError: ranks disagree on masks, weights or accuracies.

    Example::

        training = SGDTraining(train_loader, test_loader)          # the digits default
        result = prune_rewind_retrain(small_cnn, (1, 8, 8), training.train,
                                      training.evaluate, PruneConfig(epochs=20))
    """
    if spread not in ("data", "runs"):
        raise InvalidParameterError(f"spread must be 'data' or 'runs', got {spread!r}")
    world, shape = World.current(), as_input_shape(input_shape)
    if folder is None or not world.main:
        return _protocol(model_fn, shape, train, evaluate, config, spread, None, {},
                         save_models, on_progress, world, before_training)
    with folder:  # closed as failed on an error or an interrupt: its own files removed
        done = folder.open(manifest(model_fn, shape, train, config, spread, world.size,
                                    settings))
        return _protocol(model_fn, shape, train, evaluate, config, spread, folder, done,
                         save_models, on_progress, world, before_training)


def manifest(model_fn: Callable[[], nn.Module], input_shape: Sequence[int], train: Train,
             config: PruneConfig, spread: Spread, world_size: int,
             settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every setting that defines a protocol's results, as a run folder records and checks
    them on resume: the model (class and a digest of its parameter names, shapes and
    dtypes), its weights (a digest of them as ``model_fn`` builds them for the first seed,
    so given weights count), the input shape, the training's
    ``settings()`` when ``train`` is a method of an object that has one (``SGDTraining``:
    data digest, batch size, SGD's hyper-parameters), your ``settings``, the grid and the
    protocol's settings, the world size, the spread and the pathlift and torch versions.
    ``forward`` is a digest of the traced forward (``forward_digest``): a model whose
    ``forward`` changed, with the same parameters, is named on resume."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seeds[0])
        model = model_fn()
    described = getattr(getattr(train, "__self__", None), "settings", None)
    state = cpu_state(unwrap(model).state_dict())
    layout = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in state.items())
    return {"model": f"{type(unwrap(model)).__name__} "
                     f"{hashlib.sha256(layout.encode()).hexdigest()[:16]}",
            "forward": forward_digest(model, input_shape),
            "weights": fingerprint(state)[:16],
            "input_shape": list(input_shape),
            **(described() if callable(described) else {}), **(settings or {}),
            **config.settings(), "world_size": world_size, "spread": spread,
            "pathlift": __version__, "torch": torch.__version__}


def forward_digest(model: nn.Module, input_shape: Sequence[int]) -> str:
    """The traced forward of ``model`` in one line: its class, its number of graph nodes
    and the start of the sha256 of every node's op, target, arguments and output shape
    (what ``forward`` computes, not the weights), traced as in eval mode (no flag of the
    model is changed)."""
    graph = graph_of(model, input_shape, as_eval=True)
    lines = []
    for n in graph.graph.nodes:
        meta = n.meta.get("tensor_meta")
        shape = tuple(meta.shape) if hasattr(meta, "shape") else None
        target = (repr(graph.submodule(n)) if n.op == "call_module" else
                  getattr(n.target, "__module__", "") + "." +
                  getattr(n.target, "__qualname__", str(n.target)))
        lines.append(f"{n.op}|{target}|{n.args}|{n.kwargs}|{shape}")
    text = _ADDRESS.sub("", "\n".join(lines))
    return (f"{type(unwrap(model)).__name__}: {len(lines)} nodes, "
            f"{hashlib.sha256(text.encode()).hexdigest()[:16]}")


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # object addresses change from run to run


def _checked_accuracy(world: World, what: str, value: object) -> float:
    """``evaluate``'s result as an accuracy in [0, 1], checked to be the same on every
    rank."""
    number = math.nan
    if isinstance(value, (numbers.Real, Tensor)) and not isinstance(value, bool):
        with contextlib.suppress(TypeError, ValueError, RuntimeError):  # a tensor of several
            number = float(value)
    if not 0.0 <= number <= 1.0:
        raise InvalidParameterError(
            f"evaluate() returned {value!r} for the {what}; it must return an accuracy, a "
            "number in [0, 1] (a percentage divided by 100)")
    world.check_identical(what, number)
    return number


def _protocol(model_fn: Callable[[], nn.Module], shape: tuple[int, ...], train: Train,
              evaluate: Evaluate, config: PruneConfig, spread: Spread,
              folder: RunFolder | None, done: dict[RunKey, RunRecord], save_models: bool,
              on_progress: Callable[[str, int, int], None] | None, world: World,
              before_training: Callable[[int, int], None] | None = None) -> ProtocolResult:
    """``prune_rewind_retrain`` once ``folder`` (rank 0's, None elsewhere) is open."""
    worker = World(device=world.device) if spread == "runs" else world
    methods = {m.name: m for m in config.methods}  # type: ignore[union-attr]
    if folder is not None and save_models:  # a finished run must have its network
        lost = [k for k, r in done.items() if not folder.model_path(r).is_file()]
        if lost:  # (a kill between them under older versions): computed again
            folder.drop(lost)
            done = {k: r for k, r in done.items() if k not in lost}
    done = world.broadcast(done)
    pending = [k for k in config.grid() if k not in done]
    check_prunable(model_fn, shape, config, {methods[k.method] for k in pending})
    if folder is not None and pending:  # before any training: a read-only one is refused
        folder.check_writable(f"{len(pending)} of {len(config.grid())} runs are not done")
    pending_seeds = {k.seed for k in pending}
    seeds = [s for s in config.seeds if s in pending_seeds]

    if folder is not None and seeds:
        with torch.random.fork_rng(devices=[]):
            like = dict(model_fn().state_dict())  # what a dense file must hold
    saved = world.broadcast({s: folder.load_dense(s, like) for s in seeds}
                            if folder is not None and seeds else {})
    dense = {s: d for s, d in saved.items() if d is not None}
    to_train = [s for s in seeds if s not in dense]
    if before_training is not None:
        before_training(len(to_train), len(pending))
    tasks = iter(range(1, len(to_train) + len(pending) + 1))

    def note(text: str) -> None:
        if world.main and on_progress is not None:
            on_progress(text, next(tasks), len(to_train) + len(pending))

    for states in _spread(to_train, lambda s: _train_dense(s, model_fn, train, evaluate,
                                                           config, worker), world, spread):
        dense[states.seed] = states
        if folder is not None:
            folder.save_dense(states)
        note(f"seed {states.seed}: dense {100 * states.accuracy:.1f}%")
    trained = {s: _materialise(model_fn, d, world.device) for s, d in dense.items()}

    def run(key: RunKey) -> tuple[RunRecord, dict[str, Tensor] | None]:
        record, model = _run(key, trained[key.seed], dense[key.seed], methods[key.method],
                             shape, config, train, evaluate, worker, spread, world.size)
        return record, cpu_state(model.state_dict(), snapshot=True) if save_models else None

    records = dict(done)
    for record, state in _spread(pending, run, world, spread):
        records[record.key] = record
        if folder is not None:  # the network first: a row always has its network
            if state is not None:
                folder.save_model(state, record)
            folder.append(record)
        note(f"seed {record.seed} {record.method}{' rescaled' if record.rescaled else ''} "
             f"{100 * record.amount:g}%: {100 * record.accuracy:.1f}%")
    return ProtocolResult(config, tuple(records[k] for k in config.grid()))


def check_prunable(model_fn: Callable[[], nn.Module], input_shape: Sequence[int],
                   config: PruneConfig, methods: Iterable[Method] | None = None) -> None:
    """Before any training: prune the untrained ``model_fn()`` (first seed) with each of
    ``methods`` (default ``config.methods``) and the magnitude reference of its scope, as
    every run will (thesis Sec. 3.5.2), so that a model pruning refuses (a layer called
    twice, an unsupported operation) is refused now, not after the dense training.

    Raises:
        UnsupportedModelError (or the criterion's own error): naming the layer.
    """
    chosen = list(config.methods if methods is None else methods)  # type: ignore[arg-type]
    if not chosen:
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seeds[0])
        untrained = model_fn()
    per_round = 1.0 - (1.0 - max(config.amounts)) ** (1.0 / config.rounds)
    for method in {m.name: m for m in [*chosen, *(m.reference for m in chosen)]}.values():
        method.prune(copy_model(untrained).eval(), input_shape, per_round,
                     config.last_layer_factor)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


def mask_overlap(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """100 |S_a & S_b| / |S_a| where S are the pruned (mask 0) coordinates (Table 3.1)."""
    both = sum(int(((a[n] == 0) & (b[n] == 0)).sum()) for n in a)
    pruned = sum(int((a[n] == 0).sum()) for n in a)
    return 100.0 * both / pruned if pruned else 100.0


def _spread(tasks: list[T], work: Callable[[T], R], world: World, spread: Spread
            ) -> Iterator[R]:
    """``work(task)`` for every task, in order, yielded on every rank: computed by all ranks
    together ("data"), or by rank i for the i-th task of each round of ``world.size``
    tasks, then gathered ("runs")."""
    if spread == "data" or world.size == 1:
        yield from map(work, tasks)
        return
    for start in range(0, len(tasks), world.size):
        chunk = tasks[start:start + world.size]
        mine = work(chunk[world.rank]) if world.rank < len(chunk) else None
        yield from world.gather(mine)[:len(chunk)]


def _train(train: Train, model: nn.Module, epochs: int, phase: Phase) -> None:
    """``train`` on ``model`` (DDP-wrapped when distributed), then rank 0's buffers
    everywhere and the check that every rank ends with the same weights."""
    model.train()
    train(ddp(model, phase.world), epochs, phase)
    phase.world.sync_buffers(model)
    model.eval()
    what = "weights after dense training" if phase.name == "dense" else \
        "weights after retraining"
    phase.world.check_identical(what, model.state_dict())


def _train_dense(seed: int, model_fn: Callable[[], nn.Module], train: Train,
                 evaluate: Evaluate, config: PruneConfig, world: World) -> DenseStates:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_fn().to(world.device)
    phase = Phase("dense", seed, 0, world, model, config.rewind_epoch)
    _train(train, model, config.epochs, phase)
    if phase.rewind_state is None:
        raise InvalidParameterError(
            f"train() never reported the end of epoch {config.rewind_epoch}, the rewind "
            "point: loop `for epoch in phase.epochs(epochs)` or call phase.end_epoch(epoch) "
            "after each epoch")
    world.check_identical("rewind weights", phase.rewind_state)
    accuracy = _checked_accuracy(world, "dense accuracies", evaluate(model))
    trained = cpu_state(model.state_dict(), snapshot=True)
    return DenseStates(seed, trained, phase.rewind_state, accuracy)


def _materialise(model_fn: Callable[[], nn.Module], states: DenseStates,
                 device: torch.device) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        model = model_fn()
    model.load_state_dict(states.trained)
    return model.to(device).eval()


def _masked(template: nn.Module, state: dict[str, Tensor] | None,
            masks: dict[str, Tensor]) -> nn.Module:
    """A copy of the unpruned ``template`` with ``state`` (if any) and the masks."""
    model = copy_model(template)
    if state is not None:
        model.load_state_dict(state)
    return attach_masks_(model, masks).eval()


@dataclass(frozen=True)
class _Choice:
    masks: dict[str, Tensor]
    result: PruningResult
    overlap: float


def _choose(current: nn.Module, method: Method, shape: tuple[int, ...], amount: float,
            last_layer_factor: float, overlap: bool) -> _Choice:
    """Prune a copy of ``current``: its masks (on the CPU), result and, when asked, the
    overlap with magnitude pruning's masks at the same scope (else NaN)."""
    candidate = copy_model(current).eval()
    result = method.prune(candidate, shape, amount, last_layer_factor)
    masks = {k: v.cpu() for k, v in prune_masks(candidate).items()}
    common = math.nan
    if overlap:  # for the reference method too: 100 if its pruning is deterministic
        reference = copy_model(current).eval()
        method.reference.prune(reference, shape, amount, last_layer_factor)
        common = mask_overlap(masks, {k: v.cpu() for k, v in prune_masks(reference).items()})
    return _Choice(masks, result, common)


def _run(key: RunKey, dense: nn.Module, states: DenseStates, method: Method,
         shape: tuple[int, ...], config: PruneConfig, train: Train, evaluate: Evaluate,
         world: World, spread: Spread, world_size: int) -> tuple[RunRecord, nn.Module]:
    """One run: rounds of (prune on rank 0, broadcast, check) -> rewind -> retrain. The
    record's path-metric, bound and overlap describe the first round's pruning of the
    trained (or rescaled) network, the network the first mask is chosen on."""
    trained = random_rescale(dense, config.rescale_factors, key.seed, shape).to(world.device) \
        if key.rescaled else dense
    per_round = 1.0 - (1.0 - key.amount) ** (1.0 / config.rounds)
    current, first, pruned_accuracy = trained, None, math.nan
    for _ in range(config.rounds):
        choice = world.broadcast(_choose(current, method, shape, per_round,
                                         config.last_layer_factor, first is None)
                                 if world.main else None)
        masks = {k: v.to(world.device) for k, v in choice.masks.items()}
        digest = world.check_identical("pruning masks", masks)
        if first is None:
            first = choice
            pruned_accuracy = _checked_accuracy(world, "accuracies after pruning",
                                                evaluate(_masked(trained, None, masks)))
        current = _masked(trained, states.rewind, masks)
        _train(train, current, config.epochs - config.rewind_epoch,
               Phase("retrain", key.seed, config.rewind_epoch, world, current))
    accuracy = _checked_accuracy(world, "final accuracies", evaluate(current))
    kept = sum(float(m.sum()) for m in masks.values())
    record = RunRecord(key.seed, key.method, key.rescaled, key.amount, config.rounds,
                       1.0 - kept / first.result.total, states.accuracy, pruned_accuracy,
                       accuracy, first.result.log10_path_metric, first.result.log10_bound,
                       first.overlap, digest[:16], world_size, spread)
    return record, current
