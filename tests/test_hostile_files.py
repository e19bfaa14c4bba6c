"""Hostile files, folders and caches (issue 29, part A): a file never runs code or
overwrites anything, a cache is trusted only when nobody else can write it, and nothing is
read or allocated past the memory limit. Each class is attacked with the audit's examples
and with attacks of the same class the audit did not list ("unlisted" below).

Code that would run if an attack succeeded writes a marker file; the tests check that it
is absent, so a regression shows as a file that appeared, not only as a message.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import resource
import stat
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from torch import nn

import pathlift.files
import warm_process
from cli_runner import invoke
from kron_fixtures import (  # noqa: F401
    isolated_kron_cache,
    kernel_child,
    quick_build,
)
from memory_growth import refused
from pathlift.data import load_data
from pathlift.errors import ArchitectureMismatchError, InvalidParameterError, UnsupportedModelError
from pathlift.files import FileSystemError, append_rows, write_text
from pathlift.graph import graph_of
from pathlift.jobs.prune import RunFolder
from pathlift.kron import cpu_kernel
from pathlift.lift import path_norm
from pathlift.memory import MemoryLimitError
from pathlift.models import (
    UntrustedArchitectureError,
    load_model,
    mlp,
    save_checkpoint,
)
from pathlift.symmetry import compare_models

PRUNE = ("--data", "digits", "--epochs", "2", "--rewind-epoch", "1", "--seeds", "1",
         "--amount", "0.5", "--method", "magnitude-global")


def _one_line_error(result) -> str:
    """The command failed as a user's error: exit status 2, one line, no traceback."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


# A child process: ``limits`` (RLIMIT_AS, as `ulimit -v`), then pathlift command lines
# (separated by THEN) run one after the other by the console script's entry; prints the exit
# status and the seconds each command took after the imports, and ends each command's
# stderr with a line END.
THEN = "--then--"
_CLI_CHILD = f"""
import sys, time
import pathlift.cli, pathlift.quant, pathlift.data
from pathlift.cli import app
from pathlift.cli_support import run
commands = [[]]
for arg in sys.argv[1:]:
    commands.append([]) if arg == {THEN!r} else commands[-1].append(arg)
for args in commands:
    start = time.perf_counter()
    try:
        run(app, args)
    except SystemExit as done:
        print(f"STATUS {{done.code}} {{time.perf_counter() - start:.3f}}", flush=True)
    print("END", file=sys.stderr, flush=True)
"""


def _limited_clis(commands: list[list[str]], cwd: Path, address_space: int = 4 << 30,
                  timeout: float = 120) -> list[tuple[int, float, str]]:
    """(exit status, seconds, stderr) of each ``pathlift ARGS`` of ``commands``, run one
    after the other in one child under `ulimit -v` (so they share its imports and load): a
    fork of the warm process (tests/warm_process.py), which takes the limit from its
    client."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    args = [arg for command in commands for arg in (THEN, *command)][1:]
    proc = subprocess.run([warm_process.python(), "-c", _CLI_CHILD, *args], cwd=cwd,
                          timeout=timeout, capture_output=True, text=True, preexec_fn=limit,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    status = [line.split() for line in proc.stdout.splitlines() if line.startswith("STATUS ")]
    errors = proc.stderr.split("END\n")
    assert len(status) == len(commands) and len(errors) > len(commands), \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    return [(int(code), float(seconds), err) for (_, code, seconds), err in
            zip(status, errors, strict=False)]


def _limited_cli(args: list[str], cwd: Path, address_space: int = 4 << 30,
                 timeout: float = 120) -> tuple[int, float, str]:
    """(exit status, seconds, stderr) of ``pathlift ARGS`` in a child under `ulimit -v`."""
    return _limited_clis([args], cwd, address_space, timeout)[0]


def _refused_as_promptly(args: list[str], baseline: list[str], cwd: Path) -> tuple[int, str]:
    """(exit status, stderr) of ``args``, after checking that it ended about as soon as
    ``baseline``, a command line refused at the same point for a plain reason (a folder, a
    missing file), timed in the same child before and after it: at most twice the slower
    baseline and half a second (a loaded machine slows both alike; a read that blocks on a
    FIFO, or one of a device's endless bytes, would not end)."""
    before, (code, seconds, stderr), after = _limited_clis([baseline, args, baseline], cwd)
    assert before[0] == after[0] == 2, before[2] + after[2]  # the baseline is refused too
    limit = 2 * max(before[1], after[1]) + 0.5
    assert seconds <= limit, f"took {seconds:.2f} s, the plain refusal {before[1]:.2f} s"
    return code, stderr


# ===================================================================== code execution


def _evil_safetensors(path: Path, arch: str, kwargs: dict) -> Path:
    save_file({"w": torch.zeros(1)}, str(path),
              {"pathlift.arch": arch, "pathlift.kwargs": json.dumps(kwargs)})
    return path


def _evil_pt(path: Path, arch: str, kwargs: dict) -> Path:
    torch.save({"arch": arch, "kwargs": kwargs, "state_dict": {"w": torch.zeros(1)}}, path)
    return path


def _code_execution_checkpoints(folder: Path) -> dict[str, tuple[Path, Path]]:
    """The audit's three checkpoints, each with the marker its command would create."""
    out = {}
    for name, make, arch, key in (
            ("getoutput.safetensors", _evil_safetensors, "subprocess:getoutput", "cmd"),
            ("system.safetensors", _evil_safetensors, "os:system", "command"),
            ("getoutput.pt", _evil_pt, "subprocess:getoutput", "cmd")):
        marker = folder / f"{name}.marker"
        out[name] = (make(folder / name, arch, {key: f"touch '{marker}'"}), marker)
    return out


@pytest.mark.parametrize("name", ["getoutput.safetensors", "system.safetensors",
                                  "getoutput.pt"])
def test_a_checkpoint_naming_a_command_never_runs_it(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    path, marker = _code_execution_checkpoints(tmp_path)[name]
    for args in (["summary", str(path)], ["prune", "--model", str(path), *PRUNE, "--out",
                                          str(tmp_path / "out")]):
        line = _one_line_error(invoke(*args))
        assert "does not run code that a file names" in line and "--weights" in line
        assert "--trust-arch" in line
    with pytest.raises(UntrustedArchitectureError, match=r"arch='(subprocess:getoutput|"
                                                         r"os:system)'"):
        load_model(path)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_checkpoint_naming_a_python_file_never_imports_it(tmp_path, monkeypatch):
    """Unlisted: module-level code runs at import, before anything is called."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "imported.marker"
    (tmp_path / "plant.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                       "def make():\n    pass\n")
    for path in (_evil_safetensors(tmp_path / "a.safetensors", "plant.py:make", {}),
                 _evil_pt(tmp_path / "b.pt", "plant:make", {})):
        with pytest.raises(UntrustedArchitectureError):
            load_model(path)
        _one_line_error(invoke("norm", str(path)))
        _one_line_error(invoke("rescale", str(path), "--out", "rescaled.safetensors"))
    assert not marker.exists() and not Path("rescaled.safetensors").exists()
    assert "plant" not in sys.modules


def test_the_architecture_of_a_weights_file_is_never_built(tmp_path, monkeypatch):
    """Unlisted: with a name typed by the user, the weights file's own arch is ignored
    (never imported); and save_like re-reading a file applies the same rule."""
    from pathlift.models import save_like

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "weights.marker"
    state = {k: v.contiguous() for k, v in mlp(4, (3,), 2).state_dict().items()}
    path = tmp_path / "w.safetensors"
    save_file(state, str(path), {"pathlift.arch": "os:system",
                                 "pathlift.kwargs": json.dumps({"command": f"touch {marker}"})})
    with pytest.raises(Exception, match="bad arguments"):  # mlp() takes no 'command'
        load_model("mlp", weights=path)
    with pytest.raises(UntrustedArchitectureError):
        save_like(mlp(4, (3,), 2), str(path), tmp_path / "copy.safetensors", (4,))
    assert not marker.exists()


@pytest.mark.parametrize("arch", ["\x1b[2J\nos:system", "res\x1b[2Jnet\n"])
def test_control_characters_of_a_file_are_quoted_in_the_message(tmp_path, arch):
    """Unlisted: an architecture name with a terminal escape and a newline (an import path,
    or an unknown name) is printed as a quoted Python string: one line, and no escape
    sequence reaches the terminal."""
    path = _evil_safetensors(tmp_path / "esc.safetensors", arch, {})
    line = _one_line_error(invoke("norm", str(path)))
    assert "\x1b" not in line and repr(arch) in line


def test_a_user_names_or_trusts_their_own_class(tmp_path, monkeypatch):
    """The ways the refusal points to: arch= / MODEL --weights FILE, and the opt-in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostile_test_nets.py").write_text(
        "from torch import nn\n\ndef tiny():\n"
        "    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))\n\n"
        "tiny.input_shape = (6,)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.manual_seed(3)
    model = importlib.import_module("hostile_test_nets").tiny()
    path = save_checkpoint(model, tmp_path / "mine.safetensors", "hostile_test_nets:tiny")
    with pytest.raises(UntrustedArchitectureError):
        load_model(path)
    expected = path_norm(model, (6,)).log10
    for loaded, shape in (load_model(path, arch="hostile_test_nets:tiny"),
                          load_model("hostile_test_nets:tiny", weights=path),
                          load_model(path, trust_arch=True)):
        assert shape == (6,) and path_norm(loaded, shape).log10 == pytest.approx(expected,
                                                                                abs=1e-12)
    for args in (["norm", "hostile_test_nets:tiny", "--weights", str(path), "-q", "1"],
                 ["--trust-arch", "norm", str(path), "-q", "1"]):
        result = invoke(*args)
        assert result.exit_code == 0 and f"{expected:.6f}" in result.stdout, result.output
    with pytest.raises(UntrustedArchitectureError):  # --trust-arch was for that command only
        load_model(path)
    with pytest.raises(ArchitectureMismatchError):  # a wrong name is caught by the keys
        load_model(path, arch="mlp")


# ===================================================================== overwrites


def test_a_symlinked_lock_leaves_its_target_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "sym").mkdir()
    (tmp_path / "sym" / ".lock").symlink_to(victim)
    line = _one_line_error(invoke("prune", "--model", "mlp", *PRUNE, "--out", "sym"))
    assert "symbolic link" in line and ".lock" in line
    with pytest.raises(FileSystemError, match="symbolic link"):
        RunFolder(tmp_path / "sym").open({"setting": 1})
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "sym" / ".lock").is_symlink()


def test_a_hard_linked_or_foreign_lock_leaves_its_file_unchanged(tmp_path):
    """Unlisted: a hard link to another file, and a file named .lock that is not
    pathlift's (its text is someone's), are refused, not truncated."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    linked, foreign = tmp_path / "linked", tmp_path / "foreign"
    for folder in (linked, foreign):
        folder.mkdir()
    os.link(victim, linked / ".lock")
    (foreign / ".lock").write_text("my notes\n")
    with pytest.raises(FileSystemError, match="2 names"):
        RunFolder(linked).open({"setting": 1})
    with pytest.raises(FileSystemError, match="not pathlift's lock"):
        RunFolder(foreign).open({"setting": 1})
    assert victim.read_text() == "precious\n" and (foreign / ".lock").read_text() == "my notes\n"
    with RunFolder(tmp_path / "own") as own:  # pathlift's own lock is reused
        own.open({"setting": 1})
    with RunFolder(tmp_path / "own") as own:
        own.open({"setting": 1})
        assert (tmp_path / "own" / ".lock").read_text().startswith(f"pid {os.getpid()} on ")


def test_temporary_files_of_other_programs_under_out_survive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    others = [tmp_path / "proj" / "src" / ".report.docx.tmp", tmp_path / "proj" / ".x.tmp",
              tmp_path / "proj" / "models" / ".seed0.abc.tmp"]
    for p in others:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("someone's work")
    result = invoke("prune", "--model", "mlp", *PRUNE, "--out", "proj")
    assert result.exit_code == 0, result.output
    assert all(p.read_text() == "someone's work" for p in others)
    assert not list((tmp_path / "proj").rglob(".pathlift-*.tmp"))


def test_an_output_csv_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    """Unlisted: a CSV pathlift appends to is read back and rewritten, so a link there
    (to a file elsewhere) is refused rather than replaced or read."""
    victim = tmp_path / "victim.csv"
    victim.write_text("a,b\n1,2\n")
    link = tmp_path / "log.csv"
    link.symlink_to(victim)
    with pytest.raises(FileSystemError, match="symbolic link"):
        append_rows(link, ["a", "b"], [[3, 4]])
    line = _one_line_error(invoke("quantize", "mlp", "--bits", "8", "--csv", str(link)))
    assert "symbolic link" in line
    assert victim.read_text() == "a,b\n1,2\n" and link.is_symlink()


def _table(stdout: str | bytes) -> str | bytes:
    """The results table ``pathlift prune`` prints (not its progress bar)."""
    start, end = ("test accuracy", "wrote") if isinstance(stdout, str) else \
        (b"test accuracy", b"wrote")
    assert start in stdout
    return stdout.split(start, 1)[1].split(end)[0]


def test_a_legal_252_character_name_is_written(tmp_path):
    name = "n" * (252 - len(".safetensors")) + ".safetensors"
    path = save_checkpoint(mlp(4, (3,), 2), tmp_path / name, "mlp", input_shape=(4,),
                           in_features=4, hidden=[3], num_classes=2)
    assert path.name == name and len(name) == 252
    assert load_model(path)[1] == (4,)
    text = tmp_path / ("t" * 255)
    assert write_text(text, "x").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, text.name])


def test_a_300_character_out_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line_error(invoke("prune", "--model", "mlp", *PRUNE, "--out", "o" * 300))
    assert "name is too long" in line


def test_a_non_utf8_out_resumes_without_a_misleading_message(tmp_path, monkeypatch):
    """A folder name that is not UTF-8 (as a shell passes its bytes): the second run
    resumes from the dense weights the first wrote there, instead of calling them damaged."""
    from pathlift.jobs.prune import PruneConfig, prune_experiment

    monkeypatch.chdir(tmp_path)
    out = os.fsdecode(b"out\xff")
    config = PruneConfig((0.5,), ("magnitude-global",), (0,), 2, 1)
    first = prune_experiment("mlp", "digits", config, out)
    dense = Path(out) / "dense" / "seed0-trained.safetensors"
    before = dense.read_bytes()
    again = prune_experiment("mlp", "digits", config, out)
    assert again.result.runs == first.result.runs and dense.read_bytes() == before
    # the command resumes it too, and prints the path with its undecodable byte escaped
    # (as the shell's $'out\xff' writes it) even where stdout is strict UTF-8
    proc = subprocess.run([Path(sys.executable).with_name("pathlift"), "prune", "--model",
                           "mlp", *PRUNE, "--out", b"out\xff"], cwd=tmp_path,
                          capture_output=True, timeout=300,
                          env=os.environ | {"PYTHONIOENCODING": "utf-8:strict"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"wrote out\\xff/runs.csv" in proc.stdout and b"damaged" not in proc.stderr


def test_a_failed_start_without_out_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def full_disk(path, value, indent=1):
        raise pathlift.files.describe(OSError(28, "No space left on device"), path, "write")

    monkeypatch.setattr("pathlift.jobs.prune.results.write_json", full_disk)
    line = _one_line_error(invoke("prune", "--model", "mlp", *PRUNE))
    assert "disk is full" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args", [("kron-bench", "--every", "0"),
                                  ("kron-bench", "--batch", "0", "--no-vit"),
                                  ("kron-design", "64", "64", "--batch", "0")])
def test_a_refused_command_line_leaves_no_run_folder(args, tmp_path, monkeypatch):
    """kron-bench made runs/kron-bench-TIMESTAMP before its arguments were checked."""
    monkeypatch.chdir(tmp_path)
    _one_line_error(invoke(*args))
    assert not (tmp_path / "runs").exists()


def test_a_finished_read_only_folder_is_summarised_again(tmp_path, monkeypatch):
    """The tests run as root, for whom chmod does not make a folder read-only: the read-only
    file system is simulated (EROFS on every open for writing and every atomic write)."""
    monkeypatch.chdir(tmp_path)
    first = invoke("prune", "--model", "mlp", *PRUNE, "--out", "done")
    assert first.exit_code == 0, first.output
    runs = Path("done/runs.csv")
    finished = runs.read_bytes()
    runs.write_bytes(finished.splitlines(keepends=True)[0])  # the header only: runs missing
    with_missing_runs = {p: p.read_bytes() for p in Path("done").rglob("*") if p.is_file()}

    def read_only(*args, **kwargs):
        raise pathlift.files.describe(OSError(30, "Read-only file system"), "done", "write")

    monkeypatch.setattr("pathlift.jobs.prune.results.open_own", read_only)
    monkeypatch.setattr(pathlift.files, "atomic_write", read_only)
    start = time.perf_counter()
    line = _one_line_error(invoke("prune", "--model", "mlp", *PRUNE, "--out", "done"))
    assert "read-only and 2 of 2 runs are not done" in line
    assert time.perf_counter() - start < 30  # refused before training anything
    assert {p: p.read_bytes() for p in Path("done").rglob("*") if p.is_file()} == \
        with_missing_runs
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    runs.write_bytes(finished)
    monkeypatch.setattr("pathlift.jobs.prune.results.open_own", read_only)
    monkeypatch.setattr(pathlift.files, "atomic_write", read_only)
    again = invoke("prune", "--model", "mlp", *PRUNE, "--out", "done")
    assert again.exit_code == 0, again.output
    assert _table(first.stdout) == _table(again.stdout)


# ===================================================================== resources


@pytest.mark.parametrize("kind", ["/dev/full", "fifo"])
def test_a_device_or_fifo_as_csv_is_refused_as_soon_as_a_folder(tmp_path, kind):
    target = kind
    if kind == "fifo":
        target = str(tmp_path / "pipe.csv")
        os.mkfifo(target)
    (tmp_path / "folder.csv").mkdir()
    quantize = ["quantize", "mlp", "--bits", "8", "--csv"]
    code, stderr = _refused_as_promptly([*quantize, target], [*quantize, "folder.csv"],
                                        tmp_path)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "not a regular file" in lines[0], stderr
    assert kind in lines[0].replace("FIFO", "fifo"), lines[0]


@pytest.mark.parametrize("kind", ["fifo", "device link"])
def test_a_fifo_or_a_device_as_data_is_refused_at_once(tmp_path, kind):
    """Unlisted: the same as input data (a FIFO named data.csv; a link to /dev/zero)."""
    target = tmp_path / "data.csv"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    code, stderr = _refused_as_promptly(["bounds", "mlp", "--data", str(target)],
                                        ["bounds", "mlp", "--data", "missing.csv"], tmp_path)
    assert code == 2 and "not a regular file" in stderr, stderr
    assert ("FIFO" if kind == "fifo" else "character device") in stderr, stderr
    with pytest.raises(FileSystemError, match="not a regular file"):
        load_data(str(target))


def _deflated_copy(source: Path, target: Path) -> Path:
    """``source`` (a zip archive) with every entry deflated: a .pt torch.load still reads."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            entry.compress_type = zipfile.ZIP_DEFLATED
            with src.open(info) as r, dst.open(entry, "w") as w:
                while chunk := r.read(1 << 20):
                    w.write(chunk)
    return target


def test_a_deflate_bomb_pt_is_refused_before_it_is_unpacked(tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save({"state_dict": {"w": torch.zeros(1 << 24)}, "arch": "mlp"}, plain)  # 64 MiB
    bomb = _deflated_copy(plain, tmp_path / "bomb.pt")
    plain.unlink()
    assert bomb.stat().st_size < 200_000  # a ratio above 300:1, as the audit's 1 MB -> 1 GiB
    kind, grown, message = refused(f"pathlift.models.read_checkpoint({str(bomb)!r})",
                                    tmp_path, "32M")
    assert kind == "MemoryLimitError" and grown < 24, message
    assert "unpacking" in message and "bomb.pt" in message
    assert torch.load(bomb, weights_only=True)["state_dict"]["w"].shape == (1 << 24,)  # real


def test_a_deflate_bomb_npz_is_refused_before_it_is_unpacked(tmp_path):
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, x=np.zeros((1 << 20, 8)), y=np.zeros(1 << 20))  # 72 MiB
    assert bomb.stat().st_size < 200_000
    kind, grown, message = refused(f"pathlift.data.load_data({str(bomb)!r})", tmp_path, "32M")
    assert kind == "MemoryLimitError" and grown < 24 and "unpacking" in message, message


def test_an_npz_array_declaring_more_than_it_holds_is_refused(tmp_path):
    """Unlisted: numpy allocates what an .npy header declares before reading it."""
    path = tmp_path / "liar.npz"
    np.savez(path, x=np.zeros((4, 3)), y=np.zeros(4))
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    header, lie = b"(4, 3), }", b"(10000000000000, 3), }"  # same length: in the padding
    at = entries["x.npy"].index(header)
    assert entries["x.npy"][at + len(header):at + len(lie)] == b" " * (len(lie) - len(header))
    entries["x.npy"] = entries["x.npy"][:at] + lie + entries["x.npy"][at + len(lie):]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    with pytest.raises(InvalidParameterError, match=r"declares .* but holds"):
        load_data(str(path))


def _png(path: Path, width: int, height: int, text_chunk: bytes = b"") -> Path:
    """A greyscale PNG of zeros, compressed row by row (no full image in memory)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + (zlib.crc32(kind + data) & 0xFFFFFFFF).to_bytes(4, "big"))

    pack = zlib.compressobj(9)
    row = bytes(width + 1)
    body = b"".join(pack.compress(row) for _ in range(height)) + pack.flush()
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + text_chunk
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def _image_folder(tmp_path: Path, big: Path) -> Path:
    folder = tmp_path / "images"
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        _png(folder / label / "small.png", 8, 8)
    big.rename(folder / "a" / big.name)
    return folder


def test_a_png_decompression_bomb_is_one_line(tmp_path):
    folder = _image_folder(tmp_path, _png(tmp_path / "bomb.png", 20000, 20000))
    assert (folder / "a" / "bomb.png").stat().st_size < 1_000_000  # 400 M pixels
    code, _, stderr = _limited_cli(["bounds", "mlp", "--data", str(folder)], tmp_path)
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "decompression bomb" in stderr and "bomb.png" in stderr


def test_an_image_over_the_memory_limit_or_a_text_bomb_is_refused(tmp_path):
    """Unlisted: 81 M pixels (under Pillow's own limit) refused by --max-memory before it
    is decoded; a 64 MiB compressed text chunk refused by Pillow's text limit."""
    folder = _image_folder(tmp_path, _png(tmp_path / "large.png", 9000, 9000))
    kind, grown, message = refused(f"pathlift.data.load_data({str(folder)!r})", tmp_path,
                                    "256M")
    assert kind == "MemoryLimitError" and grown < 64 and "large.png" in message, message
    text = b"k\0\0" + zlib.compress(bytes(64 << 20), 9)
    chunk = (len(text).to_bytes(4, "big") + b"zTXt" + text
             + (zlib.crc32(b"zTXt" + text) & 0xFFFFFFFF).to_bytes(4, "big"))
    (folder / "a" / "large.png").unlink()
    _png(folder / "a" / "text.png", 8, 8, chunk)
    result = invoke("bounds", "mlp", "--data", str(folder))
    assert "text.png" in _one_line_error(result) and "too large" in result.stderr


def _maxpool_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, padding=1))


def test_the_max_pool_probe_over_the_limit_is_refused_without_allocating(tmp_path):
    call = ("pathlift.lift.path_norm(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), "
            "nn.MaxPool2d(2, padding=1)), (1, 20000, 20000))")
    kind, grown, message = refused(call, tmp_path, "1G")
    # a full-size probe alone is 20000^2 float32 = 1.5 GiB
    assert kind == "MemoryLimitError" and grown < 100, message


@settings(max_examples=60, deadline=None)
@given(sides=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dilation=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)), ceil=st.booleans())
def test_the_padding_probe_agrees_with_a_full_size_one(sides, kernel, stride, dilation,
                                                       padding, ceil):
    """The max-pool check (a window only in the padding) probes one dimension at a time;
    it must agree with the op run on a full-size input of zeros (-inf in the output)."""
    pool = nn.MaxPool2d(kernel, stride, padding, dilation, ceil_mode=ceil)
    try:
        full = pool(torch.zeros(1, 1, *sides))
    except RuntimeError:
        return  # a geometry torch itself refuses
    try:
        graph_of(nn.Sequential(pool), (1, *sides))
        refused = False
    except UnsupportedModelError as err:
        refused = "entirely in the padding" in str(err)
    assert refused == bool(torch.isinf(full).any())


def test_a_model_factory_with_a_huge_class_count_is_refused_before_building(tmp_path):
    kind, grown, message = refused(
        "pathlift.models.model_factory('small_cnn', num_classes=10**12)", tmp_path, "8G")
    assert kind == "MemoryLimitError" and grown < 100 and "num_classes" in message, message


def test_a_kron_chain_larger_than_its_factors_is_refused_before_building(tmp_path):
    """Unlisted: the chain saved in a checkpoint sizes the KSLinear it rebuilds."""
    from pathlift.kron import KSLinear, monarch

    net = nn.Sequential(nn.Flatten(), KSLinear(monarch(16, 16, 4)))
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    state["1.chain"] = torch.tensor([[1, 100000, 100000, 1]])
    path = tmp_path / "chain.safetensors"
    save_file(state, str(path), {"pathlift.arch": "mlp", "pathlift.kwargs": json.dumps(
        {"in_features": 16, "hidden": [], "num_classes": 16})})
    kind, grown, message = refused(f"pathlift.models.load_model({str(path)!r})", tmp_path,
                                    "8G")
    assert kind == "ArchitectureMismatchError" and grown < 100, message
    assert "saved chain" in message


@pytest.mark.parametrize(("arch", "kwargs", "expected"), [
    ("mobilenet_relu", {"num_classes": -1}, "negative dimension"),
    ("unet", {"depth": 70}, "overflowed"),
    ("mlp", {"hidden": [10**12]}, "needs about")])
def test_constructor_arguments_of_a_file_are_sized_before_building(tmp_path, arch, kwargs,
                                                                   expected):
    """Unlisted: sizes in a checkpoint's constructor arguments that torch cannot build
    (negative, overflowing) or that exceed the limit are one line, nothing allocated."""
    path = _evil_safetensors(tmp_path / "k.safetensors", arch, kwargs)
    line = _one_line_error(invoke("summary", str(path)))
    assert expected in line and arch in line


def test_a_huge_sample_count_is_refused_before_drawing(tmp_path):
    with pytest.raises(MemoryLimitError, match="2,000,000,000 random inputs"):
        compare_models(mlp(), mlp(), (1, 8, 8), samples=2_000_000_000)
    line = _one_line_error(invoke("quantize", "mlp", "--bits", "8", "--samples",
                                  "2000000000"))
    assert "random inputs" in line and "fewer samples" in line


# --------------------------------------------------------------------- mixed dtypes


def test_a_float64_tensor_among_float32_ones_is_never_rounded(tmp_path):
    """The audit's mixed checkpoint: its path-norm is about 1e-47 (below float32's smallest
    subnormal), so rounding into a float32 model gave 0."""
    torch.manual_seed(0)
    model = mlp(4, (3,), 2)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    w1 = torch.rand(3, 4, dtype=torch.float64) * 1e-47
    state["1.weight"] = w1
    state["1.bias"].zero_()
    state["3.bias"].zero_()
    path = tmp_path / "mixed.safetensors"
    save_file(state, str(path), {"pathlift.arch": "mlp", "pathlift.kwargs": json.dumps(
        {"in_features": 4, "hidden": [3], "num_classes": 2})})
    loaded, _ = load_model(path)
    assert {p.dtype for p in loaded.parameters()} == {torch.float64}
    assert torch.equal(loaded.state_dict()["1.weight"], w1)
    # by hand: sum over outputs of |W2| |W1| 1 (biases are zero), in float64
    ones = torch.ones(4, dtype=torch.float64)
    by_hand = float((state["3.weight"].double().abs() @ w1.abs() @ ones).sum())
    assert 1e-49 < by_hand < 1e-46
    assert path_norm(loaded, (4,)).log10 == pytest.approx(np.log10(by_hand), abs=1e-9)


def test_half_and_bfloat16_tensors_load_exactly_into_float32(tmp_path):
    """Unlisted: neither float16 nor bfloat16 holds the other, so the widest exact dtype is
    float32; every value loads as it is."""
    model = mlp(4, (3,), 2)
    state = {k: v.to(torch.float16 if k.startswith("1.") else torch.bfloat16)
             for k, v in model.state_dict().items()}
    path = tmp_path / "halves.safetensors"
    save_file(state, str(path), {"pathlift.arch": "mlp", "pathlift.kwargs": json.dumps(
        {"in_features": 4, "hidden": [3], "num_classes": 2})})
    loaded, _ = load_model(path)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, state[k].float()), k


# ===================================================================== the kernel cache

_POISON = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void poison(void) {
    const char *marker = getenv("PATHLIFT_TEST_MARKER");
    FILE *f = marker ? fopen(marker, "w") : NULL;
    if (f) { fputs("pwned", f); fclose(f); }
}
int ks_has_bf16(void) { return 0; }
"""

def _plant(folder: Path, tmp_path: Path, *, library_as_link: bool = False) -> None:
    """A library that writes the marker when loaded, recorded under the name the float32
    kernel is looked up by, with its true size and digest."""
    compiler = cpu_kernel._compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    src, built = tmp_path / "poison.c", tmp_path / "poison.so"
    src.write_text(_POISON)
    subprocess.run([compiler, "-shared", "-fPIC", str(src), "-o", str(built)], check=True)
    data = built.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = cpu_kernel._key("float", compiler, (*cpu_kernel.build_flags(), "-Dreal=float"))
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"ks_fused_float_{key}_{digest[:12]}.so"
    if library_as_link:
        library.symlink_to(built)
    else:
        library.write_bytes(data)
    (folder / f"ks_fused_float_{key}.json").write_text(json.dumps(
        {"file": library.name, "size": len(data), "sha256": digest}))


@pytest.mark.parametrize("poison", ["group-writable folder", "world-writable folder",
                                    "another user's folder", "folder is a link",
                                    "library is a link"])
@pytest.mark.usefixtures("quick_build")
def test_a_poisoned_kernel_cache_is_never_loaded(tmp_path, poison):
    root, marker = tmp_path / "cache", tmp_path / "marker"
    folder = root / "kron"
    if poison == "folder is a link":
        _plant(tmp_path / "elsewhere", tmp_path)
        (tmp_path / "elsewhere").chmod(0o700)
        root.mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        _plant(folder, tmp_path, library_as_link=poison == "library is a link")
        folder.chmod({"group-writable folder": 0o770, "world-writable folder": 0o777}
                     .get(poison, 0o700))
        if poison == "another user's folder":
            os.chown(folder, 54321, -1)
    result = kernel_child(root, PATHLIFT_TEST_MARKER=str(marker))
    assert not marker.exists(), poison
    assert result["kernel"] and result["error"] <= 1e-5
    untrusted = poison != "library is a link"  # then the folder is fine: rebuilt in it
    assert sum("unusable" in w for w in result["warnings"]) == (1 if untrusted else 0), result


@pytest.mark.usefixtures("quick_build")
def test_a_cached_library_missing_a_symbol_is_rebuilt_not_raised(tmp_path):
    """The audit's raw AttributeError: a recorded library (the user's own, in a trusted
    folder) without the kernel's entry points."""
    root = tmp_path / "cache"
    _plant(root / "kron", tmp_path)  # the user's own (trusted) folder: it is loaded
    (root / "kron").chmod(0o700)
    result = kernel_child(root, PATHLIFT_TEST_MARKER=str(tmp_path / "unused"))
    assert result["kernel"] and result["error"] <= 1e-5 and result["warnings"] == []


def test_every_file_reader_refuses_a_fifo_without_blocking(tmp_path):
    """Unlisted: each of pathlift's readers of a path (checkpoint, run folder files, CSV
    appends) refuses a FIFO at once."""
    from pathlift.models import read_checkpoint

    for name in ("a.safetensors", "b.pt", "c.csv"):
        os.mkfifo(tmp_path / name)
    start = time.perf_counter()
    with pytest.raises(FileSystemError, match="FIFO"):
        read_checkpoint(tmp_path / "a.safetensors")
    with pytest.raises(FileSystemError, match="FIFO"):
        read_checkpoint(tmp_path / "b.pt")
    with pytest.raises(FileSystemError, match="FIFO"):
        append_rows(tmp_path / "c.csv", ["a"], [[1]])
    run = tmp_path / "run"
    run.mkdir()  # an existing folder: kept after the first open
    with RunFolder(run) as folder:
        folder.open({"setting": 1})
    (run / "runs.csv").unlink(missing_ok=True)
    os.mkfifo(run / "runs.csv")
    with pytest.raises(FileSystemError, match="FIFO"), RunFolder(run) as folder:
        folder.open({"setting": 1})
    assert time.perf_counter() - start < 5
    assert stat.S_ISFIFO((tmp_path / "c.csv").stat().st_mode)
