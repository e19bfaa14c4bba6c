"""Your model and your data, end to end: every model-taking command with a built-in name, a
checkpoint, module:callable and path/to/file.py:callable; user data as .npz, CSV and an
image folder; a BatchNorm model through prune and report; bounds equal to the Python API."""

from __future__ import annotations

import copy
import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import user_zoo
from cli_runner import invoke
from pathlift.bounds import (
    architecture_constants,
    cross_entropy_gap_log10,
    generalization_bounds,
    lipschitz_input,
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
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.ops import supported_summary
from pathlift.jobs.report import run_report
from pathlift.lift import path_norm, path_norms
from pathlift.models import get_model, load_model, save_checkpoint, set_trust_arch
from pathlift.symmetry import identify
from pathlift.testing.neurons import NeuronDAG
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


@pytest.fixture
def own_files() -> Iterator[None]:
    """The checkpoints these tests write name the user's own architectures by import path
    (user_zoo.py): the user trusts them as their own code, as `pathlift --trust-arch`
    does (pathlift.models.set_trust_arch), for the test's in-process commands too."""
    set_trust_arch(True)
    try:
        yield
    finally:
        set_trust_arch(False)


def _ok(*args: str) -> str:
    """The output of a command line that succeeds, on one line."""
    return " ".join(_raw(*args).split())


def _raw(*args: str) -> str:
    """The output of a command line that succeeds, as printed."""
    result = invoke(*args)
    assert result.exit_code == 0, f"pathlift {' '.join(args)}:\n{result.output}"
    return result.stdout


# the architecture each kind's checkpoints name: a user's import path is named again by
# the user when a checkpoint of it is loaded (a file's import path is not trusted)
ARCHS = {**SPECS, "checkpoint": SPECS["module"]}


@pytest.mark.parametrize("kind", SPECS)
def test_every_model_command_takes_every_kind_of_model(kind: str, in_project: Path) -> None:
    spec = SPECS[kind]
    trusted = kind == "checkpoint"  # the user's own file, trusted as their code
    cli = ("--trust-arch",) if trusted else ()
    model, shape = load_model(spec, seed=0, trust_arch=trusted)
    expected = path_norm(model, shape).log10
    assert f"{expected:.6f}" in _ok(*cli, "norm", spec, "-q", "1")
    assert f"{expected:.6f}" in _ok(*cli, "summary", spec)  # ||Phi||_1 row
    assert f"{expected:.6f}" in _ok(*cli, "lipschitz", spec)  # ||Phi||_{1,1}
    assert "d lower" in _ok(*cli, "metric", spec, spec)
    assert "equivalent" in _ok(*cli, "equivalent", spec, spec)
    for command in ("rescale", "normalize"):  # both keep the function and ||Phi||_1
        _ok(*cli, command, spec, "--out", f"{command}_{kind}.safetensors")
        rewritten, same_shape = load_model(f"{command}_{kind}.safetensors", arch=ARCHS[kind])
        assert same_shape == shape
        assert path_norm(rewritten, shape).log10 == pytest.approx(expected, abs=1e-6)  # float32
    assert "quantised towards zero" in _ok(*cli, "quantize", spec, "--bits", "8")


@pytest.mark.parametrize(("spec", "data"), [
    ("relu_mlp.safetensors", "data.npz"), ("lib/nets.py:Net", "data.csv"),
    (f"{MODULE}:bn_cnn", "images"), ("mlp", "digits")])
def test_data_commands_take_every_kind_of_data(spec: str, data: str, in_project: Path) -> None:
    split = load_data(data)
    named = (f"{MODULE}:relu_mlp", "--weights", spec) if spec.endswith(".safetensors") \
        else (spec,)  # a checkpoint of the user's class: the user names the class
    model, shape = load_model(named[0], split.input_shape, named[-1] if len(named) > 1
                              else None, seed=0)
    bounds = generalization_bounds(model, shape, *loaders(split, 256, 0))
    out = _ok("bounds", *named, "--data", data)
    assert f"n = {len(split.train)}, log10 ||Phi||_1 = {bounds.path_norm_log10:.3f}" in out
    assert "certificates valid as stated" in out  # union and compression, each a verdict
    assert out.count("informative: ") == 2
    assert f"test {bounds.measured.test_error:.4f}" in out
    assert "quantised towards zero" in _ok("quantize", *named, "--data", data, "--bits", "8")


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
    result = invoke("bounds", f"{MODULE}:relu_mlp", "--weights", "trained.pt", "--data",
                    "data.npz", "--seed", "3", "--normalize", "standard")
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
    loaded, shape = load_model(path, trust_arch=True)  # the user's own file
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
    assert summary.exit_code == 2 and summary.stdout.count("pooling:") == 1
    assert summary.stderr.count("\n") == 1 and summary.stderr.startswith("Error: ")


# ----------------------------------------------------------------------- several outputs


def _zoo(name: str) -> str:
    return f"{ZOO}:{name}"


def _refused(*args: str) -> str:
    """The one-line error of a refused command line (exit status 2; stdout may hold the
    progress bar of a command that started)."""
    result = invoke(*args)
    assert result.exit_code == 2 and "Error" not in result.stdout, result.output
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
    assert "returns a single tensor (1, 8, 8)" in _refused("bounds", _zoo("unet"), "--data",
                                                           data, "--output", "0")
    spec = _zoo("unet_with_label")
    assert "'mask': (1, 8, 8), 'label': (3,)" in _refused("bounds", spec, "--data", data)
    assert "64 values" in _refused("bounds", spec, "--data", data, "--output", "mask")
    assert "keys 'mask', 'label'" in _refused("bounds", spec, "--data", data, "--output", "0")
    model, _ = load_model(spec, seed=0)
    want = generalization_bounds(model, shape, *loaders(split, 256, 0), outputs="label")
    out = _ok("bounds", spec, "--data", data, "--output", "label")
    assert f"log10 ||Phi||_1 = {want.path_norm_log10:.3f}" in out
    _ok("report", "--model", spec, "--data", data, "--output", "label", "--epochs", "1",
        "--out", "rep_label")
    saved = json.loads(Path("rep_label/report.json").read_text())
    assert saved["bounds"]["n_train"] == len(split.train)
    assert saved["constants"]["d_out"] == 3


# ----------------------------------------------------------------------- paper models


DATA = {"signal_cnn": "signals.npz", "tabular_mlp": "tabular.npz", "loop_net": "tabular.npz"}
OUTPUT = {"logits_and_features": "0", "unet_with_label": "label"}  # the logits
TOLERANCE = {"bn_cnn_half": 5e-3}  # a rewritten float16 copy rounds each weight again


def _floats(row: str, out: str) -> list[float]:
    """The numbers of the table row starting with ``row`` in a command's output."""
    line = next(line for line in out.splitlines() if line.lstrip("│┃ ").startswith(row))
    return [float(v) for v in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", line[len(row) + 2:])]


@pytest.mark.parametrize("name", sorted(user_zoo.MODELS))
def test_every_command_on_a_paper_model(name: str, in_project: Path,
                                       own_files: None) -> None:
    """norm, summary, lipschitz, rescale, normalize, metric, equivalent, quantize (with and
    without data), identify and bounds on each model of user_zoo.py, as a user runs them
    (prune and report: the slow test below): the
    numbers of the Python API (itself checked against path enumeration below), rewritten
    checkpoints that compute the same function with the same ||Phi||_1, a certified
    quantisation bound above the measured change, or a one-line refusal."""
    spec, data = _zoo(name), DATA.get(name, "images3.npz")
    model, shape = load_model(spec, seed=0)
    norms = path_norms(model, shape, qs=(1, 2))
    out = _ok("norm", spec, "-q", "1", "2")
    assert all(f"{n.log10:.6f}" in out for n in norms.values())
    assert f"{norms[1.0].log10:.6f}" in _ok("summary", spec)
    assert f"{lipschitz_input(model, shape).log10:.6f}" in _ok("lipschitz", spec)
    x = torch.randn(8, *shape, dtype=torch.float64)
    reference = flat_outputs(copy.deepcopy(model).double()(x), 8)
    for command in ("rescale", "normalize"):
        path = f"{command}_{name}.safetensors"
        if name == "parametrized_cnn":  # weight_norm cannot hold the rewritten values
            assert "parametrize" in _refused(command, spec, "--out", path)
            continue
        _ok(command, spec, "--out", path)
        other, same = load_model(path)
        assert same == shape
        assert path_norm(other, shape).log10 == pytest.approx(
            norms[1.0].log10, abs=TOLERANCE.get(name, 1e-5))
        gap = (flat_outputs(other.double()(x), 8) - reference).abs().max()
        assert gap <= TOLERANCE.get(name, 1e-5) * reference.abs().max()
    twin = spec if name == "parametrized_cnn" else f"rescale_{name}.safetensors"
    d_lower = _floats("d lower", _raw("metric", spec, twin))[0]  # d = 0, not noise
    assert d_lower == 0.0 or name == "bn_cnn_half"  # float16 rescaled values round again
    assert d_lower <= TOLERANCE.get(name, 0.0) * norms[1.0].value
    assert "not equivalent" not in _ok("equivalent", spec, twin)
    for extra in ((), ("--data", data)):
        out = _raw("quantize", spec, "--bits", "8", *extra)
        measured, bound = _floats("8", out)[3:5]
        assert measured <= bound
        # an accuracy only where the output holds one logit per class
        assert ("accuracy left out" in out) == (bool(extra) and name in (*OUTPUT, "unet"))
    # identify: 8 inputs are too few for any of them, refused at once (the Jacobian's rank
    # is at most 8 d_out); the 1-D CNN, identifiable from 60, as the Python API says
    assert "use at least" in _refused("identify", spec, "--samples", "8")
    if name == "signal_cnn":
        assert repr(identify(model, 60, shape)) in _ok("identify", spec, "--samples", "60")
    if name == "unet":  # a mask per pixel, not class logits
        assert "64 values per sample" in _refused("bounds", spec, "--data", data)
        return
    selector = ("--output", OUTPUT[name]) if name in OUTPUT else ()
    split = load_data(data)
    want = generalization_bounds(model, shape, *loaders(split, 256, 0),
                                 outputs=OUTPUT.get(name))
    out = _ok("bounds", spec, "--data", data, *selector)
    assert f"log10 ||Phi||_1 = {want.path_norm_log10:.3f}" in out
    assert f"test {want.measured.test_error:.4f}" in out


# the same classes, small enough for explicit path enumeration (Def. 2.3.3)
SMALL = {
    "densenet_bc": (lambda: user_zoo.DenseNetBC(growth=1, layers=(1, 1)), (3, 2, 2)),
    "inception": (user_zoo.inception, (3, 4, 4)),
    "resnext": (user_zoo.resnext, (3, 2, 2)),
    "wide_resnet": (lambda: user_zoo.WideResNet(base=1), (3, 2, 2)),
    "efficientnet_relu": (lambda: user_zoo.EfficientNetReLU(
        setting=((1, 1, 1, 1, 3), (2, 1, 2, 2, 3))), (3, 2, 2)),
    "unet": (lambda: user_zoo.UNet(base=1, depth=1), (3, 2, 2)),
    "unet_with_label": (lambda: user_zoo.UNet(base=1, depth=1, label_head=True), (3, 2, 2)),
    "signal_cnn": (user_zoo.signal_cnn, user_zoo.SIGNAL),
    "tabular_mlp": (user_zoo.tabular_mlp, user_zoo.TABULAR),
    "loop_net": (user_zoo.loop_net, user_zoo.TABULAR),
    "logits_and_features": (user_zoo.logits_and_features, user_zoo.IMAGE),
    "parametrized_cnn": (user_zoo.parametrized_cnn, user_zoo.IMAGE),
    "bn_cnn_channels_last": (user_zoo.bn_cnn_channels_last, user_zoo.IMAGE),
    "bn_cnn_half": (user_zoo.bn_cnn_half, user_zoo.IMAGE),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_paper_models_equal_path_enumeration(name: str) -> None:
    """||Phi||_q and the mixed (q, 1) norm of each architecture (random weights, random
    BatchNorm statistics) equal the sum over its explicitly enumerated paths at 1e-12: in
    float64, or from the float16 weights themselves, channels_last or parametrized."""
    assert set(SMALL) == set(user_zoo.MODELS)
    make, shape = SMALL[name]
    torch.manual_seed(0)
    model = user_zoo.randomise_batchnorm_(make())
    if name != "bn_cnn_half":
        model = model.double()
    dag = NeuronDAG.from_module(user_zoo.randomise_batchnorm_(copy.deepcopy(model)), shape)
    for q in (1.0, 2.0):
        for r in (None, 1.0):
            assert path_norm(model, shape, q, r).log10 == pytest.approx(
                dag.path_norm_log10(q, r), abs=1e-12)


# ----------------------------------------------------------------------- dtypes, layouts


def _half_checkpoint(dtype: str) -> str:
    """A float16 / bfloat16 checkpoint of a BatchNorm CNN, as saved after model.half()."""
    torch.manual_seed(0)
    model = user_zoo.randomise_batchnorm_(user_zoo.bn_cnn()).to(getattr(torch, dtype))
    return str(save_checkpoint(model, f"{dtype}.safetensors", f"{ZOO}:bn_cnn",
                               input_shape=user_zoo.IMAGE))


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "channels_last"])
def test_half_precision_and_channels_last_through_prune_bounds_and_quantize(
        kind: str, in_project: Path, own_files: None) -> None:
    """The data's float32 inputs are cast to the model's dtype (they were not: 'Input
    type (float) and bias type (c10::Half)'), channels_last weights are pruned like
    contiguous ones (torch's global_unstructured flattens with view). Numbers as the
    Python API gives them; --amount is the fraction of the prunable weights pruned."""
    spec = _zoo("bn_cnn_channels_last") if kind == "channels_last" else _half_checkpoint(kind)
    data = "images3.npz"
    model, shape = load_model(spec, seed=0)
    if kind == "channels_last":
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    else:
        assert model[0].weight.dtype == getattr(torch, kind)
    split = load_data(data)
    want = generalization_bounds(model, shape, *loaders(split, 256, 0))
    out = _ok("bounds", spec, "--data", data)
    assert f"log10 ||Phi||_1 = {want.path_norm_log10:.3f}" in out
    assert f"test {want.measured.test_error:.4f}" in out
    measured, bound = _floats("8", _raw("quantize", spec, "--bits", "8", "--data", data))[3:5]
    assert 0 < measured <= bound
    out = _raw("prune", "--model", spec, "--data", data, "--epochs", "2", "--rewind-epoch",
               "1", "--seeds", "1", "--amount", "0.5", "--method", "path-magnitude-global",
               "magnitude-layerwise", "--out", f"prune-{kind}")
    assert _floats("all prunable weights", out) == [50.0, 50.0]  # global, layerwise
    assert _floats("0.weight", out)[1] == _floats("5.weight", out)[1] == 50.0  # layerwise
    with Path(f"prune-{kind}/runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {round(float(r["sparsity"]), 3) for r in rows} == {0.5}


def test_compiled_and_ddp_wrapped_models_through_the_commands(in_project: Path,
                                                            own_files: None) -> None:
    """A factory returning torch.compile(model), and state_dicts saved from a DDP-wrapped
    and a compiled model (keys 'module.' / '_orig_mod.'): the plain model's numbers, and
    rescale --out writes a checkpoint that loads (it reloaded into OptimizedModule)."""
    import socket

    import torch.distributed as dist

    torch.manual_seed(0)
    model = user_zoo.randomise_batchnorm_(user_zoo.bn_cnn())
    expected = path_norm(model, user_zoo.IMAGE).log10
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        torch.save(torch.nn.parallel.DistributedDataParallel(model).state_dict(), "ddp.pt")
    finally:
        dist.destroy_process_group()
    torch.save(torch.compile(model).state_dict(), "compiled.pt")
    for weights in ("ddp.pt", "compiled.pt"):
        assert f"{expected:.6f}" in _ok("norm", _zoo("bn_cnn"), "--weights", weights, "-q", "1")
    spec = _zoo("bn_cnn_compiled")
    compiled, shape = load_model(spec, seed=0)
    assert type(compiled).__name__ == "OptimizedModule"
    _ok("rescale", spec, "--out", "compiled.safetensors")
    rescaled, _ = load_model("compiled.safetensors")
    assert path_norm(rescaled, shape).log10 == pytest.approx(
        path_norm(compiled, shape).log10, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(user_zoo.MODELS))
def test_prune_and_report_on_a_paper_model(name: str, in_project: Path) -> None:
    """The training commands on each model of user_zoo.py: prune-rewind-retrain prunes
    --amount of the prunable weights (or refuses in one line: several outputs, a
    parametrized weight), and the report trains and measures it (with --output for a model
    with several outputs; a U-Net's mask refused in one line)."""
    spec, data = _zoo(name), DATA.get(name, "images3.npz")
    prune = ("prune", "--model", spec, "--data", data, "--epochs", "2", "--rewind-epoch", "1",
             "--seeds", "1", "--amount", "0.5", "--method", "path-magnitude-global",
             "--out", f"prune-{name}")
    if name in (*OUTPUT, "unet"):
        assert "outputs" in _refused(*prune)
    elif name == "parametrized_cnn":
        assert "parametrize" in _refused(*prune)
    else:  # half of the prunable weights, to one weight
        assert _floats("all prunable weights", _raw(*prune)) == [pytest.approx(50.0, abs=0.5)]
    report = ("report", "--model", spec, "--data", data, "--epochs", "1", "--out",
              f"report-{name}", *(("--output", OUTPUT[name]) if name in OUTPUT else ()))
    if name == "unet":
        assert "64 values per sample" in _refused(*report)
        return
    _ok(*report)
    saved = json.loads(Path(f"report-{name}/report.json").read_text())
    assert saved["constants"]["d_out"] == 3 and saved["bounds"]["n_train"] == 72
