"""Average-case path-norm cost (thesis Sec. 7.2.2) against baselines of the same run.

    .venv/bin/python benchmarks/bench_average_case.py [--repeats 5] [--samples 256]

For small_cnn and an MLP on 8x8 inputs, float64: one forward pass of the batch and
torch.func.vmap(jacrev) per-sample Jacobians (the two baselines), against pathlift's
``local_affine`` (one backward pass per output over the batch, plus its float64 copy and
validation trace). Prints times and ratios.
"""

from __future__ import annotations

import argparse
import copy

import torch

from pathlift.lift import local_affine
from pathlift.models import mlp, small_cnn
from timing import median_seconds

SHAPE = (1, 8, 8)


def vmap_jacrev(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Per-sample Jacobians with torch.func: shape (n, d_out, *input_shape)."""
    return torch.func.vmap(torch.func.jacrev(lambda xi: net(xi.unsqueeze(0)).reshape(-1)))(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.samples} inputs of shape {SHAPE}, float64")
    print(f"{'model':<10} {'forward ms':>10} {'vmap ms':>8} {'ours ms':>8} {'ours/fwd':>9} "
          f"{'vmap/ours':>9}")
    torch.manual_seed(0)
    x = torch.rand(args.samples, *SHAPE, dtype=torch.float64)
    for name, build in (("small_cnn", small_cnn), ("mlp", mlp)):
        model = build().eval()
        net = copy.deepcopy(model).double()
        with torch.no_grad():
            forward = median_seconds(lambda n=net: n(x), args.repeats)
        vmap = median_seconds(lambda n=net: vmap_jacrev(n, x), args.repeats)
        ours = median_seconds(lambda m=model: local_affine(m, SHAPE, x), args.repeats)
        same = torch.allclose(vmap_jacrev(net, x), local_affine(model, SHAPE, x).slopes)
        print(f"{name:<10} {forward * 1e3:>10.2f} {vmap * 1e3:>8.2f} {ours * 1e3:>8.2f} "
              f"{ours / forward:>8.1f}x {vmap / ours:>8.2f}x  (same slopes: {same})")
    print("'ours' includes local_affine's float64 copy of the model and its validation trace")


if __name__ == "__main__":
    main()
