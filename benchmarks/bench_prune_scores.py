"""Cost of all pruning scores relative to one plain forward pass, measured in the same run.

    .venv/bin/python benchmarks/bench_prune_scores.py [--repeats 3] [--models alexnet ...]
        [--mask-flips]

For AlexNet, VGG-16 and ResNet-18 at 3x224x224: one float32 forward pass at batch 1
(baseline, timed in the same interleaved rounds), then the Path-Mag scores of every
weight (paper 002 eq. 14: one forward and one backward pass of the |theta| network) on
an already traced graph with float64 and float32 mantissas, the same including the
trace, and magnitude scores. Published on an
A100 (paper 002 Table 3): 8x, 27x, 9x the forward pass. Target here: at most 10x.

Large layers make fresh tensors expensive on CPU (page faults on first touch cost more than
reading the weights): ``THP_MEM_ALLOC_ENABLE=1`` in the environment, a PyTorch setting read
when the first tensor is allocated, backs them with huge pages; the header says whether it
is set.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from pathlift.graph import copy_model, graph_of
from pathlift.models import alexnet, resnet18, vgg16
from pathlift.prune.scores import magnitude_scores, path_magnitude_scores
from pathlift.symmetry import random_rescale
from timing import interleaved_min

SHAPE = (3, 224, 224)
MODELS = {"alexnet": alexnet, "vgg16": vgg16, "resnet18": resnet18}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--mask-flips", action="store_true",
                        help="also count the masks that float32 / float64 scores change "
                             "under a random rescaling (why float64 is the default)")
    args = parser.parse_args()
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "0")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, input {SHAPE}, "
          f"THP_MEM_ALLOC_ENABLE={thp}")
    print(f"{'model':<9} {'forward ms':>10} {'path-mag f64':>12} {'f32':>7} "
          f"{'f32+trace':>9} {'magnitude':>9}")
    for name in args.models:
        model = MODELS[name]().eval()
        x = torch.randn(1, *SHAPE)
        graph = graph_of(model, SHAPE)
        fresh = iter([copy_model(model) for _ in range(args.repeats + 1)])  # never traced

        def forward(m: nn.Module = model, x: torch.Tensor = x) -> None:
            with torch.no_grad():
                m(x)

        t = interleaved_min({
            "forward": forward,
            "f64": lambda g=graph: path_magnitude_scores(g),
            "f32": lambda g=graph: path_magnitude_scores(g, dtype=torch.float32),
            "trace": lambda f=fresh: graph_of(next(f), SHAPE),
            "magnitude": lambda g=graph: magnitude_scores(g),
        }, args.repeats)
        f = t["forward"]
        print(f"{name:<9} {f * 1e3:>10.1f} {t['f64'] / f:>11.2f}x {t['f32'] / f:>6.2f}x "
              f"{(t['f32'] + t['trace']) / f:>8.2f}x {t['magnitude'] / f:>8.2f}x")
    print("ratios are minimum times over interleaved rounds / one float32 forward pass at "
          "batch 1 (published, A100: alexnet 8x, vgg16 27x, resnet18 9x)")
    if args.mask_flips:
        print(f"mask entries that differ between a model and random_rescale(model), global "
              f"pruning of {MASK_AMOUNT:.0%} by path-magnitude:")
        for name in args.models:
            torch.manual_seed(0)
            flips = {dtype: mask_flips(MODELS[name]().eval(), dtype)
                     for dtype in (torch.float64, torch.float32)}
            print(f"{name:<9} float64 {flips[torch.float64]:>6}   float32 "
                  f"{flips[torch.float32]:>6}")


MASK_AMOUNT = 0.6


def mask_flips(model: nn.Module, dtype: torch.dtype) -> int:
    """How many coordinates a global path-magnitude pruning keeps on one of the model and
    its random rescaling and not on the other (0 in exact arithmetic, paper 002 Lemma 4.2)."""
    masks = []
    for net in (model, random_rescale(model, seed=1, input_shape=SHAPE)):
        flat = path_magnitude_scores(net, SHAPE, dtype=dtype).flat()
        masks.append(flat > flat.kthvalue(int(MASK_AMOUNT * flat.numel())).values)
    return int((masks[0] ^ masks[1]).sum())


if __name__ == "__main__":
    main()
