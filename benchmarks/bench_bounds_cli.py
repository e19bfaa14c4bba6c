"""CPU time of ``pathlift bounds`` by default on a trained 10k-parameter CNN (issue 39:
goal <= 20 s), for two source trees in the same run: a baseline (``--before``, e.g. main's
``src``) and this tree's ``src``.

The CNN (three 3x3 convolutions, a max-pool, a Linear; 11,994 parameters) is trained once
with plain Adam on the digits' training split, the split ``pathlift bounds --data digits``
uses (seed 0), and cached (``--cache``, seeded). Each round runs ``pathlift bounds`` once
per tree, in alternating order, in a child process with OMP_NUM_THREADS=1; its CPU time
(user + system) is the child's ``resource.getrusage``. Prints each run, the medians and
the median of per-round ratios, and writes benchmarks/results/bounds_cli.csv (or --out)
with the certificate each tree printed.

    PYTHONPATH=src python benchmarks/bench_bounds_cli.py --before /work/main/src [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
CLI = "from pathlift.cli import main; main()"


def digits_cnn() -> nn.Module:
    """The issue's 10k-parameter CNN on 8x8 digits (11,994 parameters)."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(256, 10))


def adam(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int = 0
         ) -> None:
    """Plain Adam (lr 1e-3, batches of 64), no regularisation, no recipe."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 64):
            b = perm[i:i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()


def trained_cnn(cache: Path, epochs: int = 30, seed: int = 0) -> tuple[Path, float]:
    """The cached state_dict of the CNN trained on the digits' training split, and its
    test accuracy (trained and written atomically on the first call)."""
    from pathlift.data import load_data
    from pathlift.files import atomic_write

    split = load_data("digits", seed=0)
    x, y = split.train.tensors
    xt, yt = split.test.tensors
    torch.manual_seed(seed)
    model = digits_cnn()
    if cache.exists():
        model.load_state_dict(torch.load(cache, weights_only=True))
    else:
        adam(model, x, y, epochs, seed)
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        atomic_write(cache, lambda fh: fh.write(buffer.getvalue()))
    with torch.no_grad():
        accuracy = float((model.eval()(xt).argmax(1) == yt).double().mean())
    return cache, accuracy


def run_bounds(src: str, weights: Path, extra: list[str]) -> tuple[float, str]:
    """CPU seconds (user + system, the child's rusage) of ``pathlift bounds`` with the
    package at ``src``, and its output."""
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{HERE}", OMP_NUM_THREADS="1",
               COLUMNS="200")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CLI, "bounds", "bench_bounds_cli:digits_cnn",
                           "--weights", str(weights), "--data", "digits", *extra],
                          env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"pathlift bounds failed with {src}:\n{done.stdout}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, done.stdout


def certificate_of(output: str) -> str:
    """The compression certificate's row: 'kl^-1(empirical, budget), L = bits' and bound."""
    found = re.search(r"kl\^-1\([^)]*\), L = \d+ bits", output)
    value = re.search(r"compression[^\n]*?(\d\.\d+)\s", output)
    return (found.group(0) if found else "?") + (f" -> {value.group(1)}" if value else "")


def write_rows(path: Path, rows: list[dict]) -> None:
    """``rows`` as a CSV file, written atomically (``pathlift.files.atomic_write``)."""
    from pathlift.files import atomic_write

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda fh: fh.write(text.getvalue().encode()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the baseline tree's src folder")
    parser.add_argument("--after", default=str(HERE.parent / "src"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "pathlift-bench" /
                        "digits_cnn_adam30_seed0.pt")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bounds_cli.csv")
    args, extra = parser.parse_known_args()
    weights, accuracy = trained_cnn(args.cache)
    print(f"digits CNN (11,994 parameters, Adam 30 epochs): test accuracy {accuracy:.4f}")
    rows, ratios = [], []
    for r in range(args.rounds):
        order = [("before", args.before), ("after", args.after)]
        times = {}
        for name, src in order if r % 2 == 0 else order[::-1]:
            cpu, output = run_bounds(src, weights, extra)
            times[name] = cpu
            rows.append({"round": r, "tree": name, "cpu_s": round(cpu, 2),
                         "certificate": certificate_of(output),
                         "test_accuracy": round(accuracy, 4)})
            print(rows[-1], flush=True)
        ratios.append(times["after"] / times["before"])
    for name in ("before", "after"):
        print(f"{name}: median {statistics.median(r['cpu_s'] for r in rows if r['tree'] == name)}"
              " s CPU")
    print(f"after / before: median of per-round ratios {statistics.median(ratios):.4f}")
    write_rows(args.out, rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
