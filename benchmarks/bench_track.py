"""Cost of one ``PathNormTracker`` call against a forward pass and a training step.

    .venv/bin/python benchmarks/bench_track.py [--repeats 7]

For small_cnn (1x8x8) and ResNet-18 (3x32x32, 10 classes), one thread: the shortest time of
a tracker call on the already traced graph (path-norms q = 1, 2, 4 and the bound; then
with the two sparsities, one more forward and backward |theta| pass), in float64 (the
default) and float32, against a float32 forward pass and an SGD step at batch 64, all
timed in the same interleaved rounds. Prints each ratio and the load average.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
from torch import nn

from pathlift.models import resnet18, small_cnn
from pathlift.track import PathNormTracker
from timing import interleaved_min

CASES = {"small_cnn": (small_cnn, (1, 8, 8)),
         "resnet18": (lambda: resnet18(num_classes=10), (3, 32, 32))}


def measure(name: str, build: Callable[[], nn.Module], shape: tuple[int, ...],
            repeats: int) -> None:
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(64, *shape), torch.randint(10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    fns: dict[str, Callable[[], object]] = {"forward": forward, "step": step}
    for dtype in (torch.float64, torch.float32):
        for sparsity in (False, True):
            tracker = PathNormTracker(shape, n_train=1000, sigma=30.0, sparsity=sparsity,
                                      dtype=dtype)
            tracker(model)  # trace once
            label = f"{str(dtype)[6:]}{' + sparsities' if sparsity else ''}"
            fns[label] = lambda t=tracker: t(model)
    t = interleaved_min(fns, repeats)
    print(f"{name}: forward {1e3 * t['forward']:.1f} ms, SGD step {1e3 * t['step']:.1f} ms")
    for label in list(fns)[2:]:
        print(f"  tracker {label:<24} {1e3 * t[label]:7.1f} ms = "
              f"{t[label] / t['forward']:.2f} forward, {t[label] / t['step']:.2f} step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f}, 1 thread, batch 64")
    for name, (build, shape) in CASES.items():
        measure(name, build, shape, args.repeats)


if __name__ == "__main__":
    main()
