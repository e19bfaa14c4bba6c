"""Depth-limit experiments of the master's thesis, Sec. 4: datasets, runs, grids, rate fits.

* C10k (Sec. 4.1): N points uniform in [-1, 1], constant target 0.01, d = 1; N = 10,000 as in
  the text (the thesis' code used 1e5: ``n_samples``). Loss: ``squared_error``, ||y - yhat||^2
  averaged over samples, as in the thesis' code (see pathlift.depth.train).
* Digits (in place of CIFAR-10, Table 4.1 classes, d = 15): scikit-learn's 8x8 digits,
  training split of pathlift.data.load_digits, 64 features, cross-entropy.

A run trains one model class at one depth and one seed (the seed fixes data and embeddings,
so one seed is the same network family across depths) and measures the 1-variation of the
rescaled weight path L^beta W^{(L)}: of the norm path k -> ||L^beta W_k|| (see
../shared/REFERENCE.md) and of the matrix path itself (what the thesis' table printer,
``path_norm.py --pvar_only`` in its code, measures; the two agree on every constant-init
C10k run here, whose weights keep their sign).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pathlift.data import load_digits
from pathlift.depth.classes import parse_model
from pathlift.depth.model import DepthResNet
from pathlift.depth.published import PUBLISHED_C10K
from pathlift.depth.pvar import p_variation
from pathlift.depth.train import train
from pathlift.errors import InvalidParameterError, check_count
from pathlift.files import append_rows, check_appendable
from pathlift.jobs.plots import depth_trajectories
from pathlift.memory import check_bytes, check_samples, check_seconds, show_seconds, time_limit

__all__ = ["CSV_FIELDS", "DepthExperiment", "DepthRow", "DepthRun", "RhoFit", "WorkEstimate",
           "append_csv", "c10k", "check_run_size", "depth_experiment", "depth_table", "digits",
           "estimate_seconds", "fit_rate", "grid", "maxima", "run"]

CSV_FIELDS = ("model", "depth", "seed", "n_samples", "dtype", "steps", "learning_rate",
              "one_var_norm", "one_var_matrix", "loss_first", "loss_last", "rho", "C")


@dataclass(frozen=True)
class DepthRun:
    """One trained model: 1-variations of L^beta W^{(L)}, losses, Omega(t) and the norm path."""

    model: str
    depth: int
    seed: int
    n_samples: int
    dtype: str
    steps: int
    learning_rate: float
    one_var_norm: float
    one_var_matrix: float
    loss: tuple[float, ...]
    omega: tuple[float, ...]
    norm_path: tuple[float, ...]


@dataclass(frozen=True)
class RhoFit:
    """Omega(t) ~ C / (t + 1)^rho (eq. 4.5), with the standard deviations of curve_fit."""

    C: float
    rho: float
    C_std: float
    rho_std: float


def c10k(n_samples: int = 10_000, target: float = 0.01, seed: int = 0,
         dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic C10k set (thesis Sec. 4.1): x ~ U[-1, 1], y = ``target``; shapes (N, 1)."""
    check_samples(n_samples, (1,), "C10k")
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = (torch.rand(n_samples, 1, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    return x, torch.full_like(x, target)


def digits(seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Training split of scikit-learn's digits: x (N, 64) in [0, 1], integer labels (N,)."""
    x, y = load_digits(seed=seed).train.tensors
    return x.reshape(x.shape[0], -1).to(dtype), y


def run(model: str, depth: int, seed: int = 0, n_samples: int = 10_000,
        dtype: torch.dtype = torch.float64,
        on_step: Callable[[int], None] | None = None) -> DepthRun:
    """Train class ``model`` (e.g. "C10k-B12c") at depth L for T_L = ceil(5 log L) GD steps."""
    cls, init = parse_model(model)
    if depth < 2:
        raise InvalidParameterError(f"depth={depth}: the lab needs L >= 2 (T_L = ceil(5 log L))")
    x, y, out, loss = _data(model, n_samples, seed, dtype)
    net = DepthResNet(x.shape[1], out, depth, cls.d, cls.alpha, cls.gamma, cls.activation,
                      init, seed, dtype)
    steps = cls.steps(depth)
    trained = train(net, x, y, steps, cls.learning_rate(depth), loss, on_step)
    path = trained.model.rescaled_weights().reshape(depth, -1).double().numpy()
    norms = np.linalg.norm(path, axis=1)
    return DepthRun(model, depth, seed, x.shape[0], str(dtype).removeprefix("torch."), steps,
                    trained.learning_rate,
                    p_variation(norms).value, p_variation(path).value,
                    trained.loss, trained.omega, tuple(norms.tolist()))


def _data(model: str, n_samples: int, seed: int, dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor, int, str]:
    """The training set of class ``model``: inputs, targets, output width and loss."""
    cls, _ = parse_model(model)
    if cls.dataset == "C10k":
        return (*c10k(n_samples, seed=seed, dtype=dtype), 1, "squared_error")
    return (*digits(seed, dtype), 10, "cross_entropy")


#: the depth of the probe that times one training step (``estimate_seconds``)
_PROBE_DEPTH = 16
_PROBE_STEPS = 2


@dataclass(frozen=True)
class WorkEstimate:
    """What ``grid`` will do: ``layer_steps`` = seeds x the sum over depths of L x T_L
    (one forward and backward pass of one d x d residual layer over all samples each), and
    ``seconds`` = layer_steps x ``seconds_per_layer_step``, timed on this machine by a
    probe of depth 16 on the same samples after one untimed step (the probe's own time,
    under a second, is not counted)."""

    runs: int
    layer_steps: int
    seconds_per_layer_step: float

    @property
    def seconds(self) -> float:
        return self.layer_steps * self.seconds_per_layer_step

    def line(self) -> str:
        """The estimate in one line, saying what it counts."""
        return (f"estimate: {self.runs} run(s), {self.layer_steps:,} layer-steps (L x T_L "
                f"summed; one forward and backward pass of one residual layer over every "
                f"sample each), about {show_seconds(self.seconds)} at "
                f"{self.seconds_per_layer_step * 1e6:.3g} us a layer-step (timed on this "
                f"machine); limit {show_seconds(time_limit())}")


def estimate_seconds(model: str, depths: Sequence[int], seeds: int, n_samples: int,
                     dtype: torch.dtype) -> WorkEstimate:
    """Size ``grid(model, depths, seeds, n_samples, dtype)`` before it runs: count its
    layer-steps and time a few steps of a depth-16 network on the same samples."""
    cls, init = parse_model(model)
    x, y, out, loss = _data(model, n_samples, 0, dtype)
    net = DepthResNet(x.shape[1], out, _PROBE_DEPTH, cls.d, cls.alpha, cls.gamma,
                      cls.activation, init, 0, dtype)
    train(net, x, y, 1, cls.learning_rate(_PROBE_DEPTH), loss)  # warm-up, not timed
    start = time.perf_counter()
    train(net, x, y, _PROBE_STEPS, cls.learning_rate(_PROBE_DEPTH), loss)
    per_layer_step = (time.perf_counter() - start) / (_PROBE_STEPS * _PROBE_DEPTH)
    return WorkEstimate(len(depths) * seeds, seeds * sum(d * cls.steps(d) for d in depths),
                        per_layer_step)


#: tensors autograd keeps per residual layer and sample: the layer's input, its
#: pre-activation and its activation, each of d values (DepthResNet, eq. 4.1)
_SAVED_PER_LAYER = 3
_DIGITS = 1797  # scikit-learn's digits, every split: a bound on the training split


def check_run_size(model: str, depth: int, n_samples: int, dtype: torch.dtype) -> None:
    """Refuse, before anything is drawn or trained, a run whose backward pass would keep
    more than the memory limit: about 3 L N d values for L layers, N samples and width d
    (``--depths 1000000`` once trained silently for minutes before failing)."""
    cls, _ = parse_model(model)
    n = n_samples if cls.dataset == "C10k" else _DIGITS
    needed = _SAVED_PER_LAYER * depth * n * cls.d * torch.empty((), dtype=dtype).element_size()
    check_bytes(needed, f"training {model} at depth L = {depth:,} on {n:,} samples "
                f"({cls.steps(depth)} full-batch steps)", "use smaller depths or --samples, or ")


def grid(model: str, depths: Iterable[int], seeds: int = 3, n_samples: int = 10_000,
         dtype: torch.dtype = torch.float64,
         on_run: Callable[[DepthRun], None] | None = None, *,
         on_estimate: Callable[[WorkEstimate], None] | None = None,
         on_step: Callable[[int, int, int], None] | None = None) -> list[DepthRun]:
    """Every depth x seeds 0..seeds-1 of one class; ``on_run`` sees each run as it ends.

    Sized before it starts: refused when the largest run exceeds the memory limit
    (``check_run_size``) or the whole grid's estimate (``estimate_seconds``, given to
    ``on_estimate`` first) exceeds the time limit (``pathlift.memory.check_seconds``).
    ``on_step(depth, seed, t)`` sees every training step t of every run."""
    seeds, n_samples = check_count("seeds", seeds), check_count("n_samples", n_samples)
    depths = list(depths)
    if not depths:
        raise InvalidParameterError("give at least one depth")
    check_run_size(model, max(check_count("depth", d) for d in depths), n_samples, dtype)
    estimate = estimate_seconds(model, depths, seeds, n_samples, dtype)
    if on_estimate is not None:
        on_estimate(estimate)
    check_seconds(estimate.seconds, f"depth {model} over {len(depths)} depth(s) x {seeds} "
                  f"seed(s) on {n_samples:,} samples",
                  "use smaller or fewer depths, fewer --seeds or --samples, ")
    runs = []
    for depth in depths:
        for seed in range(seeds):
            step = None if on_step is None else functools.partial(on_step, depth, seed)
            runs.append(run(model, depth, seed, n_samples, dtype, step))
            if on_run is not None:
                on_run(runs[-1])
    return runs


def append_csv(path: str | Path, runs: Iterable[DepthRun]) -> None:
    """Append one row per run (CSV_FIELDS) to ``path``, writing the header to a new file
    (the file replaced atomically: a kill leaves the previous rows)."""
    rows = []
    for r in runs:
        fit = fit_rate(r.omega) if len(r.omega) >= 3 else None
        rows.append([r.model, r.depth, r.seed, r.n_samples, r.dtype, r.steps,
                     f"{r.learning_rate:.10g}", f"{r.one_var_norm:.10g}",
                     f"{r.one_var_matrix:.10g}", f"{r.loss[0]:.10g}", f"{r.loss[-1]:.10g}",
                     f"{fit.rho:.6g}" if fit else "", f"{fit.C:.6g}" if fit else ""])
    append_rows(path, CSV_FIELDS, rows)


def maxima(runs: Sequence[DepthRun], norm_path: bool = True) -> dict[tuple[str, int], float]:
    """(model, L) -> maximum 1-variation over the seeds, as Tables 4.3-4.5 report."""
    best: dict[tuple[str, int], float] = {}
    for r in runs:
        value = r.one_var_norm if norm_path else r.one_var_matrix
        key = (r.model, r.depth)
        best[key] = max(best.get(key, -np.inf), value)
    return best


def fit_rate(omega: Sequence[float]) -> RhoFit:
    """Fit Omega(t) = C / (t + 1)^rho (eq. 4.5) by trust-region least squares, C, rho in [0, 3].

    As the thesis (Sec. 4.3): scipy.optimize.curve_fit, method "trf", bounds B = [0, 3]^2.
    """
    from scipy.optimize import curve_fit

    values = np.asarray(omega, dtype=np.float64)
    if values.size < 3 or not np.isfinite(values).all():
        raise InvalidParameterError("fit_rate needs at least 3 finite values of Omega(t)")
    t = np.arange(values.size, dtype=np.float64)
    start = (float(np.clip(values[0], 0.0, 3.0)), 0.5)
    params, cov = curve_fit(lambda t, c, rho: c / (t + 1.0) ** rho, t, values, p0=start,
                            bounds=([0.0, 0.0], [3.0, 3.0]), method="trf")
    std = np.sqrt(np.diag(cov))
    return RhoFit(float(params[0]), float(params[1]), float(std[0]), float(std[1]))


@dataclass(frozen=True)
class DepthRow:
    """One depth of a grid: T_L, eta, the max over seeds of ||L^beta W||_1-var along the
    norm and the matrix path, the published value (None if none) and the mean fitted rho."""

    depth: int
    steps: int
    learning_rate: float
    norm_path_max: float
    matrix_path_max: float
    published: float | None
    mean_rho: float


def depth_table(runs: Sequence[DepthRun]) -> list[DepthRow]:
    """One row per depth of ``runs`` (one class), as Tables 4.3-4.5 report them."""
    norm_max, matrix_max = maxima(runs), maxima(runs, norm_path=False)
    rows = []
    for depth in sorted({r.depth for r in runs}):
        of_depth = [r for r in runs if r.depth == depth]
        first = of_depth[0]
        rhos = [fit_rate(r.omega).rho for r in of_depth]
        rows.append(DepthRow(depth, first.steps, first.learning_rate,
                             norm_max[first.model, depth], matrix_max[first.model, depth],
                             PUBLISHED_C10K.get(first.model, {}).get(depth),
                             sum(rhos) / len(rhos)))
    return rows


@dataclass(frozen=True, repr=False)
class DepthExperiment:
    """What ``depth_experiment`` did: every run (depth by depth, seed by seed), the table
    of Tables 4.3-4.5 (``depth_table``), and the CSV and plot written (None if not asked)."""

    runs: tuple[DepthRun, ...]
    table: tuple[DepthRow, ...]
    csv: Path | None
    plot: Path | None

    def __repr__(self) -> str:
        model = self.runs[0].model if self.runs else "-"
        return (f"DepthExperiment({model}, {len(self.runs)} runs, depths "
                f"{[r.depth for r in self.table]}, csv={self.csv}, plot={self.plot})")


def depth_experiment(model: str, depths: Iterable[int] = (128, 256, 512), seeds: int = 3,
                     n_samples: int = 10_000, dtype: torch.dtype = torch.float64, *,
                     csv: str | Path | None = None, plot: str | Path | None = None,
                     on_run: Callable[[DepthRun], None] | None = None,
                     on_estimate: Callable[[WorkEstimate], None] | None = None,
                     on_step: Callable[[int, int, int], None] | None = None) -> DepthExperiment:
    """``pathlift depth`` in one call: ``grid`` of class ``model``, each run appended to
    ``csv`` as it ends (``append_csv``: a kill keeps the runs done) before ``on_run`` sees
    it, then ||L^beta W_k|| against k/L for the seed-0 runs drawn to ``plot``
    (``pathlift.jobs.plots.depth_trajectories``) and the table computed (``depth_table``).
    ``on_estimate`` and ``on_step`` are ``grid``'s."""

    if csv is not None:
        check_appendable(csv)  # a CSV that cannot take the rows is refused before any run

    def ended(r: DepthRun) -> None:
        if csv is not None:
            append_csv(csv, [r])
        if on_run is not None:
            on_run(r)

    runs = grid(model, depths, seeds, n_samples, dtype, ended, on_estimate=on_estimate,
                on_step=on_step)
    drawn = None
    if plot is not None:
        drawn = depth_trajectories([r for r in runs if r.seed == 0], plot)
    return DepthExperiment(tuple(runs), tuple(depth_table(runs)),
                           None if csv is None else Path(csv), drawn)
