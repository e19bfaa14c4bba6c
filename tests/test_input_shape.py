"""No silent input shape: every public entry point taking ``input_shape`` uses the one given,
else the model's own declaration, else refuses in one line; never an earlier call's.

The model is a global-average-pool net, whose path-norm depends on the input's spatial size
(the pool weighs each path by (1/hw)^q, Thm 3.1.1): a guessed or reused shape would be a
wrong number, so every declared-shape result is checked against the same call given that
shape explicitly, and the path-norm against explicit path enumeration at that shape.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types

import pytest
import torch
from torch import Tensor, nn

from pathlift.bounds import (
    architecture_constants,
    certified_error,
    generalization_bounds,
    lipschitz_bounds,
    lipschitz_input,
    lipschitz_params,
)
from pathlift.errors import ShapeError
from pathlift.graph import LayerGraph, check, graph_of, trace
from pathlift.graph.input_shape import InputShape, declared_input_shape
from pathlift.lift import layer_norm_product, path_metric, path_norm, path_norms
from pathlift.models import default_input_shape, get_model, load_model, load_model_pair
from pathlift.prune import magnitude_scores, path_magnitude_scores
from pathlift.quant import lfcn_constants, quantize
from pathlift.summary import summary
from pathlift.symmetry import (
    adversarial_rescale,
    analyse,
    canonicalize,
    conserved_quantities,
    equivalent,
    identify,
    magnitude_prune,
    normalize,
    normalize_report,
    permute,
    random_rescale,
    rescale,
    symmetry_dimension,
)
from pathlift.testing.neurons import NeuronDAG
from pathlift.train import differentiable_path_norm, magnitude_gradients

DECLARED, OTHER = (1, 8, 8), (1, 4, 4)


def gap_net(declared: tuple[int, ...] | None = None) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(3, 2)).eval()
    if declared is not None:
        net.input_shape = declared
    return net


def relu_mlp(declared: tuple[int, ...] | None = None) -> nn.Module:
    """For the entry points that take layered fully connected networks only (Thm 6.1.1)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 2)).eval()
    if declared is not None:
        net.input_shape = declared
    return net


def _perturbed(model: nn.Module) -> nn.Module:
    other = gap_net(getattr(model, "input_shape", None))
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other[4].weight.mul_(0.5)  # same signs, |theta'| <= |theta|
    return other


def _bounds(model: nn.Module, shape: tuple[int, ...] | None):
    """``generalization_bounds`` on inputs of ``shape`` (the declared one for None) labelled
    by the model itself (every training margin positive)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, *(shape or DECLARED), generator=generator)
    with torch.no_grad():
        logits = model(x)
    y = torch.arange(64) % 2 if logits.argmax(1).unique().numel() < 2 else logits.argmax(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    return generalization_bounds(model, shape, loader, loader)


#: every public entry point whose input_shape defaults to None, as (model, shape) -> result
ENTRY_POINTS = {
    "path_norm": lambda m, s: path_norm(m, s),
    "path_norms": lambda m, s: path_norms(m, s, qs=(1, 2)),
    "path_metric": lambda m, s: path_metric(m, _perturbed(m), s),
    "layer_norm_product": lambda m, s: layer_norm_product(m, s),
    "graph_of": lambda m, s: graph_of(m, s),
    "trace": lambda m, s: trace(m, s),
    "check": lambda m, s: check(m, s).ok,
    "architecture_constants": lambda m, s: architecture_constants(m, s),
    "lipschitz_input": lambda m, s: lipschitz_input(m, s),
    "lipschitz_bounds": lambda m, s: lipschitz_bounds(m, s),
    "lipschitz_params": lambda m, s: lipschitz_params(m, _perturbed(m), s),
    "certified_error": lambda m, s: certified_error(m, _perturbed(m), s),
    "magnitude_scores": lambda m, s: magnitude_scores(m, s),
    "path_magnitude_scores": lambda m, s: path_magnitude_scores(m, s),
    "quantize": lambda m, s: quantize(m, s, bits=4),
    "lfcn_constants": lambda m, s: lfcn_constants(m, s),
    "normalize": lambda m, s: normalize(m, s),
    "normalize_report": lambda m, s: normalize_report(m, s),
    "rescale": lambda m, s: rescale(m, {"0": 2.0}, s),
    "random_rescale": lambda m, s: random_rescale(m, input_shape=s),
    "adversarial_rescale": lambda m, s: adversarial_rescale(m, input_shape=s),
    "permute": lambda m, s: permute(m, {"0": [2, 0, 1]}, s),
    "magnitude_prune": lambda m, s: magnitude_prune(m, 0.3, s),
    "canonicalize": lambda m, s: canonicalize(m, s),
    "analyse": lambda m, s: analyse(m, s),
    "conserved_quantities": lambda m, s: conserved_quantities(m, s),
    "equivalent": lambda m, s: equivalent(m, _perturbed(m), s),
    "identify": lambda m, s: identify(m, 32, s),
    "symmetry_dimension": lambda m, s: symmetry_dimension(m, s, domain=32),
    "differentiable_path_norm": lambda m, s: differentiable_path_norm(m, s),
    "magnitude_gradients": lambda m, s: magnitude_gradients(m, s),
    "summary": lambda m, s: summary(m, s),
    "generalization_bounds": _bounds,
}


#: (model factory, its declared shape, another shape it runs at) where not the GAP net's
MODELS = {"lfcn_constants": (relu_mlp, (8,), (3, 8))}


def _case(name: str):
    return MODELS.get(name, (gap_net, DECLARED, OTHER))


def numbers(result: object, depth: int = 0) -> list[float]:
    """Every number a result holds (tensors, fields, a returned model's parameters), in
    order, so that two results can be compared."""
    if depth > 6 or isinstance(result, (str, bytes, type(None))):
        return []
    if isinstance(result, (bool, int, float)):
        return [float(result)]
    if isinstance(result, Tensor):
        return result.detach().double().flatten().tolist()
    if isinstance(result, nn.Module):
        return [x for t in result.state_dict().values() for x in numbers(t, depth + 1)]
    if isinstance(result, dict):
        return [x for k in sorted(result, key=str) for x in numbers(result[k], depth + 1)]
    if isinstance(result, (list, tuple)):
        return [x for item in result for x in numbers(item, depth + 1)]
    if isinstance(result, LayerGraph):  # its memo depends on what ran before
        return [float(s) for s in result.input_shape] + numbers(result.module, depth + 1)
    if dataclasses.is_dataclass(result):
        return [x for f in dataclasses.fields(result)
                for x in numbers(getattr(result, f.name), depth + 1)]
    return []


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_call_without_a_shape_or_a_declaration_is_refused_in_one_line(name):
    model = _case(name)[0]()
    with pytest.raises(ShapeError) as err:
        ENTRY_POINTS[name](model, None)
    message = str(err.value)
    assert "\n" not in message
    assert "does not declare its input shape" in message and "input_shape" in message


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_call_without_a_shape_never_takes_an_earlier_calls(name):
    make, declared, other = _case(name)
    model = make()
    ENTRY_POINTS[name](model, other)  # traced, and cached, at another shape
    path_norm(model, declared)
    with pytest.raises(ShapeError, match="does not declare its input shape"):
        ENTRY_POINTS[name](model, None)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_call_without_a_shape_takes_the_models_declaration(name):
    make, declared, other = _case(name)
    model = make(declared)
    ENTRY_POINTS[name](model, other)  # an earlier call at another shape changes nothing
    found = numbers(ENTRY_POINTS[name](model, None))
    assert found and _same(found, numbers(ENTRY_POINTS[name](make(declared), declared)))


def test_the_declared_shape_gives_the_enumerated_path_norm_and_says_where_it_came_from():
    model = gap_net(DECLARED)
    result = path_norm(model, q=2)
    assert result.input_shape == DECLARED
    assert result.input_shape.source == "Sequential.input_shape"
    assert result.input_shape.described() == "(1, 8, 8) (from Sequential.input_shape)"
    enumerated = NeuronDAG.from_module(model, DECLARED).path_norm(2.0)
    assert result.value == pytest.approx(enumerated, rel=1e-12)
    # the shape matters: at the 4x4 input the pool weighs each path (1/16)^2, not (1/64)^2
    assert path_norm(model, OTHER, q=2).value == pytest.approx(
        NeuronDAG.from_module(model, OTHER).path_norm(2.0), rel=1e-12)
    assert abs(path_norm(model, OTHER, q=2).value - result.value) > 1e-3 * result.value
    assert path_norm(model, OTHER).input_shape.source == "given"


def test_a_declaration_that_is_not_a_shape_is_refused_naming_it():
    model = gap_net()
    model.input_shape = (1, 0, 8)
    with pytest.raises(ShapeError, match=r"Sequential.input_shape = \(1, 0, 8\) is not an input "
                                         "shape"):
        path_norm(model)


def test_a_copy_pathlift_made_is_measured_at_the_shape_it_was_made_at():
    model = gap_net()
    copy = normalize(model, OTHER)
    result = path_norm(copy)
    assert result.input_shape == OTHER  # the graph it was made from, given at OTHER
    enumerated = NeuronDAG.from_module(copy, OTHER).path_norm(1.0)
    assert result.value == pytest.approx(enumerated, rel=1e-12)
    with pytest.raises(ShapeError):
        path_norm(model)  # the original still declares nothing


def test_input_shapes_pickle_and_compare_as_tuples():
    import pickle
    shape = InputShape((3, 4), "somewhere")
    again = pickle.loads(pickle.dumps(shape))
    assert again == (3, 4) and again.source == "somewhere" and hash(again) == hash((3, 4))
    assert repr(again) == "(3, 4)"


def test_reference_architectures_declare_their_registry_shape():
    from pathlift.models import REFERENCE_MODELS
    for name, spec in REFERENCE_MODELS.items():
        with torch.device("meta"):
            model = get_model(name)
        assert declared_input_shape(model) == spec.input_shape, name
    assert declared_input_shape(get_model("mlp", in_features=20)) == (20,)
    assert declared_input_shape(get_model("small_cnn", in_channels=3)) == (3, 8, 8)


def _module(tmp_path, monkeypatch, declared: bool) -> str:
    name = f"shape_nets_{int(declared)}"
    module = types.ModuleType(name)
    module.make = lambda: gap_net(DECLARED if declared else None)
    monkeypatch.setitem(sys.modules, name, module)
    return f"{name}:make"


def test_load_model_says_where_the_shape_came_from(tmp_path, monkeypatch):
    spec = _module(tmp_path, monkeypatch, declared=True)
    _, shape = load_model(spec)
    assert shape == DECLARED and shape.source == "Sequential.input_shape"
    _, shape = load_model(spec, (1, 5, 5))
    assert shape == (1, 5, 5) and shape.source == "given"
    _, shape = load_model(spec, data_shape=(1, 6, 6))
    assert shape == (1, 6, 6) and shape.source == "the data"
    assert load_model("resnet18")[1].source == "ResNet.input_shape"
    assert default_input_shape("small_cnn").source == "small_cnn's default"
    _, _, shape = load_model_pair(spec, spec)
    assert shape == DECLARED


def test_load_model_refuses_a_model_that_declares_nothing(tmp_path, monkeypatch):
    spec = _module(tmp_path, monkeypatch, declared=False)
    with pytest.raises(ShapeError, match="does not say its input shape: give --input-shape"):
        load_model(spec)


def test_torchvision_models_declare_their_documented_input():
    tv = pytest.importorskip("torchvision.models")
    assert declared_input_shape(tv.resnet18()) == (3, 224, 224)
    with torch.device("meta"):
        inception = tv.inception_v3(init_weights=False, aux_logits=False)
    assert declared_input_shape(inception) == (3, 299, 299)
    assert "torchvision" in declared_input_shape(inception).source


#: every command taking a model without data, with what else it needs ({out}: a file path,
#: {model}: the model again); those with --data take the data's shape (load_model above)
COMMANDS = {"norm": [], "summary": [], "lipschitz": [], "quantize": [],
            "normalize": ["--out", "{out}"], "rescale": ["--out", "{out}"],
            "metric": ["{model}"], "equivalent": ["{model}"], "identify": ["--samples", "32"]}
PRINTS_THE_SHAPE = {"norm", "summary", "lipschitz", "metric"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_command_line_prints_the_shape_and_its_source_or_refuses(command, tmp_path,
                                                                     monkeypatch):
    from cli_runner import invoke
    monkeypatch.chdir(tmp_path)
    for declared in (False, True):
        model = _module(tmp_path, monkeypatch, declared=declared)
        extra = [a.format(out=tmp_path / "out.safetensors", model=model)
                 for a in COMMANDS[command]]
        result = invoke(command, model, *extra)
        if not declared:
            assert result.exit_code == 2, result.output
            assert "does not say its input shape" in result.output
            assert len(result.output.strip().splitlines()) == 1
            continue
        assert result.exit_code in (0, 1), result.output  # 1: identify's "not identifiable"
        if command in PRINTS_THE_SHAPE:
            assert "(1,8,8)(fromSequential.input_shape)" in "".join(result.output.split())
