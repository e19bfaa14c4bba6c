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

import warm_process
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
        [warm_process.python(), "-m", "pathlift.cli", "depth", "--depths", "3000", "--samples",
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

    line = _refused_before_work(args, env, monkeypatch, tmp_path, kron_run, "design")
    assert "its dense baseline alone" in line
    assert not (tmp_path / "runs").exists()  # no output folder made


def _refused_before_work(args: list[str], env: dict[str, str], monkeypatch, tmp_path: Path,
                         owner: object, work: str) -> str:
    """``pathlift ARGS`` in ``tmp_path`` with ``env`` set and ``owner.work`` never to be
    called: status 2 and one line refusing it over the time limit, naming the flag that
    lifts it; that line."""
    monkeypatch.setattr(owner, work, _never)
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = invoke(*args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "more than the time limit" in lines[0] and "--max-time" in lines[0]
    assert "Traceback" not in result.output and ", ," not in lines[0]
    return lines[0]


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


# ------------------------------------------- prune, frontier, kron-bench: sized like depth

PRUNE = ["prune", "--model", "mlp", "--data", "digits", "--seeds", "1", "--amount", "0.5",
         "--method", "magnitude-global", "--batch-size", "256", "--epochs", "3"]


def _estimate_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("estimate:")]
    assert len(lines) == 1, stdout
    return lines[0]


def _digits_train() -> int:
    from pathlift.data import load_digits

    return len(load_digits().train)


@pytest.mark.slow  # 27 s on a loaded 2-core VM
def test_prune_states_the_trainings_it_will_do_and_a_resume_counts_only_what_is_left(
        tmp_path, monkeypatch):
    """Seeds 0 and 1: 2 dense trainings of 3 epochs and 4 runs (not rescaled, rescaled)
    retrained 3 - 2 epochs each. Interrupted in seed 1's dense training, the folder keeps
    seed 0's; run again, it trains 1 dense network and the 4 runs."""
    from pathlift.jobs.prune import SGDTraining

    out, n = tmp_path / "out", _digits_train()
    args = [*PRUNE[:5], "--seeds", "2", *PRUNE[7:], "--out", str(out)]
    train = SGDTraining.train

    def interrupted(self, model, epochs, phase):
        if phase.seed == 1:
            raise KeyboardInterrupt
        train(self, model, epochs, phase)

    monkeypatch.setattr(SGDTraining, "train", interrupted)
    first = invoke(*args)
    assert first.exit_code == 130, first.output
    assert f"2 dense training(s) and 4 run(s) of 1 round(s), {2 * 3 + 4 * 1:,} epochs of " \
           f"{n:,} samples" in _estimate_line(first.stdout)
    dense = (out / "dense" / "seed0-trained.safetensors").read_bytes()
    monkeypatch.setattr(SGDTraining, "train", train)
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    line = _estimate_line(again.stdout)
    assert f"1 dense training(s) and 4 run(s) of 1 round(s), {3 + 4:,} epochs of {n:,} " \
           "samples" in line and "limit 60.0 min" in line, line
    assert (out / "dense" / "seed0-trained.safetensors").read_bytes() == dense
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + 4


@pytest.mark.parametrize(("args", "env"), [
    (["--max-time", "0.001", *PRUNE], {}),
    ([*PRUNE[:-1], "100000000"], {}),  # > one hour (the default limit) at any pace
    ([*PRUNE[:5], "--seeds", "3", *PRUNE[7:]], {"PATHLIFT_MAX_TIME": "1e-5"}),
])
def test_prune_over_the_time_limit_is_refused_before_any_training(args, env, monkeypatch,
                                                                  tmp_path):
    from pathlift.jobs.prune import SGDTraining

    line = _refused_before_work(args, env, monkeypatch, tmp_path, SGDTraining, "train")
    assert "trainings is estimated at" in line
    assert not list(tmp_path.glob("runs/*"))  # the new run folder it made is removed again


def test_prune_refuses_more_seeds_than_memory_holds_before_training(monkeypatch, tmp_path):
    from pathlift.jobs.prune import SGDTraining

    monkeypatch.setattr(SGDTraining, "train", _never)
    monkeypatch.chdir(tmp_path)
    result = invoke("--max-memory", "1M", *PRUNE[:5], "--seeds", "50", *PRUNE[7:])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "50 seeds' dense networks" in lines[0] and "needs about" in lines[0]


def test_the_prune_estimate_is_a_lower_bound_of_the_time_taken(tmp_path):
    from pathlift.jobs.prune import PruneConfig, prune_experiment

    lines = []
    config = PruneConfig(amounts=(0.5,), methods=("magnitude-global",), seeds=(0,), epochs=4,
                         rescaled=(False,))
    start = time.perf_counter()
    prune_experiment("mlp", "digits", config, tmp_path / "out", on_estimate=lines.append)
    taken = time.perf_counter() - start
    seconds = float(lines[0].split("at least ")[1].split(" s ")[0])
    assert 0 < seconds < taken, (lines, taken)


def test_frontier_runs_only_the_methods_asked_for():
    """Once: --method l1 also trained "none" and "budget" at the MNIST-1D sizes, the
    prune-retrain recipes and an imp-rewind grid."""
    from pathlift.jobs.frontier import FrontierConfig, _runs, with_sweep

    for methods in (["l1"], ["budget", "path-sgd"], ["prune-retrain"]):
        config = with_sweep(FrontierConfig(mnist1d_sizes=(2000,)), methods)
        assert {run.method for run in _runs(config)} == set(methods)
    assert {run.num_samples for run in _runs(with_sweep(FrontierConfig(mnist1d_sizes=(2000,)),
                                                        ["none"]))} == {None, 2000}


def test_frontier_states_its_trainings_and_refuses_over_the_limit(monkeypatch, tmp_path):
    from pathlift.jobs import frontier

    monkeypatch.setattr(frontier, "_one", _never)
    monkeypatch.chdir(tmp_path)
    args = ["frontier", "--dataset", "digits", "mnist1d", "--model", "mlp", "--method",
            "none", "l1", "--mnist1d-size", "2000", "--epochs", "5", "--out", "out"]
    result = invoke("--max-time", "1e-4", *args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "frontier over 2 dataset(s) x 1 model(s) x 2 method(s)" in lines[0]
    assert "more than the time limit" in lines[0] and "--max-time" in lines[0]
    # 2 datasets x (none, 4 strengths of l1) + MNIST-1D 2000 "none" (8 epochs), in samples
    n = _digits_train()
    sample_epochs = 5 * 5 * n + 5 * 5 * 4000 + 8 * 1600
    assert f"11 training(s), {sample_epochs:,} sample-epochs" in _estimate_line(result.stdout)
    assert not (tmp_path / "out").exists()


def test_frontier_refuses_an_mnist1d_size_memory_cannot_hold(monkeypatch, tmp_path):
    from pathlift.jobs import frontier

    monkeypatch.setattr(frontier, "_one", _never)
    result = invoke("--max-memory", "10M", "frontier", "--dataset", "mnist1d",
                    "--mnist1d-size", "1000000", "--out", str(tmp_path / "out"))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "generating MNIST-1D of 1,000,000 samples" in lines[0]


KRON = ["kron-bench", "--every", "40", "--repeats", "1", "--threads", "1", "--no-vit",
        "--algorithm", "dense", "bmm"]


def test_kron_bench_counts_the_multiply_adds_of_its_grid(tmp_path):
    from pathlift.jobs.bench.kron import cpu_patterns

    result = invoke(*KRON, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    patterns = cpu_patterns(2**22, 40)
    madds = 2 * 256 * sum(p.out_features * p.in_features + p.a * p.b * p.c * p.d
                          for p in patterns)  # 2 layouts, 1 repeat, dense + bmm
    assert _estimate_line(result.stdout).startswith(
        f"estimate: {madds:,} multiply-adds ({len(patterns)} patterns x 2 algorithm(s) x 2 "
        "layouts x 1 repeats x 1 thread count(s), batch 256), at least ")


@pytest.mark.parametrize(("args", "says"), [
    (["--max-time", "1e-6", *KRON], "more than the time limit"),
    (["kron-bench", "--repeats", "100000"], "more than the time limit"),
    (["--max-memory", "16G", "kron-bench", "--full"],  # the default limit: what is free
     "(1, 768, 768, 96) on a batch of 256 needs about 21"),
    (["--max-memory", "1M", "kron-bench", "--full"], "kron-bench's largest pattern"),
])
def test_kron_bench_over_a_limit_is_refused_before_any_timing(args, says, monkeypatch,
                                                              tmp_path):
    import pathlift.jobs.bench.kron_run as kron_run

    monkeypatch.setattr(kron_run, "time_grid", _never)
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert says in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_the_kron_bench_estimate_is_a_lower_bound_of_the_time_taken(tmp_path):
    from pathlift.jobs.bench import run_kron_benchmark

    lines = []
    start = time.perf_counter()
    run_kron_benchmark(tmp_path, every=40, repeats=1, threads=[1], vit=False,
                       on_estimate=lines.append)
    taken = time.perf_counter() - start
    seconds = float(lines[0].split("at least ")[1].split(" s ")[0])
    assert 0 < seconds < taken, (lines, taken)


def test_the_paces_leave_the_thread_count_and_the_generator_as_they_were():
    from pathlift.jobs.sizing import matmul_pace, training_pace
    from pathlift.models import mlp

    threads = torch.get_num_threads()
    state = torch.get_rng_state()
    assert matmul_pace(threads=4) > 0
    assert training_pace(lambda: mlp(8, (4,), 3), (8,), 16, 3) > 0
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), state)
