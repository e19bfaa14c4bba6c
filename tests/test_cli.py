"""The ``pathlift`` command's plumbing: list options, help, --version, --seed, --weights,
one-line errors with exit status 2, and output folders outside the source tree."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from pathlift.cli import app
from pathlift.cli_support import default_out, spread_list_values
from pathlift.errors import InvalidParameterError
from pathlift.lift import path_metric, path_norms
from pathlift.models import load_model, mlp, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
WIDE = {"COLUMNS": "200"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def norm_rows(output: str) -> dict[float, float]:
    """{q: log10} from the table printed by ``pathlift norm``."""
    rows = re.findall(r"│\s*([\d.]+)\s*│\s*\S+\s*│\s*(-?[\d.]+)\s*│", output)
    return {float(q): float(log10) for q, log10 in rows}


# ------------------------------------------------------------------------ list options


@pytest.mark.parametrize("args", [
    ["--input-shape", "64", "-q", "1", "2", "4"],
    ["--input-shape", "64", "-q", "1", "-q", "2", "-q", "4"],  # the repeated form
    ["-q", "1", "2", "4", "--input-shape", "64"],
])
def test_list_options_take_their_values_as_written(args):
    result = invoke("norm", "mlp", *args)
    assert result.exit_code == 0, result.output
    model, _ = load_model("mlp", seed=0)
    expected = {q: n.log10 for q, n in path_norms(model, (64,), (1.0, 2.0, 4.0)).items()}
    assert norm_rows(result.output) == pytest.approx(expected, abs=1e-6)


def test_an_argument_may_follow_a_numeric_list_option():
    result = invoke("norm", "--input-shape", "1", "8", "8", "-q", "1", "small_cnn")
    assert result.exit_code == 0, result.output
    assert "input (1, 8, 8)" in " ".join(result.output.split())


@pytest.mark.parametrize(("args", "expected"), [
    (["--input-shape", "3", "224", "224"],
     ["--input-shape", "3", "--input-shape", "224", "--input-shape", "224"]),
    (["-q", "-1", "-2", "--seed", "3"], ["-q", "-1", "-q", "-2", "--seed", "3"]),
    (["--input-shape=3", "32", "m"], ["--input-shape=3", "--input-shape", "32", "m"]),
    (["--method", "a", "b", "--", "--method", "c"],
     ["--method", "a", "--method", "b", "--", "--method", "c"]),
    (["--method", "a", "-x"], ["--method", "a", "-x"]),
    (["--input-shape"], ["--input-shape"]),
])
def test_spread_list_values(args, expected):
    items = {"--input-shape": int, "-q": float, "--method": str}
    assert spread_list_values(args, items) == expected


# ------------------------------------------------------------------------------ help

CALLBACKS = {info.name or info.callback.__name__: info.callback
             for info in app.registered_commands}
COMMANDS = sorted(CALLBACKS)


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)])
def test_help_reads_like_a_well_kept_cli(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output  # flags take no value
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage and re.search(r"\[OPTIONS\]", usage)
    if "<int>..." in result.output or "<float>..." in result.output or \
            "<str>..." in result.output:
        assert "--input-shape 3 224 224" in result.output  # how to pass several values


def test_usage_names_the_arguments_in_upper_case():
    result = invoke("metric", "--help")
    assert re.search(r"Usage: \S+ metric \[OPTIONS\] MODEL MODEL_B\s", result.output)


def test_every_command_summary_is_one_line_in_the_command_list():
    result = invoke("--help")
    for command, callback in CALLBACKS.items():
        summary = " ".join(callback.__doc__.split("\n\n")[0].split())
        assert re.search(rf"│ {re.escape(command)}\s+{re.escape(summary)}\s+│", result.output), \
            command


def test_version_prints_the_installed_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output.startswith(f"pathlift {importlib.metadata.version('pathlift')} ")
    assert f"torch {torch.__version__}" in result.output


# ---------------------------------------------------------------------------- errors


def test_a_missing_checkpoint_is_one_line_on_stderr_and_exit_status_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pathlift.cli", "norm",
                           str(tmp_path / "missing.safetensors")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"Error: no checkpoint file at '{tmp_path / 'missing.safetensors'}'"]


@pytest.mark.parametrize(("args", "message"), [
    (["norm", "mlp", "--input-shape", "a"], "Invalid value for '--input-shape'"),
    (["norm", "mlp", "-q", "-1"], "q must be in (0, inf)"),
    (["nrm"], "No such command 'nrm'. Did you mean 'norm'?"),
    (["depth", "--dtype", "float16"], "--dtype must be one of"),
    (["prune", "--model", "vgg16"], "cannot take an input of shape (1, 8, 8)"),
])
def test_user_errors_are_one_line_with_exit_status_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], lines
    assert "Traceback" not in result.output


def test_two_models_with_different_input_shapes_need_input_shape(tmp_path):
    path = save_checkpoint(mlp(), tmp_path / "a.safetensors", "mlp", input_shape=(64,))
    result = invoke("metric", str(path), "mlp")  # mlp's default input shape is (1, 8, 8)
    assert result.exit_code == 2
    assert "has input shape (64,)" in result.stderr and "give --input-shape" in result.stderr
    assert invoke("metric", str(path), "mlp", "--input-shape", "64").exit_code == 0


def test_debug_shows_the_error_itself(tmp_path):
    result = CliRunner().invoke(app, ["--debug", "norm", str(tmp_path / "missing.pt")])
    assert isinstance(result.exception, InvalidParameterError)
    assert result.exit_code == 1


# -------------------------------------------------------------------- seeds and weights


def test_seed_fixes_the_random_initialisation_of_an_architecture_name():
    outputs = {seed: norm_rows(invoke("norm", "mlp", "-q", "1", "--seed", seed).output)
               for seed in ("0", "1")}
    assert norm_rows(invoke("norm", "mlp", "-q", "1").output) == outputs["0"]  # default 0
    model, shape = load_model("mlp", seed=1)
    assert outputs["1"][1.0] == pytest.approx(path_norms(model, shape, (1.0,))[1.0].log10,
                                               abs=1e-6)
    assert outputs["0"] != outputs["1"]


def test_two_model_commands_take_weights_for_each_model(tmp_path):
    torch.manual_seed(0)
    a, b = mlp(), mlp()
    torch.save(a.state_dict(), tmp_path / "a.pt")
    torch.save(b.state_dict(), tmp_path / "b.pt")
    result = invoke("metric", "mlp", "mlp", "--weights", str(tmp_path / "a.pt"),
                    "--weights-b", str(tmp_path / "b.pt"))
    assert result.exit_code == 0, result.output
    expected = path_metric(a.eval(), b.eval(), (64,))
    assert f"log10 {expected.lower_log10:.6f}" in result.output
    for args in (["equivalent", "mlp", "mlp", "--weights-b", str(tmp_path / "b.pt")],
                 ["lipschitz", "mlp", "--other", "mlp", "--other-weights",
                  str(tmp_path / "b.pt")]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    assert "not equivalent" in invoke("equivalent", "mlp", "mlp", "--weights-b",
                                      str(tmp_path / "b.pt")).output
    assert "not equivalent" not in invoke("equivalent", "mlp", "mlp").output


def test_a_rescaled_checkpoint_keeps_its_input_shape(tmp_path, monkeypatch):
    """rescale at 3x32x32, then norm reads 3x32x32 from the file."""
    monkeypatch.chdir(tmp_path)
    out = "rescaled.safetensors"
    result = invoke("rescale", "resnet18", "--input-shape", "3", "32", "32", "--out", out)
    assert result.exit_code == 0, result.output
    model, shape = load_model(out)
    assert shape == (3, 32, 32)
    result = invoke("norm", out, "-q", "1")
    assert "input (3, 32, 32)" in " ".join(result.output.split())  # titles wrap
    assert norm_rows(result.output)[1.0] == pytest.approx(
        path_norms(model, (3, 32, 32), (1.0,))[1.0].log10, abs=1e-6)
    result = invoke("norm", out, "-q", "1", "--input-shape", "3", "16", "16")
    assert "input (3, 16, 16)" in " ".join(result.output.split())  # an explicit shape wins


# ---------------------------------------------------------------------- output folders


def _digest(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_outputs_default_to_a_new_folder_under_the_current_directory(tmp_path, monkeypatch):
    results = _digest(ROOT / "benchmarks" / "results")
    monkeypatch.chdir(tmp_path)
    runs = [
        ("prune", ["prune", "--model", "mlp", "--epochs", "2", "--rewind-epoch", "1",
                   "--seeds", "1", "--amount", "0.5", "--method", "magnitude-global"]),
        ("kron-bench", ["kron-bench", "--every", "80", "--batch", "8", "--repeats", "1",
                        "--no-vit"]),
        ("report", ["report", "--model", "mlp"]),
    ]
    for command, args in runs:
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        (folder,) = (tmp_path / "runs").glob(f"{command}-*")
        assert re.fullmatch(rf"{command}-\d{{8}}-\d{{6}}(-\d+)?", folder.name)
        assert any(folder.iterdir())
    assert _digest(ROOT / "benchmarks" / "results") == results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_default_out_never_reuses_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folders = [default_out("x") for _ in range(3)]
    assert len(set(folders)) == 3 and all(f.is_dir() for f in folders)
    assert all(f.parent == Path("runs") for f in folders)
