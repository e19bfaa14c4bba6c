"""Issue 40, "long work stops at Ctrl-C within a second": ``kron-bench``, ``prune`` and
``frontier`` started as processes, interrupted once inside their loops (their estimate
line printed, or a file of the run written), end with status 130 within about a second,
one line on stderr, the user's files in the output folder byte for byte, and a ``prune``
folder that resumes (docs/resume.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import warm_process
from cli_runner import invoke

SRC = str(Path(__file__).resolve().parents[1] / "src")
USER = {"NOTES.txt": b"my notes\n", "data/x.bin": bytes(range(256))}


def _user_files(folder: Path) -> dict[Path, bytes]:
    """Files the user keeps in ``folder`` before the command runs."""
    files = {folder / name: data for name, data in USER.items()}
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([warm_process.python(), "-m", "pathlift.cli", *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt(process: subprocess.Popen) -> tuple[float, str]:
    """SIGINT now; the seconds until the process ended, and its stderr."""
    start = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return time.monotonic() - start, err


def _stopped_in_one_line(process: subprocess.Popen, seconds: float, err: str) -> None:
    assert process.returncode == 130 and err.startswith("Interrupted (Ctrl-C)"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert seconds < 1.5, f"took {seconds:.2f} s to stop"


def _after_estimate(process: subprocess.Popen) -> None:
    """Wait for the estimate line (the work starts right after it), then a little more."""
    first = process.stdout.readline()
    assert first.startswith("estimate: "), first + process.stderr.read()
    time.sleep(0.5)


@pytest.mark.parametrize("args", [
    ["kron-bench", "--repeats", "200", "--threads", "1", "--no-vit"],
    ["kron-bench", "--every", "3", "--algorithm", "fused", "dense", "--repeats", "100",
     "--threads", "1", "2"],
], ids=["grid", "two-thread-counts"])
def test_ctrl_c_inside_kron_bench_stops_within_a_second_keeping_the_users_files(args,
                                                                               tmp_path):
    out = tmp_path / "out"
    user = _user_files(out)
    process = _start([*args, "--out", str(out)], tmp_path)
    _after_estimate(process)
    seconds, err = _interrupt(process)
    _stopped_in_one_line(process, seconds, err)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        sorted(USER)  # no half-written CSV or plot beside them
    assert all(path.read_bytes() == data for path, data in user.items())


def test_ctrl_c_inside_frontier_stops_within_a_second_keeping_the_users_files(tmp_path):
    out = tmp_path / "out"
    user = _user_files(out)
    process = _start(["frontier", "--dataset", "mnist1d", "--model", "cnn", "--method",
                      "path-sgd", "--epochs", "100", "--out", str(out)], tmp_path)
    _after_estimate(process)
    seconds, err = _interrupt(process)
    _stopped_in_one_line(process, seconds, err)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        sorted(USER)
    assert all(path.read_bytes() == data for path, data in user.items())


PRUNE = ["prune", "--model", "mlp", "--data", "digits", "--seeds", "2", "--amount", "0.5",
         "--method", "magnitude-global", "--batch-size", "256"]


def _after_seed0_dense(process: subprocess.Popen, out: Path) -> Path:
    """Wait until ``prune`` has saved seed 0's dense network (trained and rewind files);
    the trained file."""
    dense = out / "dense" / "seed0-trained.safetensors"
    deadline = time.monotonic() + 240
    while not (out / "dense" / "seed0-rewind.safetensors").exists() or not dense.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "seed 0's dense training never ended"
        time.sleep(0.05)
    return dense


def test_ctrl_c_inside_prune_stops_within_a_second_and_the_run_resumes(tmp_path):
    """Interrupted in seed 1's dense training, once seed 0's dense network is saved (a
    result): status 130 within a second, the user's files as they were, seed 0's network
    kept; the same command then has only seed 1 and every run to do (the full resume to
    the end: tests/test_work_sized.py, slow, and tests/test_audit3_files.py)."""
    out = tmp_path / "out"
    user = _user_files(out)
    process = _start([*PRUNE, "--epochs", "40", "--out", str(out)], tmp_path)
    dense = _after_seed0_dense(process, out)
    time.sleep(0.05)  # into seed 1's dense training (on a quiet machine it may end first)
    seconds, err = _interrupt(process)
    _stopped_in_one_line(process, seconds, err)
    assert all(path.read_bytes() == data for path, data in user.items())
    saved = dense.read_bytes()
    # the same command again: it resumes (seed 0 not trained again); sized first, so a
    # time limit below its estimate shows what is left without training it
    again = invoke("--max-time", "1e-6", *PRUNE, "--epochs", "40", "--out", str(out))
    line = next(line for line in again.stdout.splitlines() if line.startswith("estimate:"))
    left = int(not (out / "dense" / "seed1-trained.safetensors").exists())
    assert line.startswith(f"estimate: {left} dense training(s) and 4 run(s) of 1 round(s), "
                           f"{40 * left + 4 * 38:,} epochs"), line
    assert again.exit_code == 2 and "more than the time limit" in again.stderr, again.output
    assert dense.read_bytes() == saved  # kept by the refused call too
    assert all(path.read_bytes() == data for path, data in user.items())
