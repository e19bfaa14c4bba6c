"""How many random inputs identify a ReLU network, up to its symmetries (thesis Sec. 7.1.1).

    .venv/bin/python benchmarks/bench_identify.py [--repeats 3] [--scale 3] [--rows 32]

Four architectures (MLP, CNN with max-pooling, ResNet basic block, U-Net block) with random
weights (BatchNorm statistics and affine parameters randomised) and Gaussian inputs of
standard deviation ``--scale`` (default 3: at 1, some neurons of the MLP switch on a side
that too few inputs reach, and 4000 inputs do not identify it). For each: the rank of the
Jacobian of theta -> (R_theta(x_i))_{i<=n} against n, the smallest n at which it reaches
dim theta - symmetry dimension (the local condition of Bona-Pellissier, Bachoc & Malgouyres
2022; doubling then bisection, the rank being monotone in n for nested inputs), and the
number of linear regions the n inputs visit (distinct activation patterns). The cost of
the test at that n is reported against one forward pass of the same n inputs (same run).
Writes benchmarks/results/identify.csv, identify_curves.csv and identify.png.
"""

from __future__ import annotations

import argparse
import csv
import io
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import nn

from pathlift.files import atomic_write
from pathlift.models import unet
from pathlift.models.resnet import BasicBlock
from pathlift.symmetry import identify
from timing import median_seconds

RESULTS = Path(__file__).parent / "results"


def _randomise_batchnorm(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.5, 0.5, generator=g)
    return model.double().eval()


def architectures() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(),
                        nn.Linear(12, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 3 * 3, 3))
    resnet = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), BasicBlock(3, 3),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 3))
    return {
        "mlp": (_randomise_batchnorm(mlp, 1), (6,)),
        "cnn": (_randomise_batchnorm(cnn, 2), (1, 6, 6)),
        "resnet_block": (_randomise_batchnorm(resnet, 3), (1, 5, 5)),
        "unet_block": (_randomise_batchnorm(unet(1, 1, base=2, depth=1), 4), (1, 4, 4)),
    }


def smallest_n(model: nn.Module, x: torch.Tensor) -> tuple[int | None, list[dict]]:
    """Doubling then bisection on n; every evaluated n as a row."""
    rows: dict[int, dict] = {}

    def evaluate(n: int) -> bool:
        if n not in rows:
            result = identify(model, x[:n], domain=x)
            rows[n] = {"n": n, "rank": result.rank.rank, "missing": result.missing,
                       "regions": result.regions, "gap": f"{result.rank.gap:.3g}",
                       "identified": result.identified, "result": result}
        return rows[n]["identified"]

    n = 1
    while n < len(x) and not evaluate(n):
        n *= 2
    n = min(n, len(x))
    if not evaluate(n):
        return None, [rows[k] for k in sorted(rows)]
    low = n // 2
    while n - low > 1:
        mid = (low + n) // 2
        if evaluate(mid):
            n = mid
        else:
            low = mid
    return n, [rows[k] for k in sorted(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=3.0,
                        help="standard deviation of the Gaussian inputs")
    parser.add_argument("--rows", type=float, default=32.0,
                        help="at most this many Jacobian rows per parameter")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    table, curves = [], {}
    for name, (model, shape) in architectures().items():
        with torch.no_grad():
            d_out = model(torch.zeros((1, *shape), dtype=torch.float64)).numel()
        count = int(args.rows * sum(p.numel() for p in model.parameters()) / d_out)
        x = args.scale * torch.randn((count, *shape), dtype=torch.float64,
                                     generator=torch.Generator().manual_seed(7))
        start = time.perf_counter()
        best, rows = smallest_n(model, x)
        search = time.perf_counter() - start
        final = rows[-1]["result"] if best is None else \
            next(r["result"] for r in rows if r["n"] == best)
        n = best or len(x)
        inputs = x[:n]
        test = median_seconds(lambda m=model, i=inputs, d=x: identify(m, i, domain=d),
                              args.repeats)
        with torch.no_grad():
            forward = median_seconds(lambda m=model, i=inputs: m(i), args.repeats)
        sym = final.symmetry
        table.append({
            "architecture": name, "params": final.num_params, "outputs": final.rank.rows // n,
            "predicted_symmetries": sym.predicted, "rescaling": sym.obstructions.rescaling,
            "phi_kernel": sym.phi_kernel, "smallest_n": best if best else f">{len(x)}",
            "regions_at_n": final.regions, "rank_at_n": final.rank.rank,
            "missing_at_n": final.missing, "involved": " ".join(final.involved),
            "gap_at_n": f"{final.rank.gap:.3g}",
            "test_seconds": f"{test:.4f}", "forward_seconds": f"{forward:.6f}",
            "test_over_forward": f"{test / forward:.0f}", "search_seconds": f"{search:.1f}"})
        curves[name] = (final.num_params - sym.predicted, rows)
        print(f"{name:<13} P={final.num_params:5d} symmetries={sym.predicted:3d} "
              f"(rescaling {sym.obstructions.rescaling}, dPhi kernel {sym.phi_kernel}) "
              f"smallest n={best} regions={final.regions} missing={final.missing} "
              f"gap={final.rank.gap:.2g}; test {test * 1e3:.1f} ms = {test / forward:.0f}x "
              f"a forward of the same {n} inputs ({forward * 1e3:.2f} ms, baseline)")
    fields = list(table[0])
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fields)
    writer.writeheader()
    writer.writerows(table)
    atomic_write(RESULTS / "identify.csv", lambda fh: fh.write(buffer.getvalue().encode()))
    curve_buffer = io.StringIO()
    curve_writer = csv.writer(curve_buffer)
    curve_writer.writerow(["architecture", "n", "rank", "target_rank", "missing", "regions",
                           "gap"])
    for name, (target, rows) in curves.items():
        for r in rows:
            curve_writer.writerow([name, r["n"], r["rank"], target, r["missing"], r["regions"],
                                   r["gap"]])
    atomic_write(RESULTS / "identify_curves.csv",
                 lambda fh: fh.write(curve_buffer.getvalue().encode()))
    plot(curves, RESULTS / "identify.png")
    print(f"wrote {RESULTS / 'identify.csv'}, identify_curves.csv and identify.png")


def plot(curves: dict[str, tuple[int, list[dict]]], path: Path) -> None:
    fig = Figure(figsize=(10, 4))
    ax_rank, ax_regions = fig.subplots(1, 2)
    for name, (target, rows) in curves.items():
        ns = [r["n"] for r in rows]
        ax_rank.plot(ns, [r["rank"] / target for r in rows], "o-", label=name)
        ax_regions.plot(ns, [r["regions"] for r in rows], "o-", label=name)
    ax_rank.axhline(1.0, color="grey", lw=0.8)
    ax_rank.set(xscale="log", xlabel="random inputs n",
                ylabel="rank / (dim theta - symmetry dim)",
                title="Jacobian rank of theta -> (R(x_i))_i")
    ax_regions.plot([1, max(r["n"] for _, rows in curves.values() for r in rows)],
                    [1, max(r["n"] for _, rows in curves.values() for r in rows)],
                    "k:", lw=0.8, label="n")
    ax_regions.set(xscale="log", yscale="log", xlabel="random inputs n",
                   ylabel="distinct activation patterns", title="linear regions visited")
    for ax in (ax_rank, ax_regions):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=110)
    atomic_write(path, lambda fh: fh.write(data.getvalue()))


if __name__ == "__main__":
    main()
