"""The window sums of max-pool neurons (``pathlift.graph.ops.pooling.window_sum``, the
|theta|^q pass of Thm 3.1.1) by a depthwise convolution with a kernel of ones against the
sum pool (zero padding, then ``avg_pool`` with divisor 1), in the same run, round-robin:
forward alone (path-norms) and forward + backward (path-magnitude scores, the penalty).

    .venv/bin/python benchmarks/bench_window_sum.py [--rounds 7] [--threads 1]

Prints t(sum pool) / t(convolution) per geometry and dtype: above 1 the convolution is
faster. ``window_sum`` takes the convolution for float32 on the CPU above 2^15 numbers
(and for dilated windows), the sum pool otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from timing import round_robin

#: (channels, size, kernel, stride, padding): ResNet's stem pool, VGG's pools, others, and
#: the batch-1 pools of a training step's penalty (small_cnn's two, ResNet-18's at 32x32).
GEOMETRIES = [(64, 112, 3, 2, 1), (64, 224, 2, 2, 0), (128, 112, 2, 2, 0), (256, 56, 2, 2, 0),
              (512, 28, 3, 1, 1), (512, 14, 2, 2, 0), (64, 112, 2, 1, 0), (16, 32, 3, 2, 1),
              (16, 8, 2, 2, 0), (32, 4, 2, 2, 0), (64, 16, 3, 2, 1)]


def _pool(x: torch.Tensor, k: int, s: int, p: int) -> torch.Tensor:
    return F.avg_pool2d(F.pad(x, (p, p, p, p)) if p else x, k, s, divisor_override=1)


def _conv(x: torch.Tensor, k: int, s: int, p: int) -> torch.Tensor:
    return F.conv2d(x, x.new_ones((x.shape[1], 1, k, k)), None, s, p, 1, x.shape[1])


def _timed(sums: Callable[..., torch.Tensor], x: torch.Tensor, geometry: tuple[int, ...],
           backward: bool) -> Callable[[], object]:
    def call() -> object:
        y = sums(x, *geometry)
        return y.sum().backward() if backward else y
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch 1, median of "
          f"{args.rounds} rounds: t(sum pool) / t(depthwise convolution)")
    for dtype in (torch.float32, torch.float64):
        for c, size, *geometry in GEOMETRIES:
            row = []
            for backward in (False, True):
                x = torch.rand((1, c, size, size), dtype=dtype, requires_grad=backward)
                with torch.set_grad_enabled(backward):
                    times = round_robin({name: _timed(sums, x, tuple(geometry), backward)
                                         for name, sums in (("pool", _pool), ("conv", _conv))},
                                        args.rounds, clock=clock)
                ratio = statistics.median(times["pool"]) / statistics.median(times["conv"])
                row.append(f"{'fwd+bwd' if backward else 'forward'} {ratio:5.2f}x")
            k, s, p = geometry
            print(f"{str(dtype).removeprefix('torch.'):<8} {c:>3}x{size:<3} k{k} s{s} p{p}  "
                  + "  ".join(row))


if __name__ == "__main__":
    main()
