"""Kronecker-sparse networks in all of pathlift, on the digits: the MLP 64-256-256-10 dense,
with its two hidden layers designed for this machine (``design`` at a quarter of their
parameters, trained from scratch), and designed then path-magnitude pruned (half of the
factor entries masked through torch.nn.utils.prune, ``pathlift.prune.prune_factors``, then
fine-tuned with the masks kept): test accuracy, l1 and l2 path-norms (the factors are
layers of the DAG, ``pathlift.graph.ops.kron``), the path-metric to the unpruned network,
the path-metric d(theta, theta') of the pruning itself (before fine-tuning; exact, Lemma
3.4.1), non-zero parameters, and forward time against the dense network measured in the
same round-robin run (batch 256, the designed layers tuned on this machine).

    python benchmarks/bench_kron_digits.py                  # 1 thread, 30 + 10 epochs
    python benchmarks/bench_kron_digits.py --epochs 5 --finetune 2   # quick

About a minute on 2 cores (the design of the two layers is cached per machine). Writes
kron_digits.csv under --out (default runs/bench-kron-digits-<timestamp>).
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from pathlift import files
from pathlift.data import load_digits, loaders
from pathlift.data.training import evaluate, train_classifier
from pathlift.kron import KSLinear, design, replace_linears
from pathlift.kron.cache import machine_description
from pathlift.kron.timing import round_robin, steady_allocator
from pathlift.lift import path_metric, path_norm
from pathlift.models import mlp
from pathlift.prune import prune_factors

SHAPE = (1, 8, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--finetune", type=int, default=10, help="epochs after pruning")
    parser.add_argument("--amount", type=float, default=0.5, help="factor entries pruned")
    parser.add_argument("--budget", type=float, default=0.25)
    parser.add_argument("--batch", type=int, default=256, help="rows timed per forward")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=f"runs/bench-kron-digits-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steady_allocator()
    console = Console(width=120)
    console.print(f"{machine_description()}; {args.threads} thread(s)")
    train, test = loaders(load_digits(), batch_size=64, seed=0)

    torch.manual_seed(0)
    dense = mlp(64, (256, 256))
    chains = {name: design(n_in, 256, args.budget, args.batch).chosen.patterns or None
              for name, n_in in (("1", 64), ("3", 256))}
    designed = replace_linears(dense, include=["1", "3"], init="random", design=chains).model
    for module in designed.modules():
        if isinstance(module, KSLinear):
            module.tune(args.batch)
    nets = {"dense": dense, "designed": designed}
    for net in nets.values():
        train_classifier(net, train, epochs=args.epochs, lr=0.05, progress=False, seed=0)
    cost = None
    if any(isinstance(m, KSLinear) for m in designed.modules()):
        pruned = prune_factors(designed, args.amount, SHAPE)
        cost = path_metric(designed, pruned, SHAPE)  # exact: the pruning's path-metric
        train_classifier(pruned, train, epochs=args.finetune, lr=0.02, progress=False, seed=1)
        nets["designed + pruned"] = pruned

    x = torch.randn(args.batch, *SHAPE)
    with torch.no_grad():
        for net in nets.values():
            net.eval()
        times = {k: statistics.median(v) for k, v in round_robin(
            {name: (lambda n=net: n(x)) for name, net in nets.items()}, args.repeats).items()}
    rows = []
    for name, net in nets.items():
        nonzero = sum(int((m.factor(i) != 0).sum()) for m in net.modules()
                      if isinstance(m, KSLinear) for i in range(len(m.patterns)))
        nonzero += sum(int((p != 0).sum()) for n, p in net.named_parameters()
                       if "factors" not in n)
        metric = cost if name == "designed + pruned" else None
        rows.append({"network": name, "accuracy": evaluate(net, test),
                     "l1_path_norm": path_norm(net, SHAPE, q=1).value,
                     "l2_path_norm": path_norm(net, SHAPE, q=2).value,
                     "pruning_path_metric": "" if metric is None else metric.value,
                     "nonzero_parameters": nonzero,
                     "time_vs_dense": times[name] / times["dense"],
                     "chains": " | ".join(" ".join(map(str, c)) if c else "dense"
                                          for c in chains.values())})
    table = Table(title=f"digits MLP 64-256-256-10: dense, designed (budget {args.budget:g}), "
                  f"designed + {args.amount:.0%} of factor entries pruned")
    for col in ("network", "accuracy", "l1 path-norm", "l2 path-norm", "pruning d(θ, θ')",
                "nonzero params", "time / dense"):
        table.add_column(col, justify="left" if col == "network" else "right")
    for r in rows:
        table.add_row(r["network"], f"{r['accuracy']:.4f}", f"{r['l1_path_norm']:.4g}",
                      f"{r['l2_path_norm']:.4g}",
                      f"{r['pruning_path_metric']:.4g}" if r["pruning_path_metric"] != ""
                      else "-", f"{r['nonzero_parameters']:,}",
                      f"{r['time_vs_dense']:.2f}")
    console.print(table)
    console.print("designed chains: " + rows[0]["chains"])
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path = files.write_text(Path(args.out) / "kron_digits.csv",
                            f"# {machine_description()}\n" + buffer.getvalue())
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
