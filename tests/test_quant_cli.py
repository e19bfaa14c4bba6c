"""The `pathlift quantize` command end to end on a small reference model."""

from __future__ import annotations

import csv
import re

from typer.testing import CliRunner

from pathlift.cli import app


def test_quantize_command_prints_plain_and_symmetry_aware_rows(tmp_path):
    out = tmp_path / "quant.csv"
    result = CliRunner().invoke(app, ["quantize", "mlp", "--bits", "4", "--bits", "12",
                                      "--symmetry-aware", "--random-rescale", "0",
                                      "--samples", "8", "--csv", str(out)],
                                env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if re.search(r"│\s+(4|12) │", line)]
    assert len(rows) == 4
    assert sum("plain" in r for r in rows) == 2 and sum("aware q=" in r for r in rows) == 2
    # each row: measured max ||dR||_1 <= its certified bound
    for row in rows:
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert float(cells[4]) <= float(cells[5])
    with out.open() as handle:
        records = list(csv.DictReader(handle))
    assert [(r["bits"], r["method"].split()[0]) for r in records] == [
        ("4", "plain"), ("4", "aware"), ("12", "plain"), ("12", "aware")]
    for record, row in zip(records, rows, strict=True):
        assert f"{float(record['certified']):.4g}" == row.split("│")[3].strip()


def test_quantize_command_refuses_unknown_data():
    result = CliRunner().invoke(app, ["quantize", "mlp", "--data", "cifar"])
    assert result.exit_code != 0


def test_compare_bits_is_the_command_in_one_call(tmp_path):
    import torch

    from pathlift.bounds.symmetry_aware import compare
    from pathlift.data import synthetic
    from pathlift.jobs.quant import compare_bits
    from pathlift.models import mlp

    net = mlp(64, (32,), 4).eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out = tmp_path / "q.csv"
    result = compare_bits(net, (1, 8, 8), [4, 8], samples=8, symmetry_aware=True, csv=out,
                          name="mlp")
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    inputs = torch.randn((8, 1, 8, 8), generator=torch.Generator().manual_seed(0))
    assert result.reports == (*compare(net, (1, 8, 8), 4, inputs, symmetry_aware=True),
                              *compare(net, (1, 8, 8), 8, inputs, symmetry_aware=True))
    assert result.inputs == 8 and result.csv == out
    with out.open() as handle:
        records = list(csv.DictReader(handle))
    assert [(r["model"], r["bits"], r["method"]) for r in records] == [
        ("mlp", str(r.bits), r.method) for r in result.reports]
    assert "\n" not in repr(result) and "4 rows" in repr(result)
    split = synthetic(n_train=16, n_test=12)
    judged = compare_bits(net, (1, 8, 8), [4], data=split, rescale_seed=0)
    assert judged.inputs == 12 and judged.csv is None
    assert all(r.accuracy is not None for r in judged.reports)
