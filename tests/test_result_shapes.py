"""Every result says the input shape it was computed at and where that shape came from
(``InputShape.source``), as path-norms, scores and path-metrics do: the Lipschitz bounds
(in x, in theta, both), the summary and the generalisation bounds. Each is checked on a
global-average-pool net whose numbers depend on the shape, against path enumeration at the
shape the result names."""

from __future__ import annotations

import pytest

from pathlift.bounds import lipschitz_bounds, lipschitz_input, lipschitz_params
from pathlift.lift import path_norm
from pathlift.summary import summary
from pathlift.testing.neurons import NeuronDAG
from test_input_shape import DECLARED, OTHER, _bounds, _perturbed, gap_net

#: entry point -> (result's shape, its ||Phi||_{1,1} in log10 when it holds one)
RESULTS = {
    "lipschitz_input": lambda m, s: (r := lipschitz_input(m, s)).input_shape and
    (r.input_shape, r.log10),
    "lipschitz_bounds": lambda m, s: (r := lipschitz_bounds(m, s, other=_perturbed(m))) and
    (r.input_shape, r.input.log10),
    "lipschitz_params": lambda m, s: (r := lipschitz_params(m, _perturbed(m), s)) and
    (r.input_shape, None),
    "summary": lambda m, s: (r := summary(m, s)) and (r.input_shape, r.lipschitz_log10),
    "generalization_bounds": lambda m, s: (r := _bounds(m, s)) and
    (r.input_shape, r.path_norm_log10),
}


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
