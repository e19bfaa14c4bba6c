"""One certificate, the training sample sharded over torchrun's ranks, for
tests/test_certificate_scale.py: run as ``python certificate_worker.py OUT`` (one process)
or under ``torchrun --nproc_per_node 2`` (each rank a strided shard of the batches); each
process writes what it certified, bit for bit (floats as hex), to OUT/rank<R>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pathlift.bounds import compression_bound
from pathlift.bounds.compression import CompressionSearch
from pathlift.bounds.disagreement import count_disagreements
from pathlift.bounds.sample import Batches
from pathlift.distributed import exit_process, launched

SEARCH = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(3, 6),
                           refine=1, subsample=100)


def problem() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A trained MLP, a second network, n = 301 samples with duplicates planted across
    batches (and so across ranks), and unlabeled inputs; the same on every rank."""
    torch.manual_seed(0)
    x = torch.randn(301, 6)
    y = x[:, :3].argmax(1)
    x[40:45], y[40:45] = x[:5], y[:5]  # batches 0 and 1 of 32 rows: ranks 0 and 1
    x[300], y[300] = x[299], y[299]  # the last, short batch
    nets = []
    for _ in range(2):
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        opt = torch.optim.Adam(net.parameters(), 0.03)
        for _ in range(60):
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
        nets.append(net.eval())
    return nets[0], nets[1], x, y, torch.randn(97, 6)


def _hex(summary: dict) -> dict:
    return {k: (v.hex() if isinstance(v, float) else v) for k, v in summary.items()}


def main(out: str) -> None:
    torch.set_num_threads(1)
    net, other, x, y, u = problem()
    with launched() as world:
        result = {"rank": world.rank, "size": world.size}
        for name, source in (("tensors", Batches(x, y, batch_size=32, world=world)),
                             ("loader", Batches(DataLoader(TensorDataset(x, y), batch_size=7),
                                                world=world))):
            cert = compression_bound(net, (6,), source, search=SEARCH)
            result[name] = _hex(cert.summary()) | {"duplicates": cert.sample.duplicates}
            result[f"{name} rows here"] = sum(len(xb) for _, xb, _ in source)
        result["one batch"] = _hex(compression_bound(  # rank 1 holds no batch at all
            net, (6,), Batches(x, y, batch_size=512, world=world), search=SEARCH).summary())
        result["disagreements"] = count_disagreements(
            net, other, Batches(u, batch_size=10, world=world, labels=False))
    Path(out, f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
    exit_process(0)
