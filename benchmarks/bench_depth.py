"""Depth-lab training cost: hand-written checkpointed depth loop vs plain autograd, same run.

    .venv/bin/python benchmarks/bench_depth.py [--compare-depth 2048] [--depth 32768]
        [--samples 10000] [--dtype float64] [--no-full]

One full-batch GD step of the eq. (4.1) ResNet (C10k-B12c hyper-parameters, d = 1) at
--compare-depth timed two ways: the baseline is the thesis code's layout, an nn.ModuleList
of L bias-free nn.Linear(1, 1) blocks differentiated by autograd (it keeps O(L N)
activations: ~8 GB at L = 32,768 in float64, hence the smaller comparison depth);
pathlift.depth runs one custom autograd function over the whole depth with O(sqrt(L) N)
memory. Then, unless --no-full, the whole training of T_L = ceil(5 log L) steps at --depth
with pathlift.depth.train (target: < 5 minutes at L = 32,768, N = 10,000). Wall and process
CPU seconds are both printed: on a shared machine the CPU time is the stable figure.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from pathlift.depth.classes import parse_model
from pathlift.depth.experiments import c10k
from pathlift.depth.model import DepthResNet
from pathlift.depth.train import train
from timing import median_seconds


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-depth", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=32768)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-full", action="store_true", help="skip the full T_L-step training")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    cls, init = parse_model("C10k-B12c")
    x, y = c10k(args.samples, dtype=dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; d=1, "
          f"N={args.samples}, {args.dtype}")

    L = args.compare_depth
    net = DepthResNet(1, 1, L, 1, cls.alpha, cls.gamma, init=init, dtype=dtype)
    lr = cls.learning_rate(L)
    ours = median_seconds(lambda: train(net, x, y, 1, lr, "squared_error"), args.repeats)
    baseline_model = ModuleListResNet(net)
    base = median_seconds(lambda: baseline_step(baseline_model, x, y, lr), args.repeats)
    print(f"one GD step at L={L}: nn.ModuleList + autograd {base:.3f} s, pathlift.depth "
          f"{ours:.3f} s, speed-up x{base / ours:.2f}")
    if not args.no_full:
        L = args.depth
        net = DepthResNet(1, 1, L, 1, cls.alpha, cls.gamma, init=init, dtype=dtype)
        wall, cpu = time.perf_counter(), time.process_time()
        result = train(net, x, y, cls.steps(L), cls.learning_rate(L), "squared_error")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"full training at L={L}, T_L={cls.steps(L)} steps: {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU (baseline per-layer cost extrapolated: "
              f"{base * cls.steps(L) * L / args.compare_depth:.1f} s); "
              f"loss {result.loss[0]:.3g} -> {result.loss[-1]:.3g}")

if __name__ == "__main__":
    main()
