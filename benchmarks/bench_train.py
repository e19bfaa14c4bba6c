"""Cost of path-norm training: the differentiable penalty, a Path-SGD step and a regularised
training step, each against the model's own forward and backward pass, in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train.py [--repeats 50]
        [--models mlp small_cnn] [--out benchmarks/results/train_cost_cpu_t1_avx512.csv]
        [--label after]

One thread, float32 models: small_cnn (1x8x8), the digits MLP, ResNet-18 (3x32x32, 10
classes) in train mode (``--models`` also takes two other MLPs: 784-256-256-10 and a
narrow one of five layers). CPU time of this thread (``time.thread_time``: other processes'
time on the core left out) of single calls, in rounds that call every function once in
a new order; each figure is the median over the rounds of that round's ratio:
- ``fb1``: model forward + backward of the cross-entropy at batch 1 (the unit of issue 25);
- ``penalty``: ln ||Phi||_1 forward + backward (``differentiable_path_norm``; for
  ResNet-18 inside ``eval_mode``, as the penalty refuses BatchNorm in training mode);
- ``path_sgd_extra``: the part of a Path-SGD step beyond SGD's (gamma from the |theta|^2
  pass forward + backward, and the scaled update), i.e. ``PathSGD.step`` on ready grads
  (for ResNet-18 inside ``eval_mode``);
- ``step``: an unregularised SGD step at batch 64 (forward, backward, update);
- ``reg_step``: the same step with loss + 0.1 ln ||Phi||_1;
- ``reg_backward``: the same regularised step as ``loss.backward()`` then
  ``path_norm_backward(model, shape, 0.1)`` (the penalty's gradient added to ``.grad``:
  one compiled call on an MLP, autograd's route on the others);
- ``path_sgd_step``: the same step with PathSGD instead of SGD.
Prints penalty / fb1, path_sgd_extra / fb1, path_sgd_step / step, reg_step / step and
reg_backward / step, with the machine. The penalty and Path-SGD's gamma are replayed
from their recorded passes (``pathlift.lift.replay``) after the first call, written out
as straight-line code (``pathlift.lift.program``), gamma's gradient by the pass's
transpose without autograd (``pathlift.lift.transpose``), and an MLP's pass by one
compiled call (``pathlift.lift.chain``: in a step, ln ||Phi|| and its gradient by that
one call in the forward, the backward scaling them by the upstream gradient); run the
script with an older checkout's ``src`` on PYTHONPATH, alternating with this one, for the
walked ones. ``--out`` keeps the rows of the file's other labels (one row per label and
model), each naming the machine (vector width, cores).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from pathlift.graph import eval_mode
from pathlift.kron.cache import machine_description
from pathlift.lift.differentiable import differentiable_path_norm, path_norm_backward
from pathlift.models import mlp, resnet18, small_cnn
from pathlift.train import PathSGD
from timing import round_robin, write_rows

CASES = {"small_cnn": (small_cnn, (1, 8, 8)),
         "mlp": (lambda: mlp(64, (128, 64), 10), (1, 8, 8)),
         "resnet18": (lambda: resnet18(num_classes=10), (3, 32, 32)),
         # other MLP shapes, so that nothing is tuned to the digits MLP (not by default)
         "mlp_784_256_256_10": (lambda: mlp(784, (256, 256), 10), (784,)),
         "mlp_narrow_5": (lambda: mlp(64, (32, 32, 32, 32), 10), (1, 8, 8))}
DEFAULT = ["small_cnn", "mlp", "resnet18"]


def measure(name: str, build: Callable[[], nn.Module], shape: tuple[int, ...],
            repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = build().train()
    x1, y1 = torch.randn(1, *shape), torch.randint(10, (1,))
    x, y = torch.randn(64, *shape), torch.randint(10, (64,))
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
    path_sgd = PathSGD(model, shape, lr=1e-6)
    ce = nn.functional.cross_entropy
    if name == "resnet18":  # BatchNorm: batch statistics need more than one sample
        x1, y1 = x[:2], y[:2]

    def fb1() -> None:
        model.zero_grad()
        ce(model(x1), y1).backward()

    # BatchNorm in training mode is refused, as by path_norm: measured as its affine map
    batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())

    def as_eval() -> contextlib.AbstractContextManager:
        return eval_mode(model) if batchnorm else contextlib.nullcontext()

    def ln_norm() -> torch.Tensor:
        with as_eval():
            return differentiable_path_norm(model, shape, q=1.0)

    def path_sgd_update() -> None:
        with as_eval():
            path_sgd.step()

    def penalty() -> None:
        model.zero_grad()
        ln_norm().backward()

    def path_sgd_extra() -> None:
        path_sgd_update()

    def step() -> None:
        sgd.zero_grad()
        ce(model(x), y).backward()
        sgd.step()

    def reg_step() -> None:
        sgd.zero_grad()
        (ce(model(x), y) + 0.1 * ln_norm()).backward()
        sgd.step()

    def reg_backward() -> None:
        sgd.zero_grad()
        ce(model(x), y).backward()
        with as_eval():
            path_norm_backward(model, shape, 0.1)
        sgd.step()

    def path_sgd_step() -> None:
        path_sgd.zero_grad()
        ce(model(x), y).backward()
        path_sgd_update()

    fb1()  # grads exist for path_sgd_extra
    penalty()  # trace and record once
    path_sgd_update()
    times = round_robin({"fb1": fb1, "penalty": penalty, "path_sgd_extra": path_sgd_extra,
                         "step": step, "reg_step": reg_step, "reg_backward": reg_backward,
                         "path_sgd_step": path_sgd_step},
                        repeats, min_sample=0, clock=time.thread_time)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    ratios = {"penalty/fb1": ratio("penalty", "fb1"),
              "path_sgd_extra/fb1": ratio("path_sgd_extra", "fb1"),
              "path_sgd_step/step": ratio("path_sgd_step", "step"),
              "reg_step/step": ratio("reg_step", "step"),
              "reg_backward/step": ratio("reg_backward", "step")}
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"{name}: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items())
          + f" (fb1 {1e3 * medians['fb1']:.2f} ms, step {1e3 * medians['step']:.2f} ms)")
    return {"model": name, **{k: round(v * 1e3, 4) for k, v in medians.items()},
            **{k: round(v, 3) for k, v in ratios.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--models", nargs="+", choices=list(CASES), default=DEFAULT)
    parser.add_argument("--out", type=Path, default=None, help="CSV of times (ms) and ratios")
    parser.add_argument("--label", default="this checkout",
                        help="the code measured (its rows in --out replace that label's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = machine_description()
    print(f"{machine}, one thread, load {os.getloadavg()[0]:.2f}")
    rows = [{"label": args.label, **measure(name, *CASES[name], args.repeats),
             "load": round(os.getloadavg()[0], 1), "machine": machine}
            for name in args.models]
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.out is not None:
        write_rows(args.out, rows)


if __name__ == "__main__":
    main()
