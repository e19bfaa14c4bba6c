"""The fused Kronecker-sparse kernel at the calls users make, against bmm in the same run:
``ks_multiply`` (the factor as a tensor, no preparation by the caller), ``prepare`` once
then ``apply`` (what ``kron-bench`` times), a ``KSLinear`` forward (inference, no_grad) and
a ``KSLinear`` training step (forward, backward of a fixed random projection of the
output, SGD update in place), each t(bmm)/t(fused) per pattern, round-robin.

    python benchmarks/bench_kron_calls.py                 # the 20-pattern quick grid
    python benchmarks/bench_kron_calls.py --every 1       # the 160 CPU grid patterns
    python benchmarks/bench_kron_calls.py --pattern 1,160,24,8 --pattern 4,96,40,5

Prints one line per pattern and the median and worst ratio of each call, and writes
kron_calls_cpu_float32_t<threads>.csv (``_patterns.csv`` with --pattern) under --out
(default benchmarks/results). With one thread each sample is the thread's CPU time.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pathlift import files
from pathlift.jobs.bench.kron import CPU_BATCH_SIZE, cpu_patterns
from pathlift.kron import KSLinear, KSPattern, apply, ks_multiply, prepare, random_factor
from pathlift.kron.cache import machine_description
from pathlift.kron.timing import round_robin, steady_allocator

CALLS = ("ks_multiply", "prepared", "forward", "train_step")


def _calls(p: KSPattern, algorithm: str, x: torch.Tensor, w: torch.Tensor,
           g: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The four calls of one algorithm on one pattern (same x, w and output weights g)."""
    op = prepare(w, p, algorithm)
    layer = KSLinear([p], algorithm=algorithm)
    with torch.no_grad():
        layer.factors[0].copy_(w)
    trained = KSLinear([p], algorithm=algorithm)
    with torch.no_grad():
        trained.factors[0].copy_(w)
    params = list(trained.parameters())

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()
        return run

    def step() -> None:
        for q in params:
            q.grad = None
        (trained(x) * g).sum().backward()
        with torch.no_grad():
            for q in params:
                q.add_(q.grad, alpha=-1e-6)

    return {"ks_multiply": no_grad(lambda: ks_multiply(x, w, p, algorithm)),
            "prepared": no_grad(lambda: apply(x, op, p, algorithm)),
            "forward": no_grad(lambda: layer(x)),
            "train_step": step}


def time_pattern(p: KSPattern, batch: int, repeats: int, clock: Callable[[], float],
                 seed: int = 0) -> dict[str, float]:
    """t(bmm)/t(fused) of each call on pattern p, all eight calls in one round-robin."""
    gen = torch.Generator().manual_seed(seed)
    w = random_factor(p, torch.float32, generator=gen)
    x = torch.randn(batch, p.in_features, generator=gen)
    g = torch.randn(batch, p.out_features, generator=gen)
    fns = {(alg, call): fn for alg in ("bmm", "fused")
           for call, fn in _calls(p, alg, x, w, g).items()}
    times = {k: statistics.median(v)
             for k, v in round_robin(fns, repeats, clock=clock).items()}
    return {call: times[("bmm", call)] / times[("fused", call)] for call in CALLS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--every", type=int, default=8, help="every k-th CPU grid pattern")
    parser.add_argument("--pattern", action="append", default=[],
                        help="a,b,c,d (repeatable): these patterns instead of the grid")
    parser.add_argument("--batch", type=int, default=CPU_BATCH_SIZE)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steady = steady_allocator()
    # one thread: its CPU time, which leaves out the time other processes hold the core
    clock, timer = ((time.thread_time, "thread CPU time") if args.threads == 1 else
                    (time.perf_counter, "wall-clock time"))
    patterns = ([KSPattern(*map(int, s.split(","))) for s in args.pattern]
                or cpu_patterns(every=args.every))
    machine = (f"{machine_description()}, load {os.getloadavg()[0]:.1f}, batch {args.batch}, "
               f"float32, {len(patterns)} patterns, {timer}, median of {args.repeats} "
               f"round-robin rounds{', steady allocator' if steady else ''}")
    print(machine)
    print(f"{'pattern':>20}" + "".join(f"{c:>13}" for c in CALLS))
    ratios: dict[KSPattern, dict[str, float]] = {}
    for p in patterns:
        ratios[p] = time_pattern(p, args.batch, args.repeats, clock)
        print(f"{p.as_tuple()!s:>20}" + "".join(f"{ratios[p][c]:>12.2f}x" for c in CALLS),
              flush=True)
    print(f"{'median':>20}" + "".join(
        f"{statistics.median(r[c] for r in ratios.values()):>12.2f}x" for c in CALLS))
    print(f"{'worst':>20}" + "".join(
        f"{min(r[c] for r in ratios.values()):>12.2f}x" for c in CALLS))
    buffer = io.StringIO(newline="")
    buffer.write(f"# t(bmm)/t(fused); {machine}, load at end {os.getloadavg()[0]:.1f}\n")
    writer = csv.writer(buffer)
    writer.writerow(["a", "b", "c", "d", *CALLS])
    for p, r in ratios.items():
        writer.writerow([*p.as_tuple(), *(f"{r[c]:.4f}" for c in CALLS)])
    stem = f"kron_calls_cpu_float32_t{args.threads}{'_patterns' if args.pattern else ''}"
    path = files.write_text(Path(args.out) / f"{stem}.csv", buffer.getvalue())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
