"""``--model-kwargs`` on every command that takes a model spec: the JSON object reaches the
constructor of each model given by name (metric, equivalent and lipschitz --other: both
models), a malformed one is refused in one line naming the option, and a checkpoint keeps
its own arguments. (``frontier``'s --model picks among its own recipes: no model spec.)"""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from torch import nn

from cli_runner import invoke
from pathlift.lift import path_metric, path_norm
from pathlift.models import get_model, save_checkpoint

CALLS: list[dict] = []  # every constructor call (load_model sizes a model on meta first)


def widths() -> set[int]:
    return {c["width"] for c in CALLS}


def make(width: int = 3, num_classes: int = 2, refuse: int | None = None) -> nn.Module:
    """A user's global-average-pool CNN; ``refuse`` = ``width`` raises (the proof that the
    arguments arrived before any training)."""
    CALLS.append({"width": width, "num_classes": num_classes})
    if refuse is not None and refuse == width:
        raise ValueError(f"constructor called with width={width}")
    net = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(width, num_classes)).eval()
    net.input_shape = (1, 8, 8)
    return net


@pytest.fixture
def spec(monkeypatch) -> str:
    module = types.ModuleType("kwargs_nets")
    module.make = make
    monkeypatch.setitem(sys.modules, "kwargs_nets", module)
    CALLS.clear()
    return "kwargs_nets:make"


def _log10_norm(width: int, seed: int = 0) -> float:
    torch.manual_seed(seed)
    return path_norm(make(width=width), q=1).log10


def test_metric_builds_both_models_with_them(spec):
    result = invoke("metric", spec, spec, "--model-kwargs", '{"width": 5}')
    assert result.exit_code == 0, result.output
    assert widths() == {5}
    expected = _log10_norm(5)  # both: seed 0, the default
    assert f"{expected:.6f},{expected:.6f}" in "".join(result.output.split())


def test_equivalent_builds_both_models_with_them(spec):
    result = invoke("equivalent", spec, spec, "--model-kwargs", '{"width": 4}')
    assert result.exit_code == 0, result.output
    assert widths() == {4} and ": equivalent" in result.output


def test_lipschitz_with_another_model_builds_both_with_them(spec):
    result = invoke("lipschitz", spec, "--other", spec, "--model-kwargs", '{"width": 6}')
    assert result.exit_code == 0, result.output
    assert widths() == {6}
    assert f"{_log10_norm(6):.6f}" in "".join(result.output.split())  # ||Phi||_{1,1}


def test_a_pair_with_one_checkpoint_gives_them_to_the_named_model_only(tmp_path):
    kwargs = {"in_features": 8, "hidden": [5], "num_classes": 3}
    model = get_model("mlp", **kwargs)
    path = save_checkpoint(model, tmp_path / "net.safetensors", "mlp", input_shape=(8,),
                           **kwargs)
    result = invoke("metric", str(path), "mlp", "--model-kwargs", json.dumps(kwargs))
    assert result.exit_code == 0, result.output
    torch.manual_seed(0)  # --seed 0: the named model's initialisation
    expected = path_metric(model, get_model("mlp", **kwargs), (8,))
    assert f"{expected.norm_b_log10:.6f}" in "".join(result.output.split())
    result = invoke("metric", str(path), str(path), "--model-kwargs", json.dumps(kwargs))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "hold their own constructor arguments" in result.output


#: commands that train first: the constructor refuses the width it is given, so the
#: arguments are seen arriving before any work
TRAINING = {
    "prune": ["prune", "--model", "{spec}", "--data", "digits", "--epochs", "2",
              "--rewind-epoch", "1", "--seeds", "1", "--amount", "0.5", "--out", "{out}"],
    "report": ["report", "--model", "{spec}", "--data", "digits", "--out", "{out}"],
}


@pytest.mark.parametrize("command", sorted(TRAINING))
def test_commands_that_train_give_them_to_the_constructor(command, spec, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [a.format(spec=spec, out=tmp_path / "out") for a in TRAINING[command]]
    result = invoke(*args, "--model-kwargs", '{"width": 7, "refuse": 7}')
    assert result.exit_code == 2, result.output
    assert "constructor called with width=7" in result.output
    assert CALLS and widths() == {7}


COMMANDS = {"metric": ["{spec}", "{spec}"], "equivalent": ["{spec}", "{spec}"],
            "lipschitz": ["{spec}", "--other", "{spec}"], "prune": ["--model", "{spec}"],
            "report": ["--model", "{spec}"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("text", ['{"width": ', "[5]", '{"width": {"a": 1}}'])
def test_a_malformed_json_object_is_refused_in_one_line(command, text, spec, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [a.format(spec=spec) for a in COMMANDS[command]]
    result = invoke(command, *args, "--model-kwargs", text)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "--model-kwargs" in result.output and "JSON object" in result.output
    assert not CALLS  # refused while parsing, nothing built


def test_a_factory_takes_them_over_the_datas_number_of_classes():
    from pathlift.models import model_factory
    net = model_factory("mlp", num_classes=3, model_kwargs={"in_features": 6, "hidden": [4]})()
    assert [m.weight.shape for m in net if isinstance(m, nn.Linear)] == [(4, 6), (3, 4)]
    net = model_factory("mlp", num_classes=3, model_kwargs={"num_classes": 5})()
    assert net[-1].out_features == 5  # the user's word over the data's


def test_a_prune_folder_resumes_only_with_the_same_arguments(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [a.format(spec=spec, out=tmp_path / "out") for a in TRAINING["prune"]]
    args += ["--method", "magnitude-global"]
    first = invoke(*args, "--model-kwargs", '{"width": 3, "num_classes": 10}')
    assert first.exit_code == 0, first.output
    runs = (tmp_path / "out" / "runs.csv").read_bytes()
    other = invoke(*args, "--model-kwargs", '{"width": 3, "num_classes": 10, "refuse": 9}')
    assert other.exit_code == 2 and "model_kwargs" in other.output, other.output
    assert (tmp_path / "out" / "runs.csv").read_bytes() == runs
    again = invoke(*args, "--model-kwargs", '{"width": 3, "num_classes": 10}')
    assert again.exit_code == 0, again.output
