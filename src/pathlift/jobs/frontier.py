"""The accuracy / certified-bound frontier (thesis Sec. 7.2.1-7.2.2): train small MLPs and
CNNs on digits and MNIST-1D under every regularisation method and strength, and place each
trained network by its test accuracy and two certificates valid as stated: the path-norm
top-1 bound (Thm 4.1.2 with Thm 4.4.1, union over radii and margins fixed in advance,
``pathlift.bounds.union``), shown beside the thesis' fixed-class form, and the compression
certificate (``pathlift.bounds.compression``, the architecture one of the experiment's
models, fixed in advance). Methods: none, weight decay, l1 / l2 / log path-norm
penalties, a path-norm budget, Path-SGD, iterative magnitude pruning with rewinding
(``pathlift.jobs.prune.protocol``), and the recipes of ``pathlift.train.recipes``
(prune-retrain, box-robust). The test split is only measured, never used to choose.

Under ``torchrun`` the runs are spread over the ranks (rank i trains runs i, i + size, ...;
the pruning grid is spread by the protocol itself, ``spread="runs"``) and rank 0 writes.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import inspect
import io
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from pathlift.bounds.code import architecture_of
from pathlift.bounds.compression import CompressionSearch, compression_bound
from pathlift.bounds.entry import chance_error
from pathlift.bounds.top1 import certified_top1
from pathlift.bounds.verdict import verdict
from pathlift.data import Digits, load_digits
from pathlift.data import mnist1d as mnist1d_data
from pathlift.data.embedded import Split
from pathlift.data.mnist1d import load_mnist1d
from pathlift.distributed import World, launched
from pathlift.errors import InvalidParameterError
from pathlift.files import (
    atomic_write,
    os_errors,
    read_safetensors,
    refuse_links,
    refuse_outputs,
    write_text,
)
from pathlift.jobs.prune.protocol import Phase, PruneConfig, prune_rewind_retrain
from pathlift.jobs.prune.results import RunFolder
from pathlift.jobs.sizing import Estimate, training_pace
from pathlift.memory import check_bytes
from pathlift.models import mlp, small_cnn
from pathlift.train.budget import PathNormBudget
from pathlift.train.path_sgd import PathSGD
from pathlift.train.penalties import make_penalty
from pathlift.train.recipes import RECIPES, compact_model, fit, train_recipe

__all__ = ["DEFAULT_SWEEP", "FrontierConfig", "FrontierPoint", "FrontierResult", "FrontierRun",
           "frontier_estimate", "frontier_experiment", "run_frontier"]

# method -> strengths (penalty weight, weight decay, budget B, Path-SGD step size)
DEFAULT_SWEEP: dict[str, tuple[float, ...]] = {
    "none": (0.0,),
    "weight-decay": (1e-3, 1e-2, 3e-2),
    "l1": (1e-6, 1e-5, 1e-4, 1e-3),
    "l2": (1e-2, 1e-1, 1.0),
    "log-l1": (0.01, 0.03, 0.1, 0.3),
    "budget": (100.0, 300.0, 1000.0, 3000.0),
    "path-sgd": (0.1, 0.3, 1.0),
    "imp-rewind": (0.6, 0.9, 0.97),
    "prune-retrain": (0.5, 0.75),
    "box-robust": (2**-8, 2**-7, 2**-6),
}

# the compression certificate of every point: the network as trained, its steps searched
FRONTIER_SEARCH = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                                    offsets=tuple(range(2, 14)), refine=1)


@dataclass(frozen=True)
class FrontierConfig:
    """The experiment: datasets x models x methods x strengths (one seed each).

    ``mnist1d_sizes`` adds runs of the "none" and "budget" (strength ``size_budget``)
    methods of the MLP on MNIST-1D with more samples, to see the sqrt(n) term move, and
    of each (model, method, strength) of ``size_recipes``. The recipes of
    ``pathlift.train.recipes`` train with Adam (``recipe_lr``) for ``recipe_epochs`` and
    batches of ``recipe_batch`` (per dataset). ``compression`` adds the compression
    certificate of each point (architecture family: every model of ``models``).
    ``data_cache``: a folder where generated MNIST-1D sets are kept between runs.
    """

    datasets: tuple[str, ...] = ("digits", "mnist1d")
    models: tuple[str, ...] = ("mlp", "cnn")
    sweep: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_SWEEP))
    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.05
    seed: int = 0
    mnist1d_sizes: tuple[int, ...] = (20_000, 100_000)
    size_epochs: int = 8
    size_budget: float = 1000.0
    size_recipes: tuple[tuple[str, str, float], ...] = (("cnn-small", "prune-retrain", 0.5),
                                                        ("cnn-small", "prune-retrain", 0.7))
    recipe_epochs: dict[str, int] = field(default_factory=lambda: {"digits": 150,
                                                                   "mnist1d": 20})
    recipe_batch: dict[str, int] = field(default_factory=lambda: {"digits": 64,
                                                                  "mnist1d": 128})
    recipe_lr: float = 3e-3
    compression: bool = True
    data_cache: str | None = None


@dataclass(frozen=True)
class FrontierPoint:
    """One trained network: where it lands, and the terms of its bounds.

    ``bound_log10``: the path-norm top-1 bound valid as stated (union form), its terms
    after it; ``thesis_bound_log10``: the fixed-class form of thesis Sec. 7.2.1 (not a
    certificate), ``validity_gap_log10`` = bound_log10 - thesis_bound_log10 >= 0 what
    validity costs; ``compression_*``: the compression certificate (nan when not asked);
    ``chance``: the best constant classifier's training error, 1 - max class frequency
    (``pathlift.bounds.verdict``), which every verdict compares the bounds with.
    """

    dataset: str
    model: str
    method: str
    strength: float
    n_train: int
    test_accuracy: float
    train_accuracy: float
    bound_log10: float
    path_norm_log10: float
    constant: float
    gamma: float
    sigma_over_n_log10: float
    train_margin_loss: float
    seconds: float
    thesis_bound_log10: float = math.nan
    compression_bound: float = math.nan
    compression_bits: int = 0
    compression_empirical: float = math.nan
    compression_budget: float = math.nan
    compression_transfer: str = ""
    chance: float = math.nan

    @property
    def validity_gap_log10(self) -> float:
        return self.bound_log10 - self.thesis_bound_log10


@dataclass(frozen=True)
class FrontierResult:
    points: tuple[FrontierPoint, ...]

    def reference(self, dataset: str, model: str) -> FrontierPoint | None:
        """The unregularised network of the standard sample size, if it was run."""
        return next((p for p in self.points if (p.dataset, p.model, p.method) ==
                     (dataset, model, "none") and p.n_train == self._standard_n(dataset)),
                    None)

    def _standard_n(self, dataset: str) -> int:
        return min(p.n_train for p in self.points if p.dataset == dataset)

    def table(self) -> list[dict[str, Any]]:
        """Per dataset, model and method, chosen on training quantities only (the bounds
        hold for every network of the architecture at once, so picking the lowest costs
        nothing; test accuracy is read afterwards): the lowest valid path-norm bound among
        networks whose training accuracy is within 2 points of the unregularised one's
        (``close_*``, with the thesis' fixed-class bound of that network) and above 50%
        (``above50_*``), and the lowest compression certificate above 50% training
        accuracy (``compression_*``)."""
        rows = []
        for dataset, model in dict.fromkeys((p.dataset, p.model) for p in self.points):
            ref = self.reference(dataset, model)
            n = self._standard_n(dataset)
            group = [p for p in self.points if (p.dataset, p.model, p.n_train) ==
                     (dataset, model, n) and not math.isnan(p.train_accuracy)]
            ref_train = ref.train_accuracy if ref is not None else max(
                (p.train_accuracy for p in group), default=math.nan)
            for method in dict.fromkeys(p.method for p in self.points):
                mine = [p for p in group if p.method == method]
                if not mine:
                    continue
                close = _best([p for p in mine if p.train_accuracy >= ref_train - 0.02])
                above = _best([p for p in mine if p.train_accuracy > 0.5])
                occam = min((p for p in mine if p.train_accuracy > 0.5
                             and not math.isnan(p.compression_bound)),
                            key=lambda p: p.compression_bound, default=None)
                rows.append({"dataset": dataset, "model": model, "method": method,
                             "reference_accuracy": ref.test_accuracy if ref else math.nan,
                             "close_bound_log10": _get(close, "bound_log10"),
                             "close_thesis_bound_log10": _get(close, "thesis_bound_log10"),
                             "close_accuracy": _get(close, "test_accuracy"),
                             "close_strength": _get(close, "strength"),
                             "above50_bound_log10": _get(above, "bound_log10"),
                             "above50_accuracy": _get(above, "test_accuracy"),
                             "above50_strength": _get(above, "strength"),
                             "compression_bound": _get(occam, "compression_bound"),
                             "compression_accuracy": _get(occam, "test_accuracy"),
                             "compression_strength": _get(occam, "strength"),
                             "compression_bits": _get(occam, "compression_bits"),
                             "chance": _get(mine[0], "chance")})
        return rows

    def best(self) -> FrontierPoint | None:
        """The lowest valid path-norm bound of any network above 50% training accuracy."""
        return _best([p for p in self.points if p.train_accuracy > 0.5])

    def best_compression(self) -> FrontierPoint | None:
        """The lowest compression certificate of any network above 50% training accuracy."""
        return min((p for p in self.points if p.train_accuracy > 0.5
                    and not math.isnan(p.compression_bound)),
                   key=lambda p: p.compression_bound, default=None)


def _best(points: list[FrontierPoint]) -> FrontierPoint | None:
    return min(points, key=lambda p: p.bound_log10, default=None)


def _get(point: FrontierPoint | None, name: str) -> float:
    return math.nan if point is None else float(getattr(point, name))


# ------------------------------------------------------------------------ data and models

def _load(name: str, num_samples: int | None = None, cache: str | None = None) -> Digits:
    if name == "digits":
        return load_digits()
    if name == "mnist1d":
        if cache is not None:
            return _cached_mnist1d(Path(cache), num_samples or 5000)
        return load_mnist1d() if num_samples is None else load_mnist1d(num_samples)
    raise InvalidParameterError(f"unknown dataset {name!r}; choose digits or mnist1d")


def _cached_mnist1d(folder: Path, num_samples: int) -> Digits:
    """MNIST-1D of ``num_samples`` generated once and kept in ``folder`` (safetensors, read
    back without unpickling anything). The file records how it was made (``_mnist1d_recipe``)
    and a SHA-256 of its tensors: a file made otherwise (an older standardisation, another
    split, no record) is made again, with a warning; one whose tensors no longer match
    their digest is refused (InvalidParameterError: remove it to have it made again)."""
    from safetensors import SafetensorError
    from safetensors.torch import save

    path = folder / f"mnist1d-{num_samples}.safetensors"
    recipe = _mnist1d_recipe(num_samples)
    if path.exists():
        with os_errors(path, "read"):
            try:
                t, made = read_safetensors(path)
            except SafetensorError as err:
                raise InvalidParameterError(f"data cache {path} is not a safetensors file "
                                            f"({err}); remove it to have it made again") from None
        kept = {k: v for k, v in made.items() if k != "sha256"}
        if kept == recipe:
            if made.get("sha256") != _digest(t):
                raise InvalidParameterError(
                    f"data cache {path}: its tensors do not match the digest written with "
                    "them (the file changed since); remove it to have it made again")
            return Split(TensorDataset(t["x_train"], t["y_train"]),
                         TensorDataset(t["x_test"], t["y_test"]), (1, 40), 10)
        changed = sorted(k for k in recipe.keys() | kept.keys() if recipe.get(k) != kept.get(k))
        warnings.warn(f"data cache {path} was made otherwise ({', '.join(changed)}); made "
                      "again", stacklevel=2)
    data = load_mnist1d(num_samples)
    (x, y), (xt, yt) = data.train.tensors, data.test.tensors
    tensors = {"x_train": x.contiguous(), "y_train": y.contiguous(),
               "x_test": xt.contiguous(), "y_test": yt.contiguous()}
    payload = save(tensors, metadata={**recipe, "sha256": _digest(tensors)})
    atomic_write(path, lambda f: f.write(payload))
    return data


def _mnist1d_recipe(num_samples: int) -> dict[str, str]:
    """How ``load_mnist1d(num_samples)`` makes its set, as a cache records it: the
    generator and its version, the size, split and seed, the standardisation."""
    defaults = inspect.signature(mnist1d_data.load_mnist1d).parameters
    return {"made_by": "pathlift.data.mnist1d.load_mnist1d",
            "mnist1d": importlib.metadata.version("mnist1d"),
            "num_samples": str(num_samples),
            "train_split": repr(defaults["train_split"].default),
            "seed": repr(defaults["seed"].default),
            "standardisation": "mean and std of the training split alone"}


def _digest(tensors: dict[str, Tensor]) -> str:
    """SHA-256 of the tensors' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _model_fn(name: str, shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    """The MLP (one hidden layer of 64) or CNN of the experiment for inputs of ``shape``,
    or a compact model of ``pathlift.train.recipes`` ("mlp-small", "cnn-small")."""
    if name == "mlp-small" or (name == "cnn-small" and len(shape) in (2, 3)):
        return lambda: compact_model(name, shape)  # the first draw of the seeded stream
    if name == "mlp":
        return lambda: mlp(math.prod(shape), (64,), 10)
    if name == "cnn" and len(shape) == 3:
        return lambda: small_cnn(shape[0], 10)
    if name == "cnn" and len(shape) == 2:
        return lambda: nn.Sequential(
            nn.Conv1d(shape[0], 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
            nn.Flatten(), nn.Linear(32 * (shape[1] // 4), 64), nn.ReLU(), nn.Linear(64, 10))
    raise InvalidParameterError(f"unknown model {name!r} for input shape {shape}")


# ------------------------------------------------------------------------------ one run

@dataclass(frozen=True)
class _Run:
    dataset: str
    model: str
    method: str
    strength: float
    num_samples: int | None = None
    epochs: int | None = None


def _tensors(data: Digits) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (*data.train.tensors, *data.test.tensors)


def _accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        model.eval()
        return float((model(x).argmax(1) == y).double().mean())


def train_regularised(model: nn.Module, x: Tensor, y: Tensor, method: str, strength: float,
                      epochs: int, batch_size: int, lr: float, seed: int,
                      on_epoch: Callable[[int], None] | None = None) -> None:
    """Train ``model`` IN PLACE on (x, y) with one regularisation method: "none",
    "weight-decay" (SGD's), a penalty of ``pathlift.train.PENALTIES`` times ``strength``,
    "budget" (||Phi||_1 <= strength after every step) or "path-sgd" (step size strength).
    SGD with momentum 0.9 and step ``lr`` otherwise; batches drawn with ``seed``."""
    shape = tuple(x.shape[1:])
    if method == "path-sgd":
        opt: torch.optim.Optimizer = PathSGD(model, shape, lr=strength)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9,
                              weight_decay=strength if method == "weight-decay" else 0.0)
    penalty = make_penalty(method, shape) if method in ("l1", "l2", "l4", "log-l1",
                                                        "average-case") else None
    budget = PathNormBudget(shape, strength) if method == "budget" else None
    if budget is not None:
        budget.project_(model)
    gen = torch.Generator().manual_seed(seed)

    def loss(xb: Tensor, yb: Tensor) -> Tensor:
        value = F.cross_entropy(model(xb), yb)
        return value if penalty is None else value + strength * penalty(model, xb)

    fit(model, x, y, opt, loss, epochs, batch_size, gen,
        after_step=None if budget is None else lambda: budget.project_(model),
        on_epoch=on_epoch, what=f"{method} (strength {strength:g}): ")


def _point(run: _Run, model: nn.Module, data: Digits, seconds: float,
           config: FrontierConfig) -> FrontierPoint:
    """Accuracies, the valid and the fixed-class path-norm bounds, and (``compression``)
    the compression certificate, its architecture one of ``config.models`` (2 bits for 4)."""
    x, y, xt, yt = _tensors(data)
    shape = data.input_shape
    b = certified_top1(model, shape, x, y)
    thesis = certified_top1(model, shape, x, y, form="fixed-class")
    occam = {}
    if config.compression:
        family = [architecture_of(_model_fn(m, shape)(), shape) for m in config.models
                  if _fits(m, shape)]
        c = compression_bound(model, shape, x, y, family=family, search=FRONTIER_SEARCH)
        occam = {"compression_bound": c.value, "compression_bits": c.length.total,
                 "compression_empirical": c.occam.empirical,
                 "compression_budget": c.occam.budget, "compression_transfer": c.transfer}
    return FrontierPoint(run.dataset, run.model, run.method, run.strength, len(x),
                         _accuracy(model, xt, yt), _accuracy(model, x, y), b.log10,
                         b.path_norm_log10, b.constant, b.gamma, b.terms_log10()["sigma/n"],
                         b.train_margin_loss, seconds, thesis.log10, **occam,
                         chance=chance_error(y)[0])


def _fits(name: str, shape: tuple[int, ...]) -> bool:
    try:
        _model_fn(name, shape)
    except InvalidParameterError:
        return False
    return True


def _one(run: _Run, config: FrontierConfig, cache: dict[tuple, Digits]) -> FrontierPoint:
    key = (run.dataset, run.num_samples)
    if key not in cache:
        cache[key] = _load(run.dataset, run.num_samples, config.data_cache)
    data = cache[key]
    x, y, _, _ = _tensors(data)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = _model_fn(run.model, data.input_shape)()
    start = time.perf_counter()
    try:
        if run.method in RECIPES:
            train_recipe(model, x, y, run.method, run.strength,
                         run.epochs or config.recipe_epochs[run.dataset],
                         config.recipe_batch[run.dataset], config.recipe_lr, config.seed)
        else:
            train_regularised(model, x, y, run.method, run.strength,
                              run.epochs or config.epochs, config.batch_size, config.lr,
                              config.seed)
    except InvalidParameterError:  # diverged: the point is at chance with no bound
        return FrontierPoint(run.dataset, run.model, run.method, run.strength, len(x), math.nan,
                             math.nan, math.inf, math.nan, math.nan, math.nan, math.nan,
                             math.nan, time.perf_counter() - start)
    return _point(run, model, data, time.perf_counter() - start, config)


def _imp(dataset: str, model_name: str, config: FrontierConfig, cache: dict[tuple, Digits],
         world: World) -> list[FrontierPoint]:
    """Iterative magnitude pruning with rewinding (2 rounds, rewind to epoch 2) at each
    final sparsity of the sweep, through ``prune_rewind_retrain``; rank 0 measures."""
    amounts = config.sweep.get("imp-rewind", ())
    if not amounts:
        return []
    key = (dataset, None)
    if key not in cache:
        cache[key] = _load(dataset, None, config.data_cache)
    data = cache[key]
    x, y, xt, yt = _tensors(data)
    shape = data.input_shape
    model_fn = _model_fn(model_name, shape)

    def train(model: nn.Module, epochs: int, phase: Phase) -> None:
        train_regularised(model, x, y, "none", 0.0, epochs, config.batch_size, config.lr,
                          phase.rank_seed,
                          on_epoch=lambda e: phase.end_epoch(phase.start_epoch + e))

    prune_config = PruneConfig(amounts=tuple(amounts), methods=("magnitude-global",),
                               seeds=(config.seed,), epochs=config.epochs, rewind_epoch=2,
                               rounds=2, rescaled=(False,))
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(world.broadcast(tmp if world.main else None))
        start = time.perf_counter()
        result = prune_rewind_retrain(model_fn, shape, train,
                                      lambda m: _accuracy(m, xt, yt), prune_config,
                                      spread="runs", folder=folder, save_models=True)
        seconds = (time.perf_counter() - start) / max(len(result.runs), 1)
        points = []
        if world.main:
            for record in result.runs:
                state, _ = read_safetensors(folder.model_path(record))
                model = model_fn()
                dense = {k.removesuffix("_orig"): v * state[k.removesuffix("_orig") + "_mask"]
                         if k.endswith("_orig") else v
                         for k, v in state.items() if not k.endswith("_mask")}
                model.load_state_dict(dense)
                points.append(_point(_Run(dataset, model_name, "imp-rewind", record.amount),
                                     model, data, seconds, config))
        world.gather(None)  # the folder outlives every rank's use of it
    return points


def _runs(config: FrontierConfig) -> list[_Run]:
    """Every run of ``config`` but the pruning grids (``_imp``), in order; the runs at
    ``mnist1d_sizes`` only for the methods of the sweep (``--method l1`` adds none)."""
    runs = [_Run(d, m, method, s) for d in config.datasets for m in config.models
            for method, strengths in config.sweep.items() if method != "imp-rewind"
            for s in strengths]
    if "mnist1d" in config.datasets and "mlp" in config.models:
        runs += [_Run("mnist1d", "mlp", method, s, n, config.size_epochs)
                 for n in config.mnist1d_sizes
                 for method, s in (("none", 0.0), ("budget", config.size_budget))
                 if method in config.sweep]
    if "mnist1d" in config.datasets:
        runs += [_Run("mnist1d", m, method, s, n) for n in config.mnist1d_sizes
                 for m, method, s in config.size_recipes
                 if m in config.models and method in config.sweep]
    return runs


#: bytes a generated MNIST-1D sample may take while it is made (40 float64 values, four
#: copies: the signal, its noise, its shifted form and the tensors kept)
_MNIST1D_SAMPLE_BYTES = 4 * 40 * 8
_SHAPES = {"digits": (1, 8, 8), "mnist1d": (1, 40)}


def frontier_estimate(config: FrontierConfig, world: World | None = None) -> Estimate:
    """A lower bound of ``run_frontier``'s time, after refusing its largest MNIST-1D set
    over the memory limit: every training's epochs x training samples (digits' split;
    80% of an MNIST-1D set) at the pace of plain SGD steps of its model timed on this
    machine (``training_pace``; penalties, budgets, Path-SGD and the certificates cost
    more and come on top), the pruning grids' trainings included, spread over the ranks."""
    world = world or World.current()
    unknown = [d for d in config.datasets if d not in _SHAPES]
    if unknown:
        raise InvalidParameterError(f"unknown dataset {unknown[0]!r}; choose digits or mnist1d")
    if "mnist1d" in config.datasets:
        largest = max((*config.mnist1d_sizes, 5000))
        check_bytes(largest * _MNIST1D_SAMPLE_BYTES, f"generating MNIST-1D of {largest:,} "
                    "samples", "use smaller --mnist1d-size values, or ")
    digits = len(load_digits().train) if "digits" in config.datasets else 0

    def n_train(run: _Run) -> int:
        return digits if run.dataset == "digits" else int(0.8 * (run.num_samples or 5000))

    trainings: list[tuple[str, str, int, int, int]] = []  # dataset, model, batch, epochs, n
    for run in _runs(config):
        recipe = run.method in RECIPES
        trainings.append((run.dataset, run.model, config.recipe_batch[run.dataset] if recipe
                          else config.batch_size, run.epochs or (
                              config.recipe_epochs[run.dataset] if recipe else config.epochs),
                          n_train(run)))
    amounts = len(config.sweep.get("imp-rewind", ()))
    if amounts:  # 2 rounds, rewind to epoch 2, as _imp runs them
        trainings += [(d, m, config.batch_size, config.epochs + 2 * amounts * (config.epochs
                                                                              - 2),
                       n_train(_Run(d, m, "none", 0.0))) for d in config.datasets
                      for m in config.models]
    paces = {}
    if world.main:
        for dataset, model, batch, _, _ in trainings:
            if (dataset, model, batch) not in paces:
                paces[dataset, model, batch] = training_pace(
                    _model_fn(model, _SHAPES[dataset]), _SHAPES[dataset], batch, 10)
    paces = world.broadcast(paces if world.main else None)
    seconds = sum(epochs * n * paces[d, m, b] for d, m, b, epochs, n in trainings)
    sample_epochs = sum(epochs * n for *_, epochs, n in trainings)
    return Estimate(f"{len(trainings)} training(s), {sample_epochs:,} sample-epochs",
                    seconds / world.size, f"at {min(paces.values()) * 1e6:.3g}-"
                    f"{max(paces.values()) * 1e6:.3g} us a sample (plain SGD steps timed on "
                    "this machine; regularisers and certificates on top)", at_least=True)


def run_frontier(config: FrontierConfig = FrontierConfig(),
                 on_progress: Callable[[str, int, int], None] | None = None,
                 on_estimate: Callable[[str], None] | None = None) -> FrontierResult:
    """Train and measure every run of ``config`` (on this process or all of torchrun's);
    the result on every rank. Sized first: ``frontier_estimate``, its line given to
    ``on_estimate`` (on rank 0), refused over the time limit before any training."""
    world = World.current()
    estimate = frontier_estimate(config, world)
    if on_estimate is not None and world.main:
        on_estimate(estimate.line())
    estimate.check(f"frontier over {len(config.datasets)} dataset(s) x {len(config.models)} "
                   f"model(s) x {len(config.sweep)} method(s)", "fewer --dataset, --model, "
                   "--method or --mnist1d-size values, or fewer --epochs")
    runs = _runs(config)
    cache: dict[tuple, Digits] = {}
    grids = [(d, m) for d in config.datasets for m in config.models
             if config.sweep.get("imp-rewind")]  # the pruning grids, when asked for
    total = len(runs) + len(grids)
    mine = []
    for i, run in enumerate(runs[world.rank::world.size]):
        mine.append(_one(run, config, cache))
        if on_progress is not None and world.main:
            p = mine[-1]
            on_progress(f"{p.dataset} {p.model} {p.method} {p.strength:g} (n = "
                        f"{p.n_train}): {100 * p.test_accuracy:.1f}%, path-norm bound "
                        f"10^{p.bound_log10:.2f} (thesis form 10^{p.thesis_bound_log10:.2f}),"
                        f" compression {p.compression_bound:.3f}", i * world.size + 1, total)
    gathered = world.gather(mine)
    points = [gathered[i % world.size][i // world.size] for i in range(len(runs))]
    for done, (d, m) in enumerate(grids, len(runs) + 1):
        points += _imp(d, m, config, cache, world)
        if on_progress is not None and world.main:
            on_progress(f"{d} {m} imp-rewind", done, total)
    return FrontierResult(tuple(world.broadcast(points if world.main else None)))


# --------------------------------------------------------------------------------- output

#: the files ``write_frontier`` writes in its folder
FRONTIER_FILES = ("frontier.csv", "frontier_table.csv", "frontier.png", "frontier.md")


def write_frontier(result: FrontierResult, out: str | Path) -> list[Path]:
    """frontier.csv (every point, with the validity gap log10(valid / fixed-class bound)),
    frontier_table.csv (the per-method table), frontier.png (test accuracy against both
    certificates, one column per dataset and model) and frontier.md (the table and the
    best points); the paths written."""
    out = Path(out)
    refuse_links(out, FRONTIER_FILES)
    points = [asdict(p) | {"validity_gap_log10": p.validity_gap_log10} for p in result.points]
    paths = [write_text(out / "frontier.csv", _csv(points)),
             write_text(out / "frontier_table.csv", _csv(result.table())),
             _plot(result, out / "frontier.png"),
             write_text(out / "frontier.md", summary_markdown(result))]
    return paths


@dataclass(frozen=True, repr=False)
class FrontierRun:
    """What ``frontier_experiment`` did: the result (on every rank), and on the main process
    the folder, the files written and the markdown summary (frontier.md's text); on the
    other ranks ``folder`` and ``markdown`` are None and ``paths`` is empty."""

    result: FrontierResult
    folder: Path | None
    paths: tuple[Path, ...]
    markdown: str | None

    def __repr__(self) -> str:
        best = self.result.best()
        return (f"FrontierRun({len(self.result.points)} points, best bound "
                + ("none" if best is None else f"10^{best.bound_log10:.2f}")
                + f", folder={self.folder})")


def frontier_experiment(config: FrontierConfig, out: str | Path | Callable[[], Path], *,
                        on_progress: Callable[[str, int, int], None] | None = None,
                        on_estimate: Callable[[str], None] | None = None,
                        overwrite: bool = False) -> FrontierRun:
    """``run_frontier`` under ``launched()`` (all of torchrun's processes, else this one),
    then, on the main process, ``write_frontier`` into ``out`` (a folder, or a callable
    returning one, called once the runs are done). ``pathlift frontier`` in one call.
    A link among its files in a given folder is refused before the runs, and so is one of
    them already there unless ``overwrite`` (``OutputExistsError``)."""
    if not callable(out):
        refuse_outputs(out, FRONTIER_FILES, overwrite)
    with launched() as world:
        result = run_frontier(config, on_progress, on_estimate)
        if not world.main:
            return FrontierRun(result, None, (), None)
        folder = Path(out() if callable(out) else out)
        paths = tuple(write_frontier(result, folder))
    return FrontierRun(result, folder, paths, summary_markdown(result))


def _csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def _plot(result: FrontierResult, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((p.dataset, p.model) for p in result.points))
    methods = list(dict.fromkeys(p.method for p in result.points))
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7.4), squeeze=False)
    for col, (dataset, model) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        for k, method in enumerate(methods):
            mine = [p for p in result.points if (p.dataset, p.model, p.method) ==
                    (dataset, model, method) and math.isfinite(p.bound_log10)]
            marker = "os^vD<>px"[k % 9]
            acc = [100 * p.test_accuracy for p in mine]
            top.scatter(acc, [p.bound_log10 for p in mine], label=method, s=22,
                        marker=marker, color=f"C{k}")
            top.scatter(acc, [p.thesis_bound_log10 for p in mine], s=14, marker=marker,
                        facecolors="none", edgecolors=f"C{k}", lw=0.7)
            bottom.scatter([a for a, p in zip(acc, mine, strict=True)
                            if not math.isnan(p.compression_bound)],
                           [p.compression_bound for p in mine
                            if not math.isnan(p.compression_bound)],
                           label=method, s=22, marker=marker, color=f"C{k}")
        top.axhline(0.0, color="k", lw=0.8, ls="--")
        top.set_title(f"{dataset}, {model}")
        top.set_ylabel("log10 path-norm top-1 bound\n(filled: valid, hollow: thesis form)")
        bottom.axhline(1.0, color="k", lw=0.8, ls="--")
        bottom.set_xlabel("test accuracy (%)")
        bottom.set_ylabel("compression certificate (top-1 error)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return atomic_write(path, lambda f: f.write(buffer.getvalue()))


def summary_markdown(result: FrontierResult) -> str:
    """The frontier table in markdown, the best points and the terms that make them."""
    lines = ["| dataset | model | method | unregularised acc. | valid path-norm bound "
             "(thesis form), train acc. within 2 points: test acc., strength | valid "
             "path-norm bound, train acc. > 50% (test acc., strength) | compression "
             "certificate (test acc., strength, bits) | chance |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result.table():
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['method']} | "
            f"{_pct(r['reference_accuracy'])} | "
            f"{_fmt(r['close_bound_log10'])} ({_fmt(r['close_thesis_bound_log10'])}): "
            f"{_pct(r['close_accuracy'])}, {r['close_strength']:g} | "
            f"{_fmt(r['above50_bound_log10'])} ({_pct(r['above50_accuracy'])}, "
            f"{r['above50_strength']:g}) | {_prob(r['compression_bound'])} "
            f"({_pct(r['compression_accuracy'])}, {r['compression_strength']:g}, "
            f"{r['compression_bits']:g}) | {_prob(r['chance'])} |")
    gaps = sorted(p.validity_gap_log10 for p in result.points
                  if math.isfinite(p.validity_gap_log10))
    if gaps:
        lines += ["", f"Validity gap log10(valid / thesis form) over the {len(gaps)} points "
                  f"with both finite: min {gaps[0]:.3f}, median {gaps[len(gaps) // 2]:.3f}, "
                  f"max {gaps[-1]:.3f}."]
    best = result.best()
    if best is not None:
        terms = {"||Phi||_1": best.path_norm_log10, "C": math.log10(best.constant),
                 "1/gamma": -math.log10(best.gamma) if best.gamma > 0 else math.inf,
                 "sigma/n (~1/sqrt(n))": best.sigma_over_n_log10}
        lines += ["", f"Best path-norm point: {best.dataset} {best.model} {best.method} "
                  f"(strength {best.strength:g}, n = {best.n_train}): test accuracy "
                  f"{100 * best.test_accuracy:.1f}%, valid top-1 bound "
                  f"10^{best.bound_log10:.2f} (thesis form 10^{best.thesis_bound_log10:.2f}); "
                  + _verdict(best.bound_log10, best) + ".",
                  "Its complexity term 8 C r / gamma * sigma / n in log10: "
                  + ", ".join(f"{k} {v:+.2f}" for k, v in terms.items())
                  + f", training margin loss {best.train_margin_loss:.3f}."]
    occam = result.best_compression()
    if occam is not None:
        lines += ["", f"Best compression point: {occam.dataset} {occam.model} {occam.method} "
                  f"(strength {occam.strength:g}, n = {occam.n_train}): test accuracy "
                  f"{100 * occam.test_accuracy:.1f}%, certificate on the trained network "
                  f"{occam.compression_bound:.4f} = kl^-1({occam.compression_empirical:.4f}, "
                  f"{occam.compression_budget:.4f}), L = {occam.compression_bits} bits, "
                  f"transfer {occam.compression_transfer}; "
                  + _verdict(math.log10(occam.compression_bound), occam) + "."]
    return "\n".join(lines) + "\n"


def _verdict(log10_bound: float, point: FrontierPoint) -> str:
    """The bound against 1 and against chance (1 - max class frequency of the training
    labels; points of an older CSV without it are judged against 1 only)."""
    chance = None if math.isnan(point.chance) else point.chance
    return verdict(log10_bound, 1 - point.test_accuracy, chance=chance,
                   rule="1 - max class frequency of the training labels")


def _prob(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.3f}"


def _fmt(log10: float) -> str:
    return "n/a" if math.isnan(log10) else f"10^{log10:.2f}"


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{100 * v:.1f}%"


def with_sweep(config: FrontierConfig, methods: Sequence[str]) -> FrontierConfig:
    """``config`` restricted to ``methods`` (their default strengths)."""
    unknown = [m for m in methods if m not in DEFAULT_SWEEP]
    if unknown:
        raise InvalidParameterError(f"unknown methods {unknown}; choose from "
                                    f"{list(DEFAULT_SWEEP)}")
    return replace(config, sweep={m: config.sweep[m] for m in methods})
