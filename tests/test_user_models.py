"""Your model and your data, end to end: every model-taking command with a built-in name, a
checkpoint, module:callable and path/to/file.py:callable; user data as .npz, CSV and an
image folder; a BatchNorm model through prune and report; bounds equal to the Python API."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import user_zoo
from cli_runner import invoke
from pathlift.bounds import (
    architecture_constants,
    cross_entropy_gap_log10,
    generalization_bounds,
    rademacher_peeling,
    sigma_of,
)
from pathlift.data import load_data, loaders
from pathlift.data.training import train_classifier
from pathlift.errors import (
    ArchitectureMismatchError,
    InvalidParameterError,
    ShapeError,
    UnsupportedModelError,
)
from pathlift.graph.ops import supported_summary
from pathlift.lift import path_norm
from pathlift.models import get_model, load_model, save_checkpoint
from pathlift.report import run_report
from user_files import MODULE, write_project

ZOO = Path(__file__).with_name("user_zoo.py")
SPECS = {"name": "mlp", "module": f"{MODULE}:relu_mlp", "file": "lib/nets.py:Net",
         "checkpoint": "relu_mlp.safetensors"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    write_project(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        torch.manual_seed(0)
        save_checkpoint(get_model(f"{MODULE}:relu_mlp"), "relu_mlp.safetensors",
                        f"{MODULE}:relu_mlp", input_shape=(20,))
    return folder


@pytest.fixture
def in_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(project)
    return project


def _ok(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, f"pathlift {' '.join(args)}:\n{result.output}"
    return " ".join(result.stdout.split())


@pytest.mark.parametrize("kind", SPECS)
def test_every_model_command_takes_every_kind_of_model(kind: str, in_project: Path) -> None:
    spec = SPECS[kind]
    model, shape = load_model(spec, seed=0)
    expected = path_norm(model, shape).log10
    assert f"{expected:.6f}" in _ok("norm", spec, "-q", "1")
    assert f"{expected:.6f}" in _ok("summary", spec)  # ||Phi||_1 row
    assert f"{expected:.6f}" in _ok("lipschitz", spec)  # ||Phi||_{1,1}
    assert "d lower" in _ok("metric", spec, spec)
    assert "equivalent" in _ok("equivalent", spec, spec)
    for command in ("rescale", "normalize"):  # both keep the function and ||Phi||_1
        _ok(command, spec, "--out", f"{command}_{kind}.safetensors")
        rewritten, same_shape = load_model(f"{command}_{kind}.safetensors")
        assert same_shape == shape
        assert path_norm(rewritten, shape).log10 == pytest.approx(expected, abs=1e-6)  # float32
    assert "quantised towards zero" in _ok("quantize", spec, "--bits", "8")


@pytest.mark.parametrize(("spec", "data"), [
    ("relu_mlp.safetensors", "data.npz"), ("lib/nets.py:Net", "data.csv"),
    (f"{MODULE}:bn_cnn", "images"), ("mlp", "digits")])
def test_data_commands_take_every_kind_of_data(spec: str, data: str, in_project: Path) -> None:
    split = load_data(data)
    model, shape = load_model(spec, split.input_shape, seed=0)
    bounds = generalization_bounds(model, shape, *loaders(split, 256, 0))
    out = _ok("bounds", spec, "--data", data)
    assert f"n = {len(split.train)}, log10 ||Phi||_1 = {bounds.path_norm_log10:.3f}" in out
    assert f"test {bounds.measured.test_error:.4f}" in out
    assert "quantised towards zero" in _ok("quantize", spec, "--data", data, "--bits", "8")


def _bounds_rows(out: str) -> dict[str, tuple[float, float]]:
    """{theorem: (log10 Rademacher, log10 bound)} from the table of ``pathlift bounds``."""
    return {name: (float(rad), float(bound)) for name, rad, bound in
            re.findall(r"│ (Thm [\d.C]+)\s+│\s+(-?[\d.]+)\s+│\s+(-?[\d.]+)\s+│", out)}


def test_bounds_of_a_model_trained_here_equal_the_python_api(in_project: Path) -> None:
    split = load_data("data.npz", seed=3, normalize="standard")
    train, test = loaders(split, batch_size=32, seed=3)
    torch.manual_seed(0)
    model = get_model(f"{MODULE}:relu_mlp")
    train_classifier(model, train, epochs=20, lr=0.05, momentum=0.9, progress=False, seed=0)
    save_checkpoint(model, "trained.pt", f"{MODULE}:relu_mlp", input_shape=(20,))
    result = invoke("bounds", "trained.pt", "--data", "data.npz", "--seed", "3",
                    "--normalize", "standard")
    assert result.exit_code == 0, result.output
    rows = _bounds_rows(result.stdout)
    python = generalization_bounds(model.eval(), (20,), train, test)
    assert python.measured.train_accuracy > 0.9  # it trained
    for bound, log10 in zip(python.rademacher, python.cross_entropy_log10, strict=True):
        assert rows[bound.theorem] == pytest.approx((bound.log10, log10), abs=6e-4)
    # the same Thm 4.4.1 numbers a third way: sigma from the raw training tensor
    x_train = split.train.tensors[0]
    c = architecture_constants(model, (20,))
    by_hand = rademacher_peeling(c, sigma_of(x_train).peeling, path_norm(model, (20,)).log10)
    assert rows["Thm 4.4.1"] == pytest.approx(
        (by_hand.log10, cross_entropy_gap_log10(by_hand, len(x_train))), abs=6e-4)


def test_a_batchnorm_user_model_through_prune_and_report(in_project: Path) -> None:
    spec = f"{MODULE}:bn_cnn"
    out = _ok("prune", "--model", spec, "--data", "images", "--epochs", "2", "--rewind-epoch",
              "1", "--seeds", "1", "--amount", "0.5", "--method", "magnitude-global",
              "--out", "pruned")
    assert "eval mode" in out and Path("pruned/runs.csv").is_file()
    out = _ok("report", "--model", spec, "--data", "images", "--epochs", "2", "--out", "rep")
    assert "eval mode" in out
    saved = json.loads(Path("rep/report.json").read_text())
    md = Path("rep/report.md").read_text()
    assert re.search(rf"\| 1 \| \S+ \| {saved['path_norm_log10']['1']:.3f} \|", md)
    assert saved["bounds"]["n_train"] == len(load_data("images").train)
    assert "## Pruning summary" in md and "eval mode" in md


def test_run_report_measures_a_user_module_without_changing_it(in_project: Path,
                                                               tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = get_model(f"{MODULE}:bn_cnn").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    split = load_data("images")
    result = run_report(tmp_path, model=model, data=split, epochs=1, progress=False)
    assert model.training and all(torch.equal(before[k], v)
                                  for k, v in model.state_dict().items())
    measured = result.model
    assert result.path_norm_log10[1.0] == pytest.approx(
        path_norm(measured, (1, 8, 8)).log10, abs=1e-12)
    bounds = generalization_bounds(measured, (1, 8, 8), *loaders(split, 64, 0))
    assert result.report.bounds.cross_entropy_log10 == pytest.approx(
        bounds.cross_entropy_log10, abs=1e-12)


# ----------------------------------------------------------------------- checkpoints


def test_save_checkpoint_names_a_user_class_by_import_path(in_project: Path) -> None:
    model = get_model("lib/nets.py:Net", hidden=5)
    path = save_checkpoint(model, "net.safetensors", hidden=5)  # arch: the class's path
    loaded, shape = load_model(path)
    assert type(loaded).__name__ == "Net" and shape == (20,)
    x = torch.randn(4, 20)
    assert torch.equal(loaded(x), model.eval()(x))


def test_save_checkpoint_checks_the_weights_load_before_writing(in_project: Path) -> None:
    model = get_model(f"{MODULE}:bn_cnn")
    with pytest.raises(ArchitectureMismatchError, match="does not fit"):
        save_checkpoint(model, "wrong.safetensors", "mlp")
    with pytest.raises(ArchitectureMismatchError):  # an nn.Sequential cannot be rebuilt
        save_checkpoint(model, "wrong.safetensors")
    assert not Path("wrong.safetensors").exists()


def test_a_class_defined_in_a_script_cannot_be_named(in_project: Path) -> None:
    class Local(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

    with pytest.raises(InvalidParameterError, match="cannot name it"):
        save_checkpoint(Local(), "local.safetensors")


def test_a_factory_without_input_shape_asks_for_one(in_project: Path) -> None:
    Path("noshape.py").write_text("from torch import nn\n\ndef make():\n"
                                  "    return nn.Sequential(nn.Linear(5, 2))\n")
    result = invoke("norm", "noshape.py:make")
    assert result.exit_code == 2 and "give --input-shape" in result.stderr
    assert invoke("norm", "noshape.py:make", "--input-shape", "5").exit_code == 0


# ----------------------------------------------------------------------- refusals


def test_a_transformer_is_refused_once_per_cause_with_the_supported_ops_once() -> None:
    """LayerNorm, the attention products, softmax and GELU: each cause on one line (the
    nodes sharing it counted), then the op table's supported operations, once."""
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(user_zoo.tiny_transformer(), (6, 4))
    *causes, supported = str(info.value).splitlines()[1:]
    for op, count in (("LayerNorm", 2), ("matmul", 2), ("softmax", 1), ("GELU", 1)):
        [line] = [c for c in causes if f"({op})" in c]
        assert line.lstrip().startswith(f"{count} nodes" if count > 1 else "node ")
    assert len(causes) == 4 and supported == f"  supported: {supported_summary()}"
    assert "Linear" in supported and "LayerNorm" not in supported
    result = invoke("norm", f"{ZOO}:tiny_transformer")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.count("pooling:") == 1
    summary = invoke("summary", f"{ZOO}:tiny_transformer")
    assert summary.exit_code == 1 and summary.stdout.count("pooling:") == 1


# ----------------------------------------------------------------------- several outputs


def _zoo(name: str) -> str:
    return f"{ZOO}:{name}"


def _refused(*args: str) -> str:
    """The one-line error of a refused command line (exit status 2)."""
    result = invoke(*args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    return result.stderr


class _Logits(torch.nn.Module):
    """The (logits, features) model as its user would cut it: the logits branch only."""

    def __init__(self, model: user_zoo.LogitsAndFeatures):
        super().__init__()
        self.body, self.fc = model.body, model.fc

    def forward(self, x):
        return self.fc(self.body(x))


def test_a_logits_and_features_model_is_bounded_on_the_output_it_names(in_project: Path
                                                                        ) -> None:
    spec, data = _zoo("logits_and_features"), "images3.npz"
    assert "0: (3,), 1: (5,)" in _refused("bounds", spec, "--data", data)  # which, and how
    assert "--output" in _refused("bounds", spec, "--data", data)
    assert "5 values per sample" in _refused("bounds", spec, "--data", data, "--output", "1")
    assert "positions 0 to 1" in _refused("bounds", spec, "--data", data, "--output", "2")
    model, shape = load_model(spec, seed=0)
    split = load_data(data)
    want = generalization_bounds(_Logits(model), shape, *loaders(split, 256, 0))
    got = generalization_bounds(model, shape, *loaders(split, 256, 0), outputs=0)
    assert got.path_norm_log10 == pytest.approx(want.path_norm_log10, abs=1e-12)
    assert got.cross_entropy_log10 == pytest.approx(want.cross_entropy_log10, abs=1e-12)
    assert got.measured == want.measured and got.constants.d_out == 3
    out = _ok("bounds", spec, "--data", data, "--output", "0")
    assert f"log10 ||Phi||_1 = {want.path_norm_log10:.3f}" in out
    assert f"test {want.measured.test_error:.4f}" in out
    with pytest.raises(ShapeError, match="2 outputs"):
        generalization_bounds(model, shape, *loaders(split, 256, 0))


def test_a_unet_is_refused_by_bounds_and_report_and_its_label_head_is_bounded(
        in_project: Path) -> None:
    """A U-Net's per-pixel output is not one logit per class: a typed refusal, in one line,
    from Python, bounds and report; with a label head, --output label is bounded (and
    equals the Python API), --output mask refused."""
    data = "images3.npz"
    split = load_data(data)
    unet, shape = load_model(_zoo("unet"), seed=0)
    with pytest.raises(ShapeError, match="64 values per sample"):
        generalization_bounds(unet, shape, *loaders(split, 256, 0))
    for command in (("bounds", _zoo("unet"), "--data", data),
                    ("report", "--model", _zoo("unet"), "--data", data, "--out", "unet")):
        assert "64 values per sample (shape (1, 8, 8)), the data has 3 classes" in \
            _refused(*command)
    assert not Path("unet").exists()  # refused before anything is written
    spec = _zoo("unet_with_label")
    assert "'mask': (1, 8, 8), 'label': (3,)" in _refused("bounds", spec, "--data", data)
    assert "64 values" in _refused("bounds", spec, "--data", data, "--output", "mask")
    assert "keys 'mask', 'label'" in _refused("bounds", spec, "--data", data, "--output", "0")
    model, _ = load_model(spec, seed=0)
    want = generalization_bounds(model, shape, *loaders(split, 256, 0), outputs="label")
    out = _ok("bounds", spec, "--data", data, "--output", "label")
    assert f"log10 ||Phi||_1 = {want.path_norm_log10:.3f}" in out
    _ok("report", "--model", spec, "--data", data, "--output", "label", "--epochs", "1",
        "--out", "rep")
    saved = json.loads(Path("rep/report.json").read_text())
    assert saved["bounds"]["n_train"] == len(split.train)
    assert saved["constants"]["d_out"] == 3
