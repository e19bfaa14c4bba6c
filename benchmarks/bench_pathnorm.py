"""Path-norm cost relative to one plain forward pass, measured in the same run.

    .venv/bin/python benchmarks/bench_pathnorm.py [--repeats 5] [--threads 1]

For ResNet-18 and ResNet-50 at 3x224x224: one float32 forward pass at batch 1 (baseline),
the trace + validation, and the |theta|^q pass of Thm 3.1.1 per exponent q in {1, 2, 4}
with float64 mantissas (the default, ~1e-12 relative) and float32 mantissas (~1e-6).
Target of the foundation issue: at most 3x the forward pass per exponent.
"""

from __future__ import annotations

import argparse

import torch

from pathlift.graph import trace
from pathlift.lift import path_norm_of_graph
from pathlift.models import resnet18, resnet50
from timing import median_seconds

SHAPE = (3, 224, 224)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, input {SHAPE}")
    print(f"{'model':<10} {'forward ms':>10} {'trace':>7} {'q':>3} {'float64':>8} "
          f"{'float32':>8} {'all-in f64':>10} {'all-in f32':>10}")
    for name, build in (("resnet18", resnet18), ("resnet50", resnet50)):
        model = build().eval()
        x = torch.randn(1, *SHAPE)
        with torch.no_grad():
            forward = median_seconds(lambda m=model, x=x: m(x), args.repeats)
        traced = median_seconds(lambda m=model: trace(m, SHAPE), args.repeats)
        graph = trace(model, SHAPE)
        for q in (1.0, 2.0, 4.0):
            f64 = median_seconds(lambda g=graph, q=q: path_norm_of_graph(g, q), args.repeats)
            f32 = median_seconds(
                lambda g=graph, q=q: path_norm_of_graph(g, q, dtype=torch.float32),
                args.repeats)
            print(f"{name:<10} {forward * 1e3:>10.1f} {traced / forward:>6.2f}x {q:>3g} "
                  f"{f64 / forward:>7.2f}x {f32 / forward:>7.2f}x "
                  f"{(f64 + traced / 3) / forward:>9.2f}x {(f32 + traced / 3) / forward:>9.2f}x")
    print("ratios are times / one float32 forward pass at batch 1; 'all-in' adds a third of "
          "the trace (path_norms traces once for three exponents)")


if __name__ == "__main__":
    main()
