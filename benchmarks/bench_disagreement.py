"""The disagreement route on MNIST-1D: a CNN trained the ordinary way (plain Adam, no
recipe, no pruning) is certified without retraining, through a compact surrogate distilled
from its predictions on the training inputs and certified by the compression bound, plus
the disagreement measured on held-out unlabeled signals (``pathlift.bounds.disagreement``).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_disagreement.py \
        [--samples 75000] [--unlabeled 10000] [--out benchmarks/results/disagreement.csv]

MNIST-1D with ``--samples`` signals, 80% for training: the last ``--unlabeled`` training
signals are held out (their labels dropped), the rest is S (n); the 20% test split is read
only for reporting. The target: conv5(32)-ReLU-maxpool2-conv5(32)-ReLU-maxpool2-Linear,
Adam lr 1e-3, batches of 128, ``--epochs``. The surrogate: ``cnn-small`` trained by the
``prune-retrain`` recipe (0.5; 20 + 10 epochs) on (S's inputs, the target's labels).
Prints the certificate with its terms and CPU times (one thread); appends a CSV row.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import torch
from torch import nn

from pathlift.bounds.compression import CompressionSearch
from pathlift.bounds.disagreement import certify
from pathlift.data.mnist1d import load_mnist1d
from pathlift.train.recipes import fit
from pathlift.train.surrogate import distil_surrogate

# the frontier's certificate search: the network as trained, steps searched
SEARCH = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                           offsets=tuple(range(2, 14)), refine=1)


def plain_cnn(classes: int = 10) -> nn.Module:
    """A CNN as a user writes it: two conv5-ReLU-maxpool2 blocks of 32 channels."""
    return nn.Sequential(nn.Conv1d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Flatten(), nn.Linear(32 * 10, classes))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).double().mean())


def append_row(path: str, row: dict[str, object]) -> None:
    """Append ``row`` to the CSV file ``path``, with a header when the file is new."""
    new = not Path(path).exists()
    with Path(path).open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=75000)
    parser.add_argument("--unlabeled", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--surrogate-epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    split = load_mnist1d(args.samples, 0.8, seed=42)
    x_all, y_all = split.train.tensors
    x, y = x_all[:-args.unlabeled], y_all[:-args.unlabeled]
    unlabeled = x_all[-args.unlabeled:]
    x_test, y_test = split.test.tensors
    torch.manual_seed(args.seed)
    target = plain_cnn()
    start = time.thread_time()
    fit(target, x, y, torch.optim.Adam(target.parameters(), lr=1e-3),
        lambda xb, yb: nn.functional.cross_entropy(target(xb), yb), args.epochs, 128,
        torch.Generator().manual_seed(args.seed))
    train_s = time.thread_time() - start
    start = time.thread_time()
    surrogate = distil_surrogate(target, x, 10, epochs=args.surrogate_epochs, seed=args.seed)
    surrogate_s = time.thread_time() - start
    start = time.thread_time()
    cert = certify(target, (1, 40), x, y, unlabeled=unlabeled,
                   surrogates={"cnn-small (prune-retrain 0.5, distilled)": surrogate},
                   direct=False, search=SEARCH)
    certify_s = time.thread_time() - start
    via = cert.through[0]
    row = {"n": len(x), "m": len(unlabeled), "target_parameters":
           sum(p.numel() for p in target.parameters()),
           "target_test_acc": accuracy(target, x_test, y_test),
           "target_train_acc": accuracy(target, x, y),
           "surrogate_test_acc": accuracy(surrogate, x_test, y_test),
           "test_disagreement": float((target(x_test).argmax(1)
                                       != surrogate(x_test).argmax(1)).double().mean()),
           "certificate": cert.value, "route": cert.route, **via.terms(),
           "surrogate_transfer": via.surrogate.transfer,
           "train_cpu_s": train_s, "surrogate_cpu_s": surrogate_s, "certify_cpu_s": certify_s}
    print(cert)
    print(cert.statement())
    for k, v in row.items():
        print(f"{k:28s} {v}")
    if args.out:
        append_row(args.out, row)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
