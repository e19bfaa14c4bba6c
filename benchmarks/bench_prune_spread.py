"""The digits prune-rewind-retrain grid spread over 2 processes against 1 process.

    .venv/bin/python benchmarks/bench_prune_spread.py [--rounds 3] [--model small_cnn]
        [--epochs 10] [--seeds 3]

Each round runs ``pathlift prune`` on the same grid (seeds x 4 methods x 3 amounts x with
and without the random rescale) twice, in alternating order, each time from a fresh
interpreter (start-up included): as one process, and under ``torchrun --standalone
--nproc_per_node 2 ... --spread runs`` (each process takes every other run). Every process
runs one thread (OMP_NUM_THREADS=1). Prints each round's wall times and ratio, the median
ratio t(2 processes) / t(1 process), the largest difference between the two CSVs, column by
column except world_size and spread (0 when the floats agree bit for bit), and the load
average before and after. On a machine shared with other jobs the wall ratio depends on
their load, so the CPU seconds of all processes are printed too: half the 2-process CPU
time over the 1-process CPU time is the wall ratio two free cores would give (the work is
split evenly). Outputs go to a temporary folder.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(command: list[str], out: Path) -> tuple[float, float]:
    """Wall and CPU seconds (all processes) of one ``pathlift prune`` run writing to
    ``out``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([*command, "--out", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def largest_difference(a: Path, b: Path) -> float:
    """Largest |x - y| over the numeric cells of two runs.csv (other cells must be equal)."""
    with a.open() as fa, b.open() as fb:
        rows_a, rows_b = list(csv.DictReader(fa)), list(csv.DictReader(fb))
    if len(rows_a) != len(rows_b):
        raise SystemExit(f"{len(rows_a)} rows against {len(rows_b)}")
    worst = 0.0
    for ra, rb in zip(rows_a, rows_b, strict=True):
        for field in ra.keys() - {"world_size", "spread"}:
            try:
                worst = max(worst, abs(float(ra[field]) - float(rb[field])))
            except ValueError:
                if ra[field] != rb[field]:
                    raise SystemExit(f"{field}: {ra[field]} != {rb[field]}") from None
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    grid = ["prune", "--model", args.model, "--epochs", str(args.epochs), "--rewind-epoch", "1",
            "--seeds", str(args.seeds)]
    one = [sys.executable, "-m", "pathlift.cli", *grid]
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "pathlift.cli", *grid, "--spread", "runs"]
    load = os.getloadavg()
    print(f"{os.cpu_count()} cpus, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"grid: {' '.join(grid)}")
    ratios, cpu_ratios, worst = [], [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = [("one", one), ("two", two)]
            times = {name: run(command, Path(tmp, f"{name}{r}"))
                     for name, command in (order if r % 2 == 0 else order[::-1])}
            (wall1, cpu1), (wall2, cpu2) = times["one"], times["two"]
            ratios.append(wall2 / wall1)
            cpu_ratios.append(cpu2 / 2 / cpu1)
            worst = max(worst, largest_difference(Path(tmp, f"two{r}", "runs.csv"),
                                                  Path(tmp, f"one{r}", "runs.csv")))
            print(f"round {r}: 1 process {wall1:.1f} s ({cpu1:.1f} s CPU), 2 processes "
                  f"{wall2:.1f} s ({cpu2:.1f} s CPU), wall ratio {ratios[-1]:.3f}, "
                  f"CPU/2 ratio {cpu_ratios[-1]:.3f}; load {os.getloadavg()[0]:.2f}")
    load = os.getloadavg()
    print(f"median ratio t(2 processes) / t(1 process) = {statistics.median(ratios):.3f} "
          f"(CPU/2 ratio {statistics.median(cpu_ratios):.3f}); largest CSV difference "
          f"{worst:.3g}; load average after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
