"""Cost of the sharded passes on an FSDP2 model, as multiples of one FSDP2 forward pass.

    .venv/bin/python benchmarks/bench_fsdp.py [--ranks 2] [--rounds 5] [--shape 3 224 224]

Starts ``--ranks`` processes (gloo, CPU, one thread each), shards ResNet-18 with
``fully_shard`` per layer and whole (eval mode), and times in turns, on every rank in
the same order (median of the rounds; single calls, so every rank runs the same
collectives): one FSDP2 forward pass at batch 1 under no_grad (the baseline: it
all-gathers every layer's weights), ``path_norm`` in float32 and float64 mantissas, the
data-free penalty with its backward (float32), and the path-magnitude scores (float32).
Prints rank 0's ratios (the slowest rank's are within noise of it: every call ends in a
collective). Target (issue 30): path_norm float32 <= 2.5x the forward, 2 ranks.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.multiprocessing as mp
from torch import nn

from pathlift.distributed import exit_process, launched
from pathlift.lift import path_norm
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.models import resnet18
from pathlift.prune import path_magnitude_scores
from timing import round_robin


def sharded_resnet18(per_layer: bool) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = resnet18().eval()
    if per_layer:
        for m in list(model.modules())[1:]:
            if any(True for _ in m.parameters(recurse=False)):
                fully_shard(m)
    return fully_shard(model)


def cases(model: nn.Module, shape: tuple[int, ...]) -> dict[str, Callable[[], object]]:
    x = torch.randn(1, *shape)

    def forward() -> object:
        with torch.no_grad():
            return model(x)

    return {
        "forward": forward,
        "path_norm f32": lambda: path_norm(model, shape, dtype=torch.float32),
        "path_norm f64": lambda: path_norm(model, shape),
        "penalty+backward f32": lambda: differentiable_path_norm(model, shape).backward(),
        "scores f32": lambda: path_magnitude_scores(model, shape, dtype=torch.float32),
    }


def rank_main(rank: int, ranks: int, port: int, rounds: int, shape: tuple[int, ...]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with launched("gloo", timeout=timedelta(minutes=10)):
        for per_layer in (True, False):
            model = sharded_resnet18(per_layer)
            times = {label: statistics.median(t) for label, t in round_robin(
                cases(model, shape), rounds, min_sample=0).items()}
            model.zero_grad(set_to_none=True)
            base = times.pop("forward")
            row = "  ".join(f"{label} {t / base:5.2f}x" for label, t in times.items())
            if rank == 0:
                print(f"{'per layer' if per_layer else 'whole':<9} forward {base * 1e3:6.1f} ms"
                      f"  {row}", flush=True)
    exit_process(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", type=int, nargs="+", default=[3, 224, 224])
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}, ResNet-18 under fully_shard on {args.ranks} gloo "
          f"ranks (CPU, 1 thread each), input {tuple(args.shape)}, median of {args.rounds} "
          "round-robin rounds; ratios to one FSDP2 forward pass at batch 1", flush=True)
    mp.start_processes(rank_main, (args.ranks, port, args.rounds, tuple(args.shape)),
                       nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
