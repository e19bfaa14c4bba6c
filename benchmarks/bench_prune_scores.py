"""Cost of all pruning scores relative to one plain forward pass, measured in the same run.

    .venv/bin/python benchmarks/bench_prune_scores.py [--repeats 3] [--models alexnet ...]

For AlexNet, VGG-16 and ResNet-18 at 3x224x224: one float32 forward pass at batch 1
(baseline), then the Path-Mag scores of every weight (paper 002 eq. 14: one forward and
one backward pass of the |theta| network) on an already traced graph with float64 and
float32 mantissas, the same including the trace, and magnitude scores. Published on an
A100 (paper 002 Table 3): 8x, 27x, 9x the forward pass. Target here: at most 10x.
"""

from __future__ import annotations

import argparse

import torch

from pathlift.graph import trace
from pathlift.models import alexnet, resnet18, vgg16
from pathlift.prune.scores import magnitude_scores_of_graph, path_magnitude_scores_of_graph
from timing import median_seconds

SHAPE = (3, 224, 224)
MODELS = {"alexnet": alexnet, "vgg16": vgg16, "resnet18": resnet18}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, input {SHAPE}")
    print(f"{'model':<9} {'forward ms':>10} {'path-mag f64':>12} {'f32':>7} "
          f"{'f32+trace':>9} {'magnitude':>9}")
    for name in args.models:
        model = MODELS[name]().eval()
        x = torch.randn(1, *SHAPE)
        with torch.no_grad():
            forward = median_seconds(lambda m=model, x=x: m(x), args.repeats)
        graph = trace(model, SHAPE)
        f64 = median_seconds(lambda g=graph: path_magnitude_scores_of_graph(g), args.repeats)
        f32 = median_seconds(
            lambda g=graph: path_magnitude_scores_of_graph(g, dtype=torch.float32), args.repeats)
        traced = median_seconds(lambda m=model: trace(m, SHAPE), args.repeats)
        mag = median_seconds(lambda g=graph: magnitude_scores_of_graph(g), args.repeats)
        print(f"{name:<9} {forward * 1e3:>10.1f} {f64 / forward:>11.2f}x {f32 / forward:>6.2f}x "
              f"{(f32 + traced) / forward:>8.2f}x {mag / forward:>8.2f}x")
    print("ratios are times / one float32 forward pass at batch 1 in the same run "
          "(published, A100: alexnet 8x, vgg16 27x, resnet18 9x)")


if __name__ == "__main__":
    main()
