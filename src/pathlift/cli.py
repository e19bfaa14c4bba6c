"""The ``pathlift`` command: parses arguments, calls the library, prints. Nothing else."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pathlift.cli_support import PathliftTyper, default_out, version_callback, working

app = PathliftTyper(no_args_is_help=True, add_completion=False,
                    pretty_exceptions_show_locals=False,
                    help="Path-lifting analysis of ReLU networks.")
console = Console()

Model = Annotated[str, typer.Argument(
    help="reference architecture name (see 'pathlift models') or checkpoint file")]
ModelB = Annotated[str, typer.Argument(help="second model: architecture name or checkpoint "
                                            "file, same architecture")]
InputShape = Annotated[list[int] | None, typer.Option(
    "--input-shape", help="input shape without the batch dimension, as in 3 224 224 "
    "(default: the one stored in the checkpoint, else the architecture's)")]
Weights = Annotated[str | None, typer.Option(
    "--weights", help="state_dict file (.safetensors, .pt, .pth; weights only) for the "
    "architecture MODEL")]
WeightsB = Annotated[str | None, typer.Option(
    "--weights-b", help="state_dict file for the architecture MODEL_B")]
Seed = Annotated[int, typer.Option(
    "--seed", help="seed of the random initialisation when a model is an architecture name")]


@app.callback()
def main(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=version_callback,
        help="Print the versions of pathlift, torch and Python, then exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="PATHLIFT_DEBUG",
        help="Show the full traceback of an error instead of one line.")] = False,
) -> None:
    """Path-lifting analysis of ReLU networks.

    Errors print one line and exit with status 2; 'pathlift --debug COMMAND ...' shows the
    traceback. Commands that write files default to a new folder runs/COMMAND-TIMESTAMP
    under the current directory.
    """


@app.command()
def norm(
    model: Model,
    input_shape: InputShape = None,
    q: list[float] = typer.Option([1.0, 2.0, 4.0], "-q", help="exponents q"),
    r: float = typer.Option(None, "-r", help="outer exponent r (inf for max); default r = q, "
                            "the plain l^q norm of Phi as in thesis Table 7.2"),
    weights: Weights = None,
    seed: Seed = 0,
) -> None:
    """Path-norms ||Phi||_{q,r} in one forward pass per q (thesis Thm 3.1.1)."""
    from pathlift.lift import path_norms
    from pathlift.models import load_model

    with working(console, f"path-norms of {model}"):
        net, shape = load_model(model, input_shape, weights, seed=seed)
        norms = path_norms(net, shape, q, r)
    outer = "q" if r is None else f"{r:g}"
    table = Table(title=f"path-norms of {model}, input {tuple(shape)}, r={outer}")
    table.add_column("q", justify="right")
    table.add_column("value", justify="right")
    table.add_column("log10", justify="right")
    for qq, result in norms.items():
        table.add_row(f"{qq:g}", f"{result.value:.6g}", f"{result.log10:.6f}")
    console.print(table)


@app.command()
def models() -> None:
    """Reference architectures: default input shape and parameter count."""
    import torch

    from pathlift.models import REFERENCE_MODELS

    table = Table(title="pathlift reference architectures (torchvision names where one exists)")
    table.add_column("name")
    table.add_column("input shape", justify="right")
    table.add_column("parameters", justify="right")
    for name, spec in REFERENCE_MODELS.items():
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            count = sum(p.numel() for p in spec.constructor().parameters())
        table.add_row(name, " ".join(map(str, spec.input_shape)), f"{count:,}")
    console.print(table)


@app.command()
def report(
    model: str = typer.Option(None, "--model", help="reference name or checkpoint; default: "
                              "small_cnn trained on the embedded digits"),
    input_shape: InputShape = None,
    data: str = typer.Option(None, "--data", help="data for the data-dependent sections: digits"),
    out: str = typer.Option(None, "--out", help="output folder (default: a new "
                            "runs/report-TIMESTAMP)"),
    epochs: int = typer.Option(None, "--epochs", help="training epochs (default 30 for the "
                               "default model, 0 with --model)"),
    seed: int = typer.Option(0, "--seed", help="seed of initialisation, split and shuffling"),
) -> None:
    """Bounds, path-norms, margins, average case, pruning: writes OUT/report.md and .html."""
    from pathlift.report import run_report

    result = run_report(out or default_out("report"), model, input_shape or None, data, epochs,
                        seed)
    table = Table(title=f"pathlift report -> {result.markdown} ({result.seconds:.1f} s)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for q, log10 in result.path_norm_log10.items():
        table.add_row(f"log10 ||Phi||_{q:g}", f"{log10:.3f}")
    if result.test_accuracy is not None:
        table.add_row("test accuracy", f"{result.test_accuracy:.4f}")
        table.add_row("log10 bound on E cross-entropy gap (Thm 4.4.1)",
                      f"{result.bound_ce_log10:.2f}")
        table.add_row("measured cross-entropy gap", f"{result.measured_ce_gap:.4f}")
    table.add_row("plots", str(len(result.plots)))
    console.print(table)


@app.command()
def prune(
    model: str = typer.Option("small_cnn", "--model", help="registered name (pathlift models), "
                              "module:callable factory, or checkpoint file"),
    weights: str = typer.Option(None, "--weights", help="state_dict file for the architecture "
                                "MODEL: every run starts from these weights"),
    dataset: str = typer.Option("digits", "--dataset", help="embedded dataset: digits or "
                                "synthetic (Gaussian clusters, 4 classes)"),
    input_shape: list[int] = typer.Option(None, "--input-shape", help="synthetic inputs' "
                                          "shape, no batch (default: the model's)"),
    amount: list[float] = typer.Option([0.4, 0.6, 0.8], "--amount", help="fraction pruned"),
    method: list[str] = typer.Option(None, "--method", help="magnitude-global, "
                                     "magnitude-layerwise, path-magnitude-global, "
                                     "path-magnitude-layerwise (default: all four)"),
    seeds: int = typer.Option(3, "--seeds", help="number of seeds (0, 1, ...)"),
    epochs: int = typer.Option(30, "--epochs", help="dense training epochs"),
    rewind_epoch: int = typer.Option(2, "--rewind-epoch", help="epoch to rewind weights to"),
    rounds: int = typer.Option(1, "--rounds", help="prune-rewind-retrain rounds (lottery)"),
    lr: float = typer.Option(0.05, "--lr", help="SGD learning rate (momentum 0.9)"),
    batch_size: int = typer.Option(64, "--batch-size", help="batch size per process"),
    spread: str = typer.Option("data", "--spread", help="under torchrun: 'data' trains each "
                               "network with DDP over all processes, 'runs' gives each "
                               "process its own runs of the grid (small models)"),
    out: str = typer.Option(None, "--out", help="folder for runs.csv, dense weights and plot "
                            "(default runs/prune-<time>); a folder of the same settings is "
                            "resumed"),
    save_models: bool = typer.Option(False, "--save-models", help="also write each run's "
                                     "final network to OUT/models"),
) -> None:
    """Train, rescale at random or not, prune, rewind, retrain (thesis Sec. 3.5.2); run it
    under `torchrun --nproc_per_node N` to use N processes."""

    from rich.progress import Progress

    from pathlift.data import load_digits, loaders, synthetic
    from pathlift.data.training import reproducible
    from pathlift.distributed import launched
    from pathlift.graph import graph_of
    from pathlift.models import REFERENCE_MODELS, model_factory
    from pathlift.prune import (
        METHODS,
        PruneConfig,
        RunFolder,
        SGDTraining,
        prune_rewind_retrain,
    )
    from pathlift.prune.pipeline import plot, scatter
    from pathlift.symmetry import random_rescale

    if dataset not in ("digits", "synthetic") or spread not in ("data", "runs"):
        raise typer.BadParameter("use --dataset digits|synthetic and --spread data|runs")
    with launched() as world:
        if dataset == "digits":
            data = load_digits()
        else:
            spec = REFERENCE_MODELS.get(model)
            shape = tuple(input_shape or (spec.input_shape if spec else (1, 8, 8)))
            data = synthetic(input_shape=shape)
        make = model_factory(model, data.num_classes, weights)
        d_out = graph_of(make(), data.input_shape).d_out
        if d_out != data.num_classes:
            raise typer.BadParameter(f"{model} has {d_out} outputs, {dataset} has "
                                     f"{data.num_classes} classes")
        config = PruneConfig(tuple(amount), tuple(method or METHODS), tuple(range(seeds)),
                             epochs, rewind_epoch, rounds)
        train, test = loaders(data, batch_size=batch_size, seed=0)
        training = SGDTraining(train, test, lr)
        folder = RunFolder(out or default_out("prune")) if world.main else None  # rank 0 writes
        with Progress(console=console, disable=not world.main) as bar, reproducible():
            task = bar.add_task(f"prune {model} on {dataset}", total=None)
            result = prune_rewind_retrain(
                make, data.input_shape, training.train, training.evaluate, config,
                spread=spread, folder=folder, save_models=save_models,
                on_progress=lambda text, done, total: bar.update(
                    task, completed=done, total=total, description=text))
        if not world.main:
            return
        first = folder.load_dense(config.seeds[0])
        trained = make()
        trained.load_state_dict(first.trained)
        scatters = {False: scatter(trained, data.input_shape),
                    True: scatter(random_rescale(trained, config.rescale_factors, 0,
                                                 data.input_shape), data.input_shape)}
    png = plot(result, folder.path / "summary.png",
               f"{model} on {dataset}, {seeds} seeds, {world.size} process(es)", scatters)
    table = Table(title=f"test accuracy (%) after prune-rewind-retrain, mean ± std over "
                        f"{seeds} seeds ({world.size} process(es), --spread {spread})")
    table.add_column("method")
    for a in config.amounts:
        table.add_column(f"{100 * a:g}%", justify="right")
    dense, dense_std = result.dense_accuracy()
    table.add_row("dense (not pruned)", *[f"{100 * dense:.1f} ± {100 * dense_std:.1f}"] *
                  len(config.amounts))
    summary = {(r["method"], r["rescaled"], r["amount"]): r for r in result.summary()}
    for m in config.methods:
        for rescaled in config.rescaled:
            cells = [f"{100 * summary[m.name, rescaled, a]['mean']:.1f} ± "
                     f"{100 * summary[m.name, rescaled, a]['std']:.1f}" for a in config.amounts]
            table.add_row(m.name + (" + random rescale" if rescaled else ""), *cells)
    overlaps = result.overlaps()
    for m in config.methods:
        if (m.name, config.amounts[0]) in overlaps:
            table.add_row(f"mask overlap with magnitude, {m.name}",
                          *(f"{overlaps[m.name, a]:.0f}%" for a in config.amounts))
    console.print(table)
    console.print(f"wrote {folder.csv}, {png}")


@app.command()
def depth(
    model: str = typer.Option("C10k-B12c", "--model", help="class of Tables 4.1/4.2 + c|t"),
    depths: list[int] = typer.Option(None, "--depths", help="depths (default 128 256 512)"),
    seeds: int = typer.Option(3, "--seeds", help="seeds per depth; the table reports the max"),
    samples: int = typer.Option(10_000, "--samples", help="C10k size N (the thesis' text: 1e4)"),
    dtype: str = typer.Option("float64", "--dtype", help="float64, or float32 as the thesis' code"),
    csv: str = typer.Option(None, "--csv", help="append one row per run to this CSV"),
    plot: str = typer.Option(None, "--plot", help="PNG of ||L^beta W_k|| against k/L"),
) -> None:
    """Depth-limit ResNet lab (master's thesis eq. 4.1): 1-variation of L^beta W across depths."""
    import torch
    from rich.progress import Progress

    from pathlift.depth.experiments import (
        DepthRun,
        append_csv,
        fit_rate,
        grid,
        maxima,
        plot_trajectories,
    )
    from pathlift.depth.published import PUBLISHED_C10K

    all_depths = depths or [128, 256, 512]
    types = {"float64": torch.float64, "float32": torch.float32}
    if dtype not in types:
        raise typer.BadParameter(f"--dtype must be one of {sorted(types)}")

    def on_run(r: DepthRun) -> None:
        progress.update(task, advance=1, description=f"{model} L={r.depth}")
        if csv is not None:
            append_csv(csv, [r])

    with Progress(console=console) as progress:
        task = progress.add_task(f"{model}", total=len(all_depths) * seeds)
        runs = grid(model, all_depths, seeds, samples, types[dtype], on_run)
    if plot is not None:
        plot_trajectories([r for r in runs if r.seed == 0], plot)
    norm_max, matrix_max = maxima(runs), maxima(runs, norm_path=False)
    table = Table(title=f"{model}: ||L^beta W||_1-var, max over {seeds} seeds ({dtype})")
    for column in ("L", "T_L", "eta", "norm path", "matrix path", "published", "mean rho"):
        table.add_column(column, justify="right")
    for L in all_depths:
        of_L = [r for r in runs if r.depth == L]
        rhos = [fit_rate(r.omega).rho for r in of_L]
        published = PUBLISHED_C10K.get(model, {}).get(L)
        table.add_row(str(L), str(of_L[0].steps), f"{of_L[0].learning_rate:.4g}",
                      f"{norm_max[model, L]:.4g}", f"{matrix_max[model, L]:.4g}",
                      "-" if published is None else f"{published:.4g}",
                      f"{sum(rhos) / len(rhos):.3g}")
    console.print(table)


@app.command()
def quantize(
    model: Model,
    bits: list[int] = typer.Option([8], "--bits", help="bit widths"),
    symmetry_aware: bool = typer.Option(False, "--symmetry-aware",
                                        help="also normalise before quantising and compare"),
    per_channel: bool = typer.Option(False, "--per-channel", help="one step per out channel"),
    input_shape: InputShape = None,
    weights: Weights = None,
    seed: Seed = 0,
    data: str = typer.Option(None, "--data", help="'digits': measure on the digits test set"),
    samples: int = typer.Option(64, "--samples", help="N(0,1) inputs when no --data"),
    rescale_seed: int = typer.Option(None, "--random-rescale",
                                     help="first apply random_rescale with this seed"),
    csv: str = typer.Option(None, "--csv", help="append one row per table row to this CSV"),
) -> None:
    """Quantisation towards zero with its certified error (thesis Lemma 3.4.1, Cor. 3.4.1)."""
    import torch
    from rich.progress import track

    from pathlift.models import load_model
    from pathlift.quant import append_csv, compare

    net, shape = load_model(model, input_shape, weights, seed=seed)
    labels = None
    if data == "digits":
        from pathlift.data import load_digits

        inputs, labels = load_digits().test.tensors
    elif data is not None:
        raise typer.BadParameter("--data must be 'digits' (or left out)")
    else:
        inputs = torch.randn((samples, *shape), generator=torch.Generator().manual_seed(0))
    if rescale_seed is not None:
        from pathlift.symmetry import random_rescale

        net = random_rescale(net, seed=rescale_seed, input_shape=shape)
    reports = [r for b in track(bits, description="quantising", console=console)
               for r in compare(net, shape, b, inputs, labels, per_channel=per_channel,
                                symmetry_aware=symmetry_aware)]
    table = Table(title=f"{model} quantised towards zero, {len(inputs)} inputs",
                  caption="d = ||Phi(theta) - Phi(Q)||_1 (Lemma 3.4.1); bound = max over "
                  "inputs of max(1, ||x||_inf) d >= ||R_theta(x) - R_Q(x)||_1 (Cor. 3.4.1)")
    for column in ("bits", "method", "d", "d/||Phi||_1", "max ||dR||_1", "bound", "acc"):
        table.add_column(column, justify="right")
    for r in reports:
        table.add_row(str(r.bits), r.method, f"{r.certified:.4g}", f"{r.relative:.4f}",
                      f"{r.measured:.4g}", f"{r.bound:.4g}",
                      "-" if r.accuracy is None else f"{r.accuracy:.4f}")
    console.print(table)
    if csv is not None:
        append_csv(csv, reports, model=model, random_rescale=rescale_seed,
                   per_channel=per_channel)


@app.command("kron-bench")
def kron_bench(
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    full: bool = typer.Option(False, "--full", help="all 627 patterns of App. D.2.1 (default on"
                              " CPU: those with M*N <= --max-dense)"),
    max_dense: int = typer.Option(2**22, "--max-dense", help="CPU subset: largest M*N"),
    every: int = typer.Option(1, "--every", help="keep every k-th pattern of the grid"),
    batch: int = typer.Option(None, "--batch", help="default 25,088 on cuda, 256 on cpu"),
    algorithms: list[str] = typer.Option(None, "--algorithm", help="repeatable; default all"),
    dtype: str = typer.Option("float32", "--dtype", help="float32, float16 or bfloat16"),
    repeats: int = typer.Option(5, "--repeats", help="timed runs per algorithm (median)"),
    threads: list[int] = typer.Option(None, "--threads", help="intra-op threads, repeatable "
                                      "(one run each); default torch's current count"),
    vit: bool = typer.Option(True, "--vit/--no-vit", help="also time the ViT-S/16 MLP"),
    vit_batch: int = typer.Option(None, "--vit-batch", help="tokens; default 8*196 on cpu, "
                                  "128*196 on cuda"),
    out: str = typer.Option(None, "--out", help="folder for CSV and plots; default "
                            "runs/kron-bench-<timestamp>"),
) -> None:
    """Kronecker-sparse multiplication benchmark (thesis Sec. 5.4-5.5, App. D.2.1).

    Prints which CPU and instruction set the figures come from (the fused kernel is built
    for this CPU; PATHLIFT_KRON_CFLAGS=-mno-avx512f builds the AVX2 one), and for each
    thread count the median t(bmm)/t(fused) and the check that the algorithm KSLinear
    picks (fastest_algorithm) is never more than 10% slower than bmm.
    """
    import torch
    from rich.progress import Progress

    from pathlift.bench import kron as bench
    from pathlift.kron import ALGORITHMS, benchmark_patterns
    from pathlift.kron.cache import machine_description
    from pathlift.kron.timing import steady_allocator

    dev = torch.device(device)
    patterns = benchmark_patterns()[::every] if full else bench.cpu_patterns(max_dense, every)
    batch = batch or bench.thesis_batch(dev)
    algs = tuple(algorithms or ALGORITHMS)
    torch_dtype = getattr(torch, dtype)
    steady = steady_allocator()
    out = out or default_out("kron-bench")
    for count in threads or [torch.get_num_threads()]:
        torch.set_num_threads(count)
        machine = (f"{machine_description(torch_dtype)}, "
                   f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, "
                   f"load {os.getloadavg()[0]:.1f}, batch {batch}, {dtype}, {len(patterns)} "
                   f"patterns{' (full grid)' if full else f', M*N <= {max_dense}'}"
                   f"{', steady allocator' if steady else ''}")
        console.print(machine)
        with Progress(console=console) as progress:
            task = progress.add_task(f"patterns, {count} thread(s)", total=len(patterns))
            rows = bench.time_grid(patterns, batch, algs, dtype=torch_dtype, device=dev,
                                   repeats=repeats,
                                   on_pattern=lambda _, task=task: progress.advance(task))
        stem = Path(out) / f"kron_{dev.type}_{dtype}_t{count}"
        console.print(f"wrote {bench.write_csv(rows, stem.with_suffix('.csv'), machine)}")
        if {"fused", "bmm", "dense"} <= set(algs):
            defaults = (bench.fastest_choices(patterns, batch, torch_dtype)
                        if dev.type == "cpu" and set(ALGORITHMS) <= set(algs) else None)
            s = bench.summarize(rows, defaults)
            console.print(f"wrote {bench.plot_speedups(rows, stem.with_suffix('.png'), machine)}")
            _kron_grid_table(s, count)
        if vit:
            tokens = vit_batch or (128 * 196 if dev.type == "cuda" else 8 * 196)
            ratios = bench.time_vit_mlp(tokens, [a for a in ("bmm", "fused") if a in algs],
                                        device=dev, repeats=max(repeats, 10))
            vit_path = bench.write_vit_csv(ratios, f"{stem}_vit.csv",
                                           f"{machine}, {tokens} tokens")
            console.print(f"wrote {vit_path}")
            console.print(bench.vit_table(ratios, tokens))


def _kron_grid_table(s, threads: int) -> None:
    table = Table(title=f"fused vs baselines, same run ({s.patterns} patterns, {threads} "
                  "thread(s))")
    console.print("ratios t(baseline)/t(fused), medians over patterns; 'best' = each "
                  f"algorithm at its faster layout; {s.sparse_patterns} patterns have "
                  "density <= 1/8")
    for col in ("layout", "vs bmm", "fused fastest", "vs best other",
                "fused < dense (density <= 1/8)", "worst vs dense"):
        table.add_column(col, justify="right")
    for key in s.speedup_vs_bmm:
        table.add_row(key, f"{s.speedup_vs_bmm[key]:.2f}x", f"{s.fused_fastest[key]:.0%}",
                      f"{s.speedup_vs_best_other[key]:.2f}x",
                      f"{s.fused_beats_dense[key]}/{s.sparse_patterns}",
                      f"{s.worst_vs_dense[key]:.2f}x")
    console.print(table)
    if not math.isnan(s.default_vs_bmm):
        loses = ", ".join(map(str, s.default_loses)) or "none"
        console.print(f"default algorithm (fastest_algorithm, batch-size-first) vs bmm: median "
                      f"t(bmm)/t(default) {s.default_vs_bmm:.2f}x, worst "
                      f"{s.default_worst_vs_bmm:.2f}x; patterns where it is > 10% slower than "
                      f"bmm: {loses}")


@app.command("kron-design")
def kron_design(
    n_in: int = typer.Argument(..., help="input features of the dense layer"),
    n_out: int = typer.Argument(..., help="output features of the dense layer"),
    budget: float = typer.Option(0.25, "--budget", help="largest parameter count, as a "
                                 "fraction of n_in*n_out"),
    batch: int = typer.Option(256, "--batch", help="rows per forward (tokens x sequences)"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or float64"),
    lengths: list[int] = typer.Option([2, 3], "--factors", help="numbers of factors to search "
                                      "(repeatable)"),
    top_k: int = typer.Option(8, "--top-k", help="best predicted chains timed for real"),
    repeats: int = typer.Option(5, "--repeats", help="round-robin runs per timing"),
    threads: int = typer.Option(None, "--threads", help="intra-op threads; default torch's"),
    rows: int = typer.Option(20, "--rows", help="candidates shown"),
    out: str = typer.Option(None, "--out", help="folder for the CSV and the plot; default "
                            "runs/kron-design-<timestamp>"),
) -> None:
    """Fastest Kronecker-sparse chain for an N_OUT x N_IN weight (thesis Sec. 7.4.1).

    Chains with a dense support product within the budget, ranked by the Chapter 5 cost
    model calibrated on this machine, the best ones timed. Cached per machine: a second
    call is instant.
    """
    import torch
    from rich.progress import Progress

    from pathlift.bench import kron as bench
    from pathlift.kron import design
    from pathlift.kron.timing import steady_allocator

    if threads:
        torch.set_num_threads(threads)
    steady_allocator()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("calibrating and timing", total=None)
        result = design(n_in, n_out, budget, batch, getattr(torch, dtype), lengths, top_k,
                        repeats=repeats, progress=lambda stage, n: progress.update(
                            task, description=stage, advance=n))
    console.print(f"{result.machine}; batch {batch}, {dtype}, budget {budget:g}")
    table = Table(title=f"Kronecker-sparse chains for a {n_out} x {n_in} weight "
                  f"({len(result.candidates)} candidates; timed ones first)")
    for col in ("#", "chain (a,b,c,d)", "params", "of dense", "predicted ms", "measured ms",
                "vs dense"):
        table.add_column(col, justify="left" if col.startswith("chain") else "right")
    for rank, c in enumerate(result.candidates[:rows], 1):
        chain = c.chain() if len(c.patterns) <= 3 else f"{len(c.patterns)} factors"
        table.add_row(str(rank), f"{c.family}: {chain}" if c.family and c.patterns else chain,
                      f"{c.params:,}", f"{c.density:.3f}", f"{c.predicted_s * 1e3:.3f}",
                      "-" if c.measured_s is None else f"{c.measured_s * 1e3:.3f}",
                      "-" if c.speedup is None else c.pace())
    console.print(table)
    rho = "undefined" if result.spearman is None else f"{result.spearman:.2f}"
    console.print(f"chosen: {result.summary()}; Spearman rank correlation of predicted and "
                  f"measured time over the timed candidates: {rho}")
    folder = Path(out or default_out("kron-design"))
    folder.mkdir(parents=True, exist_ok=True)
    bench.write_candidates_csv(result.candidates, folder / "candidates.csv", result.machine)
    plot = bench.plot_design(result.candidates, folder / "predicted_vs_measured.png",
                             f"{n_out} x {n_in}, batch {batch}: {result.machine}")
    console.print(f"wrote {folder / 'candidates.csv'} and {plot}")


def _symmetry_table(title: str, net, other, shape, samples: int) -> Table:
    """Parameter norm, l1 path-norm and output gap of a model and its transformed copy."""
    import torch

    from pathlift.lift import path_norm

    x = torch.randn((samples, *shape), generator=torch.Generator().manual_seed(0))
    x = x.to(next(net.parameters()).dtype)
    with torch.no_grad():
        y, y2 = net(x), other(x)
    table = Table(title=title)
    for column in ("", "original", "transformed"):
        table.add_column(column, justify="right")
    norms = [sum(float(p.detach().double().pow(2).sum()) for p in m.parameters()) ** 0.5
             for m in (net, other)]
    table.add_row("||theta||_2", *(f"{v:.6g}" for v in norms))
    table.add_row("log10 ||Phi||_1", *(f"{path_norm(m, shape).log10:.10f}" for m in (net, other)))
    gap = float((y - y2).abs().max() / y.abs().max().clamp_min(1e-300))
    table.add_row("max |R - R'| / max |R|", "", f"{gap:.3g}")
    return table


def _save_like(net, spec: str, out: str, shape: tuple[int, ...]) -> None:
    """Write ``net`` as a checkpoint of the architecture (and kwargs) of ``spec``, with
    the input shape it was analysed at."""
    from pathlift.models.checkpoints import read_checkpoint, save_checkpoint

    arch, kwargs = spec, {}
    if Path(spec).is_file():
        ckpt = read_checkpoint(spec)
        arch, kwargs = ckpt.arch or spec, ckpt.kwargs
    console.print(f"wrote {save_checkpoint(net, out, arch, input_shape=shape, **kwargs)}")


@app.command("rescale")
def rescale_command(
    model: Model,
    input_shape: InputShape = None,
    weights: Weights = None,
    factors: list[float] = typer.Option([1.0, 128.0, 4096.0], "--factor",
                                        help="factors drawn per neuron"),
    seed: int = typer.Option(0, "--seed", help="seed of the factors, and of the random "
                             "initialisation when MODEL is an architecture name"),
    out: str = typer.Option(None, "--out", help="write the rescaled checkpoint here"),
    samples: int = typer.Option(16, "--samples", help="N(0,1) inputs for the output gap"),
) -> None:
    """Random rescaling lambda <> theta (thesis Def. 2.4.1, App. E.1.2).

    Same function and path-norms, different raw parameters.
    """
    from pathlift.models import load_model
    from pathlift.symmetry import random_rescale

    with working(console, f"rescaling {model}"):
        net, shape = load_model(model, input_shape, weights, seed=seed)
        rescaled = random_rescale(net, factors, seed, shape)
        table = _symmetry_table(f"random rescaling of {model}, factors {factors}", net,
                                rescaled, shape, samples)
    console.print(table)
    if out:
        _save_like(rescaled, model, out, shape)


@app.command("normalize")
def normalize_command(
    model: Model,
    input_shape: InputShape = None,
    weights: Weights = None,
    seed: Seed = 0,
    q: float = typer.Option(1.0, "-q", help="normalise incoming (weights, bias) in l^q"),
    out: str = typer.Option(None, "--out", help="write the normalised checkpoint here"),
    samples: int = typer.Option(16, "--samples", help="N(0,1) inputs for the output gap"),
) -> None:
    """Normalisation (thesis Alg. 3.2.1): every hidden neuron gets norm 0 or 1.

    Each hidden neuron's ||(theta^{->v}, b_v)||_q becomes 0 or 1; residual-tied channels
    share one factor.
    """
    from pathlift.models import load_model
    from pathlift.symmetry import normalize_report

    with working(console, f"normalising {model}"):
        net, shape = load_model(model, input_shape, weights, seed=seed)
        result = normalize_report(net, shape, q)
        table = _symmetry_table(f"{model} normalised (q={q:g})", net, result.model, shape,
                                samples)
    table.caption = (f"{result.dead_neurons} input-dead neuron groups, {result.tied_groups} "
                     "residual-tied groups (Def. 3.2.1 exact for untied neurons)")
    console.print(table)
    if out:
        _save_like(result.model, model, out, shape)


def _load_pair(model: str, model_b: str, input_shape: list[int] | None,
               weights: str | None, weights_b: str | None, seed: int):
    """Both models of a two-model command and their common input shape (ShapeError when
    they come with different ones and no --input-shape chooses)."""
    from pathlift.errors import ShapeError
    from pathlift.models import load_model

    net_a, shape = load_model(model, input_shape, weights, seed=seed)
    net_b, shape_b = load_model(model_b, input_shape, weights_b, seed=seed)
    if shape != shape_b:
        raise ShapeError(f"{model} has input shape {shape} and {model_b} has {shape_b} (stored "
                         "in a checkpoint, or an architecture's default): give --input-shape")
    return net_a, net_b, shape


@app.command()
def metric(
    model: Model,
    model_b: ModelB,
    input_shape: InputShape = None,
    weights: Weights = None,
    weights_b: WeightsB = None,
    seed: Seed = 0,
) -> None:
    """l1 path-metric ||Phi(A) - Phi(B)||_1 of two models.

    Exact in two passes when signs agree and one model dominates the other (Lemma 3.4.1),
    else a certified interval (paper 002 Lemma 3.2 / F.3).
    """
    from pathlift.lift import path_metric

    with working(console, f"path-metric between {model} and {model_b}"):
        net_a, net_b, shape = _load_pair(model, model_b, input_shape, weights, weights_b,
                                         seed)
        result = path_metric(net_a, net_b, shape)
    table = Table(title=f"path-metric between {model} and {model_b}, input {shape}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("case", result.case)
    table.add_row("d lower", f"{result.lower:.6g} (log10 {result.lower_log10:.6f})")
    table.add_row("d upper", f"{result.upper:.6g} (log10 {result.upper_log10:.6f})")
    table.add_row("||Phi(A)||_1, ||Phi(B)||_1 (log10)",
                  f"{result.norm_a_log10:.6f}, {result.norm_b_log10:.6f}")
    table.add_row("relative accuracy", f"{result.relative_accuracy:.2g}")
    table.caption = result.reason
    console.print(table)


@app.command()
def lipschitz(
    model: Model,
    other: str = typer.Option(None, "--other", help="second model: bound in the parameters"),
    input_shape: InputShape = None,
    weights: Weights = None,
    other_weights: str = typer.Option(None, "--other-weights",
                                      help="state_dict file for the architecture OTHER"),
    seed: Seed = 0,
    r: float = typer.Option(1.0, "-r", help="output norm l^r (inf for max)"),
    x_inf: float = typer.Option(1.0, "--x-inf", help="bound on ||x||_inf of the inputs"),
) -> None:
    """Lipschitz bounds in the input, and in the parameters with --other.

    In x: ||Phi||_{1,r} (Thm 3.3.1) against Pi_{1,r} (Def. 3.3.1). In theta, with --other:
    max(||x||_inf, 1) d(theta, theta') (Cor. 3.4.1) against eq. 3.7.
    """
    from pathlift.lift import lipschitz_input, lipschitz_params
    from pathlift.models import load_model

    with working(console, f"Lipschitz bounds of {model}"):
        if other:
            net, net_b, shape = _load_pair(model, other, input_shape, weights, other_weights,
                                           seed)
            p = lipschitz_params(net, net_b, shape, x_inf)
        else:
            net, shape = load_model(model, input_shape, weights, seed=seed)
        bound = lipschitz_input(net, shape, r)
    table = Table(title=f"Lipschitz bounds of {model}, input {shape}, r={r:g}")
    table.add_column("bound")
    table.add_column("log10", justify="right")
    table.add_row("in x: ||Phi||_{1,r} (Thm 3.3.1)", f"{bound.log10:.6f}")
    product = "n/a (residual sums)" if bound.layer_product is None else \
        f"{bound.layer_product.log10:.6f}"
    table.add_row("in x: Pi_{1,r} product of layer norms", product)
    if other:
        table.add_row(f"in theta, ||x||_inf <= {x_inf:g} (Cor. 3.4.1)",
                      f"{p.log10:.6f}" if p.applies else "no bound")
        table.add_row("in theta: classical (eq. 3.7)",
                      "n/a" if p.lfcn_log10 is None else f"{p.lfcn_log10:.6f}")
        table.caption = p.reason
    console.print(table)


@app.command("equivalent")
def equivalent_command(
    model: Model,
    model_b: ModelB,
    input_shape: InputShape = None,
    weights: Weights = None,
    weights_b: WeightsB = None,
    seed: Seed = 0,
    tolerance: float = typer.Option(1e-6, "--tolerance", help="relative parameter tolerance"),
) -> None:
    """Do MODEL and MODEL_B differ only by neuron permutations and rescalings?

    Compares canonical forms (q = 2 normalisation, neurons sorted), and reports the output
    gap on N(0, 1) samples.
    """
    from pathlift.symmetry import equivalent

    with working(console, f"comparing the canonical forms of {model} and {model_b}"):
        net_a, net_b, shape = _load_pair(model, model_b, input_shape, weights, weights_b,
                                         seed)
        result = equivalent(net_a, net_b, shape, tolerance)
    verdict = "[green]equivalent[/]" if result.equivalent else "[red]not equivalent[/]"
    console.print(f"{model} vs {model_b}: {verdict} (canonical parameter gap "
                  f"{result.parameter_gap:.3g}, output gap on samples {result.output_gap:.3g})")


@app.command()
def frontier(
    out: Path = typer.Option(None, "--out", help="output folder (default: runs/frontier-TIME)"),
    dataset: list[str] = typer.Option(["digits", "mnist1d"], "--dataset",
                                      help="digits and/or mnist1d"),
    model: list[str] = typer.Option(["mlp", "cnn"], "--model", help="mlp and/or cnn"),
    method: list[str] = typer.Option(None, "--method", help="methods to run (default: all: "
                                     "none, weight-decay, l1, l2, log-l1, budget, path-sgd, "
                                     "imp-rewind)"),
    epochs: int = typer.Option(30, "--epochs", help="training epochs per run"),
    sizes: list[int] = typer.Option([20_000, 100_000], "--mnist1d-size",
                                    help="extra MNIST-1D sample counts (the sqrt(n) term)"),
) -> None:
    """Test accuracy vs certified top-1 bound across path-norm training methods.

    Trains MLPs and CNNs on digits and MNIST-1D under each method and strength, bounds each
    with Thm 4.1.2 + Thm 4.4.1, and writes frontier.csv, frontier_table.csv, frontier.png
    and frontier.md. Runs under `torchrun --nproc_per_node N` to use N processes."""
    from pathlift.distributed import launched
    from pathlift.train.frontier import FrontierConfig, run_frontier, with_sweep, write_frontier

    config = FrontierConfig(datasets=tuple(dataset), models=tuple(model), epochs=epochs,
                            mnist1d_sizes=tuple(sizes))
    if method:
        config = with_sweep(config, method)
    with launched() as world:
        result = run_frontier(config, on_progress=lambda text, i, n: console.print(
            f"[{i}/{n}] {text}") if world.main else None)
        if world.main:
            folder = default_out("frontier") if out is None else out
            for path in write_frontier(result, folder):
                console.print(f"wrote {path}")
            console.print(Path(folder, "frontier.md").read_text())


@app.command("identify")
def identify_command(
    model: Model,
    samples: int = typer.Option(256, "--samples", help="number of Gaussian inputs N"),
    input_shape: InputShape = None,
    weights: Weights = None,
    seed: Seed = 0,
    scale: float = typer.Option(1.0, "--scale", help="standard deviation of the inputs"),
    method: str = typer.Option("auto", "--method", help="auto, exact or randomized"),
) -> None:
    """Is MODEL identifiable, up to its symmetries, from its outputs on N random inputs?

    Rank of the Jacobian of theta -> (R(x_i))_i against dim theta - symmetry dimension
    (Bona-Pellissier, Bachoc & Malgouyres 2022; Stock & Gribonval 2023; thesis Sec. 7.1.1).
    """
    import torch

    from pathlift.models import load_model
    from pathlift.symmetry import identify

    with working(console, f"identifying {model} from {samples} inputs"):
        net, shape = load_model(model, input_shape, weights, seed=seed)
        generator = torch.Generator().manual_seed(seed)
        x = scale * torch.randn((samples, *shape), generator=generator, dtype=torch.float64)
        result = identify(net, x, method=method, seed=seed)
    console.print(f"{model}: {result!r}\n  {result.symmetry.obstructions!r}\n  {result.rank!r}")


if __name__ == "__main__":
    app()
