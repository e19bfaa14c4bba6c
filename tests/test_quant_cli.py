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
