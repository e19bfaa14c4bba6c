"""Depth-lab training cost: hand-written depth loop vs plain autograd, same run.

    .venv/bin/python benchmarks/bench_depth.py [--compare-depth 2048] [--depth 32768]
        [--samples 10000] [--dtype float64] [--threads 1] [--full]

The T_L-step full-batch GD training of the eq. (4.1) ResNet (C10k-B12c hyper-parameters,
d = 1) at --compare-depth timed two ways: the baseline is the thesis code's layout, an
nn.ModuleList of L bias-free nn.Linear(1, 1) blocks differentiated by autograd (it keeps
O(L N) activations: ~8 GB at L = 32,768 in float64, hence the smaller comparison depth);
pathlift.depth runs one custom autograd function over the whole depth (d = 1: three
elementwise kernels per layer forward, a backward vectorised over blocks of layers).
Then two GD steps at --depth (32,768), scaled to the T_L = ceil(5 log L) steps of a
training, or with --full the whole training timed (target: < 5 minutes at L = 32,768,
N = 10,000); last, one step of the d = 15, L = 12,000 network on the digits, extrapolated.
Wall and process CPU seconds are both printed, with the load average before and after: on a
shared machine the CPU time is the stable figure. --threads sets torch's intra-op threads
(default 1: the forward is 3 L kernels of N elements, and with two threads each one ends
in a barrier that stalls whenever another process holds the second core).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from pathlift.depth.classes import parse_model
from pathlift.depth.model import DepthResNet
from pathlift.depth.train import train
from pathlift.jobs.depth import c10k, digits


class ModuleListResNet(nn.Module):
    """Baseline: the same network as L nn.Linear blocks (the thesis code's structure)."""

    def __init__(self, net: DepthResNet) -> None:
        super().__init__()
        self.net = net
        self.blocks = nn.ModuleList()
        for w in net.weight.detach():
            block = nn.Linear(net.d, net.d, bias=False, dtype=w.dtype)
            block.weight.data.copy_(w)
            self.blocks.append(block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.net.u_in.T
        for block in self.blocks:
            h = h + self.net.delta * torch.tanh(block(h))
        return h @ self.net.u_out.T


def baseline_step(model: ModuleListResNet, x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
    model.zero_grad(set_to_none=True)
    (model(x) - y).pow(2).sum(1).mean().backward()
    with torch.no_grad():
        for p in model.blocks.parameters():
            p.sub_(p.grad, alpha=lr)


def cpu_and_wall(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median (process CPU seconds, wall seconds) of ``fn()`` after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        samples.append((time.process_time() - cpu, time.perf_counter() - wall))
    return statistics.median(c for c, _ in samples), statistics.median(w for _, w in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-depth", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=32768)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--full", action="store_true", help="time the whole T_L-step training")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cls, init = parse_model("C10k-B12c")
    x, y = c10k(args.samples, dtype=dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; d=1, "
          f"N={args.samples}, {args.dtype}; load average {os.getloadavg()[0]:.2f}")

    L = args.compare_depth
    net = DepthResNet(1, 1, L, 1, cls.alpha, cls.gamma, init=init, dtype=dtype)
    lr, steps = cls.learning_rate(L), cls.steps(L)
    ours = cpu_and_wall(lambda: train(net, x, y, steps, lr, "squared_error"), args.repeats)

    def baseline_training() -> None:
        model = ModuleListResNet(net)
        for _ in range(steps):
            baseline_step(model, x, y, lr)

    base = cpu_and_wall(baseline_training, args.repeats)
    print(f"training at L={L} (T_L={steps} steps): nn.ModuleList + autograd {base[0]:.2f} s "
          f"CPU ({base[1]:.2f} s wall), pathlift.depth {ours[0]:.2f} s CPU ({ours[1]:.2f} s "
          f"wall); speed-up x{base[0] / ours[0]:.2f} CPU, x{base[1] / ours[1]:.2f} wall")
    L = args.depth
    net = DepthResNet(1, 1, L, 1, cls.alpha, cls.gamma, init=init, dtype=dtype)
    steps = cls.steps(L) if args.full else 2
    cpu, wall = time.process_time(), time.perf_counter()
    result = train(net, x, y, steps, cls.learning_rate(L), "squared_error")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    scale, how = cls.steps(L) / steps, "timed" if args.full else "two steps timed, scaled"
    print(f"training at L={L}, T_L={cls.steps(L)} steps ({how}): {scale * cpu:.1f} s CPU, "
          f"{scale * wall:.1f} s wall; baseline's cost per layer-step scaled to it: "
          f"{base[0] * cls.steps(L) * L / (cls.steps(args.compare_depth) * args.compare_depth):.1f}"
          f" s CPU; loss {result.loss[0]:.3g} -> {result.loss[-1]:.3g}; "
          f"load average {os.getloadavg()[0]:.2f}")

    digits_cls, _ = parse_model("Digits-B11c")  # d = 15 on the digits, L = 12,000
    xd, yd = digits(dtype=dtype)
    net = DepthResNet(64, 10, 12_000, 15, digits_cls.alpha, digits_cls.gamma, dtype=dtype)
    lr = digits_cls.learning_rate(12_000)
    cpu, wall = cpu_and_wall(lambda: train(net, xd, yd, 1, lr, "cross_entropy"), 1)
    steps = digits_cls.steps(12_000)
    print(f"d=15, L=12000, N={xd.shape[0]} digits, one step timed x T_L={steps}: "
          f"{steps * cpu:.1f} s CPU, {steps * wall:.1f} s wall")


if __name__ == "__main__":
    main()
