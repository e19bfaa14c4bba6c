"""The compiled chain (``pathlift.lift.chain``) against the replayed tape it replaces, in one
process: two copies of each MLP, one whose passes run as the chain, one whose plans keep
the tape (as main's code), and a plain SGD step, alternated round-robin.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_chain.py [--repeats 200]

One thread, float32, batch 64, CPU time of this thread; each figure the median over the
rounds of that round's ratio to the plain step: the step with loss + 0.1 ln ||Phi||_1 and
the Path-SGD step, by the chain and by the tape. Also the floor of a penalty as one
autograd node: the step with 0.1 times a constant (the two nodes of the scaled sum) and
with a ``Function`` doing nothing but returning zero gradients.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
from torch import nn

from pathlift.kron.cache import machine_description
from pathlift.lift import replay
from pathlift.lift.chain import Chain
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.lift.transpose import Transposed
from pathlift.models import mlp
from pathlift.train import PathSGD
from timing import round_robin

CASES = {"digits mlp": (lambda: mlp(64, (128, 64), 10), (1, 8, 8)),
         "784-256-256-10": (lambda: mlp(784, (256, 256), 10), (784,)),
         "narrow, 5 layers": (lambda: mlp(64, (32, 32, 32, 32), 10), (1, 8, 8))}


class _Zeros(torch.autograd.Function):
    """A penalty node that computes nothing: a constant, zero gradients."""

    @staticmethod
    def forward(ctx, *params):
        ctx.shapes = [p for p in params]
        return torch.tensor(0.0)

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.zeros_like(p) for p in ctx.shapes)


def _tape_plans(model: nn.Module) -> None:
    """Keep the tapes of ``model``'s plans (drop the chains): main's replay."""
    plans = replay._PLANS[model]
    for key, (watch, tape, plan) in plans.items():
        if isinstance(plan, Chain):  # gamma's result: (layers, total, leaves)
            slots = tape.result_slots()
            plans[key] = (watch, tape, Transposed.plan(tape, slots[2:], slots[1])
                          if key[0] == "gamma" else None)


def measure(name: str, repeats: int) -> dict[str, float]:
    build, shape = CASES[name]
    torch.manual_seed(0)
    chained = build().train()
    taped = copy.deepcopy(chained)
    x, y = torch.randn(64, *shape), torch.randint(10, (64,))
    ce = nn.functional.cross_entropy
    runs = {}
    for label, model in (("chain", chained), ("tape", taped)):
        sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
        path_sgd = PathSGD(model, shape, lr=1e-6)
        differentiable_path_norm(model, shape)
        ce(model(x), y).backward()
        path_sgd.step()
        runs[label] = (model, sgd, path_sgd)
    _tape_plans(taped)
    model, sgd, _ = runs["chain"]
    params = list(model.parameters())
    constant = torch.tensor(1.0, requires_grad=True)

    def step() -> None:
        sgd.zero_grad()
        ce(model(x), y).backward()
        sgd.step()

    def scaled(penalty) -> None:
        sgd.zero_grad()
        (ce(model(x), y) + 0.1 * penalty()).backward()
        sgd.step()

    fns = {"step": step, "constant": lambda: scaled(lambda: constant),
           "zeros node": lambda: scaled(lambda: _Zeros.apply(*params))}
    for label, (net, opt, psgd) in runs.items():
        def reg(net=net, opt=opt) -> None:
            opt.zero_grad()
            (ce(net(x), y) + 0.1 * differentiable_path_norm(net, shape)).backward()
            opt.step()

        def path(net=net, psgd=psgd) -> None:
            psgd.zero_grad()
            ce(net(x), y).backward()
            psgd.step()

        fns[f"regularised, {label}"], fns[f"Path-SGD, {label}"] = reg, path
    times = round_robin(fns, repeats, min_sample=0, clock=time.thread_time)
    ratios = {k: statistics.median(a / b for a, b in zip(v, times["step"], strict=True))
              for k, v in times.items() if k != "step"}
    print(f"{name} (step {1e3 * statistics.median(times['step']):.2f} ms): "
          + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    assert all(isinstance(p, Chain) for _, _, p in replay._PLANS[chained].values())
    assert not any(isinstance(p, Chain) for _, _, p in replay._PLANS[taped].values())
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{machine_description()}, one thread, load {os.getloadavg()[0]:.2f}")
    for name in args.models:
        measure(name, args.repeats)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
