"""Inputs a newcomer gets wrong get the right number or a typed error that says what to do,
never a silently wrong answer, and nothing printed on stderr."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError, UnsupportedModelError
from pathlift.lift import path_metric, path_norm
from pathlift.lift.path_metric import enumerated_path_metric
from pathlift.models import mlp, small_cnn


def _bn_net(eps: float = 1e-5) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, eps=eps), nn.ReLU(),
                         nn.Flatten(), nn.Linear(18, 2)).eval()


def test_float32_models_get_a_finite_certified_interval():
    """Normalised float32 weights exceed norm 1 by rounding (~1e-7): the Lemma F.3 premise
    is checked with that tolerance and the bound widened by it, so it stays certified."""
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    b = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    metric = path_metric(a, b, (3,))
    truth = enumerated_path_metric(a, b, (3,))
    assert metric.case == "interval" and metric.upper < float("inf")
    assert metric.lower * (1 - 1e-6) <= truth <= metric.upper * (1 + 1e-6)


def test_integer_mantissas_are_refused_and_half_precision_warns():
    model = mlp().eval()
    with pytest.raises(InvalidParameterError, match="floating"):
        path_norm(model, (1, 8, 8), dtype=torch.int32)
    exact = path_norm(model, (1, 8, 8)).log10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        half = path_norm(model, (1, 8, 8), dtype=torch.bfloat16).log10
    assert any("bfloat16" in str(w.message) and "%" in str(w.message) for w in caught)
    assert abs(half - exact) < 0.05  # off by a few percent, as the warning says


@pytest.mark.parametrize("eps, var", [(1e-5, -1.0), (0.0, 0.0)])
def test_batchnorm_statistics_without_a_square_root_are_named(eps, var):
    model = _bn_net(eps)
    with torch.no_grad():
        model[1].running_var[0] = var
    with pytest.raises(UnsupportedModelError, match="running_var") as info:
        path_norm(model, (1, 5, 5))
    assert info.value.problems[0].node == "1"


@pytest.mark.parametrize("shape", [(2.7, 6.2, 6.9), 2, "1 8 8", (1, 0, 8), (True, 8, 8)])
def test_malformed_input_shapes_are_refused(shape):
    with pytest.raises(ShapeError, match="input_shape"):
        path_norm(mlp().eval(), shape)


def test_whole_float_sizes_are_accepted():
    model = mlp().eval()
    assert path_norm(model, (1.0, 8.0, 8.0)).log10 == path_norm(model, (1, 8, 8)).log10


@pytest.mark.parametrize("q, r", [("1", 1.0), (1.0, "inf"), (True, 1.0), (-1.0, 1.0)])
def test_bad_exponents_are_refused(q, r):
    with pytest.raises(InvalidParameterError):
        path_norm(mlp().eval(), (1, 8, 8), q=q, r=r)


def test_a_layer_without_outputs_is_named():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that it cannot initialise it
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 0)).eval()
    with pytest.raises(UnsupportedModelError, match="no neuron") as info:
        path_norm(model, (4,))
    assert info.value.problems[0].node == "2"


def test_a_wrong_input_shape_says_what_fits_in_two_lines_and_nothing_on_stderr(capfd):
    with pytest.raises(ShapeError) as info:
        path_norm(small_cnn().eval(), (3, 8, 8))
    message = str(info.value)
    assert len(message.splitlines()) <= 3
    assert "'features.0'" in message and "(3, 8, 8)" in message and "(1, 8, 8)" in message
    assert "batch" in message
    assert capfd.readouterr().err == ""


def test_a_deeper_layer_names_its_expected_features(capfd):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(9, 2)).eval()
    with pytest.raises(ShapeError, match=r"'3' \(Linear\).*\(8,\).*expects 9 features"):
        path_norm(model, (64,))
    assert capfd.readouterr().err == ""


def test_a_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        model = mlp()
    with pytest.raises(InvalidParameterError, match="meta device"):
        path_norm(model.eval(), (1, 8, 8))
