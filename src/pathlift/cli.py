"""The ``pathlift`` command: parses arguments, calls the library, prints. Nothing else.

Each command is one small function that imports the library inside its body (so --help
and argument errors never import torch), resolves its model and data specs, calls one
library function returning a result object, and prints it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from typing import Annotated, Any

try:
    import typer
    from rich.table import Table
except ImportError as err:  # the library installed without its command line
    raise SystemExit(f"pathlift's command line needs {err.name}: pip install "
                     "'pathlift[cli]'") from err

from pathlift.cli_support import (
    INTERRUPTED,
    USAGE_EXIT,
    new_console,
    new_out,
    output_folder,
    printable,
    progress_bar,
    run,
    shown,
    version_callback,
    working,
)

# start-up: every command imports the library (torch) in its body, so --help, argument
# errors and 'pathlift models' start without it (tests/test_cli.py times them)

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  pretty_exceptions_enable=False, help="Path-lifting analysis of ReLU networks.")
console = new_console()


def _say(text: object) -> None:
    """Print ``text`` on standard output as written (``shown``: no markup read, control
    characters escaped: names come from files and users)."""
    console.print(shown(text))

MODEL_HELP = ("a reference architecture (see 'pathlift models'), a checkpoint file "
              "(.safetensors, .pt, .pth), timm:NAME (a timm architecture, random weights), "
              "module:callable or path/to/file.py:callable (a class or factory returning an "
              "nn.Module)")
DATA_HELP = ("digits, synthetic, a .npz file (arrays x, y), a .csv file (label column 'label', "
             "'y' or the last), a folder of class sub-folders of images, or module:callable "
             "returning (train, test) datasets")
Model = Annotated[str, typer.Argument(metavar="MODEL", help=MODEL_HELP, show_default=False)]
ModelB = Annotated[str, typer.Argument(metavar="MODEL_B", help="the second model: "
                                       + MODEL_HELP, show_default=False)]
InputShape = Annotated[list[int] | None, typer.Option(
    "--input-shape", metavar="<int>...", help="input shape without the batch dimension, "
    "values separated by spaces as in --input-shape 3 224 224 (default: the checkpoint's, "
    "else the data's, else the one the model declares: an input_shape attribute, timm's "
    "pretrained_cfg; never a guess)")]
Weights = Annotated[str | None, typer.Option(
    "--weights", help="state_dict file (.safetensors, .pt, .pth; weights only) for MODEL")]
WeightsB = Annotated[str | None, typer.Option(
    "--weights-b", help="state_dict file for MODEL_B")]
ModelKwargs = Annotated[str | None, typer.Option(
    "--model-kwargs", metavar="JSON", help="constructor arguments of each model given by "
    "name, a JSON object of plain literals, e.g. '{\"num_classes\": 10, \"drop_rate\": "
    "0.0}' for timm:NAME (a checkpoint holds its own)")]
Seed = Annotated[int, typer.Option(
    "--seed", help="seed of the random initialisation of a model given by name, and of the "
    "data's train/test split")]
Data = Annotated[str | None, typer.Option("--data", help=DATA_HELP)]
TestFraction = Annotated[float, typer.Option(
    "--test-fraction", help="fraction of the samples held out for testing (data without a "
    "split of its own)")]
Normalize = Annotated[str, typer.Option(
    "--normalize", help="none, or standard: subtract the training mean and divide by the "
    "training standard deviation per input value")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="batch size")]
Output = Annotated[str | None, typer.Option(
    "--output", metavar="KEY", help="for a model returning several tensors (a tuple, list or "
    "dict): the one holding the class logits, by position (0) or key (logits)")]
Out = Annotated[str | None, typer.Option(
    "--out", help="output folder (default: a new runs/COMMAND-TIMESTAMP)")]


Overwrite = Annotated[bool, typer.Option(
    "--overwrite", help="replace this command's files already in OUT (else refused)")]


def _kwargs(text: str | None) -> dict[str, Any] | None:
    """``--model-kwargs``: the JSON object (its domain checked while parsing)."""
    return None if text is None else json.loads(text)


def main() -> None:
    """The ``pathlift`` console script: one-line errors with exit status 2 (see
    ``pathlift.cli_support.run``). A command that ran a torch.distributed group (under
    torchrun) ends through ``pathlift.distributed.exit_process``; one interrupted by Ctrl-C
    (status 130) ends at once, without the interpreter's finalisation; and a Ctrl-C during
    the finalisation of a command that has ended (its files written, its output flushed)
    ends the process at once with the command's status, where it once printed a traceback
    from an exit hook."""
    try:
        run(app)
    except SystemExit as done:
        if done.code == INTERRUPTED:  # Ctrl-C: every file is whole (atomic writes), so the
            sys.stdout.flush()        # seconds of finalising a large model's memory are
            os._exit(INTERRUPTED)     # skipped (once 4 s of garbage collection after
                                      # `frontier`, which imports pathlift.distributed)
        distributed = sys.modules.get("pathlift.distributed")  # imported by such commands
        if distributed is not None:
            distributed.exit_process(done.code)
        status = done.code if isinstance(done.code, int) else int(done.code is not None)
        signal.signal(signal.SIGINT, lambda *_: os._exit(status))
        raise


@app.callback()
def _group(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=version_callback,
        help="Print the versions of pathlift, torch and Python, then exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="PATHLIFT_DEBUG",
        help="Show the full traceback of an error instead of one line.")] = False,
    max_memory: Annotated[str | None, typer.Option(
        "--max-memory", metavar="SIZE",
        help="Refuse, before allocating, any pass or checkpoint estimated to need more "
        "than SIZE (e.g. 8G, 512M) [default: PATHLIFT_MAX_MEMORY, else the memory "
        "available now]")] = None,
    trust_arch: Annotated[bool, typer.Option(
        "--trust-arch",
        help="Build the architecture a checkpoint names by an import path (module:callable): "
        "this runs code the file chose, so give it only for files you trust as your own "
        "code. Without it such a file is refused; name the architecture yourself instead "
        "(MODEL mymodule:Net --weights FILE)")] = False,
    max_time: Annotated[float | None, typer.Option(
        "--max-time", metavar="SECONDS",
        help="Refuse, before it starts, work sized by your counts (depth, prune, frontier, "
        "report, kron-bench, kron-design: seeds, epochs, sizes, repeats, patterns) whose "
        "estimate, "
        "printed first, exceeds SECONDS (inf: no limit) "
        "[default: PATHLIFT_MAX_TIME, else 3600]")] = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", metavar="SECONDS",
        help="Under torchrun: how long a collective waits for the other ranks before the "
        "run fails, so that a frozen rank ends the run [default: PATHLIFT_TIMEOUT, else "
        "1800]")] = None,
) -> None:
    """Path-lifting analysis of ReLU networks.

    A model is a reference name, a checkpoint, module:callable or path/to/file.py:callable.
    Errors print one line and exit with status 2; 'pathlift --debug COMMAND ...' shows the
    traceback. Commands that write files default to a new folder runs/COMMAND-TIMESTAMP
    under the current directory. Global options (--max-memory, --max-time, --timeout) come
    before COMMAND: 'pathlift --max-memory 8G norm resnet18'.
    """
    if max_memory is not None:
        from pathlift import set_memory_limit
        set_memory_limit(max_memory)
    if max_time is not None:
        from pathlift import set_time_limit
        set_time_limit(max_time)
        ctx.call_on_close(lambda: set_time_limit(None))
    if trust_arch:  # for this command only
        from pathlift.models import set_trust_arch
        set_trust_arch(True)
        ctx.call_on_close(lambda: set_trust_arch(False))
    if timeout is not None:
        from pathlift.distributed import set_collective_timeout
        set_collective_timeout(timeout)


def _table(title: str, columns: list[str], rows: list[list[Any]],
           caption: str | None = None, left: tuple[int, ...] = (0,)) -> Table:
    """A rich table of ``shown`` text; the columns numbered in ``left`` are left-aligned,
    the others right."""
    table = Table(title=shown(title), caption=None if caption is None else shown(caption))
    for i, column in enumerate(columns):
        table.add_column(shown(column), justify="left" if i in left else "right")
    for row in rows:
        table.add_row(*map(shown, row))
    return table


@app.command(short_help="Path-norms ||Phi||_q of a model, one forward pass per q.")
def norm(
    model: Model,
    input_shape: InputShape = None,
    q: Annotated[list[float], typer.Option("-q", metavar="<float>...", help="exponents q, "
                                           "separated by spaces")] = [1.0, 2.0, 4.0],  # noqa: B006
    r: Annotated[float | None, typer.Option("-r", help="outer exponent r (inf for max); "
                                            "default r = q, the plain l^q norm of Phi")] = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
) -> None:
    """Path-norms ||Phi||_{q,r} in one forward pass per q (thesis Thm 3.1.1)."""
    from pathlift.lift import path_norms
    from pathlift.models import load_model

    with working(console, f"path-norms of {model}"):
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed)
        norms = path_norms(net, shape, q, r)
    console.print(_table(f"path-norms of {model}, input {shape.described()}, "
                         f"r={'q' if r is None else f'{r:g}'}", ["q", "value", "log10"],
                         [[f"{k:g}", f"{n.value:.6g}", f"{n.log10:.6f}"]
                          for k, n in norms.items()]))


@app.command(short_help="Constants, path-norms and the Lipschitz bound of a model, on one screen.")
def summary(
    model: Model,
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
) -> None:
    """Constants, path-norms, Lipschitz bound and what is unsupported, in one screen."""
    from pathlift.models import load_model
    from pathlift.summary import summary as summarize

    with working(console, f"summary of {model}"):
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed)
        s = summarize(net, shape, name=model)
    if not s.supported:
        _say(f"{model} ({s.parameters:,} parameters) is outside the ReLU DAG model "
                      "(thesis Def. 2.2.2):")
        for problem in s.unsupported:
            _say(f"  - {problem}")
        if s.supported_ops:
            _say(f"supported: {s.supported_ops}")
        typer.echo(f"Error: {printable(model)} is not a supported ReLU network (the causes are "
                   "listed above)", err=True)
        raise typer.Exit(USAGE_EXIT)  # a refusal, as norm and bounds refuse it
    c = s.constants
    rows = [["parameters", f"{s.parameters:,}"], ["D, depth (Thm 4.4.1)", c.depth],
            ["K, largest max-pool kernel", c.kernel], ["d_in, d_out", f"{c.d_in}, {c.d_out}"],
            *([f"log10 ||Phi||_{q:g} (Thm 3.1.1)", f"{v:.6f}"]
              for q, v in s.path_norm_log10.items()),
            ["log10 Lipschitz in x, l_inf -> l_1 (Thm 3.3.1)", f"{s.lipschitz_log10:.6f}"],
            ["log10 product of layer norms (Thm 3.3.2)", "n/a (residual sums)"
             if s.layer_product_log10 is None else f"{s.layer_product_log10:.6f}"]]
    console.print(_table(f"{model}, input {shape.described()}", ["quantity", "value"], rows))


@app.command(short_help="Generalisation bounds of a trained model against its measured gap.")
def bounds(
    model: Model,
    data: Annotated[str, typer.Option("--data", help=DATA_HELP)],
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
    test_fraction: TestFraction = 0.25,
    normalize: Normalize = "none",
    batch_size: BatchSize = 256,
    compression: Annotated[bool, typer.Option(
        "--compression/--no-compression", help="also the compression certificate (Occam "
        "bound on a coded quantised network, carried to the trained one)")] = True,
    time_budget: Annotated[float | None, typer.Option(
        "--time-budget", help="seconds the compression search may take; it then "
        "certifies the best network found so far (valid whatever is found)")] = None,
    output: Output = None,
    unlabeled: Annotated[str | None, typer.Option(
        "--unlabeled", metavar="NPZ", help="held-out unlabeled inputs (an .npz with an array "
        "x, unused in training): adds the disagreement route through distilled compact "
        "surrogates and prints the tightest route")] = None,
) -> None:
    """Generalisation bounds of a trained model on its training data, with the measured gap.

    First the certificates valid as stated (Thm 4.1.2 + 4.4.1 with a union over radii and
    margins fixed in advance; the compression certificate), each with a one-line verdict;
    then the thesis' fixed-class forms (Thm 4.4.1, 4.3.1 with Thm 4.1.1 on the expected
    cross-entropy gap, Thm 4.1.2 on the top-1 error) for comparison. The model is measured
    in eval mode. Use the data and --seed it was trained with, so that the training split
    is the same.
    """
    from pathlift.bounds import generalization_bounds, verdict
    from pathlift.data import labels_of, load_data, load_streamed, loaders
    from pathlift.jobs.report.certificate import certificate_rows, certificates_of
    from pathlift.models import load_model

    with working(console, f"bounds of {model} on {data}") as describe:
        # an .npz's inputs read a batch at a time (the disagreement route holds them)
        split = (load_data if unlabeled else load_streamed)(
            data, input_shape=input_shape, test_fraction=test_fraction, normalize=normalize,
            seed=seed)
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed,
                                data_shape=split.input_shape)
        b = generalization_bounds(net, shape, *loaders(split, batch_size, seed), outputs=output)
        # measured in eval mode (the certificate's statement names the layers it concerns)
        cert, route = certificates_of(
            net.eval(), shape, split, output, compression, unlabeled, time_budget=time_budget,
            progress=lambda done, planned: describe(
                f"compression search: candidate {done} of at most {planned}"))
    m, u = b.measured, b.top1_union
    rows = [["Thm 4.1.2 + 4.4.1, union over radii and margins",
             f"margin loss {u.train_margin_loss:.4f} + complexity 10^{u.complexity_log10:.2f} "
             f"+ confidence {u.confidence:.4f}",
             verdict(u.log10, m.test_error, labels=labels_of(split.train))]]
    more, caption = certificate_rows(cert, route, split, m.test_error)
    console.print(_table(f"{model} on {data}, input {shape.described()}: certificates valid "
                         f"as stated (delta = {u.delta:g}, n = {b.n_train})",
                         ["bound", "terms", "verdict"], rows + more, caption=caption))
    rows = [[r.theorem, f"{r.log10:.3f}", f"{v:.3f}",
             "n/a (gap <= 0)" if math.isnan(o) else f"{o:.1f}"] for r, v, o in
            zip(b.rademacher, b.cross_entropy_log10, b.orders_above_measured, strict=True)]
    rows.append([f"Thm 4.1.2 top-1 error (gamma {b.top1.gamma:.3g})", "",
                 f"{b.top1.log10:.3f}", f"{b.top1_orders_above_measured:.1f}"])
    console.print(_table(
        f"{model} on {data}: n = {b.n_train}, log10 ||Phi||_1 = {b.path_norm_log10:.3f} "
        "(fixed-class form, thesis Sec. 7.2.1: not certificates)",
        ["bound", "log10 Rademacher", "log10 bound", "orders above measured"], rows,
        caption=f"measured: cross-entropy gap {m.cross_entropy_gap:.4f} (train "
        f"{m.train_loss:.4f}, test {m.test_loss:.4f}); top-1 error train "
        f"{1 - m.train_accuracy:.4f}, test {m.test_error:.4f}"))


@app.command(short_help="The reference architectures, their input shapes and sizes.")
def models() -> None:
    """Reference architectures: default input shape and parameter count."""
    from pathlift.models import reference_models

    console.print(_table("pathlift reference architectures (torchvision names where one "
                         "exists)", ["name", "input shape", "parameters"],
                         [[m.name, " ".join(map(str, m.input_shape)), f"{m.parameters:,}"]
                          for m in reference_models()]))


@app.command(short_help="Measure a model (trained first if asked) and write a report.")
def report(
    model: Annotated[str | None, typer.Option(
        "--model", help=MODEL_HELP + " (default: small_cnn trained on the digits)")] = None,
    data: Data = None,
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    out: Out = None,
    epochs: Annotated[int | None, typer.Option(
        "--epochs", help="training epochs before measuring (default 30 for the default "
        "model, 0 with --model: a trained checkpoint is measured as it is)")] = None,
    seed: Seed = 0,
    test_fraction: TestFraction = 0.25,
    normalize: Normalize = "none",
    batch_size: BatchSize = 64,
    output: Output = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="replace report files (report.md, .html, .json, the PNGs) "
        "already in OUT")] = False,
) -> None:
    """Bounds, path-norms, margins, average case, pruning: writes OUT/report.md, .html, .json."""
    from pathlift.jobs.report import run_report

    with output_folder(out, "report") as folder:  # created now: removed if left empty
        result = run_report(folder, model, input_shape, data, epochs, seed, weights=weights,
                            test_fraction=test_fraction, normalize=normalize,
                            batch_size=batch_size, outputs=output, overwrite=overwrite,
                            model_kwargs=_kwargs(model_kwargs),
                            on_estimate=lambda line: console.print(line, soft_wrap=True))
    for note in result.report.notes:
        _say(f"note: {note}")
    rows = [[f"log10 ||Phi||_{q:g}", f"{v:.3f}"] for q, v in result.path_norm_log10.items()]
    if result.test_accuracy is not None:
        rows += [["test accuracy", f"{result.test_accuracy:.4f}"],
                 ["log10 bound on E cross-entropy gap (Thm 4.4.1)",
                  f"{result.bound_ce_log10:.2f}"],
                 ["measured cross-entropy gap", f"{result.measured_ce_gap:.4f}"]]
    rows.append(["plots", len(result.plots)])
    console.print(_table(f"pathlift report -> {result.markdown} ({result.seconds:.1f} s)",
                         ["quantity", "value"], rows))


@app.command(short_help="Train, prune, rewind, retrain: path-magnitude against magnitude.")
def prune(
    model: Annotated[str, typer.Option("--model", help=MODEL_HELP)] = "small_cnn",
    data: Annotated[str, typer.Option("--data", help=DATA_HELP)] = "digits",
    weights: Annotated[str | None, typer.Option(
        "--weights", help="state_dict file for MODEL: every run starts from these weights")
    ] = None,
    model_kwargs: ModelKwargs = None,
    input_shape: InputShape = None,
    amount: Annotated[list[float], typer.Option(
        "--amount", metavar="<float>...", help="fractions of the prunable weights pruned "
        "(of all of them for global methods, of each layer for layerwise ones), separated by "
        "spaces")] = [0.4, 0.6, 0.8],  # noqa: B006
    last_layer_factor: Annotated[float, typer.Option(
        "--last-layer-factor", help="prune the last layer at this times the rate of the "
        "others; 0.5 is the thesis' convention (App. E.1), which prunes less than --amount "
        "of the weights")] = 1.0,
    method: Annotated[list[str] | None, typer.Option(
        "--method", metavar="<str>...", help="methods separated by spaces: "
        "magnitude-global, magnitude-layerwise, path-magnitude-global, "
        "path-magnitude-layerwise (default: all)")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="number of seeds (0, 1, ...)")] = 3,
    epochs: Annotated[int, typer.Option("--epochs", help="dense training epochs")] = 30,
    rewind_epoch: Annotated[int, typer.Option("--rewind-epoch", help="epoch to rewind "
                                              "weights to")] = 2,
    rounds: Annotated[int, typer.Option("--rounds", help="prune-rewind-retrain rounds")] = 1,
    lr: Annotated[float, typer.Option("--lr", help="SGD learning rate (momentum 0.9)")] = 0.05,
    batch_size: BatchSize = 64,
    test_fraction: TestFraction = 0.25,
    normalize: Normalize = "none",
    spread: Annotated[str, typer.Option("--spread", help="under torchrun: 'data' trains each "
                                        "network with DDP over all processes, 'runs' gives "
                                        "each process its own runs")] = "data",
    out: Annotated[str | None, typer.Option(
        "--out", help="folder for runs.csv, dense weights and plot (default runs/prune-TIME);"
        " a folder of the same settings is resumed")] = None,
    save_models: Annotated[bool, typer.Option("--save-models", help="also write each run's "
                                              "final network to OUT/models")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="replace a summary.png already in OUT (not a run to resume)")
    ] = False,
    output: Output = None,
) -> None:
    """Train, rescale at random or not, prune, rewind, retrain (thesis Sec. 3.5.2); run it
    under `torchrun --nproc_per_node N` to use N processes."""
    import os

    from pathlift.jobs.prune import METHODS, PruneConfig, prune_experiment

    config = PruneConfig(tuple(amount), tuple(method or METHODS), range(seeds),
                         epochs, rewind_epoch, rounds, last_layer_factor)
    with progress_bar(console, disable=os.environ.get("RANK", "0") != "0") as bar, \
            new_out(out, "prune") as target:
        task = bar.add_task(shown(f"prune {model} on {data}"), total=None)
        done = prune_experiment(
            model, data, config, target, weights=weights,
            input_shape=input_shape, test_fraction=test_fraction, normalize=normalize,
            batch_size=batch_size, lr=lr, spread=spread, save_models=save_models,
            overwrite=overwrite, output=output, model_kwargs=_kwargs(model_kwargs),
            on_progress=lambda text, n, total: bar.update(task, completed=n, total=total,
                                                          description=shown(text)),
            on_estimate=lambda line: bar.console.print(line, soft_wrap=True))
    if done.result is None:
        return  # not rank 0
    if done.eval_note:
        _say(f"note: {done.eval_note}")
    console.print(_prune_table(done.result, f"{seeds} seeds ({done.world_size} process(es), "
                                            f"--spread {spread})"))
    console.print(_sparsity_table(done.layer_sparsity))
    _say(f"wrote {done.csv}, {done.plot}")


def _sparsity_table(sparsity: dict[tuple[str, float], dict[str, float]]) -> Table:
    """Achieved sparsity (%) of each layer, per method and amount (seed 0's masks)."""
    runs = list(sparsity)
    layers = list(next(iter(sparsity.values()), {}))
    rows = [["all prunable weights" if layer == "all" else layer,
             *(f"{100 * sparsity[run][layer]:.1f}" for run in runs)]
            for layer in [*(n for n in layers if n != "all"), "all"]]
    return _table("achieved sparsity (%) per layer, masks of seed 0 (trained, not rescaled)",
                  ["weights", *(f"{name} {100 * a:g}%" for name, a in runs)], rows)


def _prune_table(result: Any, runs: str) -> Table:
    """Accuracy mean ± std per method and level, and the mask overlaps with magnitude."""
    config, overlaps = result.config, result.overlaps()
    summary = {(r["method"], r["rescaled"], r["amount"]): r for r in result.summary()}
    dense, dense_std = result.dense_accuracy()
    rows = [["dense (not pruned)", *[f"{100 * dense:.1f} ± {100 * dense_std:.1f}"] *
             len(config.amounts)]]
    rows += [[m.name + (" + random rescale" if rescaled else ""),
              *(f"{100 * summary[m.name, rescaled, a]['mean']:.1f} ± "
                f"{100 * summary[m.name, rescaled, a]['std']:.1f}" for a in config.amounts)]
             for m in config.methods for rescaled in config.rescaled]
    rows += [[f"mask overlap with magnitude, {m.name}",
              *(f"{overlaps[m.name, a]:.0f}%" for a in config.amounts)]
             for m in config.methods if (m.name, config.amounts[0]) in overlaps]
    return _table(f"test accuracy (%) after prune-rewind-retrain, mean ± std over {runs}",
                  ["method", *(f"{100 * a:g}%" for a in config.amounts)], rows)


@app.command(short_help="Depth-limit lab: the 1-variation of trained ResNet weights.")
def depth(
    model: Annotated[str, typer.Option("--model", help="class of Tables 4.1/4.2 + c|t")
                     ] = "C10k-B12c",
    depths: Annotated[list[int] | None, typer.Option(
        "--depths", metavar="<int>...", help="depths, separated by spaces (default 128 256 "
        "512)")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="seeds per depth; the table reports "
                                       "the max")] = 3,
    samples: Annotated[int, typer.Option("--samples", help="C10k size N")] = 10_000,
    dtype: Annotated[str, typer.Option("--dtype", help="float64, or float32 as the thesis' "
                                       "code")] = "float64",
    csv: Annotated[str | None, typer.Option("--csv", help="append one row per run to this "
                                            "CSV")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="PNG of ||L^beta W_k|| against "
                                             "k/L")] = None,
) -> None:
    """Depth-limit ResNet lab (Susanna's master's thesis, eq. 4.1): 1-variation of L^beta W."""
    import torch

    from pathlift.jobs.depth import depth_experiment, parse_model

    all_depths = depths or [128, 256, 512]
    with progress_bar(console) as progress:
        task = progress.add_task(shown(f"{model}: timing a probe"), total=None)
        steps = parse_model(model)[0].steps

        def estimated(estimate: Any) -> None:
            progress.console.print(estimate.line(), soft_wrap=True)
            progress.update(task, total=estimate.layer_steps,
                            description=shown(f"{model} layer-steps"))

        def stepped(depth: int, seed: int, t: int) -> None:
            progress.update(task, advance=depth, description=shown(
                f"{model} L={depth} seed {seed}: step {t + 1}/{steps(depth)}"))

        result = depth_experiment(
            model, all_depths, seeds, samples, getattr(torch, dtype), csv=csv, plot=plot,
            on_estimate=estimated, on_step=stepped)
    console.print(_table(
        f"{model}: ||L^beta W||_1-var, max over {seeds} seeds ({dtype})",
        ["L", "T_L", "eta", "norm path", "matrix path", "published", "mean rho"],
        [[r.depth, r.steps, f"{r.learning_rate:.4g}", f"{r.norm_path_max:.4g}",
          f"{r.matrix_path_max:.4g}", "-" if r.published is None else f"{r.published:.4g}",
          f"{r.mean_rho:.3g}"] for r in result.table]))


@app.command(short_help="Quantise towards zero, with the certified change of every output.")
def quantize(
    model: Model,
    bits: Annotated[list[int], typer.Option("--bits", metavar="<int>...", help="bit widths, "
                                            "separated by spaces")] = [8],  # noqa: B006
    symmetry_aware: Annotated[bool, typer.Option(
        "--symmetry-aware", help="also normalise before quantising and compare")] = False,
    per_channel: Annotated[bool, typer.Option("--per-channel", help="one step per out "
                                              "channel")] = False,
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
    data: Annotated[str | None, typer.Option("--data", help="measure on the test split of "
                                             "this data: " + DATA_HELP)] = None,
    test_fraction: TestFraction = 0.25,
    normalize: Normalize = "none",
    samples: Annotated[int, typer.Option("--samples", help="N(0,1) inputs when no --data")
                       ] = 64,
    rescale_seed: Annotated[int | None, typer.Option(
        "--random-rescale", help="first apply random_rescale with this seed")] = None,
    csv: Annotated[str | None, typer.Option("--csv", help="append one row per table row to "
                                            "this CSV")] = None,
) -> None:
    """Quantisation towards zero with its certified error (thesis Lemma 3.4.1, Cor. 3.4.1)."""
    from pathlift.data import load_data
    from pathlift.jobs.quant import compare_bits
    from pathlift.models import load_model

    with working(console, f"quantising {model}"):
        split = None if data is None else load_data(data, input_shape=input_shape,
                                                    test_fraction=test_fraction,
                                                    normalize=normalize, seed=seed)
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed,
                                data_shape=split and split.input_shape)
        result = compare_bits(net, shape, bits, data=split, samples=samples,
                              rescale_seed=rescale_seed, per_channel=per_channel,
                              symmetry_aware=symmetry_aware, csv=csv, name=model)
    console.print(_table(
        f"{model} quantised towards zero, {result.inputs} inputs of {shape.described()}",
        ["bits", "method", "d", "d/||Phi||_1", "max ||dR||_1", "bound", "acc"],
        [[r.bits, r.method, f"{r.certified:.4g}", f"{r.relative:.4f}", f"{r.measured:.4g}",
          f"{r.bound:.4g}", "-" if r.accuracy is None else f"{r.accuracy:.4f}"]
         for r in result.reports], left=(),
        caption="d = ||Phi(theta) - Phi(Q)||_1 (Lemma 3.4.1); bound = max over inputs of "
        "max(1, ||x||_inf) d >= ||R_theta(x) - R_Q(x)||_1 (Cor. 3.4.1)"))
    if result.note:
        _say(f"note: {result.note}")


@app.command("kron-bench", short_help="Benchmark the Kronecker-sparse multiplication algorithms.")
def kron_bench(
    device: Annotated[str, typer.Option("--device", help="cpu or cuda")] = "cpu",
    full: Annotated[bool, typer.Option("--full", help="all 627 patterns of App. D.2.1 "
                                       "(default on CPU: those with M*N <= --max-dense)")
                    ] = False,
    max_dense: Annotated[int, typer.Option("--max-dense", help="CPU subset: largest M*N")
                         ] = 2**22,
    every: Annotated[int, typer.Option("--every", help="keep every k-th pattern")] = 1,
    batch: Annotated[int | None, typer.Option("--batch", help="default 25,088 on cuda, 256 "
                                              "on cpu")] = None,
    algorithms: Annotated[list[str] | None, typer.Option(
        "--algorithm", metavar="<str>...", help="algorithms, separated by spaces (default "
        "all)")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32, float16 or bfloat16")
                     ] = "float32",
    repeats: Annotated[int, typer.Option("--repeats", help="timed runs per algorithm "
                                         "(median)")] = 5,
    threads: Annotated[list[int] | None, typer.Option(
        "--threads", metavar="<int>...", help="intra-op thread counts separated by spaces, one "
        "run each (default torch's current count)")] = None,
    vit: Annotated[bool, typer.Option("--vit/--no-vit", help="also time the ViT-S/16 MLP")
                   ] = True,
    vit_batch: Annotated[int | None, typer.Option("--vit-batch", help="tokens; default "
                                                  "8*196 on cpu, 128*196 on cuda")] = None,
    out: Out = None,
    overwrite: Overwrite = False,
) -> None:
    """Kronecker-sparse multiplication benchmark (thesis Sec. 5.4-5.5, App. D.2.1).

    Prints which CPU and instruction set the figures come from (the fused kernel is built
    for this CPU; PATHLIFT_KRON_CFLAGS=-mno-avx512f builds the AVX2 one), and for each
    thread count the median t(bmm)/t(fused) and the check that the algorithm KSLinear
    picks (fastest_algorithm) is never more than 10% slower than bmm.
    """

    from pathlift.jobs.bench import run_kron_benchmark

    with progress_bar(console) as progress, new_out(out, "kron-bench") as target:
        tasks: dict[int, Any] = {}

        def advance(count: int, done: int, total: int) -> None:
            if count not in tasks:
                tasks[count] = progress.add_task(f"patterns, {count} thread(s)", total=total)
            progress.update(tasks[count], completed=done)

        run_kron_benchmark(target, device=device, dtype=dtype,
                           full=full, max_dense=max_dense, every=every, batch=batch,
                           algorithms=algorithms, repeats=repeats, threads=threads, vit=vit,
                           vit_batch=vit_batch, on_pattern=advance, on_run=_print_kron_run,
                           on_estimate=lambda line: progress.console.print(line, soft_wrap=True),
                           overwrite=overwrite)


def _print_kron_run(timed: Any) -> None:
    """One thread count of ``kron-bench``: the machine, the files, the ratios."""
    from pathlift.jobs.bench import kron as bench

    _say(timed.machine)
    _say(f"wrote {timed.csv}")
    if timed.summary is not None:
        _say(f"wrote {timed.plot}")
        _kron_grid_table(timed.summary, timed.threads)
    if timed.vit is not None:
        _say(f"wrote {timed.vit_csv}")
        console.print(bench.vit_table(timed.vit, timed.vit_tokens))


def _kron_grid_table(s: Any, threads: int) -> None:
    _say("ratios t(baseline)/t(fused), medians over patterns; 'best' = each "
                  f"algorithm at its faster layout; {s.sparse_patterns} patterns have "
                  "density <= 1/8")
    console.print(_table(
        f"fused vs baselines, same run ({s.patterns} patterns, {threads} thread(s))",
        ["layout", "vs bmm", "fused fastest", "vs best other",
         "fused < dense (density <= 1/8)", "worst vs dense"],
        [[key, f"{s.speedup_vs_bmm[key]:.2f}x", f"{s.fused_fastest[key]:.0%}",
          f"{s.speedup_vs_best_other[key]:.2f}x",
          f"{s.fused_beats_dense[key]}/{s.sparse_patterns}", f"{s.worst_vs_dense[key]:.2f}x"]
         for key in s.speedup_vs_bmm]))
    if not math.isnan(s.default_vs_bmm):
        loses = ", ".join(map(str, s.default_loses)) or "none"
        _say(f"default algorithm (fastest_algorithm, batch-size-first) vs bmm: median "
                      f"t(bmm)/t(default) {s.default_vs_bmm:.2f}x, worst "
                      f"{s.default_worst_vs_bmm:.2f}x; patterns where it is > 10% slower than "
                      f"bmm: {loses}")


@app.command("kron-design",
             short_help="Find the fastest Kronecker-sparse chain for a dense weight.")
def kron_design(
    n_in: Annotated[int, typer.Argument(metavar="N_IN", help="input features of the dense "
                                        "layer")],
    n_out: Annotated[int, typer.Argument(metavar="N_OUT", help="output features of the dense "
                                         "layer")],
    budget: Annotated[float, typer.Option("--budget", help="largest parameter count, as a "
                                          "fraction of n_in*n_out")] = 0.25,
    batch: Annotated[int, typer.Option("--batch", help="rows per forward (tokens x "
                                       "sequences)")] = 256,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 or float64")] = "float32",
    lengths: Annotated[list[int], typer.Option(
        "--factors", metavar="<int>...", help="numbers of factors to search, separated by spaces")
    ] = [2, 3],  # noqa: B006
    top_k: Annotated[int, typer.Option("--top-k", help="best predicted chains timed for "
                                       "real")] = 8,
    repeats: Annotated[int, typer.Option("--repeats", help="round-robin runs per timing")
                       ] = 5,
    threads: Annotated[int | None, typer.Option("--threads", help="intra-op threads; "
                                                "default torch's")] = None,
    rows: Annotated[int, typer.Option("--rows", help="candidates shown")] = 20,
    out: Out = None,
    overwrite: Overwrite = False,
) -> None:
    """Fastest Kronecker-sparse chain for an N_OUT x N_IN weight (thesis Sec. 7.4.1).

    Chains with a dense support product within the budget, ranked by the Chapter 5 cost
    model calibrated on this machine, the best ones timed. Cached per machine: a second
    call is instant.
    """

    from pathlift.jobs.bench import run_kron_design

    with progress_bar(console, transient=True) as progress, \
            new_out(out, "kron-design") as target:
        task = progress.add_task("calibrating and timing", total=None)
        result = run_kron_design(
            n_in, n_out, target, budget=budget,
            batch=batch, dtype=dtype, lengths=lengths, top_k=top_k, repeats=repeats,
            threads=threads, progress=lambda stage, n: progress.update(
                task, description=stage, advance=n),
            on_estimate=lambda line: progress.console.print(line, soft_wrap=True),
            overwrite=overwrite)
    _say(f"{result.design.machine}; batch {batch}, {dtype}, budget {budget:g}")
    console.print(_kron_design_table(result.design, n_in, n_out, rows))
    _say(f"wrote {result.csv} and {result.plot}")


def _kron_design_table(result: Any, n_in: int, n_out: int, rows: int) -> Table:
    """The ranked candidates, with the chosen chain and the rank correlation as caption."""
    rho = "undefined" if result.spearman is None else f"{result.spearman:.2f}"
    return _table(
        f"Kronecker-sparse chains for a {n_out} x {n_in} weight ({len(result.candidates)} "
        "candidates; timed ones first)",
        ["#", "chain (a,b,c,d)", "params", "of dense", "predicted ms", "measured ms",
         "vs dense"],
        [[rank, (f"{c.family}: " if c.family and c.patterns else "")
          + (c.chain() if len(c.patterns) <= 3 else f"{len(c.patterns)} factors"),
          f"{c.params:,}", f"{c.density:.3f}", f"{c.predicted_s * 1e3:.3f}",
          "-" if c.measured_s is None else f"{c.measured_s * 1e3:.3f}",
          "-" if c.speedup is None else c.pace()]
         for rank, c in enumerate(result.candidates[:rows], 1)], left=(1,),
        caption=f"chosen: {result.summary()}; Spearman rank correlation of predicted and "
        f"measured time over the timed candidates: {rho}")


def _comparison_table(title: str, c: Any) -> Table:
    """Parameter norm, l1 path-norm and output gap of a model and its transformed copy."""
    return _table(title, ["", "original", "transformed"], [
        ["||theta||_2", *(f"{v:.6g}" for v in c.parameter_norm)],
        ["log10 ||Phi||_1", *(f"{v:.10f}" for v in c.path_norm_log10)],
        ["max |R - R'| / max |R|", "", f"{c.output_gap:.3g}"]])


@app.command("rescale", short_help="Rescale a model at random: the same function, other weights.")
def rescale_command(
    model: Model,
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    factors: Annotated[list[float], typer.Option(
        "--factor", metavar="<float>...", help="factors drawn per neuron, separated by spaces")
    ] = [1.0, 128.0, 4096.0],  # noqa: B006
    seed: Seed = 0,
    out: Annotated[str | None, typer.Option("--out", help="write the rescaled checkpoint "
                                            "here")] = None,
    samples: Annotated[int, typer.Option("--samples", help="N(0,1) inputs for the output "
                                         "gap")] = 16,
) -> None:
    """Random rescaling lambda <> theta (thesis Def. 2.4.1, App. E.1.2).

    Same function and path-norms, different raw parameters.
    """
    from pathlift.jobs.transform import compare_random_rescale
    from pathlift.models import load_model

    with working(console, f"rescaling {model}"):
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed)
        result = compare_random_rescale(net, shape, factors, seed, samples=samples, out=out,
                                        spec=model)
    console.print(_comparison_table(f"random rescaling of {model}, factors {factors}, "
                                    f"input {shape.described()}", result.comparison))
    if result.path is not None:
        _say(f"wrote {result.path}")


@app.command("normalize", short_help="Normalise a model: every hidden neuron of norm 0 or 1.")
def normalize_command(
    model: Model,
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
    q: Annotated[float, typer.Option("-q", help="normalise incoming (weights, bias) in l^q")
                 ] = 1.0,
    out: Annotated[str | None, typer.Option("--out", help="write the normalised checkpoint "
                                            "here")] = None,
    samples: Annotated[int, typer.Option("--samples", help="N(0,1) inputs for the output "
                                         "gap")] = 16,
) -> None:
    """Normalisation (thesis Alg. 3.2.1): every hidden neuron gets norm 0 or 1.

    Each hidden neuron's ||(theta^{->v}, b_v)||_q becomes 0 or 1; residual-tied channels
    share one factor.
    """
    from pathlift.jobs.transform import compare_normalized
    from pathlift.models import load_model

    with working(console, f"normalising {model}"):
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed)
        result = compare_normalized(net, shape, q, samples=samples, out=out, spec=model)
    counts = result.normalized
    table = _comparison_table(f"{model} normalised (q={q:g}), input {shape.described()}",
                              result.comparison)
    table.caption = (f"{counts.dead_neurons} input-dead neuron groups, {counts.tied_groups} "
                     "residual-tied groups (Def. 3.2.1 exact for untied neurons)")
    console.print(table)
    if result.path is not None:
        _say(f"wrote {result.path}")


@app.command(short_help="The l1 path-metric between two models.")
def metric(
    model: Model,
    model_b: ModelB,
    input_shape: InputShape = None,
    weights: Weights = None,
    weights_b: WeightsB = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
) -> None:
    """l1 path-metric ||Phi(A) - Phi(B)||_1 of two models.

    Exact in two passes when signs agree and one model dominates the other (Lemma 3.4.1),
    else a certified interval (Gonon et al. 2025, Lemma 3.2 / F.3).
    """
    from pathlift.lift import path_metric
    from pathlift.models import load_model_pair

    with working(console, f"path-metric between {model} and {model_b}"):
        net_a, net_b, shape = load_model_pair(model, model_b, input_shape, weights, weights_b,
                                              seed=seed, model_kwargs=_kwargs(model_kwargs))
        d = path_metric(net_a, net_b, shape)
    console.print(_table(
        f"path-metric between {model} and {model_b}, input {shape.described()}",
        ["quantity", "value"],
        [["case", d.case], ["d lower", f"{d.lower:.6g} (log10 {d.lower_log10:.6f})"],
         ["d upper", f"{d.upper:.6g} (log10 {d.upper_log10:.6f})"],
         ["||Phi(A)||_1, ||Phi(B)||_1 (log10)", f"{d.norm_a_log10:.6f}, {d.norm_b_log10:.6f}"],
         ["relative accuracy", f"{d.relative_accuracy:.2g}"]], caption=d.reason))


@app.command(short_help="Lipschitz bounds of a model in its input and in its parameters.")
def lipschitz(
    model: Model,
    other: Annotated[str | None, typer.Option("--other", help="second model, for the bound "
                                              "in the parameters: " + MODEL_HELP)] = None,
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    other_weights: Annotated[str | None, typer.Option(
        "--other-weights", help="state_dict file for OTHER")] = None,
    seed: Seed = 0,
    r: Annotated[float, typer.Option("-r", help="output norm l^r (inf for max)")] = 1.0,
    x_inf: Annotated[float, typer.Option("--x-inf", help="bound on ||x||_inf of the inputs")
                     ] = 1.0,
) -> None:
    """Lipschitz bounds in the input, and in the parameters with --other.

    In x: ||Phi||_{1,r} (Thm 3.3.1) against Pi_{1,r} (Def. 3.3.1). In theta, with --other:
    max(||x||_inf, 1) d(theta, theta') (Cor. 3.4.1) against eq. 3.7.
    """
    from pathlift.bounds import lipschitz_bounds
    from pathlift.models import load_model, load_model_pair

    with working(console, f"Lipschitz bounds of {model}"):
        if other:
            net, net_b, shape = load_model_pair(model, other, input_shape, weights,
                                                other_weights, seed=seed,
                                                model_kwargs=_kwargs(model_kwargs))
        else:
            (net, shape), net_b = load_model(model, input_shape, weights,
                                             model_kwargs=_kwargs(model_kwargs), seed=seed), None
        result = lipschitz_bounds(net, shape, r, other=net_b, x_inf=x_inf)
    bound, p = result.input, result.params
    rows = [["in x: ||Phi||_{1,r} (Thm 3.3.1)", f"{bound.log10:.6f}"],
            ["in x: Pi_{1,r} product of layer norms", "n/a (residual sums)"
             if bound.layer_product is None else f"{bound.layer_product.log10:.6f}"]]
    if other:
        rows += [[f"in theta, ||x||_inf <= {x_inf:g} (Cor. 3.4.1)",
                  f"{p.log10:.6f}" if p.applies else "no bound"],
                 ["in theta: classical (eq. 3.7)",
                  "n/a" if p.lfcn_log10 is None else f"{p.lfcn_log10:.6f}"]]
    console.print(_table(f"Lipschitz bounds of {model}, input {shape.described()}, r={r:g}",
                         ["bound", "log10"], rows, caption=p.reason if other else None))


@app.command("equivalent", short_help="Do two models differ only by permutations and rescalings?")
def equivalent_command(
    model: Model,
    model_b: ModelB,
    input_shape: InputShape = None,
    weights: Weights = None,
    weights_b: WeightsB = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
    tolerance: Annotated[float | None, typer.Option(
        "--tolerance", help="relative parameter tolerance [default: 1e-6, 4 units in the "
        "last place for float16/bfloat16 models]")] = None,
) -> None:
    """Do MODEL and MODEL_B differ only by neuron permutations and rescalings?

    Compares canonical forms (q = 2 normalisation, neurons sorted), and reports the output
    gap on N(0, 1) samples.
    """
    from pathlift.models import load_model_pair
    from pathlift.symmetry import equivalent

    with working(console, f"comparing the canonical forms of {model} and {model_b}"):
        net_a, net_b, shape = load_model_pair(model, model_b, input_shape, weights, weights_b,
                                              seed=seed, model_kwargs=_kwargs(model_kwargs))
        result = equivalent(net_a, net_b, shape, tolerance)
    from rich.text import Text

    verdict = ("equivalent", "green") if result.equivalent else ("not equivalent", "red")
    console.print(Text.assemble(
        shown(f"{model} vs {model_b}: "), verdict, f" (canonical parameter gap "
        f"{result.parameter_gap:.3g}, output gap on samples {result.output_gap:.3g})"))


@app.command(short_help="Test accuracy against the certified bound across training methods.")
def frontier(
    out: Out = None,
    overwrite: Overwrite = False,
    dataset: Annotated[list[str], typer.Option(
        "--dataset", metavar="<str>...", help="digits and/or mnist1d, separated by spaces")
    ] = ["digits", "mnist1d"],  # noqa: B006
    model: Annotated[list[str], typer.Option(
        "--model", metavar="<str>...", help="mlp, cnn, mlp-small and/or cnn-small, "
        "separated by spaces")] = ["mlp", "cnn"],  # noqa: B006
    method: Annotated[list[str] | None, typer.Option(
        "--method", metavar="<str>...", help="methods to run, separated by spaces (default: "
        "all: none, weight-decay, l1, l2, log-l1, budget, path-sgd, imp-rewind, "
        "prune-retrain, box-robust)")] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="training epochs per run")] = 30,
    sizes: Annotated[list[int], typer.Option(
        "--mnist1d-size", metavar="<int>...", help="extra MNIST-1D sample counts (train + "
        "test; 80% train), separated by spaces")] = [20_000, 100_000],  # noqa: B006
    compression: Annotated[bool, typer.Option(
        "--compression/--no-compression", help="add the compression certificate of every "
        "point")] = True,
    data_cache: Annotated[str | None, typer.Option(
        "--data-cache", help="folder keeping generated MNIST-1D sets between runs")] = None,
) -> None:
    """Test accuracy vs certified top-1 bounds across training methods.

    Trains MLPs and CNNs on digits and MNIST-1D under each method and strength, bounds each
    with Thm 4.1.2 + Thm 4.4.1 (valid as stated: union over radii and margins; the thesis'
    fixed-class form beside it) and with the compression certificate, and writes
    frontier.csv, frontier_table.csv, frontier.png and frontier.md. Runs under
    `torchrun --nproc_per_node N` to use N processes."""
    from pathlift.jobs.frontier import FrontierConfig, frontier_experiment, with_sweep

    config = FrontierConfig(datasets=tuple(dataset), models=tuple(model), epochs=epochs,
                            mnist1d_sizes=tuple(sizes), compression=compression,
                            data_cache=data_cache)
    if method:
        config = with_sweep(config, method)
    with new_out(out, "frontier") as target:
        done = frontier_experiment(
            config, target, on_progress=lambda text, i, n: _say(f"[{i}/{n}] {text}"),
            on_estimate=lambda line: console.print(line, soft_wrap=True), overwrite=overwrite)
    for path in done.paths:
        _say(f"wrote {path}")
    if done.markdown is not None:
        _say(done.markdown)


@app.command("identify", short_help="Is a model identifiable from its outputs on random inputs?")
def identify_command(
    model: Model,
    samples: int = typer.Option(256, "--samples", help="number of Gaussian inputs N"),
    input_shape: InputShape = None,
    weights: Weights = None,
    model_kwargs: ModelKwargs = None,
    seed: Seed = 0,
    scale: float = typer.Option(1.0, "--scale", help="standard deviation of the inputs"),
    method: str = typer.Option("auto", "--method", help="auto, exact or randomized"),
) -> None:
    """Is MODEL identifiable, up to its symmetries, from its outputs on N random inputs?

    Rank of the Jacobian of theta -> (R(x_i))_i against dim theta - symmetry dimension
    (Bona-Pellissier, Bachoc & Malgouyres 2022; Stock & Gribonval 2023; thesis Sec. 7.1.1).
    """
    from pathlift.models import load_model
    from pathlift.symmetry import identify

    with working(console, f"identifying {model} from {samples} inputs"):
        net, shape = load_model(model, input_shape, weights,
                                model_kwargs=_kwargs(model_kwargs), seed=seed)
        result = identify(net, samples, shape, method=method, seed=seed, scale=scale)
    _say(f"{model}: {result!r}\n  {result.symmetry.obstructions!r}\n  {result.rank!r}")


if __name__ == "__main__":
    main()
