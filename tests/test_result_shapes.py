"""Results other than PathNorm say which input shape they were computed at and where it
came from (issue 38: no silent shape): path-magnitude and magnitude scores, the path-metric,
the Lipschitz bounds (in x, in theta, both), the summary and the generalisation bounds.
Each is checked against the same call at the shape given explicitly (the numbers agree,
the source differs), on global-average-pool nets whose numbers depend on the shape, and the
Lipschitz constants against path enumeration at the shape the result names."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from pathlift.bounds import lipschitz_bounds, lipschitz_input, lipschitz_params
from pathlift.graph.input_shape import GIVEN
from pathlift.lift import path_metric, path_norm
from pathlift.prune import magnitude_scores, path_magnitude_scores
from pathlift.summary import summary
from pathlift.testing.neurons import NeuronDAG
from test_input_shape import DECLARED, OTHER, _bounds, _perturbed, gap_net


class Declared(nn.Module):
    input_shape = (1, 6, 6)

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)  # border windows: the norm depends on hw
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = Declared().double().eval()
    b = Declared().double().eval()
    b.load_state_dict({k: v * 0.5 for k, v in a.state_dict().items()})  # |b| <= |a|
    return a, b


@pytest.mark.parametrize("scores", [path_magnitude_scores, magnitude_scores])
def test_scores_say_their_shape_and_its_source(scores):
    a, _ = _pair()
    declared, given = scores(a), scores(a, (1, 6, 6))
    assert declared.input_shape == (1, 6, 6) and declared.input_shape.source != GIVEN
    assert "input_shape" in declared.input_shape.source
    assert given.input_shape == (1, 6, 6) and given.input_shape.source == GIVEN
    for name in declared.tensors:
        torch.testing.assert_close(declared.value(name), given.value(name), rtol=1e-12,
                                   atol=0)
    other = scores(a, (1, 9, 9))  # another shape, another number (the pool weighs 1/hw)
    assert other.input_shape == (1, 9, 9)
    if scores is path_magnitude_scores:
        assert not math.isclose(other.log10_sum(), declared.log10_sum(), rel_tol=1e-6)


def test_the_path_metric_says_its_shape_and_its_source():
    a, b = _pair()
    declared, given = path_metric(a, b), path_metric(a, b, (1, 6, 6))
    assert declared.input_shape == (1, 6, 6) and "input_shape" in declared.input_shape.source
    assert given.input_shape.source == GIVEN
    assert declared.upper_log10 == pytest.approx(given.upper_log10, abs=1e-12)
    assert path_metric(a, b, (1, 9, 9)).input_shape == (1, 9, 9)


def _in_x(m, s):
    r = lipschitz_input(m, s)
    return r.input_shape, r.log10


def _both(m, s):
    r = lipschitz_bounds(m, s, other=_perturbed(m))
    return r.input_shape, r.input.log10


def _in_theta(m, s):
    return lipschitz_params(m, _perturbed(m), s).input_shape, None


def _summary(m, s):
    r = summary(m, s)
    return r.input_shape, r.lipschitz_log10


def _generalization(m, s):
    r = _bounds(m, s)
    return r.input_shape, r.path_norm_log10


#: entry point -> (result's shape, its ||Phi||_{1,1} in log10 when it holds one)
RESULTS = {"lipschitz_input": _in_x, "lipschitz_bounds": _both, "lipschitz_params": _in_theta,
           "summary": _summary, "generalization_bounds": _generalization}


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_a_result_says_its_declared_shape_and_is_exact_there(name):
    model = gap_net(DECLARED)
    shape, log10 = RESULTS[name](model, None)
    assert shape == DECLARED and shape.source == "Sequential.input_shape"
    assert shape.described() == "(1, 8, 8) (from Sequential.input_shape)"
    if log10 is not None:  # ||Phi||_{1,1} = ||Phi||_1 (Thm 3.3.1), enumerated at that shape
        enumerated = NeuronDAG.from_module(model, DECLARED).path_norm_log10(1.0, 1.0)
        assert log10 == pytest.approx(enumerated, abs=1e-12)


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_a_given_shape_says_given_even_where_the_declared_graph_was_traced_first(name):
    model = gap_net(DECLARED)
    path_norm(model)  # the graph at the declared shape, cached with that source
    shape, _ = RESULTS[name](model, DECLARED)
    assert shape == DECLARED and shape.source == "given"
    shape, log10 = RESULTS[name](model, OTHER)
    assert shape == OTHER and shape.source == "given"
    if log10 is not None:
        enumerated = NeuronDAG.from_module(model, OTHER).path_norm_log10(1.0, 1.0)
        assert log10 == pytest.approx(enumerated, abs=1e-12)


def test_a_refused_models_summary_says_its_shape_too():
    from torch import nn
    model = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))
    result = summary(model, (4,))
    assert not result.supported and result.input_shape == (4,)
    assert result.input_shape.source == "given"
