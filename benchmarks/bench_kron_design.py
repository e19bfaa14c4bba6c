"""Evidence that the Chapter 5 heuristic helps design Kronecker-sparse layers (thesis
Sec. 7.4.1): for transformer and MLP widths, the dense layer, the hand families (Monarch
with blocks of about √n, the square dyadic butterfly where it exists, the thesis' ViT-S/16
chains) and the designed chain, as t(dense)/t(chain) measured together in one round-robin
run; the Spearman rank correlation between predicted and measured time over every
candidate of each size; and the ViT-S/16 feed-forward block with designed layers.

    python benchmarks/bench_kron_design.py                 # 1 thread, 1,568 tokens, budget 1/4
    python benchmarks/bench_kron_design.py --threads 2 --sizes 512x512

Takes about half an hour on 2 cores (every candidate is timed twice, in other round-robin
groups). Writes one CSV of candidates and one predicted-vs-measured plot per size under
--out (default runs/bench-kron-design-<timestamp>).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from pathlift.jobs.bench import kron as bench
from pathlift.kron.cache import machine_description
from pathlift.kron.timing import steady_allocator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8 * 196, help="batch rows (ViT tokens)")
    parser.add_argument("--budget", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", nargs="*", default=[f"{i}x{o}" for i, o in bench.DESIGN_GRID],
                        help="n_in x n_out pairs, e.g. 384x1536")
    parser.add_argument("--out", default=f"runs/bench-kron-design-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steady = steady_allocator()
    console = Console(width=120)
    console.print(f"{machine_description()}; load {os.getloadavg()[0]:.1f}; {args.tokens} "
                  f"tokens, float32, budget {args.budget:g}"
                  f"{', steady allocator' if steady else ''}")
    out = Path(args.out)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes]
    table = Table(title="t(dense) / t(chain), same run; Spearman over every candidate")
    for col in ("n_in x n_out", "candidates", "Spearman", "dense ms", "designed chain",
                "of dense", "designed", "best hand family (in budget)", "hand",
                "designed / hand"):
        table.add_column(col, justify="left" if "chain" in col or "family" in col else "right")
    checks = {}
    for n_in, n_out in sizes:
        check = bench.check_design(n_in, n_out, args.budget, args.tokens, repeats=args.repeats)
        checks[(n_in, n_out)] = check
        _write(check, out / f"design_{n_in}x{n_out}")
        in_budget = {k: v for k, v in check.speedups.items()
                     if k != "designed" and check.density[k] <= args.budget}
        hand = max(in_budget, key=in_budget.get) if in_budget else None
        chosen = check.design.best_chain  # the designed chain (dense or not faster)
        dense_ms = 1e3 * chosen.dense_s
        table.add_row(f"{n_in} x {n_out}", str(len(check.candidates)),
                      "-" if check.spearman is None else f"{check.spearman:.2f}",
                      f"{dense_ms:.2f}", chosen.family or chosen.chain(),
                      f"{check.density['designed']:.3f}", f"{check.speedups['designed']:.2f}x",
                      hand or "-", f"{in_budget[hand]:.2f}x" if hand else "-",
                      f"{check.speedups['designed'] / in_budget[hand]:.2f}x" if hand else "-")
        console.print(f"{n_in} x {n_out}: " + ", ".join(
            f"{k} {v:.2f}x ({check.density[k]:.3f} of dense)"
            for k, v in check.speedups.items()))
    console.print(table)
    vit = {"nn": (384, 384), "up": (384, 1536), "down": (1536, 384)}
    if {(384, 1536), (1536, 384)} <= set(checks):
        from pathlift.kron import design

        designed = {k: (checks[shape].design if shape in checks else
                        design(*shape, args.budget, args.tokens, repeats=args.repeats)
                        ).best_chain.patterns for k, shape in vit.items()}
        ratios = bench.time_vit_mlp(args.tokens, ("bmm", "fused"), repeats=max(args.repeats, 10),
                                    designed=designed)
        console.print(bench.vit_table(ratios, args.tokens, "bmm and fused run the thesis "
                                      "chains, designed the designed ones with 'auto'"))
        console.print("designed chains: " + "; ".join(
            f"{k} {' '.join(map(str, v))}" for k, v in designed.items()))
        bench.write_vit_csv(ratios, out / "vit.csv", machine_description())
    console.print(f"wrote {out}")


def _write(check: bench.DesignCheck, stem: Path) -> None:
    bench.write_candidates_csv(check.candidates, stem.with_suffix(".csv"),
                               f"{check.design.machine}; spearman {check.spearman}")
    d = check.design
    rho = "-" if check.spearman is None else f"{check.spearman:.2f}"
    bench.plot_design(check.candidates, stem.with_suffix(".png"),
                      f"{d.n_out} x {d.n_in}, batch {d.batch}, Spearman {rho}: {d.machine}",
                      chosen=d.best_chain.patterns)


if __name__ == "__main__":
    main()
