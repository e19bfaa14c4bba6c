"""The ``kron-bench`` and ``kron-design`` commands as one call each, returning a result
object: the Kronecker-sparse grid of thesis Sec. 5.4-5.5 timed at each thread count with
its CSV, Figure 5.8 and the ViT-S/16 timings of Table 5.5 (``run_kron_benchmark``), and a
chain designed for one weight with its candidates' CSV and plot (``run_kron_design``)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from pathlift.errors import InvalidParameterError, check_count
from pathlift.files import refuse_links, refuse_outputs
from pathlift.jobs.bench.kron import (
    CPU_MAX_DENSE,
    GridSummary,
    Timing,
    cpu_patterns,
    fastest_choices,
    plot_design,
    plot_speedups,
    summarize,
    thesis_batch,
    time_grid,
    time_vit_mlp,
    write_candidates_csv,
    write_csv,
    write_vit_csv,
)
from pathlift.jobs.sizing import Estimate, matmul_pace
from pathlift.kron import (
    ALGORITHMS,
    LAYOUTS,
    Design,
    KSPattern,
    benchmark_patterns,
    design,
    machine_description,
    steady_allocator,
)
from pathlift.memory import check_bytes, check_seconds, show_seconds, time_limit

__all__ = ["KronBenchResult", "KronBenchRun", "KronDesignRun", "bench_estimate", "design_estimate",
           "run_kron_benchmark", "run_kron_design"]


@dataclass(frozen=True, repr=False)
class KronBenchRun:
    """One thread count of ``run_kron_benchmark``: the machine line (CPU, fused kernel,
    load, batch, dtype, patterns), the timings and the CSV they were written to; with
    fused, bmm and dense timed, Figure 5.8 (``plot``) and the Table 5.3/5.4 ratios
    (``summary``); with the ViT-S/16 timings, their ratios to dense (``vit``, {module:
    {algorithm: ratio}}) at ``vit_tokens`` tokens and their CSV."""

    threads: int
    machine: str
    csv: Path
    timings: tuple[Timing, ...]
    plot: Path | None = None
    summary: GridSummary | None = None
    vit: dict[str, dict[str, float]] | None = None
    vit_tokens: int | None = None
    vit_csv: Path | None = None

    @property
    def patterns(self) -> int:
        return len({t.pattern for t in self.timings})

    def __repr__(self) -> str:
        parts = [f"threads={self.threads}", f"patterns={self.patterns}"]
        s = self.summary
        if s is not None:
            parts.append(f"fused vs bmm {s.speedup_vs_bmm['best']:.2f}x")
            if not math.isnan(s.default_vs_bmm):
                parts.append(f"default vs bmm {s.default_vs_bmm:.2f}x")
        if self.vit and "fused" in self.vit["feed-forward"]:
            parts.append(f"ViT feed-forward fused/dense {self.vit['feed-forward']['fused']:.2f}")
        return f"KronBenchRun({', '.join(parts)}, csv={str(self.csv)!r})"


@dataclass(frozen=True, repr=False)
class KronBenchResult:
    """What ``run_kron_benchmark`` measured and wrote: one ``KronBenchRun`` per thread
    count, in the order given, and the folder holding their files."""

    folder: Path
    runs: tuple[KronBenchRun, ...]

    def __repr__(self) -> str:
        best = ", ".join(f"{r.threads}: {r.summary.speedup_vs_bmm['best']:.2f}x"
                         for r in self.runs if r.summary is not None)
        return (f"KronBenchResult({len(self.runs)} thread count(s)"
                f"{f', fused vs bmm by threads {best}' if best else ''}, "
                f"folder={str(self.folder)!r})")


def run_kron_benchmark(out: str | Path | Callable[[], Path], *, device: str | torch.device = "cpu",
                       dtype: str = "float32", full: bool = False,
                       max_dense: int = CPU_MAX_DENSE, every: int = 1,
                       batch: int | None = None, algorithms: Sequence[str] | None = None,
                       repeats: int = 5, threads: Sequence[int] | None = None,
                       vit: bool = True, vit_batch: int | None = None,
                       on_pattern: Callable[[int, int, int], None] | None = None,
                       on_run: Callable[[KronBenchRun], None] | None = None,
                       on_estimate: Callable[[str], None] | None = None,
                       overwrite: bool = False) -> KronBenchResult:
    """Time the Kronecker-sparse grid (thesis Sec. 5.4-5.5, App. D.2.1) once per thread
    count and write ``out``/kron_<device>_<dtype>_t<threads>.csv, ``.png`` (Figure 5.8)
    and ``_vit.csv`` (Table 5.5).

    Args:
        out: the folder for the files (created if needed; files written atomically), or
            a function that creates it, called once the arguments are checked (a refused
            command line leaves no folder).
        dtype: "float32", "float16" or "bfloat16".
        full: all 627 patterns of App. D.2.1, else those with M·N <= ``max_dense``; every
            ``every``-th pattern of either.
        batch: vectors per product (default 25,088 on cuda, 256 on cpu).
        algorithms: those to time (default all); the plot and the summary need fused, bmm
            and dense, the default algorithm's check (``fastest_algorithm`` vs bmm, on cpu)
            all of them.
        repeats: round-robin runs per timing (the ViT timings take at least 10).
        threads: intra-op thread counts, one run each (default torch's current count);
            torch's count is restored afterwards.
        vit: also time the ViT-S/16 linear layer and feed-forward block at ``vit_batch``
            tokens (default 8·196 on cpu, 128·196 on cuda).
        on_pattern: called as ``on_pattern(threads, done, total)`` before the first
            pattern of a thread count and after each pattern.
        on_run: called with each thread count's ``KronBenchRun`` once its files are written.
        on_estimate: sees the estimate's line (``bench_estimate``) before the first timing.

    Sized first (no folder made when refused): the largest pattern's tensors against the
    memory limit, then ``bench_estimate`` against the time limit. Keeps freed memory in
    the process (``steady_allocator``), as a benchmark should.

    Example:
        >>> result = run_kron_benchmark("runs/kron", every=8, threads=[1, 2], vit=False)
        >>> result.runs[0].summary.speedup_vs_bmm["best"]
    """
    dev, torch_dtype = torch.device(device), getattr(torch, dtype)
    every = check_count("every", every)
    for name, count in (("max_dense", max_dense), ("batch", batch), ("vit_batch", vit_batch)):
        if count is not None:
            check_count(name, count)
    patterns = benchmark_patterns()[::every] if full else cpu_patterns(max_dense, every)
    if not patterns:
        raise InvalidParameterError(f"no pattern of the grid has M*N <= max_dense = "
                                    f"{max_dense}; raise it")
    batch = batch or thesis_batch(dev)
    algs = tuple(algorithms or ALGORITHMS)
    counts = _check_threads(threads or [torch.get_num_threads()])
    estimate = bench_estimate(patterns, batch, algs, torch_dtype, dev, repeats, counts)
    if on_estimate is not None:
        on_estimate(estimate.line())
    estimate.check(f"kron-bench over {len(patterns)} patterns x {len(algs)} algorithm(s) x "
                   f"{len(counts)} thread count(s), batch {batch:,},",
                   "--every K, a smaller --max-dense, --batch or --repeats, fewer --algorithm "
                   "or --threads")
    folder = Path(out() if callable(out) else out)
    dev_dtype = f"kron_{dev.type}_{dtype}"
    refuse_outputs(folder, [f"{dev_dtype}_t{count}{end}" for count in counts
                            for end in (".csv", ".png", *(("_vit.csv",) if vit else ()))],
                   overwrite)
    steady = steady_allocator()
    scope = " (full grid)" if full else f", M*N <= {max_dense}"
    runs = []
    for count in counts:
        with _threads(count):
            machine = (f"{machine_description(torch_dtype)}, "
                       f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, "
                       f"load {os.getloadavg()[0]:.1f}, batch {batch}, {dtype}, "
                       f"{len(patterns)} patterns{scope}{', steady allocator' if steady else ''}")
            run = _one_count(patterns, batch, algs, dev, dtype, repeats, count, machine,
                             folder / f"{dev_dtype}_t{count}", vit, vit_batch,
                             on_pattern)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return KronBenchResult(folder, tuple(runs))


def bench_estimate(patterns: Sequence[KSPattern], batch: int, algorithms: Sequence[str],
                   dtype: torch.dtype, device: torch.device, repeats: int,
                   threads: Sequence[int]) -> Estimate:
    """A lower bound of ``run_kron_benchmark``'s time, after refusing its largest pattern
    over the memory limit: each thread count times every pattern ``repeats`` times in both
    layouts for each algorithm, ``dense`` doing batch x M x N multiply-adds and the others
    batch x abcd (thesis Sec. 5.1: the non-zeros), at the pace of a dense matmul timed on
    one thread of this machine times the thread count (``matmul_pace``: perfect scaling;
    the ViT timings, the preparation and the sparse algorithms' slower pace on top)."""
    check_count("repeats", repeats)
    itemsize = torch.empty((), dtype=dtype).element_size()
    big = max(patterns, key=lambda p: p.out_features * p.in_features)
    check_bytes((big.out_features * big.in_features + len(algorithms) * big.nnz
                 + 2 * batch * (big.in_features + big.out_features)) * itemsize,
                f"kron-bench's largest pattern {big.as_tuple()} on a batch of {batch:,}",
                "use a smaller --max-dense or --batch, or ")
    madds = repeats * len(LAYOUTS) * batch * sum(
        p.out_features * p.in_features if a == "dense" else p.nnz
        for p in patterns for a in algorithms)
    pace = matmul_pace(dtype, device, threads=1)
    seconds = sum(madds / (pace if device.type == "cuda" else pace * count)
                  for count in threads)
    return Estimate(f"{len(threads) * madds:,} multiply-adds ({len(patterns)} patterns x "
                    f"{len(algorithms)} algorithm(s) x {len(LAYOUTS)} layouts x {repeats} "
                    f"repeats x {len(threads)} thread count(s), batch {batch:,})", seconds,
                    f"at {pace / 1e9:.3g} G multiply-adds/s a thread (a dense matmul timed on "
                    "this machine; the ViT timings on top)", at_least=True)


def _one_count(patterns: Sequence, batch: int, algs: tuple[str, ...], dev: torch.device,
               dtype: str, repeats: int, count: int, machine: str, stem: Path, vit: bool,
               vit_batch: int | None, on_pattern: Callable[[int, int, int], None] | None
               ) -> KronBenchRun:
    """Time the grid (and the ViT modules) at the current thread count and write the files."""
    torch_dtype = getattr(torch, dtype)
    done = iter(range(1, len(patterns) + 1))
    if on_pattern is not None:
        on_pattern(count, 0, len(patterns))
    rows = time_grid(patterns, batch, algs, dtype=torch_dtype, device=dev, repeats=repeats,
                     on_pattern=None if on_pattern is None else
                     lambda _: on_pattern(count, next(done), len(patterns)))
    fields: dict = {"csv": write_csv(rows, stem.with_suffix(".csv"), machine)}
    if {"fused", "bmm", "dense"} <= set(algs):
        defaults = (fastest_choices(patterns, batch, torch_dtype)
                    if dev.type == "cpu" and set(ALGORITHMS) <= set(algs) else None)
        fields["plot"] = plot_speedups(rows, stem.with_suffix(".png"), machine)
        fields["summary"] = summarize(rows, defaults)
    if vit:
        tokens = vit_batch or (128 * 196 if dev.type == "cuda" else 8 * 196)
        ratios = time_vit_mlp(tokens, [a for a in ("bmm", "fused") if a in algs], device=dev,
                              repeats=max(repeats, 10))
        fields |= {"vit": ratios, "vit_tokens": tokens,
                   "vit_csv": write_vit_csv(ratios, f"{stem}_vit.csv", machine)}
    return KronBenchRun(count, machine, timings=tuple(rows), **fields)


#: the most intra-op threads a run may use: the machine's CPUs (more measures contention,
#: not the algorithms; torch.set_num_threads(100000) once crashed the process)
MAX_THREADS = os.cpu_count() or 1


def _check_threads(counts: Sequence[int]) -> list[int]:
    """``counts`` if each is a thread count in [1, ``MAX_THREADS``], else
    InvalidParameterError naming it, before any work."""
    for count in counts:
        if check_count("threads", count) > MAX_THREADS:
            raise InvalidParameterError(f"threads must be at most {MAX_THREADS} (this "
                                        f"machine's CPUs), got {count}")
    return list(counts)


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` (None: left alone), then restored."""
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True, repr=False)
class KronDesignRun:
    """What ``run_kron_design`` chose (``design``) and the files it wrote: the candidates'
    CSV and the plot of measured against predicted time."""

    design: Design
    csv: Path
    plot: Path

    def __repr__(self) -> str:
        return f"KronDesignRun({self.design!r}, csv={str(self.csv)!r})"


def _check_design_size(n_in: int, n_out: int, batch: int, dtype: str) -> None:
    """Refuse, before anything is searched or allocated, a layer whose dense baseline (the
    weight, a batch of inputs and its outputs, each candidate timed against it) does not
    fit the memory limit: ``kron-design 1000000000 1000000000`` once searched for minutes."""
    for name, value in (("n_in", n_in), ("n_out", n_out), ("batch", batch)):
        check_count(name, value)
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    check_bytes((n_in * n_out + batch * (n_in + n_out)) * itemsize,
                f"timing a dense {n_out:,} x {n_in:,} layer on a batch of {batch:,}",
                "use smaller N_IN, N_OUT or --batch, or ")


#: the files ``run_kron_design`` writes in its folder
DESIGN_FILES = ("candidates.csv", "predicted_vs_measured.png")

def design_estimate(n_in: int, n_out: int, batch: int, dtype: str, repeats: int) -> str:
    """A lower bound of ``design``'s time, in one line, refused over the time limit
    (``pathlift.memory.check_seconds``): the dense baseline alone is timed at least
    3 x ``repeats`` times (``repeats`` in the first round, twice as many for the
    finalists), each ``batch`` x ``n_in`` x ``n_out`` multiply-adds, at this machine's
    pace (``pathlift.jobs.sizing.matmul_pace``; calibration and the chains come on top)."""
    pace = matmul_pace(getattr(torch, dtype))
    madds = 3 * repeats * batch * n_in * n_out
    seconds = madds / pace
    check_seconds(seconds, f"kron-design {n_in} {n_out}, its dense baseline alone on a batch "
                  f"of {batch:,},",
                  "use smaller N_IN, N_OUT, --batch or --repeats, ")
    return (f"estimate: at least {madds:,} multiply-adds timing the dense baseline "
            f"(3 x {repeats} repeats of {batch:,} x {n_in:,} x {n_out:,}), about "
            f"{show_seconds(seconds)} at {pace / 1e9:.3g} G multiply-adds/s (timed on this "
            f"machine), calibration and chains on top; limit {show_seconds(time_limit())}")


def run_kron_design(n_in: int, n_out: int, out: str | Path | Callable[[], Path], *,
                    budget: float = 0.25, batch: int = 256, dtype: str = "float32",
                    lengths: Sequence[int] = (2, 3), top_k: int = 8, repeats: int = 5,
                    threads: int | None = None,
                    progress: Callable[[str, int], None] | None = None,
                    on_estimate: Callable[[str], None] | None = None,
                    overwrite: bool = False) -> KronDesignRun:
    """``design`` a Kronecker-sparse chain for an ``n_out`` x ``n_in`` weight (thesis
    Sec. 7.4.1), then write ``out``/candidates.csv and ``out``/predicted_vs_measured.png.

    ``out`` may be a callable returning the folder, called once the design is done (a
    refused request leaves no folder). ``threads``: torch's intra-op thread count during
    the design (default, or 0: left as it is), restored afterwards. ``progress(stage, n)`` is
    passed to ``design``. Keeps freed memory in the process (``steady_allocator``). Sized
    first: refused over the memory limit, then over the time limit by ``design_estimate``,
    whose line ``on_estimate`` sees before the search starts.
    """
    _check_design_size(n_in, n_out, batch, dtype)
    if not callable(out):  # before the timing, not after it
        refuse_outputs(out, DESIGN_FILES, overwrite)
    steady_allocator()
    with _threads(_check_threads([threads])[0] if threads else None):
        estimate = design_estimate(n_in, n_out, batch, dtype, repeats)
        if on_estimate is not None:
            on_estimate(estimate)
        result = design(n_in, n_out, budget, batch, getattr(torch, dtype), lengths, top_k,
                        repeats=repeats, progress=progress)
    folder = Path(out() if callable(out) else out)
    refuse_links(folder, DESIGN_FILES)
    csv = write_candidates_csv(result.candidates, folder / "candidates.csv", result.machine)
    plot = plot_design(result.candidates, folder / "predicted_vs_measured.png",
                       f"{n_out} x {n_in}, batch {batch}: {result.machine}")
    return KronDesignRun(result, csv, plot)
