"""The graph is traced once per model object and reused, yet every result is that of the
model as it is now: a weight update keeps the graph, a structural change re-traces it,
an unsupported change raises. Each value is checked against a fresh, never-traced copy."""

from __future__ import annotations

import copy
import gc
import importlib
import weakref

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from nets import SHAPE, dense_equivalent, residual_cnn
from pathlift.bounds import symmetry_aware_quantize
from pathlift.errors import ShapeError, UnsupportedModelError
from pathlift.graph import eval_mode, graph_of, trace
from pathlift.lift import path_norm
from pathlift.symmetry import equivalent, random_rescale


def fresh_value(model: nn.Module, q: float = 1.0) -> float:
    """The path-norm of an independent plain copy (pruning masks folded into the weights):
    a model object pathlift has never seen."""
    clone = dense_equivalent(model, type(model)().to(torch.float64))
    return path_norm(clone, SHAPE, q).log10


def test_the_graph_is_reused_and_sees_weight_updates():
    model = residual_cnn()
    graph = graph_of(model, SHAPE)
    before = path_norm(model, SHAPE).log10
    with torch.no_grad():
        model.head.weight.mul_(3.0)  # an optimiser step, in place
    assert graph_of(model, SHAPE) is graph
    after = path_norm(model, SHAPE).log10
    assert after == pytest.approx(fresh_value(model), abs=1e-12)
    assert after > before + 0.1


def test_a_replaced_submodule_retraces():
    model = residual_cnn()
    graph = graph_of(model, SHAPE)
    torch.manual_seed(3)
    model.out = nn.Linear(6, 3).double()
    assert graph_of(model, SHAPE) is not graph
    assert path_norm(model, SHAPE).log10 == pytest.approx(fresh_value(model), abs=1e-12)


def test_a_graph_held_by_the_caller_is_never_stale():
    model = residual_cnn()
    graph = graph_of(model, SHAPE)
    model.out = nn.Linear(6, 3).double()
    assert path_norm(graph).log10 == pytest.approx(fresh_value(model), abs=1e-12)


def test_relu_swapped_for_gelu_raises():
    model = residual_cnn()
    path_norm(model, SHAPE)

    class GeluHead(nn.Module):
        def __init__(self, linear: nn.Module):
            super().__init__()
            self.linear, self.act = linear, nn.GELU()

        def forward(self, x):
            return self.act(self.linear(x))

    model.head = GeluHead(model.head)
    with pytest.raises(UnsupportedModelError, match="GELU"):
        path_norm(model, SHAPE)


def test_train_eval_flip_and_eval_mode():
    model = residual_cnn()
    value = path_norm(model, SHAPE).log10
    model.train()
    with pytest.raises(UnsupportedModelError, match="training mode"):
        path_norm(model, SHAPE)
    with eval_mode(model):
        assert path_norm(model, SHAPE).log10 == value
    assert model.training and model.bn.training  # the flags are restored


def test_a_new_pruning_reparametrisation_retraces():
    model = residual_cnn()
    graph = graph_of(model, SHAPE)
    prune.l1_unstructured(model.a, "weight", amount=0.5)
    assert graph_of(model, SHAPE) is not graph
    assert path_norm(model, SHAPE).log10 == pytest.approx(fresh_value(model), abs=1e-12)


def test_hooks_that_change_a_layer_are_refused_observers_are_not():
    model = residual_cnn()
    seen = []
    handle = model.b.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    assert path_norm(model, SHAPE).log10 == pytest.approx(fresh_value(model), abs=1e-12)
    assert seen  # the observer ran (on shapes only)
    handle.remove()
    model.b.register_forward_hook(lambda m, i, o: 2 * o)
    with pytest.raises(UnsupportedModelError, match="another function"):
        path_norm(model, SHAPE)


def test_a_dtype_change_retraces():
    model = residual_cnn().float()
    assert graph_of(model, SHAPE).dtype == torch.float32
    assert graph_of(model.double(), SHAPE).dtype == torch.float64


def test_the_cache_does_not_keep_models_alive():
    model = residual_cnn()
    graph_of(model, SHAPE)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_a_call_without_a_shape_never_takes_an_earlier_calls():
    model = residual_cnn()
    graph = graph_of(model, SHAPE)
    with pytest.raises(ShapeError, match="does not declare its input shape"):
        path_norm(model)
    assert path_norm(graph).log10 == path_norm(model, SHAPE).log10  # a graph keeps its own
    with pytest.raises(ShapeError, match="traced for input shape"):
        path_norm(graph, (2, 16, 16))


def test_trace_checks_values_that_the_cached_graph_does_not():
    model = residual_cnn()
    graph_of(model, SHAPE)
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    with pytest.raises(UnsupportedModelError, match="'weight' holds NaN"):
        trace(model, SHAPE)
    with pytest.raises(UnsupportedModelError, match="'weight' holds NaN"):
        path_norm(model, SHAPE)  # the non-finite result makes it look


def test_a_deep_copy_of_a_traced_model_is_traced_anew():
    model = residual_cnn()
    graph = graph_of(model, SHAPE)
    clone = copy.deepcopy(model)
    assert graph_of(clone, SHAPE) is not graph


@pytest.fixture
def traces(monkeypatch):
    """Counts the torch.fx traces pathlift runs."""
    module = importlib.import_module("pathlift.graph.trace")
    count = [0]
    original = module._symbolic_trace

    def counting(*args):
        count[0] += 1
        return original(*args)

    monkeypatch.setattr(module, "_symbolic_trace", counting)
    return count


def test_equivalent_traces_each_model_once(traces):
    a = residual_cnn()
    b = random_rescale(a, seed=2, input_shape=SHAPE)
    traces[0] = 0
    assert equivalent(a, b, SHAPE).equivalent
    assert traces[0] == 0  # a was traced by random_rescale, b shares a's graph
    assert equivalent(residual_cnn(1), residual_cnn(2), SHAPE).parameter_gap > 0
    assert traces[0] == 2


def test_symmetry_aware_quantisation_traces_once(traces):
    model = residual_cnn()
    symmetry_aware_quantize(model, SHAPE, 6)
    assert traces[0] == 1
