"""Issue 40, data lost: pathlift removes only what it wrote, refuses to replace a user's
files unasked, follows no link inside a run folder, and serialises appends to a shared CSV
(concurrent writers under kills lose no row)."""

from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from cli_runner import invoke
from pathlift.files import OutputExistsError, append_rows
from pathlift.jobs.prune import PruneConfig, ResultsFileError, RunFolder, prune_rewind_retrain
from pathlift.jobs.prune.results import COLUMNS, DenseStates
from pathlift.models import mlp

SRC = str(Path(__file__).resolve().parents[1] / "src")
SHAPE = (4,)
GRID = PruneConfig(amounts=(0.5,), methods=("magnitude-global",), seeds=(0, 1), epochs=2,
                   rewind_epoch=1, rescaled=(False,))


def _net() -> torch.nn.Module:
    return mlp(4, (3,), 2)


def _epochs(model: torch.nn.Module, epochs: int, phase) -> None:
    for _ in phase.epochs(epochs):
        pass


def _user_files(folder: Path) -> dict[Path, bytes]:
    """What a user (or a finished ``report``) put into ``folder`` while a run was going."""
    files = {folder / "NOTES.txt": b"my notes\n", folder / "data" / "x.bin": bytes(range(256)),
             folder / "report.md": b"# pathlift report: finished\n"}
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def _interrupting(folder: Path, error: BaseException, user: bool = True):
    """A ``train`` that, during the first dense training, lets the user write into
    ``folder`` (when ``user``) and then fails with ``error`` (Ctrl-C: KeyboardInterrupt)."""
    def train(model, epochs, phase):
        if user:
            _user_files(folder)
        raise error
    return train


# ------------------------------------------------------------- only its own files are removed


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("the GPU fell off")],
                         ids=["ctrl-c", "error"])
@pytest.mark.parametrize("existed", [False, True], ids=["new-folder", "existing-folder"])
def test_an_interrupted_run_removes_its_files_and_keeps_the_users(tmp_path, error, existed):
    out = tmp_path / "out"
    if existed:
        out.mkdir()
    with pytest.raises(type(error)):
        prune_rewind_retrain(_net, SHAPE, _interrupting(out, error), lambda m: 0.5, GRID,
                             folder=RunFolder(out))
    files = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert files == {"NOTES.txt", "data", "data/x.bin", "report.md"}  # no manifest, no lock
    assert (out / "NOTES.txt").read_bytes() == b"my notes\n"
    assert (out / "data" / "x.bin").read_bytes() == bytes(range(256))
    assert (out / "report.md").read_bytes() == b"# pathlift report: finished\n"


def test_an_interrupted_run_alone_leaves_no_folder_and_a_resumable_one_keeps_its_results(
        tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prune_rewind_retrain(_net, SHAPE, _interrupting(out, KeyboardInterrupt(), user=False),
                             lambda m: 0.5, GRID, folder=RunFolder(out))
    assert not out.exists()  # it created the folder and nothing else was put there

    calls = []

    def second_seed_interrupted(model, epochs, phase):
        calls.append(phase.seed)
        if phase.seed == 1:
            raise KeyboardInterrupt
        _epochs(model, epochs, phase)

    with pytest.raises(KeyboardInterrupt):
        prune_rewind_retrain(_net, SHAPE, second_seed_interrupted, lambda m: 0.5, GRID,
                             folder=RunFolder(out))
    kept = sorted(p.name for p in (out / "dense").iterdir())
    assert kept == ["seed0-rewind.safetensors", "seed0-trained.safetensors"]  # results kept
    result = prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID,
                                  folder=RunFolder(out))
    assert len(result.runs) == 2 and calls == [0, 1]


def test_a_half_saved_dense_network_is_removed_with_the_rest(tmp_path, monkeypatch):
    """Unlisted: Ctrl-C between the rewind and the trained file of a seed's first save."""
    out = tmp_path / "out"
    import pathlift.jobs.prune.results as results

    written = []

    def write_then_interrupt(path, data):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        return real(path, data)

    real = results.write_bytes
    folder = RunFolder(out)
    folder.open({"setting": 1})
    (out / "NOTES.txt").write_text("mine")
    monkeypatch.setattr(results, "write_bytes", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt), folder:
        folder.save_dense(DenseStates(0, {"w": torch.ones(2)}, {"w": torch.zeros(2)}, 0.5))
    assert written and sorted(p.name for p in out.iterdir()) == ["NOTES.txt"]


# ------------------------------------------------------------- no file replaced unasked


@pytest.mark.parametrize("name", ["report.md", "report.json", "report.html", "margins.png"])
def test_report_refuses_an_out_holding_its_files_unless_overwrite(tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(b"the user's own " + name.encode())
    (out / "other.txt").write_bytes(b"untouched")
    result = invoke("report", "--model", "mlp", "--input-shape", "64", "--out", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert str(out / name) in lines[0] and "--overwrite" in lines[0]
    assert (out / name).read_bytes() == b"the user's own " + name.encode()
    assert sorted(p.name for p in out.iterdir()) == sorted([name, "other.txt"])
    if name == "report.md":  # asked: replaced
        result = invoke("report", "--model", "mlp", "--input-shape", "64", "--out", str(out),
                        "--overwrite")
        assert result.exit_code == 0, result.output
        assert (out / "report.md").read_text().startswith("# pathlift report")
        assert (out / "other.txt").read_bytes() == b"untouched"


@pytest.mark.slow
def test_every_file_a_report_writes_is_in_report_files(tmp_path):
    """REPORT_FILES, what the refusal checks, covers every file a report with data and
    training writes (so a new figure cannot be written over a user's file unasked)."""
    from pathlift.jobs.report import run as report_run

    report_run.run_report(tmp_path / "r", model="mlp", input_shape=(64,), data="digits",
                          epochs=1, samples=16, progress=False)
    written = {p.name for p in (tmp_path / "r").iterdir()}
    assert written <= set(report_run.REPORT_FILES) and {"report.md", "report.json"} <= written
    with pytest.raises(OutputExistsError, match="report"):
        report_run.run_report(tmp_path / "r", model="mlp", input_shape=(64,), progress=False)


@pytest.mark.parametrize("args", [[], ["--weights", "nowhere.safetensors"]],
                         ids=["plain", "other-options"])
def test_prune_refuses_an_out_holding_a_summary_png_before_training(tmp_path, args):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.png").write_bytes(b"my own figure")
    (out / "report.md").write_bytes(b"a report")  # not a name prune writes: no refusal
    start = time.perf_counter()
    result = invoke("prune", "--model", "mlp", "--data", "digits", "--epochs", "2",
                    "--rewind-epoch", "1", "--seeds", "1", "--amount", "0.5", "--method",
                    "magnitude-global", "--out", str(out), *args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert ("summary.png" in lines[0]) != bool(args) or "nowhere" in lines[0]
    assert time.perf_counter() - start < 30
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "summary.png"]
    assert (out / "summary.png").read_bytes() == b"my own figure"


@pytest.mark.slow
def test_prune_resumes_over_its_own_summary_and_overwrites_when_asked(tmp_path):
    out = tmp_path / "out"
    base = ["prune", "--model", "mlp", "--data", "digits", "--epochs", "2", "--rewind-epoch",
            "1", "--seeds", "1", "--amount", "0.5", "--method", "magnitude-global", "--out",
            str(out)]
    out.mkdir()
    (out / "summary.png").write_bytes(b"my own figure")
    first = invoke(*base, "--overwrite")
    assert first.exit_code == 0, first.output
    png = (out / "summary.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    again = invoke(*base)  # a resume: its own summary.png, no --overwrite needed
    assert again.exit_code == 0, again.output
    rows = list(csv.reader((out / "runs.csv").read_text().splitlines()))
    assert rows[0] == list(COLUMNS) and len(rows) == 3  # not rescaled, rescaled


# ------------------------------------------------------------- no link followed in a run folder


@pytest.mark.parametrize("name", ["dense", "models", "manifest.json", "runs.csv"])
def test_a_run_folder_entry_that_is_a_link_is_refused_and_its_target_untouched(tmp_path,
                                                                               name):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / ("seed0-trained.safetensors" if name in ("dense", "models")
                          else "victim")
    victim.write_bytes(b"someone else's file")
    out.mkdir()
    (out / name).symlink_to(elsewhere if name in ("dense", "models") else victim)
    with pytest.raises(ResultsFileError) as info:
        prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID, folder=RunFolder(out),
                             save_models=True)
    message = str(info.value)
    assert "\n" not in message and str(out / name) in message and "symbolic link" in message
    assert victim.read_bytes() == b"someone else's file"
    assert sorted(p.name for p in elsewhere.iterdir()) == [victim.name]
    assert (out / name).is_symlink()


@pytest.mark.parametrize("name", ["dense", "models"])
def test_a_sub_folder_turned_into_a_link_during_the_run_is_refused(tmp_path, name):
    """Unlisted: the sub-folder is replaced by a link after the folder was opened."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()

    def swap(model, epochs, phase):
        _epochs(model, epochs, phase)
        if not (out / name).is_symlink():
            if (out / name).exists():
                for p in (out / name).iterdir():
                    p.unlink()
                (out / name).rmdir()
            (out / name).symlink_to(elsewhere)

    with pytest.raises(ResultsFileError, match="symbolic link"):
        prune_rewind_retrain(_net, SHAPE, swap, lambda m: 0.5, GRID, folder=RunFolder(out),
                             save_models=True)
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------------------- concurrent writers, under kills

CSV_WRITER = textwrap.dedent("""
    import sys
    from pathlift.files import append_rows
    path, name = sys.argv[1], sys.argv[2]
    for i in range(10**6):
        append_rows(path, ["writer", "row", "payload"], [[name, i, "x" * (i % 50)]])
        print(i, flush=True)
""")


def _spawn(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)


def test_concurrent_csv_writers_killed_at_random_lose_no_completed_row(tmp_path):
    table = tmp_path / "log.csv"
    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"a user's file beside the log\n")
    rng = random.Random(40)
    done: dict[str, set[int]] = {}
    for round_ in range(3):
        writers = {f"w{round_}-{k}": _spawn(CSV_WRITER, str(table), f"w{round_}-{k}")
                   for k in range(4)}
        time.sleep(rng.uniform(0.8, 1.6))
        for proc in writers.values():  # each killed at its own random point
            time.sleep(rng.uniform(0.0, 0.2))
            proc.send_signal(rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGINT]))
        for name, proc in writers.items():
            out, _ = proc.communicate(timeout=60)
            done[name] = {int(line) for line in out.split()}
    rows = list(csv.reader(table.read_text().splitlines()))
    assert rows[0] == ["writer", "row", "payload"]
    body = rows[1:]
    assert all(len(r) == 3 and r[2] == "x" * (int(r[1]) % 50) for r in body)  # whole rows
    seen = [(r[0], int(r[1])) for r in body]
    assert len(seen) == len(set(seen))  # none twice
    assert sum(len(v) for v in done.values()) > 20  # the writers got going
    for name, rows_done in done.items():
        assert {(name, i) for i in rows_done} <= set(seen), name  # every completed row
        mine_rows = sorted(i for n, i in seen if n == name)
        assert mine_rows == list(range(len(mine_rows)))  # in order, none lost in between
    assert mine.read_bytes() == b"a user's file beside the log\n"


@pytest.mark.slow  # 5 processes: 80 s on a loaded 2-core VM
def test_concurrent_quantize_runs_appending_to_one_csv_lose_no_row(tmp_path):
    """The audit's case with the command itself: four `pathlift quantize --csv F` runs
    started together (each its own --random-rescale seed, 3 rows) and a fifth killed
    (SIGKILL) while they run: one header, every finished run's 3 rows, the killed run's
    rows all or none."""
    table = tmp_path / "q.csv"
    cli = "import sys; from pathlift.cli import main; sys.argv[0] = 'pathlift'; main()"

    def run(seed: int) -> subprocess.Popen:
        return _spawn(cli, "quantize", "mlp", "--bits", "2", "3", "4", "--samples", "4",
                      "--random-rescale", str(seed), "--csv", str(table))

    writers = [run(seed) for seed in range(4)]
    killed = run(9)
    time.sleep(random.Random(40).uniform(1.0, 3.0))
    killed.kill()
    for proc in writers:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    killed.communicate(timeout=60)
    rows = list(csv.reader(table.read_text().splitlines()))
    assert rows[0][:2] == ["model", "random_rescale"] and rows.count(rows[0]) == 1
    seeds = [r[1] for r in rows[1:]]
    assert all(seeds.count(str(seed)) == 3 for seed in range(4)), seeds
    assert seeds.count("9") in (0, 3) and len(seeds) in (12, 15)
    assert all(len(r) == len(rows[0]) for r in rows)


RUN_WRITER = textwrap.dedent("""
    import sys, time
    from pathlift.jobs.prune import PruneConfig, RunFolder, RunFolderBusyError
    from pathlift.jobs.prune import prune_rewind_retrain
    from pathlift.models import mlp
    grid = PruneConfig(amounts=(0.3, 0.5, 0.7), methods=("magnitude-global",),
                       seeds=(0, 1, 2), epochs=2, rewind_epoch=1, rescaled=(False,))

    def train(model, epochs, phase):
        for _ in phase.epochs(epochs):
            time.sleep(0.05)

    try:
        r = prune_rewind_retrain(lambda: mlp(4, (3,), 2), (4,), train, lambda m: 0.5, grid,
                                 folder=RunFolder(sys.argv[1]), save_models=True)
        print("done", len(r.runs), flush=True)
    except RunFolderBusyError:
        print("busy", flush=True)
""")


@pytest.mark.slow
def test_concurrent_runs_into_one_out_killed_at_random_keep_user_files_and_every_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    user = _user_files(out)
    rng = random.Random(7)
    for _ in range(3):
        writers = [_spawn(RUN_WRITER, str(out)) for _ in range(3)]
        time.sleep(rng.uniform(2.0, 6.0))
        for proc in writers:
            proc.send_signal(rng.choice([signal.SIGKILL, signal.SIGINT, signal.SIGTERM]))
        for proc in writers:
            proc.communicate(timeout=120)
    last = _spawn(RUN_WRITER, str(out))
    stdout, stderr = last.communicate(timeout=300)
    assert stdout.split() == ["done", "9"], stderr
    assert all(path.read_bytes() == data for path, data in user.items())
    rows = list(csv.reader((out / "runs.csv").read_text().splitlines()))
    keys = [(r[0], r[3]) for r in rows[1:]]
    assert rows[0] == list(COLUMNS) and len(keys) == 9 == len(set(keys))
    assert len(list((out / "models").glob("*.safetensors"))) == 9


def test_append_rows_waits_for_a_writer_holding_the_lock(tmp_path):
    """Two instances: a writer holding the lock delays, never loses, the other's row."""
    import fcntl

    table = tmp_path / "t.csv"
    append_rows(table, ["a"], [[1]])
    with open(table, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = _spawn("import sys; from pathlift.files import append_rows; "
                      "append_rows(sys.argv[1], ['a'], [[2]]); print('ok')", str(table))
        time.sleep(1.0)
        assert proc.poll() is None and table.read_text() == "a\n1\n"  # waiting
    assert proc.communicate(timeout=30)[0].strip() == "ok"
    assert table.read_text() == "a\n1\n2\n"


# ------------------------------------------------------------- everything read is range-checked


def _finished(out: Path) -> None:
    """A finished GRID in ``out``, then its runs.csv removed: a resume reads the dense
    weights of every seed again."""
    prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID, folder=RunFolder(out))
    (out / "runs.csv").unlink()


def _edit_dense(path: Path, metadata: dict[str, str] | None = None,
                tensors: dict[str, torch.Tensor] | None = None) -> None:
    from safetensors.torch import save_file

    from pathlift.files import read_safetensors

    state, meta = read_safetensors(path)
    save_file(tensors if tensors is not None else state, str(path),
              metadata={**meta, **(metadata or {})})


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("accuracy", "nan", "accuracy 'nan'"), ("accuracy", "7", "accuracy '7'"),
    ("accuracy", "-1", "accuracy '-1'"), ("accuracy", "inf", "accuracy 'inf'"),
    ("accuracy", "0.5 ", "accuracy '0.5 '"), ("accuracy", "high", "accuracy 'high'"),
    ("seed", "3", "seed '3'"), ("seed", "-1", "seed '-1'")])
def test_dense_metadata_out_of_range_is_refused_naming_file_and_field(tmp_path, field, value,
                                                                      shown):
    out = tmp_path / "out"
    _finished(out)
    dense = out / "dense" / "seed1-rewind.safetensors"
    _edit_dense(dense, {field: value})
    with pytest.raises(ResultsFileError) as info:
        prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID, folder=RunFolder(out))
    message = str(info.value)
    assert "\n" not in message and str(dense) in message and shown in message
    assert not (out / "runs.csv").exists()  # nothing computed from it, nothing written


def test_dense_files_that_disagree_or_hold_other_tensors_are_refused(tmp_path):
    """Unlisted fields: the two files' accuracies, the tensors' names and shapes."""
    out = tmp_path / "out"
    _finished(out)
    trained, rewind = (out / "dense" / f"seed0-{p}.safetensors" for p in ("trained", "rewind"))
    from pathlift.files import read_safetensors

    state = dict(read_safetensors(trained)[0])
    first = next(iter(state))
    wider = torch.zeros(state[first].shape[0] + 1, *state[first].shape[1:])
    cases = [
        (rewind, {"accuracy": "0.25"}, state, "differs from the trained file's 0.5"),
        (trained, None, {k: v for k, v in state.items() if k != first},
         f"tensor '{first}' is missing"),
        (trained, None, {**state, first: wider}, f"tensor '{first}' is {tuple(wider.shape)}"),
        (trained, None, {**state, "z": torch.zeros(1)}, "tensor 'z' is not one of the model's"),
    ]
    for path, metadata, tensors, shown in cases:
        before = {p: p.read_bytes() for p in (trained, rewind)}
        _edit_dense(path, metadata, tensors if path == trained else None)
        with pytest.raises(ResultsFileError) as info:
            prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID,
                                 folder=RunFolder(out))
        message = str(info.value)
        assert "\n" not in message and str(path) in message and shown in message, message
        for p, data in before.items():
            p.write_bytes(data)
    assert len(prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID,
                                    folder=RunFolder(out)).runs) == 2  # restored: resumes


@pytest.mark.parametrize(("column", "value"), [("log10_bound", "nan"),
                                               ("log10_path_metric", "inf")])
def test_a_runs_csv_log10_that_cannot_be_is_refused(tmp_path, column, value):
    out = tmp_path / "out"
    prune_rewind_retrain(_net, SHAPE, _epochs, lambda m: 0.5, GRID, folder=RunFolder(out))
    rows = list(csv.reader((out / "runs.csv").read_text().splitlines()))
    rows[2][COLUMNS.index(column)] = value
    (out / "runs.csv").write_text("".join(",".join(r) + "\n" for r in rows))
    with pytest.raises(ResultsFileError) as info:
        RunFolder(out).records()
    message = str(info.value)
    assert "line 3" in message and f"{column} {value}" in message and "\n" not in message


@pytest.mark.slow
@pytest.mark.parametrize("value", ["7", "nan"])
def test_prune_with_an_edited_dense_accuracy_exits_2_in_one_line(tmp_path, value):
    out = tmp_path / "out"
    args = ["prune", "--model", "mlp", "--data", "digits", "--epochs", "2", "--rewind-epoch",
            "1", "--seeds", "1", "--amount", "0.5", "--method", "magnitude-global", "--out",
            str(out)]
    assert invoke(*args).exit_code == 0
    (out / "runs.csv").unlink()
    _edit_dense(out / "dense" / "seed0-trained.safetensors", {"accuracy": value})
    result = invoke(*args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and f"accuracy '{value}'" in lines[0]
    assert "700.0" not in result.stdout and "nan" not in result.stdout
    assert not (out / "runs.csv").exists()


CLI = "import sys; from pathlift.cli import main; sys.argv[0] = 'pathlift'; main()"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_prune_stopped_during_training_removes_only_its_own_files(tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    user = _user_files(out)
    proc = _spawn(CLI, "prune", "--model", "mlp", "--data", "digits", "--epochs", "100000",
                  "--seeds", "1", "--amount", "0.5", "--method", "magnitude-global", "--out",
                  str(out))
    deadline = time.monotonic() + 120
    while not (out / "manifest.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # training
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, stderr
    assert {p.relative_to(out).as_posix() for p in out.rglob("*")} == \
        {"NOTES.txt", "data", "data/x.bin", "report.md"}
    assert all(path.read_bytes() == data for path, data in user.items())


def test_sigterm_during_prune_experiment_exits_143_removing_only_its_files(tmp_path,
                                                                          monkeypatch):
    """In-process: the dense training receives SIGTERM (as from `kill PID` or torchrun)."""
    from pathlift.jobs.prune import SGDTraining, prune_experiment

    out = tmp_path / "out"
    out.mkdir()
    user = _user_files(out)
    terminated = []

    def train(self, model, epochs, phase):
        terminated.append(phase.seed)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(SGDTraining, "train", train)
    with pytest.raises(SystemExit) as info:
        prune_experiment("mlp", "digits", GRID, out)
    assert info.value.code == 143 and terminated == [0]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    assert {p.relative_to(out).as_posix() for p in out.rglob("*")} == \
        {"NOTES.txt", "data", "data/x.bin", "report.md"}
    assert all(path.read_bytes() == data for path, data in user.items())


@pytest.mark.parametrize(("command", "name"), [
    (["kron-bench", "--threads", "1"], "kron_cpu_float32_t1.png"),
    (["kron-design", "16", "16"], "candidates.csv"),
    (["frontier"], "frontier.md"),
], ids=["kron-bench", "kron-design", "frontier"])
def test_an_output_file_that_is_a_link_is_refused_before_any_work(tmp_path, command, name):
    """As in prune's run folders: no output file is written through a symbolic link."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"someone else's file")
    (out / name).symlink_to(victim)
    start = time.monotonic()
    result = invoke(*command, "--out", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert str(out / name) in lines[0] and "symbolic link" in lines[0]
    assert time.monotonic() - start < 20  # refused before the timings or the runs
    assert victim.read_bytes() == b"someone else's file" and (out / name).is_symlink()
    assert [p.name for p in out.iterdir()] == [name]


def test_refuse_link_raises_the_callers_error_and_passes_real_files(tmp_path):
    from pathlift.files import FileSystemError, refuse_link, refuse_links

    (tmp_path / "real.csv").write_text("a\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    refuse_links(tmp_path, ["real.csv", "missing.csv"])  # no link: nothing raised
    with pytest.raises(FileSystemError, match=r"link\.csv' is a symbolic link"):
        refuse_links(tmp_path, ["real.csv", "link.csv"])
    with pytest.raises(ResultsFileError, match="symbolic link"):
        refuse_link(tmp_path / "link.csv", ResultsFileError)


def _failing_report(error: BaseException, write: str | None = None):
    """A ``run_report`` that fails with ``error``, after writing ``write`` into its folder."""
    def run_report(out_dir, *args, **kwargs):
        if write is not None:
            (Path(out_dir) / write).write_text("written before the failure\n")
        raise error
    return run_report


@pytest.mark.parametrize(("error", "status"), [
    (KeyboardInterrupt(), 130), (ResultsFileError("a refusal"), 2)], ids=["Ctrl-C", "refused"])
def test_a_failed_report_leaves_no_empty_default_folder(tmp_path, monkeypatch, error, status):
    import pathlift.jobs.report as report_job

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(report_job, "run_report", _failing_report(error))
    result = invoke("report", "--model", "mlp", "--input-shape", "64")
    assert result.exit_code == status, result.output
    assert not (tmp_path / "runs").exists()  # runs/report-TIME removed, and runs it made
    # a folder the user named stays, and so does a default one holding anything
    (tmp_path / "mine").mkdir()
    result = invoke("report", "--model", "mlp", "--input-shape", "64", "--out", "mine")
    assert result.exit_code == status and (tmp_path / "mine").is_dir(), result.output
    monkeypatch.setattr(report_job, "run_report", _failing_report(error, "notes.txt"))
    assert invoke("report", "--model", "mlp", "--input-shape", "64").exit_code == status
    (kept,) = (tmp_path / "runs").iterdir()
    assert kept.name.startswith("report-") and [p.name for p in kept.iterdir()] == ["notes.txt"]


def test_a_real_report_that_fails_leaves_no_empty_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("report", "--model", "missing.py:build", "--input-shape", "64")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "runs").exists()
