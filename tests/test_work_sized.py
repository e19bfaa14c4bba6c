"""Issue 40, "work sized before it starts": ``depth`` states an estimate of its work in one
line before the first run, refuses work whose estimate exceeds the time limit
(``pathlift --max-time``, ``PATHLIFT_MAX_TIME``, else one hour), shows every training step
as progress, and stops within about a second of Ctrl-C once that line is printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli_runner import invoke
from pathlift.depth.classes import parse_model
from pathlift.jobs import depth
from pathlift.memory import WorkLimitError, set_time_limit, time_limit

SRC = str(Path(__file__).resolve().parents[1] / "src")
SMALL = ["depth", "--depths", "8", "16", "--seeds", "2", "--samples", "200"]


def _never(*args, **kwargs):
    raise AssertionError("work started: the estimate should have refused it before")


def _layer_steps(model: str, depths: list[int], seeds: int) -> int:
    steps = parse_model(model)[0].steps
    return seeds * sum(d * steps(d) for d in depths)


def test_depth_prints_its_estimate_in_one_line_before_the_runs(tmp_path):
    csv = tmp_path / "runs.csv"
    result = invoke(*SMALL, "--csv", str(csv))
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("estimate:")]
    assert len(lines) == 1, result.stdout
    assert f"4 run(s), {_layer_steps('C10k-B12c', [8, 16], 2):,} layer-steps" in lines[0]
    assert "limit 60.0 min" in lines[0]
    assert len(csv.read_text().splitlines()) == 1 + 4  # the header and every run


@pytest.mark.parametrize(("args", "env"), [
    (["--max-time", "0.001", *SMALL], {}),
    (SMALL, {"PATHLIFT_MAX_TIME": "1e-6"}),
    (["depth", "--depths", "1000000", "--samples", "10"], {}),  # > 1 hour: the default limit
])
def test_work_over_the_time_limit_is_refused_before_any_run(args, env, monkeypatch, tmp_path):
    monkeypatch.setattr(depth, "run", _never)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    csv = tmp_path / "runs.csv"
    result = invoke(*args, "--csv", str(csv))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "more than the time limit" in lines[0], result.stderr
    assert "estimated at" in lines[0] and "Traceback" not in result.output
    assert not csv.exists()  # nothing written


def test_a_raised_time_limit_lets_the_same_work_run(monkeypatch):
    monkeypatch.setenv("PATHLIFT_MAX_TIME", "1e-6")
    assert invoke("--max-time", "inf", *SMALL).exit_code == 0
    assert time_limit() == 1e-6  # --max-time holds for its command only


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_time_limit_outside_its_domain_is_a_usage_error(value, monkeypatch):
    monkeypatch.setattr(depth, "run", _never)
    result = invoke("--max-time", value, *SMALL)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("value", ["0", "-5", "later"])
def test_a_bad_time_limit_in_the_environment_is_refused(value, monkeypatch):
    monkeypatch.setattr(depth, "run", _never)
    monkeypatch.setenv("PATHLIFT_MAX_TIME", value)
    result = invoke(*SMALL)
    assert result.exit_code == 2 and "time limit" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_estimate_comes_first_and_every_step_is_reported():
    events = []
    runs = depth.grid("C10k-B12c", [8, 16], 2, 200, torch.float64,
                      on_estimate=lambda e: events.append(("estimate", e.layer_steps)),
                      on_step=lambda d, s, t: events.append((d, s, t)))
    steps = parse_model("C10k-B12c")[0].steps
    assert len(runs) == 4
    assert events[0] == ("estimate", _layer_steps("C10k-B12c", [8, 16], 2))
    assert events[1:] == [(d, s, t) for d in (8, 16) for s in range(2) for t in range(steps(d))]


def test_the_estimate_is_within_a_factor_of_ten_of_the_time_taken():
    """The probe times a depth-16 network on the same samples; the runs are linear in L."""
    estimate = depth.estimate_seconds("C10k-B12c", [400], 1, 4000, torch.float64)
    start = time.perf_counter()
    depth.grid("C10k-B12c", [400], 1, 4000, torch.float64)
    taken = time.perf_counter() - start
    assert estimate.seconds / 10 < taken < estimate.seconds * 10, (estimate.seconds, taken)


def test_the_library_refuses_too_and_resets():
    set_time_limit(1e-9)
    try:
        with pytest.raises(WorkLimitError, match="more than the time limit"):
            depth.grid("C10k-B12c", [8], 1, 200, torch.float64, on_run=_never)
    finally:
        set_time_limit(None)


def test_ctrl_c_after_the_estimate_stops_within_a_second_in_one_line(tmp_path):
    """SIGINT as soon as the estimate line shows (the runs start right after it)."""
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pathlift.cli", "depth", "--depths", "3000", "--samples",
         "20000", "--seeds", "1"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("estimate: 1 run(s)"), first
        time.sleep(0.5)  # into the training loop
        start = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    seconds = time.monotonic() - start
    assert process.returncode == 130 and err.startswith("Interrupted (Ctrl-C)"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert seconds < 1.5, f"took {seconds:.2f} s to stop"


def test_kron_design_states_a_lower_bound_of_its_dense_timings():
    from pathlift.jobs.bench.kron_run import design_estimate

    line = design_estimate(64, 32, 16, "float32", 2)
    assert line.startswith(f"estimate: at least {3 * 2 * 16 * 64 * 32:,} multiply-adds"), line
    assert "(3 x 2 repeats of 16 x 64 x 32)" in line and "\n" not in line


@pytest.mark.parametrize(("args", "env"), [
    (["--max-time", "0.0001", "kron-design", "512", "512"], {}),
    (["kron-design", "256", "1024", "--repeats", "50"], {"PATHLIFT_MAX_TIME": "1e-4"}),
])
def test_kron_design_over_the_time_limit_is_refused_before_the_search(args, env, monkeypatch,
                                                                      tmp_path):
    import pathlift.jobs.bench.kron_run as kron_run

    monkeypatch.setattr(kron_run, "design", _never)
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = invoke(*args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "its dense baseline alone" in lines[0], result.stderr
    assert "more than the time limit" in lines[0]
    assert not (tmp_path / "runs").exists()  # no output folder made


def test_ctrl_c_while_a_finished_command_exits_keeps_its_status_and_says_nothing(tmp_path):
    """Once: Ctrl-C landing in an exit hook after ``frontier`` had written its files
    printed a 10-line traceback; now the process ends at once with the command's status.
    The exit hook here sleeps so that the signal surely lands in it."""
    env = {**os.environ, "PYTHONPATH": SRC}
    code = ("import atexit, sys, time; atexit.register(time.sleep, 5); "
            "from pathlift.cli import main; sys.argv[1:] = ['models']; "
            "atexit.register(print, 'exiting', flush=True); main()")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while process.stdout.readline() not in ("exiting\n", ""):
            pass
        time.sleep(0.2)  # in the sleeping exit hook
        start = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0 and err == "", err
    assert time.monotonic() - start < 1.5
