"""The compression certificate of a compact network trained by a recipe, on a validation
split (to choose the recipe) or on the full training split (to report it).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/bench_recipes.py \
        --dataset mnist1d --recipe quantized --strength 2 [--validation] [--out FILE.csv]

MNIST-1D with ``--samples`` signals (default 62,500), 80% for training (n = 50,000), the
generated 28x28 digit images (``pathlift.data.images``: ``--samples`` images, 80% drawn
for training, the rest drawn independently for testing), or the digits (n = 1,347, the
data's seed-0 split). With ``--validation`` the end of the training split is held out
(``VALIDATION``: 5,000 signals or images, 300 digits): the network is trained and
certified on the rest and its accuracy read on the held-out part; the test split is not
read. Without it: trained and certified on the whole training split,
accuracy on the test split. The certificate's search is the frontier's (the network as
trained, steps 2..13 below each tensor's largest power of two, one refinement round).
``--sparsity``: the recipes' relative-l1 penalty on the retraining. ``--seeds K``: seeds
``--seed`` .. ``--seed`` + K - 1, each certified at delta = 0.05 / K, and the one with the
lowest certificate kept (a union bound over the K networks, chosen on training data
alone: the kept network's bound holds with probability >= 0.95). Prints one row per
seed (certificate, its terms, accuracy, CPU seconds of one thread, ``kept``); appends
them to ``--out``.

``--prior-split p`` (recipe ``quantized`` only): the data-dependent code of
``pathlift.bounds.reference``: the training sample is split by ``split_sample(n, p,
seed=0)``, the recipe trains the reference network on the first part alone, the network
is then fine-tuned from it on the whole sample (``--tune-epochs``, default epochs / 2;
``--pull``: the pull towards the reference's cells) and certified relative to it, the
event counted on the other part (n2 = n - floor(p n)).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from bench_disagreement import append_row
from pathlift.bounds.compression import compression_bound
from pathlift.data import load_data
from pathlift.data.images import load_digit_images
from pathlift.data.mnist1d import load_mnist1d
from pathlift.jobs.frontier import FRONTIER_SEARCH
from pathlift.train.recipes import compact_model, train_recipe, train_with_reference
from pathlift.train.surrogate import predictions

# the held-out part of the training split with --validation (as the recipes of
# docs/training.md were chosen)
VALIDATION = {"mnist1d": 5000, "images": 5000, "digits": 300}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=tuple(VALIDATION), default="mnist1d")
    parser.add_argument("--samples", type=int, default=62500)
    parser.add_argument("--model", default="cnn-small")
    parser.add_argument("--recipe", default="prune-retrain")
    parser.add_argument("--strength", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sparsity", type=float, default=0.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--prior-split", type=float, default=0.0)
    parser.add_argument("--pull", type=float, default=0.0)
    parser.add_argument("--tune-epochs", type=int, default=None)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.prior_split and args.recipe != "quantized":
        parser.error("--prior-split needs --recipe quantized (the reference's grids)")
    torch.set_num_threads(1)
    split = _split(args.dataset, args.samples)
    x, y = split.train.tensors
    if args.validation:
        k = VALIDATION[args.dataset]
        x, y, xe, ye = x[:-k], y[:-k], x[-k:], y[-k:]
    else:
        xe, ye = split.test.tensors
    rows = []
    for seed in range(args.seed, args.seed + args.seeds):
        torch.manual_seed(seed)
        net = compact_model(args.model, split.input_shape, 10)
        start = time.thread_time()
        reference = None
        if args.prior_split:
            reference = train_with_reference(
                net, x, y, int(args.strength), args.epochs, args.batch_size, 3e-3, seed,
                prior_fraction=args.prior_split, pull=args.pull, tune_epochs=args.tune_epochs)
        else:
            train_recipe(net, x, y, args.recipe, args.strength, args.epochs, args.batch_size,
                         3e-3, seed, sparsity=args.sparsity)
        train_s = time.thread_time() - start
        start = time.thread_time()
        cert = compression_bound(net, split.input_shape, x, y, search=FRONTIER_SEARCH,
                                 delta=0.05 / args.seeds, reference=reference)
        extra = {} if reference is None else {
            "n_train": len(x), "prior_split": args.prior_split, "pull": args.pull,
            "tune_epochs": args.tune_epochs}
        rows.append({**extra, "dataset": args.dataset, "epochs": args.epochs, "model": args.model,
                     "recipe": args.recipe, "strength": args.strength, "seed": seed,
                     "sparsity": args.sparsity, "seeds": args.seeds,
                     "validation": args.validation, "n": len(x),
                     "accuracy": float((predictions(net, xe) == ye).double().mean()),
                     **cert.summary(), "train_cpu_s": train_s,
                     "certify_cpu_s": time.thread_time() - start})
        print(cert)
    best = min(rows, key=lambda r: r["bound"])  # chosen on the training data alone
    for row in rows:
        row["kept"] = row is best
        print(row)
        if args.out:
            append_row(args.out, row)
    if args.seeds > 1:
        print(f"kept seed {best['seed']} of {args.seeds}: bound {best['bound']:.4f} "
              f"(each at delta = 0.05/{args.seeds}), accuracy {best['accuracy']:.4f}")


def _split(dataset: str, samples: int):
    if dataset == "mnist1d":
        return load_mnist1d(samples, 0.8, seed=42)
    if dataset == "images":
        return load_digit_images(int(0.8 * samples), samples - int(0.8 * samples), seed=0)
    return load_data("digits", seed=0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
