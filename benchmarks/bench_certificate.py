"""What the compression certificate costs against training (issue 39): CPU seconds of one
thread (time.thread_time, OMP_NUM_THREADS=1) of

1. ``compression_bound`` with its default search on a 10k-parameter CNN (three 3x3
   convolutions, a max-pool, a Linear) trained with plain Adam on the embedded digits,
   against that training;
2. ``compression_bound`` with the frontier's search on the MNIST-1D ``cnn-small`` trained
   by the ``prune-retrain`` recipe at n = 50,000 (``--mnist1d``; minutes), against the
   recipe's training (goal: <= 0.10).

Each row: the code measured (``--code``), the model, n, training CPU s, certificate CPU s,
their ratio, the bound, the search's candidates. Writes
benchmarks/results/certificate_cost.csv (or --out). The committed file holds main's rows
(PYTHONPATH=/work/main/src) and this branch's, from runs of this script.

    OMP_NUM_THREADS=1 PYTHONPATH=src:benchmarks python benchmarks/bench_certificate.py \
        [--mnist1d [--no-digits]] [--code LABEL]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn

from bench_bounds_cli import adam, digits_cnn, write_rows
from pathlift.bounds.compression import compression_bound
from pathlift.data import load_digits
from pathlift.jobs.frontier import FRONTIER_SEARCH
from pathlift.train.recipes import compact_model, train_recipe


def _row(code: str, name: str, model: nn.Module, shape, x, y, xt, yt, train, search=None
         ) -> dict:
    torch.manual_seed(0)
    start = time.thread_time()
    train()
    trained = time.thread_time() - start
    model.eval()
    counted = []
    start = time.thread_time()
    kwargs = {} if search is None else {"search": search}
    cert = compression_bound(model, shape, x, y, progress=lambda d, p: counted.append(d),
                             **kwargs)
    certified = time.thread_time() - start
    with torch.no_grad():
        accuracy = float((model(xt).argmax(1) == yt).double().mean())
    row = {"code": code, "model": name, "n": len(x), "train_cpu_s": round(trained, 2),
           "certificate_cpu_s": round(certified, 2),
           "ratio": round(certified / trained, 4), "bound": round(cert.value, 4),
           "chance": round(cert.chance, 4), "test_accuracy": round(accuracy, 4),
           "candidates": len(counted), "stopped": cert.stopped}
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist1d", action="store_true", help="also MNIST-1D, n = 50,000")
    parser.add_argument("--no-digits", action="store_true", help="MNIST-1D alone")
    parser.add_argument("--code", default="this tree", help="what the rows measure (a label)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "certificate_cost.csv")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("warning: set OMP_NUM_THREADS=1 for one-thread figures")
    digits = load_digits()
    x, y = digits.train.tensors
    xt, yt = digits.test.tensors
    torch.manual_seed(0)
    cnn = digits_cnn()
    rows = [] if args.no_digits else [
        _row(args.code, "digits cnn-10k, Adam 30 epochs", cnn, (1, 8, 8), x, y, xt, yt,
             lambda: adam(cnn, x, y, 30))]
    if args.mnist1d:
        from pathlift.data.mnist1d import load_mnist1d

        data = load_mnist1d(62_500)
        x, y = data.train.tensors
        xt, yt = data.test.tensors
        torch.manual_seed(0)
        small = compact_model("cnn-small", (1, 40))
        rows.append(_row(args.code, "mnist1d cnn-small, prune-retrain 0.5", small, (1, 40), x,
                         y, xt, yt, lambda: train_recipe(small, x, y, "prune-retrain", 0.5, 20,
                                                         128, 3e-3, 0), FRONTIER_SEARCH))
    write_rows(args.out, rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
