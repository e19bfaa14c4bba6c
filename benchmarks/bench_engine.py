"""Cost of the graph engine where users call it, as multiples of one forward pass.

    .venv/bin/python benchmarks/bench_engine.py [--rounds 5] [--threads 1]
        [--models resnet18 resnet50 vgg11] [--authors PATH/TO/pathnorm.py]
        [--out benchmarks/results/bench_engine_runs.csv] [--label "this checkout"]

For each model at 3x224x224 (the MLP at 3x32x32), measured in turns in the same run (each
figure is the median over the rounds of its ratio to the forward pass timed in the same
round):
one float32 forward pass at batch 1 (the baseline); the first ``path_norm`` call on a model
object never seen before (trace, validation and the |theta| pass; float64 and float32
mantissas); a repeated call after an in-place weight update (the graph is reused);
all path-magnitude scores in float32, trace included. With ``--authors`` the authors'
script (agonon/pathnorm-pytorch, not shipped with pathlift) is timed in the same turns.
Targets on ResNet-18 (issue 33: no engine regression from the library/jobs split): first
call float32 <= 1.6x, repeated float32 <= 1.1x, scores <= 3.6x (and float64 <= 0.7x the
authors' float64). With one thread each sample is the thread's CPU time (all the work runs
on it), which leaves out the time other processes hold the core on a shared machine.
``--out`` keeps the rows of the file's other labels (one row per label and model), each
naming the machine (vector width, cores) and the load.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from pathlift.graph import copy_model
from pathlift.kron.cache import machine_description
from pathlift.lift import path_norm
from pathlift.models import mlp, resnet18, resnet50, unet, vgg11
from pathlift.prune import path_magnitude_scores
from timing import round_robin, write_rows

SHAPE = (3, 224, 224)
MODELS: dict[str, Callable[[], nn.Module]] = {
    "resnet18": resnet18, "resnet50": resnet50, "vgg11": vgg11,
    # networks beyond the targets' (not run by default): an encoder-decoder with skip
    # concatenations and transposed convolutions, and a CIFAR-sized MLP at (3, 32, 32)
    "unet": lambda: unet(3, 2, base=16, depth=4),
    "mlp": lambda: mlp(3 * 32 * 32, (1024, 512), 10)}
DEFAULT = ("resnet18", "resnet50", "vgg11")
SHAPES = {"mlp": (3, 32, 32)}


def cases(model: nn.Module, shape: tuple[int, ...], authors
          ) -> dict[str, Callable[[], Callable[[], object]]]:
    x = torch.randn(1, *shape)

    def forward() -> Callable[[], object]:
        return lambda: model(x)

    def fresh(call: Callable[[nn.Module], object]) -> Callable[[], Callable[[], object]]:
        def setup() -> Callable[[], object]:
            copy = copy_model(model)  # a model object pathlift has never seen
            return lambda: call(copy)
        return setup

    first_param = next(model.parameters())

    def updated(dtype: torch.dtype) -> Callable[[], Callable[[], object]]:
        def setup() -> Callable[[], object]:
            with torch.no_grad():
                first_param.mul_(1.0001)  # an optimiser step: the cached graph stays valid
            return lambda: path_norm(model, shape, dtype=dtype)
        return setup

    found = {
        "forward": forward,
        "first f64": fresh(lambda m: path_norm(m, shape)),
        "first f32": fresh(lambda m: path_norm(m, shape, dtype=torch.float32)),
        "repeat f64": updated(torch.float64),
        "repeat f32": updated(torch.float32),
        "scores f32": fresh(lambda m: path_magnitude_scores(m, shape, dtype=torch.float32)),
    }
    if authors is not None:
        for name, dtype in (("authors f64", torch.float64), ("authors f32", torch.float32)):
            found[name] = fresh(lambda m, d=dtype: authors.compute_path_norm(
                m, input_shape=shape, exponent=1, working_dtype=d))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT), choices=list(MODELS))
    parser.add_argument("--authors", default=None,
                        help="path to the authors' pathnorm.py, timed in the same turns")
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/bench_engine_runs.csv"))
    parser.add_argument("--label", default="this checkout",
                        help="the code measured (its rows in --out replace that label's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    authors = None
    if args.authors:
        spec = importlib.util.spec_from_file_location("authors_pathnorm", args.authors)
        authors = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(authors)
    clock = "CPU" if args.threads == 1 else "wall-clock"
    machine = machine_description()
    print(machine)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), input {SHAPE} "
          f"(mlp {SHAPES['mlp']}), median of {args.rounds} round-robin rounds ({clock} "
          "time); ratios to one float32 forward pass at batch 1")
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = MODELS[name]().eval()
        shape = SHAPES.get(name, SHAPE)
        path_norm(model, shape, dtype=torch.float32)  # the repeated call's graph
        with torch.no_grad():
            times = round_robin(cases(model, shape, authors), args.rounds, min_sample=0,
                                setup=True,
                                clock=time.thread_time if args.threads == 1 else time.perf_counter)
        base = times.pop("forward")
        ratios = {label: statistics.median(t / b for t, b in zip(ts, base, strict=True))
                  for label, ts in times.items()}  # each against its own round's forward
        row = "  ".join(f"{label} {r:5.2f}x" for label, r in ratios.items())
        forward_ms = statistics.median(base) * 1e3
        print(f"{name:<9} forward {forward_ms:6.1f} ms  {row}", flush=True)
        rows.append({"label": args.label, "model": name, "forward_ms": f"{forward_ms:.2f}",
                     **{label.replace(" ", "_") + "_x": f"{r:.3f}"
                        for label, r in ratios.items()},
                     "load": round(os.getloadavg()[0], 1), "machine": machine})
    write_rows(args.out, rows)


if __name__ == "__main__":
    main()
