"""Cost of the symmetry operations and of the path-metric, against baselines of the same run.

    .venv/bin/python benchmarks/bench_symmetry.py [--repeats 3]

1. ResNet-18 at 3x224x224 (float32): random_rescale, normalize (Alg. 3.2.1) and the
   two-pass path_metric to a pruned copy, each as a multiple of one plain forward pass
   at batch 1 (baseline).
2. A small CNN (8x8 input, ~10^5 paths): path_metric in two passes (Lemma 3.4.1)
   against the explicit enumeration of every path of both networks (NeuronDAG, the
   ground truth): speed-up.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from pathlift.lift import path_metric
from pathlift.lift.path_metric import enumerated_path_metric
from pathlift.models import resnet18
from pathlift.symmetry import magnitude_prune, normalize, random_rescale
from pathlift.testing.neurons import NeuronDAG
from timing import median_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    shape = (3, 224, 224)
    model = resnet18().eval()
    pruned = magnitude_prune(model, 0.5, shape)
    x = torch.randn(1, *shape)
    with torch.no_grad():
        forward = median_seconds(lambda: model(x), args.repeats)
    print(f"resnet18 {shape}: forward {forward * 1e3:.1f} ms (baseline)")
    for label, fn in (("random_rescale", lambda: random_rescale(model, input_shape=shape)),
                      ("normalize q=1", lambda: normalize(model, shape, 1.0)),
                      ("path_metric (pruned)", lambda: path_metric(model, pruned, shape))):
        seconds = median_seconds(fn, args.repeats)
        print(f"  {label:<22} {seconds * 1e3:9.1f} ms = {seconds / forward:7.1f}x forward")

    small = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    small = small.double().eval()
    small_shape = (1, 8, 8)
    small_pruned = magnitude_prune(small, 0.5, small_shape)
    result = path_metric(small, small_pruned, small_shape)
    reference = enumerated_path_metric(small, small_pruned, small_shape)
    fast = median_seconds(lambda: path_metric(small, small_pruned, small_shape), args.repeats)
    slow = median_seconds(lambda: enumerated_path_metric(small, small_pruned, small_shape), 1, 0)
    paths = NeuronDAG.from_module(small, small_shape).num_paths
    print(f"small CNN {small_shape}, {paths} paths: two passes {fast * 1e3:.1f} ms, "
          f"enumeration {slow * 1e3:.1f} ms (baseline): {slow / fast:.0f}x faster; "
          f"d = {result.lower:.10g} ({result.case}) vs enumerated {reference:.10g}")


if __name__ == "__main__":
    main()
