"""timm (PyTorch Image Models) through pathlift (issue 38), classified by pathlift itself.

Every model pathlift accepts is measured exactly: ||Phi||_q at q = 1, 2, each output's,
against the independent |theta|^q pass of ``abs_pow_oracle`` (Thm 3.1.1, <= 1e-12 in
float64), path-magnitude scores against autograd of that pass (sec. 3.5), invariance
under a random rescaling (Thm 2.4.1); every model it refuses is refused in one line naming
the op and the module. The families issue 38 found fully inside the theory must stay
measured. The scan of every model timm lists is ``slow``; by default one model of each
family the issue names runs. Also: ``timm:NAME`` as a model spec, in Python and on the
command line, and checkpoints that name a timm architecture.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch

import timm_scan
from cli_runner import invoke
from pathlift.errors import InvalidParameterError
from pathlift.lift import path_norm
from pathlift.models import (
    UntrustedArchitectureError,
    get_model,
    load_model,
    save_checkpoint,
)
from pathlift.models.checkpoints import _ARCH, _KWARGS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None,
                                reason="timm is not installed")


@pytest.fixture(scope="module")
def timm():
    """timm, imported when a test of this file runs, not at collection: its ~760 nn.Module
    subclasses make each torch.fx trace that the worker runs afterwards slower (setting
    ``nn.Module.__call__``, as fx does twice a trace, updates every subclass)."""
    import timm

    return timm

#: the families run by default (the cheapest of each); the others are ``slow``
DEFAULT = {"ResNet", "ResNet-D", "DLA", "SelecSLS", "MobileOne", "TF-EfficientNet-Lite"}
DEFAULT_LISTED = {"vgg11", "mobilenetv1_100", "efficientnet_b0", "legacy_seresnet18",
                  "resnet50_gn"}
#: timm's constructor arguments of a default case whose size is not what it tests: vgg11's
#: pre-logits ConvMlp (a 7x7 convolution to 4096 channels, 103M of its 129M parameters) at
#: ``mlp_ratio`` 1/64 is the same timm code at 11M parameters (34 s -> 2 s of CPU); vgg11 at
#: timm's own width is the slow ``vgg11-timm-width`` case
NARROW = {"vgg11": {"mlp_ratio": 1 / 64}}


def _param(name: str, default: bool, *more, id: str | None = None):
    return pytest.param(name, *more, id=id or name,
                        marks=() if default else (pytest.mark.slow,))


def _assert_exact(name: str, verdict, **kwargs) -> None:
    worst = timm_scan.check_measured(timm_scan.build(name, **kwargs), verdict.shape)
    assert max(worst.values()) <= timm_scan.RTOL, (name, worst)


@pytest.mark.parametrize("name", [_param(n, f in DEFAULT)
                                  for f, n in timm_scan.INSIDE_TODAY.items()])
def test_families_inside_the_theory_are_measured_exactly(name):
    verdict = timm_scan.classify(name)
    assert verdict.status == "measured", verdict.reason
    _assert_exact(name, verdict)


@pytest.mark.parametrize(("name", "kwargs"), [
    *(_param(n, n in DEFAULT_LISTED, NARROW.get(n, {})) for n in timm_scan.LISTED),
    *(_param(n, False, {}, id=f"{n}-timm-width") for n in NARROW)])
def test_listed_models_are_measured_exactly_or_refused_in_one_line(name, kwargs):
    verdict = timm_scan.classify(name, **kwargs)
    assert verdict.status in ("measured", "refused"), verdict
    if verdict.status == "measured":
        _assert_exact(name, verdict, **kwargs)
    else:
        timm_scan.check_refused(verdict.error)


@pytest.mark.slow
def test_every_model_timm_lists_is_measured_exactly_or_refused_in_one_line(timm):
    """The whole list (timm.list_models()); models over ``MAX_PARAMETERS`` are left out."""
    measured = 0
    for verdict in timm_scan.scan(timm.list_models()):
        if verdict.status == "measured":
            _assert_exact(verdict.name, verdict)
            measured += 1
        elif verdict.status == "refused" and verdict.error is not None:
            timm_scan.check_refused(verdict.error)
    assert measured >= len(timm_scan.INSIDE_TODAY)


# ----------------------------------------------------------------------- timm:NAME specs
def test_a_timm_spec_builds_timms_model_with_its_arguments_and_declared_shape(timm):
    model, shape = load_model("timm:resnet18", seed=0)
    assert type(model).__module__.startswith("timm.")
    assert shape == (3, 224, 224) and "pretrained_cfg" in shape.source
    assert get_model("timm:resnet18", num_classes=3).fc.out_features == 3
    torch.manual_seed(0)
    again = timm.create_model("resnet18", pretrained=False)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values(), strict=True))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pretrained": True}, "does not take pretrained"),
    ({"checkpoint_path": "/etc/passwd"}, "does not take checkpoint_path"),
    ({"no_such_argument": 1}, "bad arguments"),
])
def test_a_timm_spec_refuses_loading_arguments_in_one_line(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match) as err:
        get_model("timm:resnet18", **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["timm:no_such_model", "timm:hf-hub:someone/model",
                                  "timm:../../x"])
def test_a_timm_spec_is_only_a_name_timm_lists(name):
    with pytest.raises(InvalidParameterError, match="timm has no model"):
        get_model(name)


def test_without_timm_a_timm_spec_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    with pytest.raises(InvalidParameterError, match=r"needs timm.*pip install timm"):
        get_model("timm:resnet18")


def test_the_command_line_takes_a_timm_spec_and_says_where_the_shape_came_from(timm):
    result = invoke("norm", "timm:resnet18", "-q", "2")
    assert result.exit_code == 0, result.output
    text = "".join(result.output.split())  # rich may wrap the title anywhere
    assert "(3,224,224)(fromtimm'spretrained_cfg['input_size'])" in text
    torch.manual_seed(0)  # --seed 0, the default
    expected = path_norm(timm.create_model("resnet18").eval(), (3, 224, 224), q=2)
    assert f"{expected.log10:.6f}" in text
    result = invoke("norm", "timm:no_such_model")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def test_a_checkpoint_may_name_a_timm_architecture(tmp_path, timm):
    torch.manual_seed(1)
    model = timm.create_model("resnet18", pretrained=False, num_classes=4).eval()
    path = save_checkpoint(model, tmp_path / "net.safetensors", "timm:resnet18",
                           input_shape=(3, 64, 64), num_classes=4)
    loaded, shape = load_model(path)  # no trust needed: timm's code, not the file's
    assert shape == (3, 64, 64) and shape.source == "the checkpoint"
    assert math.isclose(path_norm(loaded, shape).log10, path_norm(model, shape).log10,
                        rel_tol=1e-12)


def test_a_checkpoint_cannot_make_timm_load_or_run_what_it_names(tmp_path, timm):
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in
             timm.create_model("resnet18", num_classes=4).state_dict().items()}
    path = tmp_path / "evil.safetensors"
    save_file(state, path, metadata={_ARCH: "timm:resnet18",
                                     _KWARGS: '{"num_classes": 4, "pretrained": true}'})
    with pytest.raises(InvalidParameterError, match="does not take pretrained"):
        load_model(path)
    save_file(state, path, metadata={_ARCH: "timm.models:resnet18", _KWARGS: "{}"})
    with pytest.raises(UntrustedArchitectureError):
        load_model(path)


def test_model_kwargs_build_the_named_architecture_with_them(timm):
    result = invoke("norm", "timm:resnet18", "--model-kwargs",
                    '{"num_classes": 10, "drop_rate": 0.0}', "--input-shape", "3", "32", "32",
                    "-q", "2")
    assert result.exit_code == 0, result.output
    torch.manual_seed(0)  # --seed 0, the default
    expected = path_norm(timm.create_model("resnet18", num_classes=10).eval(), (3, 32, 32), q=2)
    assert f"{expected.log10:.6f}" in "".join(result.output.split())
    model, _ = load_model("timm:resnet18", model_kwargs={"num_classes": 3})
    assert model.fc.out_features == 3


@pytest.mark.parametrize("text", ['{"num_classes": ', "[10]", '{"num_classes": {"a": 1}}',
                                  '{"drop_rate": NaN}'])
def test_model_kwargs_that_are_no_json_object_of_literals_are_refused_in_one_line(text):
    result = invoke("norm", "timm:resnet18", "--model-kwargs", text)
    assert result.exit_code == 2
    assert "--model-kwargs" in result.output and "JSON object" in result.output


def test_model_kwargs_with_a_checkpoint_are_refused_in_one_line(tmp_path, timm):
    model = timm.create_model("resnet18", pretrained=False, num_classes=4).eval()
    path = save_checkpoint(model, tmp_path / "net.safetensors", "timm:resnet18",
                           input_shape=(3, 32, 32), num_classes=4)
    result = invoke("norm", str(path), "--model-kwargs", '{"num_classes": 10}')
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "holds its own constructor arguments" in result.output
    with pytest.raises(InvalidParameterError, match="holds its own constructor arguments"):
        load_model(path, model_kwargs={"num_classes": 10})
