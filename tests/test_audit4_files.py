"""Issue 40, "data lost", variants the issue does not list: another command's ``--out``.
``kron-bench``, ``kron-design`` and ``frontier --out DIR`` silently replaced the user's
own files of the names they write (``kron_cpu_float32_t1.csv``, ``candidates.csv``,
``frontier.md``...), as ``report`` and ``prune`` did before. Now each refuses, before any
timing or training, in one line naming the file, unless ``--overwrite``; the user's files
stay byte for byte, and with ``--overwrite`` only the command's own files change."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import invoke
from pathlift.files import OutputExistsError
from pathlift.jobs.bench import kron_run
from pathlift.jobs.bench.kron_run import run_kron_benchmark
from pathlift.jobs.frontier import FrontierConfig, frontier_experiment

MINE = b"my own results, not pathlift's\n"
KRON_BENCH = ["kron-bench", "--every", "400", "--repeats", "1", "--threads", "1", "--no-vit",
              "--algorithm", "fused"]


def _never(*args, **kwargs):
    raise AssertionError("work started: the output folder should have been refused before")


def _user_files(out: Path, name: str) -> dict[Path, bytes]:
    """``out`` holding the user's NOTES.txt and their own file called ``name``."""
    out.mkdir()
    files = {out / "NOTES.txt": b"notes\n", out / name: MINE}
    for path, data in files.items():
        path.write_bytes(data)
    return files


def _kept(files: dict[Path, bytes]) -> bool:
    return all(path.read_bytes() == data for path, data in files.items())


@pytest.mark.parametrize(("command", "name", "work"), [
    (KRON_BENCH, "kron_cpu_float32_t1.csv", "_one_count"),
    (KRON_BENCH, "kron_cpu_float32_t1.png", "_one_count"),
    (["kron-design", "64", "64", "--top-k", "1", "--repeats", "1"], "candidates.csv", "design"),
    (["kron-design", "64", "64"], "predicted_vs_measured.png", "design"),
    (["frontier", "--dataset", "digits", "--model", "mlp-small", "--method", "none"],
     "frontier.md", "run_frontier"),
    (["frontier"], "frontier.csv", "run_frontier"),
], ids=["kron-bench-csv", "kron-bench-png", "kron-design-csv", "kron-design-png",
        "frontier-md", "frontier-csv"])
def test_an_out_holding_a_file_the_command_writes_is_refused_before_any_work(
        command, name, work, monkeypatch, tmp_path):
    owner = "pathlift.jobs.frontier" if work == "run_frontier" else "pathlift.jobs.bench.kron_run"
    monkeypatch.setattr(f"{owner}.{work}", _never)
    out = tmp_path / "out"
    files = _user_files(out, name)
    result = invoke(*command, "--out", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"'{out / name}' already exists and would be replaced: give --overwrite" in lines[0]
    assert _kept(files) and sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in files)


def test_kron_bench_overwrite_replaces_only_its_own_files(tmp_path):
    out = tmp_path / "out"
    files = _user_files(out, "kron_cpu_float32_t1.csv")
    notes = {p: d for p, d in files.items() if p.name == "NOTES.txt"}
    result = invoke(*KRON_BENCH, "--out", str(out), "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / "kron_cpu_float32_t1.csv").read_bytes() != MINE
    assert (out / "kron_cpu_float32_t1.csv").read_text().startswith("# ")  # pathlift's CSV
    assert _kept(notes)
    again = invoke(*KRON_BENCH, "--out", str(out))  # its own files are replaced only if asked
    assert again.exit_code == 2 and "already exists" in again.stderr


def test_a_file_the_run_does_not_write_is_no_reason_to_refuse(monkeypatch, tmp_path):
    """--no-vit writes no _vit.csv, so one already there (an earlier run's) stays and does
    not stop the run; the library raises the typed error."""
    out = tmp_path / "out"
    files = _user_files(out, "kron_cpu_float32_t1_vit.csv")
    assert invoke(*KRON_BENCH, "--out", str(out)).exit_code == 0
    assert _kept(files)
    monkeypatch.setattr(kron_run, "_one_count", _never)
    with pytest.raises(OutputExistsError, match=r"kron_cpu_float32_t1\.csv"):
        run_kron_benchmark(out, every=400, repeats=1, threads=[1], vit=False)
    monkeypatch.setattr("pathlift.jobs.frontier.run_frontier", _never)
    (out / "frontier.png").write_bytes(MINE)
    with pytest.raises(OutputExistsError, match=r"frontier\.png"):
        frontier_experiment(FrontierConfig(), out)
    assert (out / "frontier.png").read_bytes() == MINE
