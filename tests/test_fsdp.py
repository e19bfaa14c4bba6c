"""Sharded models (FSDP2 ``fully_shard``, FSDP1) on gloo CPU groups of 2 and 3 processes:
the ranks run scenarios of ``fsdp_worker`` and every number is compared with the plain
model's."""

from __future__ import annotations

from pathlib import Path

from fsdp_worker import spawn


def test_tracing_an_fsdp2_model_leaves_the_rng_and_the_model_alone(tmp_path: Path) -> None:
    ranks = spawn("trace_keeps_rng", 2, tmp_path)
    for found in ranks:
        for key in ("layer", "whole"):
            assert found[key]["rng"], key  # FSDPModule.__new__ re-ran __init__ before
            assert found[key]["d_out"] == 10 and found[key]["kinds"]
            assert found[key]["loss"] > 0
