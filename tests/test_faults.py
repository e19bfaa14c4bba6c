"""Fault injection: kills, concurrent runs, changed settings, damaged files, full and
read-only disks, and inputs too large for the machine (issue 23).

The prune runs use a tiny MLP on the embedded digits (about a second a run), forked from
the test process so that a kill at a random moment costs no interpreter start."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import pathlift.files
from memory_growth import refused
from pathlift.bounds.symmetry_aware import QuantReport
from pathlift.data import load_digits, loaders, synthetic
from pathlift.errors import InvalidParameterError
from pathlift.files import FileSystemError
from pathlift.jobs.depth import DepthRun, append_csv
from pathlift.jobs.plots import depth_trajectories
from pathlift.jobs.plots import pruning_experiment as plot
from pathlift.jobs.prune import (
    PruneConfig,
    ResultsFileError,
    RunFolder,
    RunFolderBusyError,
    SGDTraining,
    prune_rewind_retrain,
)
from pathlift.jobs.prune.protocol import manifest
from pathlift.jobs.prune.results import COLUMNS, RunRecord
from pathlift.jobs.quant import append_csv as append_quant_csv
from pathlift.models import load_model, mlp, save_checkpoint

SHAPE = (1, 8, 8)
CONFIG = PruneConfig(amounts=(0.5, 0.8), methods=("magnitude-global", "path-magnitude-global"),
                     seeds=(0, 1), epochs=2, rewind_epoch=1, rescaled=(False,))
TRAINING = SGDTraining(*loaders(load_digits(), 128, 0))


def _tiny() -> nn.Module:
    return mlp(64, (16,), 10)


def _prune(out: Path, config: PruneConfig = CONFIG, training: SGDTraining = TRAINING,
           model_fn: Callable[[], nn.Module] = _tiny, **kwargs):
    return prune_rewind_retrain(model_fn, SHAPE, training.train, training.evaluate, config,
                                folder=RunFolder(out), **kwargs)


def _forked(work: Callable[[], None]) -> int:
    """``work()`` in a forked child; its pid (the child exits 0 on success, 1 on error)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# ------------------------------------------------------------------ kills at random moments


def _contents(path: Path) -> tuple[dict, dict]:
    """A safetensors file's metadata and tensors (as bytes): its header orders the metadata
    keys as the writer's hash map iterates them, which differs between processes."""
    with safe_open(path, "pt") as f:
        return f.metadata(), {k: f.get_tensor(k).numpy().tobytes() for k in f.keys()}  # noqa: SIM118


def _killed_runs(tmp_path: Path, kills: int) -> None:
    whole = tmp_path / "whole"
    start = time.perf_counter()
    assert _exit_code(_forked(lambda: _prune(whole))) == 0
    duration = time.perf_counter() - start
    rng, landed, chains = random.Random(23), 0, [tmp_path / "killed0"]

    def check(folder: Path) -> None:
        text = (folder / "runs.csv").read_text()
        assert text == (whole / "runs.csv").read_text()  # same rows, order and digits
        keys = [tuple(line.split(",")[:4]) for line in text.splitlines()[1:]]
        assert len(keys) == len(set(keys)) == len(CONFIG.grid())  # no duplicate row
        for name in (f"dense/seed{s}-{p}.safetensors" for s in CONFIG.seeds
                     for p in ("trained", "rewind")):
            assert _contents(folder / name) == _contents(whole / name)
        assert not list(folder.rglob("*.tmp"))  # temporaries of killed writes are cleaned

    for _ in range(8 * kills):  # each process is killed at a random moment of its life
        if landed == kills:
            break
        pid = _forked(lambda: _prune(chains[-1]))
        time.sleep(rng.uniform(0.0, duration / 2))
        os.kill(pid, signal.SIGKILL)
        if _exit_code(pid) == 0:  # it finished first: that resumed folder is complete
            check(chains[-1])
            chains.append(tmp_path / f"killed{len(chains)}")
        else:
            landed += 1
    assert landed == kills
    assert _exit_code(_forked(lambda: _prune(chains[-1]))) == 0  # the last resume ends
    check(chains[-1])


def test_twenty_kills_at_random_moments_resume_to_the_uninterrupted_results(tmp_path):
    _killed_runs(tmp_path, 20)


# ------------------------------------------------------------------ one run per folder


def test_a_second_run_into_a_busy_folder_is_refused_naming_the_holder(tmp_path):
    holder = RunFolder(tmp_path / "out")
    holder.open(manifest(_tiny, SHAPE, TRAINING.train, CONFIG, "data", 1))
    with pytest.raises(RunFolderBusyError) as info:
        _prune(tmp_path / "out")
    message = str(info.value)
    assert f"pid {os.getpid()} on {os.uname().nodename}" in message and "\n" not in message
    holder.close()
    assert len(_prune(tmp_path / "out").runs) == len(CONFIG.grid())  # free again


def test_two_concurrent_processes_one_refused(tmp_path):
    out = tmp_path / "out"
    slow = dataclasses.replace(CONFIG, epochs=30)
    first = _forked(lambda: _prune(out, slow))
    deadline = time.monotonic() + 60
    while not (out / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(RunFolderBusyError, match=f"pid {first} on"):
        _prune(out, slow)
    assert _exit_code(first) == 0
    assert len(RunFolder(out).records()) == len(CONFIG.grid())


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "out"

    def hold_and_die() -> None:
        RunFolder(out).open({"setting": 1})
        os.kill(os.getpid(), signal.SIGKILL)

    pid = _forked(hold_and_die)
    assert _exit_code(pid) == -signal.SIGKILL
    assert (out / ".lock").read_text().startswith(f"pid {pid} ")
    with RunFolder(out) as folder:
        assert folder.open({"setting": 1}) == {}
        assert (out / ".lock").read_text().startswith(f"pid {os.getpid()} ")


def test_temporaries_of_killed_writes_are_removed_when_the_folder_is_opened(tmp_path):
    with RunFolder(tmp_path) as folder:
        folder.open({"setting": 1})
    left = [tmp_path / ".pathlift-k2j4x9ab.tmp", tmp_path / "dense" / ".pathlift-a1b2c3d4.tmp"]
    foreign = tmp_path / "models" / "src" / ".pathlift-x.tmp"  # not a folder pathlift writes
    for p in [*left, foreign]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a file")
    with RunFolder(tmp_path) as folder:
        folder.open({"setting": 1})
    assert not any(p.exists() for p in left) and foreign.read_bytes() == b"half a file"
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"setting": 1}


# ------------------------------------------------------------------ settings checked on resume


ONE = PruneConfig(amounts=(0.5,), methods=("magnitude-global",), seeds=(0,), epochs=2,
                  rewind_epoch=1, rescaled=(False,))


def _other_weights() -> nn.Module:
    model = _tiny()
    with torch.no_grad():
        model[1].weight.mul_(2.0)
    return model


@pytest.mark.parametrize(("setting", "change"), [
    ("model", {"model_fn": lambda: mlp(64, (8,), 10)}),
    ("weights", {"model_fn": _other_weights}),
    ("data", {"training": SGDTraining(*loaders(synthetic(num_classes=10), 128, 0))}),
    ("batch_size", {"training": SGDTraining(*loaders(load_digits(), 64, 0))}),
    ("lr", {"training": SGDTraining(*loaders(load_digits(), 128, 0), lr=0.5)}),
    ("seeds", {"config": dataclasses.replace(ONE, seeds=(0, 1))}),
    ("epochs", {"config": dataclasses.replace(ONE, epochs=3)}),
    ("methods", {"config": dataclasses.replace(ONE, methods=("path-magnitude-global",))}),
    ("amounts", {"config": dataclasses.replace(ONE, amounts=(0.5, 0.6))}),
    ("spread", {"spread": "runs"}),
    ("dataset", {"settings": {"dataset": "digits"}}),
])
def test_resume_with_a_defining_setting_changed_is_refused_naming_it(tmp_path, setting,
                                                                     change):
    out = tmp_path / "out"
    _prune(out, ONE)
    before = (out / "runs.csv").read_bytes()
    kwargs = {"config": ONE, **change}
    with pytest.raises(InvalidParameterError, match=f"other settings: {setting} was") as info:
        _prune(out, **kwargs)
    assert "\n" not in str(info.value)
    assert (out / "runs.csv").read_bytes() == before


@pytest.mark.parametrize(("setting", "value"), [("world_size", 2), ("torch", "1.0"),
                                                ("pathlift", "0.0.1")])
def test_a_folder_of_another_world_size_or_version_is_refused(tmp_path, setting, value):
    out = tmp_path / "out"
    _prune(out, ONE)
    saved = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**saved, setting: value}))
    with pytest.raises(InvalidParameterError, match=f"{setting} was {json.dumps(value)}, now"):
        _prune(out, ONE)


# ------------------------------------------------------------------ damaged results files


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, bytes]:
    out = tmp_path_factory.mktemp("finished")
    _prune(out)
    return out, (out / "runs.csv").read_bytes()


def _damaged(tmp_path: Path, finished: tuple[Path, bytes], edit: Callable[[bytes], bytes]
             ) -> Path:
    source, text = finished
    out = tmp_path / "out"
    for p in source.rglob("*"):
        if p.is_file() and p.name != ".lock":
            target = out / p.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(p.read_bytes())
    (out / "runs.csv").write_bytes(edit(text))
    return out


def _field(text: bytes, line: int, column: int, value: bytes) -> bytes:
    lines = text.split(b"\n")
    cells = lines[line - 1].split(b",")
    cells[column - 1] = value
    lines[line - 1] = b",".join(cells)
    return b"\n".join(lines)


def test_a_torn_last_line_is_dropped_and_recomputed(tmp_path, finished):
    out = _damaged(tmp_path, finished, lambda t: t[:-25])  # cut inside the last row
    calls = []

    def counting(model, epochs, phase):
        calls.append(phase.name)
        TRAINING.train(model, epochs, phase)

    result = prune_rewind_retrain(_tiny, SHAPE, counting, TRAINING.evaluate, CONFIG,
                                  folder=RunFolder(out), settings=TRAINING.settings())
    assert calls == ["retrain"]  # that one run only
    assert (out / "runs.csv").read_bytes() == finished[1]
    assert [r.to_row() for r in result.runs] == \
        [r.to_row() for r in RunFolder(finished[0]).records()]


@pytest.mark.parametrize(("edit", "where"), [
    (lambda t: _field(t, 3, 3, b"Tru"), r"line 3, column 3 \(rescaled 'Tru'"),
    (lambda t: _field(t, 4, 6, b"0.5x"), r"line 4, column 6 \(sparsity '0.5x'"),
    (lambda t: _field(t, 2, 1, b""), r"line 2, column 1 \(seed ''"),
    (lambda t: _field(t, 5, 9, b"\xff\xfe"), r"line 5, column \d+: bytes that are not UTF-8"),
    (lambda t: _field(t, 6, 15, b"data,extra"), "line 6, column 16: 16 fields"),
    (lambda t: t.replace(b"\n", b"\n0,magnitude\n", 1), "line 2, column 3: 2 fields"),
])
def test_an_unparsable_results_file_names_file_line_and_column(tmp_path, finished, edit,
                                                                where):
    out = _damaged(tmp_path, finished, edit)
    before = (out / "runs.csv").read_bytes()
    with pytest.raises(ResultsFileError, match=where) as info:
        _prune(out)
    assert str(out / "runs.csv") in str(info.value) and "\n" not in str(info.value)
    assert (out / "runs.csv").read_bytes() == before  # never recomputed and appended


def test_two_different_rows_for_one_run_are_an_error(tmp_path, finished):
    second = finished[1].split(b"\n")[1] + b"\n"
    out = _damaged(tmp_path, finished, lambda t: t + _field(second, 1, 9, b"0.99"))
    with pytest.raises(ResultsFileError, match="lines 2 and 10 hold different results"):
        _prune(out)


def test_a_damaged_header_is_an_error_not_a_recompute(tmp_path, finished):
    out = _damaged(tmp_path, finished, lambda t: t.replace(b"seed,method", b"sed,method", 1))
    with pytest.raises(ResultsFileError, match="line 1: the header is damaged"):
        _prune(out)


def test_an_identical_repeated_row_counts_once(tmp_path, finished):
    out = _damaged(tmp_path, finished, lambda t: t + t.split(b"\n")[3] + b"\n")
    records = RunFolder(out).records()
    assert len(records) == len(CONFIG.grid())
    assert len(_prune(out).runs) == len(CONFIG.grid())


@pytest.mark.parametrize("content", [b"{\"model\": ", b"[1, 2]", b"\x00\x01"])
def test_a_damaged_manifest_is_an_error(tmp_path, finished, content):
    out = _damaged(tmp_path, finished, lambda t: t)
    (out / "manifest.json").write_bytes(content)
    with pytest.raises(ResultsFileError, match=r"manifest\.json' is damaged"):
        _prune(out)


def test_a_damaged_dense_checkpoint_is_an_error_naming_it(tmp_path, finished):
    out = _damaged(tmp_path, finished, lambda t: t.split(b"\n", 2)[0] + b"\n")
    dense = out / "dense" / "seed0-trained.safetensors"
    dense.write_bytes(dense.read_bytes()[:100])
    with pytest.raises(ResultsFileError, match=f"'{dense}' is damaged.*train seed 0 again"):
        _prune(out)


def test_results_without_a_manifest_are_refused(tmp_path, finished):
    out = _damaged(tmp_path, finished, lambda t: t)
    (out / "manifest.json").unlink()
    with pytest.raises(InvalidParameterError, match=r"no manifest\.json"):
        _prune(out)


def test_float_fields_read_back_exactly(tmp_path):
    record = RunRecord(3, "m,ethod", True, 0.1 + 0.2, 1, 1 / 3, 0.5, 1 / 7, 0.25,
                       float("-inf"), 1e-300, float("nan"), "0123456789abcdef", 2, "runs")
    folder = RunFolder(tmp_path)
    folder.append(record)
    (read,) = folder.records()
    assert read.to_row() == record.to_row()
    assert (tmp_path / "runs.csv").read_text().splitlines()[0] == ",".join(COLUMNS)


# ------------------------------------------------------------------ folders and names


def test_a_run_failing_before_any_result_leaves_no_folder(tmp_path):
    def broken(model, epochs, phase):
        raise RuntimeError("out of data")

    for out, kept in ((tmp_path / "new", False), (tmp_path, True)):
        with pytest.raises(RuntimeError, match="out of data"):
            prune_rewind_retrain(_tiny, SHAPE, broken, TRAINING.evaluate, ONE,
                                 folder=RunFolder(out))
        assert out.exists() is kept


def test_repeated_amounts_are_one_run_and_saved_models_have_distinct_names(tmp_path):
    config = dataclasses.replace(ONE, amounts=(0.3, 0.3, 0.1 + 0.2))
    assert config.amounts == (0.3, 0.1 + 0.2)
    result = _prune(tmp_path, config, save_models=True)
    assert len(result.runs) == 2
    names = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert names == ["seed0-magnitude-global-0.3.safetensors",
                     "seed0-magnitude-global-0.30000000000000004.safetensors"]


# ------------------------------------------------------------------ full and read-only disks


def _fail_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Every atomic write fails: ENOSPC once its bytes are written (at fsync), EROFS when
    its temporary file is created."""
    if code == errno.ENOSPC:
        def fsync(fd: int) -> None:
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(pathlift.files.os, "fsync", fsync)
    else:
        def mkstemp(*args, **kwargs):
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(pathlift.files.tempfile, "mkstemp", mkstemp)


def _record(amount: float) -> RunRecord:
    return RunRecord(0, "magnitude-global", False, amount, 1, 0.5, 0.9, 0.8, 0.85, 1.0, 1.1,
                     100.0, "0" * 16, 1, "data")


def _state() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(6.0).reshape(2, 3)}


def _depth_run(seed: int) -> DepthRun:
    return DepthRun("C10k-B12c", 4, seed, 10, "float64", 5, 0.1, 1.0, 2.0, (1.0, 0.5),
                    (1.0, 0.5, 0.25), (1.0, 1.1, 1.2, 1.3))


def _writers(tmp_path: Path) -> dict[str, tuple[Path, Callable[[int], object]]]:
    """Each writer: (the file it writes, write version i)."""
    from pathlift.jobs.prune.protocol import ProtocolResult
    from pathlift.jobs.prune.results import DenseStates

    folder = RunFolder(tmp_path / "run")
    result = ProtocolResult(ONE, (_record(0.5),))
    return {
        "runs.csv": (folder.csv, lambda i: folder.append(_record(0.1 * (i + 1)))),
        "dense": (folder.dense_path(0), lambda i: folder.save_dense(
            DenseStates(0, {"w": torch.full((2,), float(i))}, _state(), 0.5))),
        "saved model": (folder.model_path(_record(0.5)),
                        lambda i: folder.save_model({"w": torch.full((2,), float(i))},
                                                    _record(0.5))),
        "checkpoint .safetensors": (tmp_path / "net.safetensors", lambda i: save_checkpoint(
            mlp(4, (i + 2,), 2), tmp_path / "net.safetensors", "mlp", in_features=4,
            hidden=[i + 2], num_classes=2)),
        "checkpoint .pt": (tmp_path / "net.pt", lambda i: save_checkpoint(
            mlp(4, (i + 2,), 2), tmp_path / "net.pt", "mlp", in_features=4, hidden=[i + 2],
            num_classes=2)),
        "prune plot": (tmp_path / "summary.png",
                       lambda i: plot(result, tmp_path / "summary.png", f"try {i}")),
        "depth csv": (tmp_path / "depth.csv", lambda i: append_csv(tmp_path / "depth.csv",
                                                                    [_depth_run(i)])),
        "depth plot": (tmp_path / "paths.png", lambda i: depth_trajectories(
            [_depth_run(i)], str(tmp_path / "paths.png"))),
        "quant csv": (tmp_path / "quant.csv", lambda i: append_quant_csv(
            tmp_path / "quant.csv", [QuantReport("plain", 8, 1.0, 0.1, 0.5, 2.0, None)],
            run=i)),
    }


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
@pytest.mark.parametrize("writer", ["runs.csv", "dense", "saved model",
                                    "checkpoint .safetensors", "checkpoint .pt", "prune plot",
                                    "depth csv", "depth plot", "quant csv"])
def test_a_full_or_read_only_disk_keeps_the_previous_file(tmp_path, monkeypatch, writer,
                                                          code):
    path, write = _writers(tmp_path)[writer]
    write(0)
    before = path.read_bytes()
    files_before = sorted(p for p in tmp_path.rglob("*") if p.name != ".lock")
    _fail_writes(monkeypatch, code)
    with pytest.raises(FileSystemError) as info:
        write(1)
    message = str(info.value)
    advice = {errno.ENOSPC: "disk is full", errno.EROFS: "read-only"}[code]
    assert "\n" not in message and str(path.parent) in message and advice in message
    assert path.read_bytes() == before
    assert sorted(p for p in tmp_path.rglob("*") if p.name != ".lock") == files_before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_manifest_that_cannot_be_written_leaves_no_folder(tmp_path, monkeypatch, code):
    _fail_writes(monkeypatch, code)
    with pytest.raises(FileSystemError, match=r"manifest\.json"):
        _prune(tmp_path / "out", ONE)
    assert not (tmp_path / "out").exists()


def test_a_read_only_output_folder_is_one_line(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("running as a user who writes anywhere (root)")
        with pytest.raises(FileSystemError, match="permission denied"):
            _prune(out / "run", ONE)
    finally:
        out.chmod(0o700)


# ------------------------------------------------------------------ too large for the machine


def test_a_huge_input_shape_is_refused_before_allocating(tmp_path):
    side = 65536
    kind, grown_mb, message = refused(f"path_norm(model, (1, {side}, {side}))", tmp_path)
    assert kind == "MemoryLimitError" and grown_mb < 100
    # by hand: float64 input, conv (8 ch), relu (8 ch), conv (1 ch) outputs at batch 1,
    # and the parameters twice (|theta|^q and its gradient)
    needed = 8 * side * side * (1 + 8 + 8 + 1) + 16 * ((8 * 9 + 8) + (8 * 9 + 1))
    assert f"needs about {needed / 2**30:.1f} GB" in message
    assert f"largest layer '0' outputs (8, {side}, {side})" in message


def test_a_checkpoint_asking_for_a_huge_model_is_refused_before_building(tmp_path):
    path = tmp_path / "huge.safetensors"
    # as many tensors as the three layers hold (a weight and a bias each): a list longer
    # than that is refused before this check, by its length
    tensors = {f"t{i}": torch.zeros(1) for i in range(6)}
    save_file(tensors, str(path), {"pathlift.arch": "mlp", "pathlift.kwargs":
                                               json.dumps({"hidden": [200000, 200000]})})
    kind, grown_mb, message = refused(f"pathlift.models.load_model({str(path)!r})", tmp_path)
    assert kind == "MemoryLimitError" and grown_mb < 100
    params = 64 * 200000 + 200000 + 200000 * 200000 + 200000 + 200000 * 10 + 10
    assert f"'mlp' {{'hidden': [200000, 200000]}} needs about {params * 4 / 2**30:.1f} GB" \
        in message


def test_the_estimate_counts_parameters_and_outputs(monkeypatch):
    from pathlift.graph import graph_of
    from pathlift.graph.memory import estimate
    from pathlift.memory import MemoryLimitError

    model = mlp(64, (32, 16), 10)
    found = estimate(graph_of(model, (64,)))
    params = sum(p.numel() for p in model.parameters())
    assert found.parameters == 16 * params == 16 * (64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10)
    # input, flatten, linear 32, relu, linear 16, relu, linear 10
    assert found.activations == 8 * (64 + 64 + 32 + 32 + 16 + 16 + 10)
    assert (found.largest, found.largest_shape) == ("<input>", (64,))
    monkeypatch.setenv("PATHLIFT_MAX_MEMORY", f"{found.total - 1}")
    with pytest.raises(MemoryLimitError,
                       match=r"pathlift\.set_memory_limit or PATHLIFT_MAX_MEMORY"):
        graph_of(mlp(64, (32, 16), 10), (64,))
    monkeypatch.setenv("PATHLIFT_MAX_MEMORY", "1G")
    graph_of(mlp(64, (32, 16), 10), (64,))


# ------------------------------------------------------------------ inputs checked


def test_integer_weights_are_refused_not_cast(tmp_path):
    path = tmp_path / "int.safetensors"
    state = {k: v.to(torch.int64) if k == "1.weight" else v
             for k, v in mlp(4, (3,), 2).state_dict().items()}
    save_file(state, str(path), {"pathlift.arch": "mlp", "pathlift.kwargs": json.dumps(
        {"in_features": 4, "hidden": [3], "num_classes": 2})})
    with pytest.raises(InvalidParameterError, match=r"1.weight \(torch.int64\): integer"):
        load_model(path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_classes": [10]}, "num_classes=\\[10\\] for 'mlp': expected int"),
    ({"hidden": 16}, "hidden=16 for 'mlp': expected"),
    ({"hidden": [16, True]}, "hidden=\\[16, True\\]"),
    ({"width": 3}, "it takes only in_features, hidden, num_classes"),
])
def test_checkpoint_metadata_is_checked_against_the_constructor(tmp_path, kwargs, message):
    path = tmp_path / "bad.safetensors"
    tensors = {f"t{i}": torch.zeros(1) for i in range(6)}  # enough for the lists' lengths
    save_file(tensors, str(path), {"pathlift.arch": "mlp",
                                                "pathlift.kwargs": json.dumps(kwargs)})
    with pytest.raises(InvalidParameterError, match=message):
        load_model(path)


def test_list_kwargs_where_the_constructor_takes_a_sequence_load(tmp_path):
    model = mlp(4, (3, 5), 2)
    save_checkpoint(model, tmp_path / "ok.safetensors", "mlp", in_features=4, hidden=[3, 5],
                    num_classes=2)
    loaded, _ = load_model(tmp_path / "ok.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values(), strict=True))


def test_an_empty_checkpoint_says_so(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(InvalidParameterError, match="is empty \\(0 bytes\\)"):
        load_model(tmp_path / "empty.pt")


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_a_bad_batch_size_is_refused(batch_size):
    with pytest.raises(InvalidParameterError, match="batch_size must be a positive int"):
        loaders(load_digits(), batch_size)


def test_the_collective_timeout(monkeypatch):
    from datetime import timedelta

    from pathlift.distributed import DEFAULT_TIMEOUT, collective_timeout

    monkeypatch.delenv("PATHLIFT_TIMEOUT", raising=False)
    assert collective_timeout() == DEFAULT_TIMEOUT == timedelta(minutes=30)
    assert collective_timeout(90) == timedelta(seconds=90)
    monkeypatch.setenv("PATHLIFT_TIMEOUT", "45")
    assert collective_timeout() == timedelta(seconds=45)
    for bad in (0, -5, float("nan"), "soon"):
        with pytest.raises(InvalidParameterError, match="positive number of seconds"):
            collective_timeout(bad)


@pytest.fixture
def global_options():
    """The command line's --max-memory and --timeout set process-wide defaults: undo them."""
    from pathlift import set_memory_limit
    from pathlift.distributed import set_collective_timeout

    yield
    set_memory_limit(None)
    set_collective_timeout(None)


def test_the_max_memory_option_refuses_before_allocating(global_options, monkeypatch):
    from cli_runner import invoke
    from pathlift.graph import graph_of
    from pathlift.graph.memory import estimate
    from pathlift.models import small_cnn

    monkeypatch.delenv("PATHLIFT_MAX_MEMORY", raising=False)
    needed = estimate(graph_of(small_cnn(), (1, 8, 8))).total
    refused = invoke("--max-memory", str(needed - 1), "norm", "small_cnn")
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "limit set by pathlift --max-memory" in \
        refused.stderr
    assert invoke("--max-memory", str(needed), "norm", "small_cnn").exit_code == 0
    bad = invoke("--max-memory", "lots", "norm", "small_cnn")
    assert bad.exit_code == 2 and "'lots' is not a size" in bad.stderr


def test_the_timeout_option_sets_the_collective_timeout(global_options, monkeypatch):
    from datetime import timedelta

    from cli_runner import invoke
    from pathlift.distributed import collective_timeout

    monkeypatch.setenv("PATHLIFT_TIMEOUT", "45")
    assert invoke("--timeout", "7.5", "models").exit_code == 0
    assert collective_timeout() == timedelta(seconds=7.5)  # the option wins over the variable
    assert collective_timeout(3) == timedelta(seconds=3)  # an explicit argument wins over both
    for bad in ("0", "-2", "nan"):
        result = invoke("--timeout", bad, "models")
        assert result.exit_code == 2 and "--timeout': " in result.stderr
        assert "is not a finite number > 0" in result.stderr


def test_the_prune_command_refuses_a_resume_with_another_learning_rate(tmp_path):
    from cli_runner import invoke

    args = ["prune", "--model", "mlp", "--epochs", "2", "--rewind-epoch", "1", "--seeds", "1",
            "--amount", "0.8", "--method", "magnitude-global", "--out", str(tmp_path)]
    assert invoke(*args).exit_code == 0
    before = (tmp_path / "runs.csv").read_bytes()
    again = invoke(*args, "--lr", "0.5")
    assert again.exit_code == 2
    assert "other settings: lr was 0.05, now 0.5" in " ".join(again.output.split())
    assert (tmp_path / "runs.csv").read_bytes() == before
    bad = invoke(*args[:-1], str(tmp_path / "other"), "--batch-size", "0")
    assert bad.exit_code == 2 and "--batch-size': 0 is not an integer >= 1" in bad.output
    assert not (tmp_path / "other").exists()
