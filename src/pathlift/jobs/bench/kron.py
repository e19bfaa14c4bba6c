"""The Kronecker-sparse benchmark of thesis Sec. 5.4-5.5: every algorithm and layout on the
pattern grid of App. D.2.1, medians of repeated runs, the summary of Tables 5.3-5.4, the
plot of Figure 5.8, and the ViT-S/16 MLP timings of Table 5.5.

Ratios, never absolute times, are the result: all algorithms of one pattern are timed in
the same run, round-robin (one run of each algorithm in turn, ``repeats`` times), so a
change of machine load hits them alike.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import random
import statistics
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from pathlift import files
from pathlift.kron.design import (
    Candidate,
    Design,
    design,
    hand_families,
    measure,
    spearman,
)
from pathlift.kron.factor import random_factor
from pathlift.kron.layer import KSLinear, fastest_algorithm
from pathlift.kron.machine import cpu_name
from pathlift.kron.multiply import ALGORITHMS, LAYOUTS, apply, prepare
from pathlift.kron.pattern import (
    GRID_BATCH_SIZE,
    VIT_PATTERNS_DOWN,
    VIT_PATTERNS_NN,
    VIT_PATTERNS_UP,
    VIT_S_DIM,
    KSPattern,
    benchmark_patterns,
)
from pathlift.kron.timing import round_robin

__all__ = [
    "CPU_BATCH_SIZE",
    "CPU_MAX_DENSE",
    "DESIGN_GRID",
    "DesignCheck",
    "GridSummary",
    "Timing",
    "check_design",
    "cpu_name",
    "cpu_patterns",
    "fastest_choices",
    "plot_design",
    "plot_speedups",
    "read_csv",
    "summarize",
    "time_grid",
    "time_vit_mlp",
    "vit_table",
    "write_candidates_csv",
    "write_csv",
    "write_vit_csv",
]

# The documented CPU configuration: the thesis batch (25,088) and the 627 patterns take days
# on 2 cores; 256 vectors and the patterns whose dense matrix has at most 2^22 entries
# (M·N <= 4,194,304: 160 patterns, 62 of density <= 1/8) take minutes.
CPU_BATCH_SIZE = 256
CPU_MAX_DENSE = 2**22


@dataclass(frozen=True)
class Timing:
    """Median time of one (pattern, algorithm, layout) in one run."""

    a: int
    b: int
    c: int
    d: int
    algorithm: str
    layout: str
    batch: int
    dtype: str
    device: str
    median_s: float
    min_s: float
    max_s: float

    @property
    def pattern(self) -> KSPattern:
        return KSPattern(self.a, self.b, self.c, self.d)


def cpu_patterns(max_dense: int = CPU_MAX_DENSE, every: int = 1) -> tuple[KSPattern, ...]:
    """The grid of App. D.2.1 restricted to dense sizes M·N <= max_dense, every k-th one."""
    grid = [p for p in benchmark_patterns() if p.out_features * p.in_features <= max_dense]
    return tuple(grid[::every])


def time_grid(patterns: Iterable[KSPattern], batch: int,
              algorithms: Sequence[str] = ALGORITHMS, layouts: Sequence[str] = LAYOUTS,
              dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
              repeats: int = 5, seed: int = 0,
              on_pattern: Callable[[KSPattern], None] | None = None) -> list[Timing]:
    """Time Y = X K^T for every pattern, algorithm and layout (forward, no autograd).

    Entries of K uniform in [-1/sqrt(c), 1/sqrt(c)], of X standard normal (App. D.2.1);
    each algorithm's storage of K is prepared before timing, as in the thesis."""
    device = torch.device(device)
    rows: list[Timing] = []
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in patterns:
            w = random_factor(p, torch.float32, generator=g).to(device, dtype)
            x = torch.randn(batch, p.in_features, generator=g).to(device, dtype)
            inputs = {"bsf": x, "bsl": x.T.contiguous()}
            fns = {}
            for algorithm in algorithms:
                op = prepare(w, p, algorithm)
                for layout in layouts:
                    fns[(algorithm, layout)] = functools.partial(
                        apply, inputs[layout], op, p, algorithm, layout)
            for (algorithm, layout), ts in round_robin(fns, repeats, device).items():
                rows.append(Timing(*p.as_tuple(), algorithm, layout, batch, str(dtype),
                                   str(device), statistics.median(ts), min(ts), max(ts)))
            del fns, inputs, x, w
            if on_pattern is not None:
                on_pattern(p)
    return rows


@contextlib.contextmanager
def _csv_rows(path: str | Path, comment: str, columns: Sequence[str]) -> Iterator:
    """A csv.writer whose rows, after a '# comment' line and the header, are written to
    ``path`` atomically when the block ends (``pathlift.files``)."""
    buffer = io.StringIO(newline="")
    if comment:
        buffer.write(f"# {comment}\n")
    writer = csv.writer(buffer)
    writer.writerow(columns)
    yield writer
    files.write_text(path, buffer.getvalue())


def write_csv(rows: Sequence[Timing], path: str | Path, machine: str = "") -> Path:
    """One line per timing; ``machine`` goes into a leading comment line."""
    names = [*asdict(rows[0]), "rewrite_ratio", "energy_ratio", "density"]
    with _csv_rows(path, machine, names) as writer:
        for r in rows:
            p = r.pattern
            writer.writerow([*asdict(r).values(), p.rewrite_ratio, p.energy_ratio, p.density])
    return Path(path)


def read_csv(path: str | Path) -> list[Timing]:
    """Timings written by ``write_csv``."""
    with files.open_text(path) as fh:
        lines = [line for line in fh if not line.startswith("#")]
    out = []
    for row in csv.DictReader(lines):
        out.append(Timing(*(int(row[k]) for k in "abcd"), row["algorithm"], row["layout"],
                          int(row["batch"]), row["dtype"], row["device"],
                          *(float(row[k]) for k in ("median_s", "min_s", "max_s"))))
    return out


@dataclass(frozen=True)
class GridSummary:
    """Same-run ratios over the grid (time of the baseline / time of fused).

    ``speedup_vs_bmm[layout]``: median over patterns of t(bmm)/t(fused) in that layout,
    ``"best"`` taking for each algorithm the faster layout (as Table 5.3);
    ``fused_fastest[layout]``: fraction of patterns where fused beats every other algorithm
    (Table 5.4); ``sparse_patterns``: patterns of density <= 1/8; ``fused_beats_dense``:
    how many of them have t(fused) < t(dense) in each layout; ``worst_vs_dense``: the
    smallest t(dense)/t(fused) among them. With the algorithm ``fastest_algorithm`` chose
    for each pattern (batch-size-first, what ``KSLinear`` runs): ``default_vs_bmm`` the
    median and ``default_worst_vs_bmm`` the smallest t(bmm)/t(chosen) in this run, and
    ``default_loses`` the patterns where the chosen one is over 10% slower than bmm."""

    patterns: int
    speedup_vs_bmm: dict[str, float]
    fused_fastest: dict[str, float]
    speedup_vs_best_other: dict[str, float]
    sparse_patterns: int
    fused_beats_dense: dict[str, int]
    worst_vs_dense: dict[str, float]
    default_vs_bmm: float = float("nan")
    default_worst_vs_bmm: float = float("nan")
    default_loses: tuple[KSPattern, ...] = ()


def _table(rows: Sequence[Timing]) -> dict[KSPattern, dict[str, dict[str, float]]]:
    table: dict[KSPattern, dict[str, dict[str, float]]] = {}
    for r in rows:
        per_layout = table.setdefault(r.pattern, {}).setdefault(r.layout, {})
        per_layout[r.algorithm] = r.median_s
    for per in table.values():
        layouts = list(per)
        per["best"] = {alg: min(per[lay][alg] for lay in layouts if alg in per[lay])
                       for alg in per[layouts[0]]}
    return table


def summarize(rows: Sequence[Timing], defaults: dict[KSPattern, str] | None = None
              ) -> GridSummary:
    """Table 5.3/5.4-style figures of a run that timed ``fused``, ``bmm`` and ``dense``;
    ``defaults`` maps patterns to the algorithm ``fastest_algorithm`` chose for them."""
    table = _table(rows)
    keys = sorted({k for per in table.values() for k in per}, key=lambda k: (k != "best", k))
    vs_bmm, fastest, vs_other, beats, worst = {}, {}, {}, {}, {}
    sparse = [p for p in table if p.density <= 1 / 8]
    for key in keys:
        per = [table[p][key] for p in table if key in table[p]]
        vs_bmm[key] = statistics.median(t["bmm"] / t["fused"] for t in per)
        others = [min(v for alg, v in t.items() if alg != "fused") for t in per]
        vs_other[key] = statistics.median(o / t["fused"] for o, t in zip(others, per,
                                                                          strict=True))
        fastest[key] = sum(o > t["fused"] for o, t in zip(others, per, strict=True)) / len(per)
        dense_ratios = [table[p][key]["dense"] / table[p][key]["fused"] for p in sparse
                        if key in table[p]]
        beats[key] = sum(r > 1 for r in dense_ratios)
        worst[key] = min(dense_ratios, default=float("nan"))
    extra = {}
    if defaults:
        ratio = {p: table[p]["bsf"]["bmm"] / table[p]["bsf"][alg]
                 for p, alg in defaults.items() if alg in table.get(p, {}).get("bsf", {})}
        extra = {"default_vs_bmm": statistics.median(ratio.values()),
                 "default_worst_vs_bmm": min(ratio.values()),
                 "default_loses": tuple(p for p, r in ratio.items() if r < 1 / 1.1)}
    return GridSummary(len(table), vs_bmm, fastest, vs_other, len(sparse), beats, worst,
                       **extra)


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    """Lay out, write (creating the folder) and close a figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        return files.atomic_write(path, lambda fh: fig.savefig(fh, dpi=120, format="png"))
    finally:
        plt.close(fig)


def plot_speedups(rows: Sequence[Timing], path: str | Path, title: str = "") -> Path:
    """Figure 5.8: boxplots of t(baseline)/t(fused) grouped by (b+c)/(bc), for bmm and for
    the best of bmm, einsum and bsr, each algorithm at its faster layout."""
    plt = _pyplot()
    table = _table(rows)
    groups: dict[float, list[tuple[float, float]]] = {}
    for p, per in table.items():
        best = per["best"]
        baseline = min(best[a] for a in ("bmm", "einsum", "bsr") if a in best)
        groups.setdefault(round(p.rewrite_ratio, 4), []).append(
            (best["bmm"] / best["fused"], baseline / best["fused"]))
    ratios = sorted(groups)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, idx, label in ((axes[0], 0, "bmm"), (axes[1], 1, "min(bmm, einsum, bsr)")):
        ax.boxplot([[v[idx] for v in groups[r]] for r in ratios], whis=(5, 95),
                   showfliers=False)
        ax.set_xticks(range(1, len(ratios) + 1), [f"{r:.4f}" for r in ratios], rotation=90,
                      fontsize=7)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("(b+c)/(bc)")
        ax.set_title(f"time({label}) / time(fused)")
    axes[0].set_ylabel("speed-up of fused")
    fig.suptitle(title)
    return _save(fig, path)


# --- Table 5.5: ViT-S/16 -----------------------------------------------------------------


def _mlp(up: nn.Module, down: nn.Module) -> nn.Module:
    return nn.Sequential(up, nn.GELU(), down)


def time_vit_mlp(batch: int, algorithms: Sequence[str] = ("bmm", "fused"),
                 device: str | torch.device = "cpu", repeats: int = 10,
                 designed: dict[str, Sequence[KSPattern]] | None = None
                 ) -> dict[str, dict[str, float]]:
    """Table 5.5 on this machine: time(module with Kronecker-sparse weights) / time(dense)
    for the N × N linear layer and the feed-forward block of ViT-S/16 (N = 384, hidden 4N,
    thesis patterns), batch-size-first, float32, inference; ``designed`` ({"nn", "up",
    "down"}: chains) adds a column "designed" with those chains and the "auto" algorithm.
    Returns {module: {algorithm: ratio}}, each the median of ``repeats`` round-robin runs."""
    device = torch.device(device)
    n = VIT_S_DIM
    torch.manual_seed(0)
    modules: dict[str, dict[str, nn.Module]] = {
        "linear N x N": {"dense": nn.Linear(n, n)},
        "feed-forward": {"dense": _mlp(nn.Linear(n, 4 * n), nn.Linear(4 * n, n))},
    }
    chains = {alg: (VIT_PATTERNS_NN, VIT_PATTERNS_UP, VIT_PATTERNS_DOWN, alg)
              for alg in algorithms}
    if designed is not None:
        chains["designed"] = (designed["nn"], designed["up"], designed["down"], "auto")
    for name, (nn_chain, up, down, alg) in chains.items():
        layers = [KSLinear(chain, algorithm=alg) for chain in (nn_chain, up, down)]
        for layer in layers:
            layer.tune(batch)  # "auto": the fastest algorithm per factor at this batch
        modules["linear N x N"][name] = layers[0]
        modules["feed-forward"][name] = _mlp(layers[1], layers[2])
    x = torch.randn(batch, n, device=device)
    out: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for name, variants in modules.items():
            fns = {alg: functools.partial(m.to(device).eval(), x) for alg, m in variants.items()}
            times = {k: statistics.median(v)
                     for k, v in round_robin(fns, repeats, device).items()}
            out[name] = {alg: times[alg] / times["dense"] for alg in chains}
    return out


def vit_table(ratios: dict[str, dict[str, float]], tokens: int, note: str = "thesis Table 5.5"):
    """A rich table of ``time_vit_mlp``'s ratios, each with its speed-up."""
    from rich.table import Table

    table = Table(title=f"ViT-S/16 modules, {tokens} tokens: time / time(dense) ({note})")
    table.add_column("module")
    for alg in next(iter(ratios.values())):
        table.add_column(alg, justify="right")
    for module, per in ratios.items():
        table.add_row(module, *(f"{v:.2f} ({1 / v:.2f}x faster)" for v in per.values()))
    return table


def write_candidates_csv(candidates: Sequence[Candidate], path: str | Path, header: str = ""
                         ) -> Path:
    """One line per candidate chain of a design; ``header`` goes into a leading comment."""
    columns = ["family", "patterns", "params", "density", "predicted_s", "measured_s",
               "dense_s", "algorithms"]
    with _csv_rows(path, header, columns) as writer:
        for c in candidates:
            writer.writerow([c.family, c.chain(), c.params, f"{c.density:.6f}", c.predicted_s,
                             c.measured_s, c.dense_s, " ".join(c.algorithms or ())])
    return Path(path)


def write_vit_csv(ratios: dict[str, dict[str, float]], path: str | Path, machine: str = ""
                  ) -> Path:
    """The ratios of ``time_vit_mlp``, one line per (module, algorithm)."""
    with _csv_rows(path, machine, ["module", "algorithm", "time_over_dense"]) as writer:
        for module, per in ratios.items():
            writer.writerows([module, alg, f"{v:.4f}"] for alg, v in per.items())
    return Path(path)


def thesis_batch(device: torch.device | str) -> int:
    """25,088 on GPU (App. D.2.1), the documented CPU batch otherwise."""
    return GRID_BATCH_SIZE if torch.device(device).type == "cuda" else CPU_BATCH_SIZE


# --- networks by design (thesis Sec. 7.4.1) ------------------------------------------------
# (n_in, n_out) of transformer and MLP weights: ViT-S/16, ViT-B/16 and BERT-large feed-forward
# (up and down), and a square MLP layer.
DESIGN_GRID = ((384, 1536), (1536, 384), (768, 3072), (1024, 4096), (512, 512))


def fastest_choices(patterns: Iterable[KSPattern], batch: int,
                    dtype: torch.dtype = torch.float32) -> dict[KSPattern, str]:
    """The algorithm ``fastest_algorithm`` (what ``KSLinear`` runs) takes for each pattern."""
    return {p: fastest_algorithm(p, batch, dtype) for p in patterns}


@dataclass(frozen=True)
class DesignCheck:
    """Evidence for one size: every candidate of ``design`` timed (``candidates``), the
    Spearman rank correlation between predicted time and measured time / dense time of the
    same group over all of them, and t(dense)/t(chain) of the designed chain and of each
    hand family measured together in one final round-robin (``speedups``, with the
    families' parameter fractions in ``density``)."""

    design: Design
    candidates: tuple[Candidate, ...]
    spearman: float | None
    speedups: dict[str, float]
    density: dict[str, float]


def check_design(n_in: int, n_out: int, budget: float = 0.25, batch: int = 1568,
                 dtype: torch.dtype = torch.float32, repeats: int = 7, contexts: int = 2,
                 on_progress: Callable[[int], None] | None = None) -> DesignCheck:
    """Design a chain for n_out × n_in, then time all its candidates and, in one run, the
    dense layer, the designed chain and the hand families of ``hand_families``.

    Each candidate is timed in ``contexts`` runs, the candidates shuffled into other
    round-robin groups each time, and keeps its fastest time relative to its group's
    dense layer: a chain's time depends a little on what shares its group (where the
    allocator puts its intermediates), which a per-factor cost model cannot see."""
    import dataclasses

    d = design(n_in, n_out, budget, batch, dtype, repeats=repeats)
    chains = [c for c in d.candidates if not c.is_dense]
    best: dict[int, tuple[float, float, tuple[str, ...]]] = {}
    for seed in range(contexts):
        order = list(range(len(chains)))
        random.Random(seed).shuffle(order)
        runs = measure([chains[i].patterns for i in order], batch, dtype, repeats,
                       on_group=on_progress)
        for i, s, ds, a in zip(order, *runs, strict=True):
            if i not in best or s / ds < best[i][0] / best[i][1]:
                best[i] = (s, ds, a)
    timed = tuple(dataclasses.replace(c, measured_s=best[i][0], dense_s=best[i][1],
                                      algorithms=best[i][2])
                  for i, c in enumerate(chains))
    rho = spearman(timed)
    final = {"designed": d.best_chain.patterns} | hand_families(n_in, n_out)
    seconds, dense_s, _ = measure(list(final.values()), batch, dtype, repeats,
                                  group=len(final))
    speedups = {name: ds / s for name, s, ds in zip(final, seconds, dense_s, strict=True)}
    density = {name: sum(p.nnz for p in chain) / (n_in * n_out) for name, chain in final.items()}
    return DesignCheck(d, timed, rho, speedups, density)


def plot_design(candidates: Sequence[Candidate], path: str | Path, title: str = "",
                chosen: Sequence[KSPattern] | None = None) -> Path:
    """Measured against predicted time of the timed candidates (log-log), two-factor and
    longer chains and the named families apart, the chosen chain (default: the first
    candidate) circled, the dense layer's time as a horizontal line."""
    plt = _pyplot()
    timed = [c for c in candidates if c.measured_s is not None and not c.is_dense]
    fig, ax = plt.subplots(figsize=(6.5, 5))
    groups = {"2 factors": [c for c in timed if not c.family and len(c.patterns) == 2],
              "3+ factors": [c for c in timed if not c.family and len(c.patterns) > 2],
              "named families": [c for c in timed if c.family]}
    for (label, group), marker in zip(groups.items(), "o^s", strict=True):
        if group:
            ax.scatter([c.predicted_s * 1e3 for c in group], [c.measured_s * 1e3 for c in group],
                       s=18, marker=marker, alpha=0.7, label=label)
    for c in groups["named families"]:
        ax.annotate(c.family, (c.predicted_s * 1e3, c.measured_s * 1e3), fontsize=7)
    if timed:
        best = next((c for c in timed if c.patterns == tuple(chosen)), timed[0]) \
            if chosen is not None else timed[0]
        ax.scatter([best.predicted_s * 1e3], [best.measured_s * 1e3], s=120,
                   facecolors="none", edgecolors="black", label="chosen")
        dense = statistics.median(c.dense_s for c in timed if c.dense_s is not None)
        ax.axhline(dense * 1e3, color="grey", lw=0.8, ls="--", label="dense")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted time (ms)")
    ax.set_ylabel("measured time (ms)")
    ax.set_title(textwrap.fill(title, 90), fontsize=8)
    ax.legend(fontsize=8)
    return _save(fig, path)
