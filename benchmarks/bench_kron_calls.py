"""The fused Kronecker-sparse kernel at the calls users make, against bmm in the same run:
``ks_multiply`` (the factor as a tensor, no preparation by the caller), ``prepare`` once
then ``apply`` (what ``kron-bench`` times), a ``KSLinear`` forward (inference, no_grad) and
a ``KSLinear`` training step (forward, backward of a fixed random projection of the
output, SGD update in place), each t(bmm)/t(fused) per pattern: the median over
round-robin rounds of each round's ratio.

    python benchmarks/bench_kron_calls.py                 # the 20-pattern quick grid
    python benchmarks/bench_kron_calls.py --width 512 --width 256   # AVX-512 and AVX2 builds
    python benchmarks/bench_kron_calls.py --every 1       # the 160 CPU grid patterns
    python benchmarks/bench_kron_calls.py --pattern 1,160,24,8 --pattern 4,96,40,5

``--width`` (repeatable) times the kernel built for each vector width (bits, at most the
CPU's: ``pathlift.kron.vector_width``) in the same round-robin as bmm. Prints the machine
of each width (CPU, cores, the kernel's instruction set and vector bytes), one line per
pattern and the median and worst ratio of each call, and writes
kron_calls_cpu_float32_t<threads>_<isa>.csv (``_patterns`` before ``_<isa>`` with
--pattern) under --out (default benchmarks/results). With one thread each sample is the
thread's CPU time.
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
from pathlift.kron.cpu_kernel import current_kernel, vector_width
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
                 widths: tuple[int | None, ...] = (None,), seed: int = 0
                 ) -> dict[int | None, dict[str, float]]:
    """Per vector width, t(bmm)/t(fused) of each call on pattern p: the median of each
    round's ratio, bmm and the fused calls of every width in one round-robin. Every call
    runs inside its ``vector_width`` (bmm's: the CPU's own), so all pay its cost alike."""
    gen = torch.Generator().manual_seed(seed)
    w = random_factor(p, torch.float32, generator=gen)
    x = torch.randn(batch, p.in_features, generator=gen)
    g = torch.randn(batch, p.out_features, generator=gen)

    def within(width: vector_width, fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with width:
                return fn()
        return run

    fns = {}
    for alg, bits in [("bmm", None), *(("fused", bits) for bits in widths)]:
        width = vector_width(bits)
        with width:
            calls = _calls(p, alg, x, w, g)
        fns |= {(alg, bits, call): within(width, fn) for call, fn in calls.items()}
    times = round_robin(fns, repeats, clock=clock)
    return {bits: {call: statistics.median(
        b / f for b, f in zip(times[("bmm", None, call)], times[("fused", bits, call)],
                              strict=True)) for call in CALLS} for bits in widths}


def _width(value: str) -> int | None:
    return None if value == "native" else int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--every", type=int, default=8, help="every k-th CPU grid pattern")
    parser.add_argument("--pattern", action="append", default=[],
                        help="a,b,c,d (repeatable): these patterns instead of the grid")
    parser.add_argument("--width", action="append", type=_width, default=[],
                        help="vector bits of the fused kernel, 512, 256, 128 or native "
                             "(repeatable; default native)")
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
    widths = tuple(dict.fromkeys(args.width or [None]))
    machines = {}
    for bits in widths:
        with vector_width(bits):
            kernel = current_kernel(torch.float32)
            machines[bits] = (kernel.isa if kernel else "einsum", (
                f"{machine_description()}, load {os.getloadavg()[0]:.1f}, batch {args.batch}, "
                f"float32, {len(patterns)} patterns, {timer}, median of the ratios of "
                f"{args.repeats} round-robin rounds{', steady allocator' if steady else ''}"))
        print(machines[bits][1])
    ratios: dict[int | None, dict[KSPattern, dict[str, float]]] = {b: {} for b in widths}
    print(f"{'pattern':>20} {'isa':>7}" + "".join(f"{c:>13}" for c in CALLS))
    for p in patterns:
        for bits, r in time_pattern(p, args.batch, args.repeats, clock, widths).items():
            ratios[bits][p] = r
            print(f"{p.as_tuple()!s:>20} {machines[bits][0]:>7}"
                  + "".join(f"{r[c]:>12.2f}x" for c in CALLS), flush=True)
    for bits in widths:
        _summary(ratios[bits], machines[bits], args, bool(args.pattern))


def _summary(ratios: dict[KSPattern, dict[str, float]], machine: tuple[str, str],
             args: argparse.Namespace, listed: bool) -> None:
    """Print the median and worst of one width and write its CSV."""
    isa, line = machine
    for name, pick in (("median", statistics.median), ("worst", min)):
        print(f"{name:>20} {isa:>7}" + "".join(
            f"{pick(r[c] for r in ratios.values()):>12.2f}x" for c in CALLS))
    buffer = io.StringIO(newline="")
    buffer.write(f"# t(bmm)/t(fused); {line}, load at end {os.getloadavg()[0]:.1f}\n")
    writer = csv.writer(buffer)
    writer.writerow(["a", "b", "c", "d", *CALLS])
    for p, r in ratios.items():
        writer.writerow([*p.as_tuple(), *(f"{r[c]:.4f}" for c in CALLS)])
    stem = f"kron_calls_cpu_float32_t{args.threads}{'_patterns' if listed else ''}_{isa}"
    path = files.write_text(Path(args.out) / f"{stem}.csv", buffer.getvalue())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
