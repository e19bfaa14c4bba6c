"""Cost of path-norm training: the differentiable penalty, a Path-SGD step and a regularised
training step, each against the model's own forward and backward pass, in the same run.

    .venv/bin/python benchmarks/bench_train.py [--repeats 7] [--out benchmarks/results/train.csv]

One thread, float32 models: small_cnn (1x8x8), the digits MLP, ResNet-18 (3x32x32, 10
classes) in train mode. Shortest time over interleaved rounds of:
- ``fb1``: model forward + backward of the cross-entropy at batch 1 (the unit of issue 25);
- ``penalty``: ln ||Phi||_1 forward + backward (``differentiable_path_norm``);
- ``path_sgd_extra``: the part of a Path-SGD step beyond SGD's (gamma from the |theta|^2
  pass forward + backward, and the scaled update), i.e. ``PathSGD.step`` on ready grads;
- ``step``: an unregularised SGD step at batch 64 (forward, backward, update);
- ``reg_step``: the same step with loss + 0.1 ln ||Phi||_1;
- ``path_sgd_step``: the same step with PathSGD instead of SGD.
Prints penalty / fb1, path_sgd_extra / fb1, path_sgd_step / step and reg_step / step.
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.models import mlp, resnet18, small_cnn
from pathlift.train import PathSGD
from timing import interleaved_min

CASES = {"small_cnn": (small_cnn, (1, 8, 8)),
         "mlp": (lambda: mlp(64, (128, 64), 10), (1, 8, 8)),
         "resnet18": (lambda: resnet18(num_classes=10), (3, 32, 32))}


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

    def penalty() -> None:
        model.zero_grad()
        differentiable_path_norm(model, shape, q=1.0).backward()

    def path_sgd_extra() -> None:
        path_sgd.step()

    def step() -> None:
        sgd.zero_grad()
        ce(model(x), y).backward()
        sgd.step()

    def reg_step() -> None:
        sgd.zero_grad()
        (ce(model(x), y) + 0.1 * differentiable_path_norm(model, shape, q=1.0)).backward()
        sgd.step()

    def path_sgd_step() -> None:
        path_sgd.zero_grad()
        ce(model(x), y).backward()
        path_sgd.step()

    fb1()  # grads exist for path_sgd_extra
    penalty()  # trace once
    times = interleaved_min({"fb1": fb1, "penalty": penalty, "path_sgd_extra": path_sgd_extra,
                             "step": step, "reg_step": reg_step,
                             "path_sgd_step": path_sgd_step}, repeats)
    ratios = {"penalty/fb1": times["penalty"] / times["fb1"],
              "path_sgd_extra/fb1": times["path_sgd_extra"] / times["fb1"],
              "path_sgd_step/step": times["path_sgd_step"] / times["step"],
              "reg_step/step": times["reg_step"] / times["step"]}
    print(f"{name}: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items())
          + f" (fb1 {1e3 * times['fb1']:.2f} ms, step {1e3 * times['step']:.2f} ms)")
    return {"model": name, **{k: round(v * 1e3, 4) for k, v in times.items()},
            **{k: round(v, 3) for k, v in ratios.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="CSV of times (ms) and ratios")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [measure(name, build, shape, args.repeats) for name, (build, shape) in CASES.items()]
    print(f"load average {os.getloadavg()[0]:.2f}, one thread")
    if args.out is not None:
        import io

        from pathlift.files import write_text
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text(args.out, buffer.getvalue())


if __name__ == "__main__":
    main()
