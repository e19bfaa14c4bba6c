"""Issue 40, "hangs and crashes", variants the issue does not list: other huge counts.
``prune --seeds 100000000`` held 12 GB for minutes, silent (the seeds and the grid of runs
spelt out, and a scan quadratic in them, before any check); ``kron-bench --threads
100000`` crashed the interpreter (signal 11) and ``kron-design --threads 100000`` with it.
Now each is refused in one line, status 2, before the work: the seeds and runs against the
memory limit before the grid exists, the thread count against the machine's CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import invoke
from pathlift.errors import InvalidParameterError
from pathlift.jobs.bench.kron_run import MAX_THREADS, run_kron_benchmark, run_kron_design
from pathlift.jobs.prune import PruneConfig, SGDTraining

SRC = str(Path(__file__).resolve().parents[1] / "src")
PRUNE = ["prune", "--model", "mlp", "--data", "digits", "--amount", "0.5", "--method",
         "magnitude-global", "--epochs", "3"]


def _never(*args, **kwargs):
    raise AssertionError("work started: the sizing should have refused it before")


@pytest.mark.parametrize(("seeds", "memory"), [("100000", "100M"), ("1000000000000", None)])
def test_prune_sizes_its_seeds_before_spelling_out_their_runs(seeds, memory, monkeypatch,
                                                             tmp_path):
    monkeypatch.setattr(PruneConfig, "grid", _never)
    monkeypatch.setattr(SGDTraining, "train", _never)
    monkeypatch.chdir(tmp_path)
    limit = ["--max-memory", memory] if memory else []
    result = invoke(*limit, *PRUNE, "--seeds", seeds, "--out", "out")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"{int(seeds):,} seeds' dense networks" in lines[0] and "needs about" in lines[0]
    assert f"{2 * int(seeds):,} runs" in lines[0]  # rescaled or not, one amount, one method
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_a_grid_of_runs_that_fits_is_still_run(tmp_path):
    """The same check passes what fits: the range of seeds is the tuple it stands for."""
    config = PruneConfig(seeds=range(3), amounts=(0.5, 0.5), epochs=3)
    assert config.seeds == range(3) and len(config.grid()) == 3 * 2 * 1 * 4
    assert config.settings()["seeds"] == [0, 1, 2]
    assert config.settings() == PruneConfig(seeds=(0, 1, 2, 0), amounts=(0.5,),
                                            epochs=3).settings()


@pytest.mark.parametrize("command", [
    ["kron-bench", "--every", "40", "--repeats", "1", "--no-vit", "--threads", "1", "100000"],
    ["kron-design", "64", "64", "--threads", "100000"],
], ids=["kron-bench", "kron-design"])
def test_a_thread_count_beyond_the_machine_is_one_line_not_a_crash(command, tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pathlift.cli", *command, "--out", "out"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert f"Invalid value for '--threads': 100000 is not an integer in [1, {MAX_THREADS}]" \
        in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_library_refuses_them_too_before_any_timing(tmp_path, monkeypatch):
    monkeypatch.setattr("pathlift.jobs.bench.kron_run._one_count", _never)
    monkeypatch.setattr("pathlift.jobs.bench.kron_run.design", _never)
    with pytest.raises(InvalidParameterError, match="threads must be at most"):
        run_kron_benchmark(tmp_path, every=40, repeats=1, threads=[1, MAX_THREADS + 1],
                           vit=False)
    with pytest.raises(InvalidParameterError, match="threads must be at most"):
        run_kron_design(64, 64, tmp_path, threads=10**5)
    with pytest.raises(InvalidParameterError, match="threads must be an integer >= 1"):
        run_kron_benchmark(tmp_path, every=40, repeats=1, threads=[0], vit=False)
    assert not list(tmp_path.iterdir())
