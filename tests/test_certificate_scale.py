"""The certificate data-parallel under torchrun (issue 39, "At scale"): two gloo ranks on
the CPU, each a strided shard of the training sample's batches, get the certificate of one
process bit for bit, duplicates across shards counted exactly (tests/certificate_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from certificate_worker import problem
from test_distributed import TORCHRUN, WARM, _launch

pytestmark = pytest.mark.serial  # a torchrun group of its own

WORKER = str(Path(__file__).with_name("certificate_worker.py"))


def _set_count(x: torch.Tensor, y: torch.Tensor) -> int:
    rows = [(x[i].numpy().tobytes(), int(y[i])) for i in range(len(x))]
    return len(rows) - len(set(rows))


def test_two_ranks_certify_bit_for_bit_as_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    rc, log = _launch([WARM, WORKER, str(one)], tmp_path)
    assert rc == 0, log
    rc, log = _launch([*TORCHRUN, WORKER, str(two)], tmp_path)
    assert rc == 0, log
    alone = json.loads((one / "rank0.json").read_text())
    r0, r1 = (json.loads((two / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (alone["size"], r0["size"], r1["size"]) == (1, 2, 2)
    _, _, x, y, _ = problem()
    assert alone["tensors"]["duplicates"] == _set_count(x, y) == 6
    for key in ("tensors", "loader", "one batch", "disagreements"):
        assert r0[key] == r1[key] == alone[key], key
    for key in ("tensors rows here", "loader rows here"):  # disjoint shards, all the rows
        assert alone[key] == r0[key] + r1[key] == 301 and 0 < r1[key] < 301, key
    assert float.fromhex(alone["tensors"]["bound"]) < 1
