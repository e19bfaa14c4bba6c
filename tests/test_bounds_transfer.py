"""The two transfers of the compression certificate, on random networks of every supported
op (pathlift.bounds.box, pathlift.bounds.compression): the path-metric one
(m_theta >= m_Q - B(x) d for Q a truncation towards zero of a rescaled, pruned theta) and
the per-input box one (every network sampled in the box has its outputs in the enclosure
and its margin above the bound), checked on random inputs."""

import math
import random

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds.box import box_margins, box_outputs, margin_lower_bounds
from pathlift.bounds.code import quantized_tensors
from pathlift.bounds.compression import input_scale, logit_margins
from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import copy_model, graph_of
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.normalize import normalize
from pathlift.lift import path_metric, path_norm
from pathlift.quant import quantize
from random_nets import random_input, random_network


def _outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return flat_outputs(model(x), len(x))


def _margins(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    index = y.reshape(-1, 1)
    return out.gather(1, index).squeeze(1) - out.scatter(1, index, -math.inf).amax(1)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
@example(58)  # Q = theta on every path: the difference of the norms is lost to rounding
def test_path_metric_transfer_holds_on_random_inputs(seed):
    """Q = truncation towards zero (a random step per tensor) of a power-of-two rescaling of
    theta, some coordinates pruned first: d = ||Phi(theta)||_1 - ||Phi(Q)||_1 is exact (or
    below float64's rounding of the norms, certified) and ||R_theta(x) - R_Q(x)||_1 <=
    B(x) d, m_theta >= m_Q - B(x) d on random inputs."""
    model, shape = random_network(seed)
    model = model.double()
    rng = random.Random(seed)
    rescaled = normalize(model, shape, rng.choice((1.0, 2.0, math.inf)), power_of_two=True)
    assert path_norm(rescaled, shape).log10 == pytest.approx(path_norm(model, shape).log10,
                                                             abs=1e-12)
    pruned = copy_model(rescaled)
    if rng.random() < 0.5:  # zero random coordinates of the weights (a pruning)
        with torch.no_grad():
            for module in pruned.modules():
                if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                    keep = torch.rand(module.weight.shape, generator=torch.Generator()
                                      .manual_seed(seed)) > 0.3
                    module.weight.mul_(keep)
    names = [n for n, *_ in quantized_tensors(graph_of(rescaled, shape))]
    steps = {n: 2.0 ** rng.randint(-7, 0) for n in names}
    q = quantize(pruned, shape, step=steps)
    metric = path_metric(rescaled, q.model, shape)
    # exact, or (Q = theta on every path) lost to cancellation with its certified upper end
    assert metric.same_signs and (metric.exact or metric.upper_log10 < metric.norm_a_log10 - 9)
    d = metric.value * (1 + 10 * metric.relative_accuracy)
    x = random_input(shape, seed, batch=16)
    out_theta, out_q = _outputs(model, x), _outputs(q.model.double(), x)
    bound = input_scale(x) * d
    assert bool(((out_theta - out_q).abs().sum(1) <= bound * (1 + 1e-9) + 1e-9).all())
    y = torch.randint(out_theta.shape[1], (16,), generator=torch.Generator().manual_seed(seed))
    assert bool((_margins(out_theta, y) >= _margins(out_q, y) - bound * (1 + 1e-9)
                 - 1e-9).all())


def _box_of(graph, rng: random.Random, scale: float):
    """A random box around each quantised tensor of the graph's model: (low, high)."""
    boxes = {}
    for name, _, _, value in quantized_tensors(graph):
        layer, pname = name.rsplit(".", 1)
        v = value.detach().double()
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        below = torch.rand(v.shape, generator=g, dtype=torch.float64) * scale
        above = torch.rand(v.shape, generator=g, dtype=torch.float64) * scale
        boxes.setdefault(layer, {})[pname] = (v - below, v + above)
    return boxes


def _sample(model: nn.Module, graph, boxes, rng: random.Random) -> nn.Module:
    """A network whose every quantised tensor is drawn in its box (corners half the time),
    written as quantisation writes it (BatchNorm as x * a + c)."""
    sample = copy_model(model).double()
    with torch.no_grad():
        for node in graph.parametric_nodes():
            module = sample.get_submodule(node.target)
            values = {}
            for pname, _, _ in graph.handler(node).quantizable(module):
                low, high = boxes[node.target][pname]
                g = torch.Generator().manual_seed(rng.randrange(2**31))
                u = torch.rand(low.shape, generator=g, dtype=torch.float64)
                if rng.random() < 0.5:
                    u = u.round()
                values[pname] = low + u * (high - low)
            graph.handler(node).write_quantized_(module, values)
    return sample


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
@example(12433)  # a Linear on the last dim of a signal returns the output
def test_box_enclosure_and_margin_bound_hold_for_sampled_networks(seed):
    """Every op: Linear, Conv, ConvTranspose, eval BatchNorm, ReLU, max-pool, average pools,
    mean, interpolation, padding, slicing, residual sums, cat, LeakyReLU, PReLU, ReLU6,
    Hardtanh, clamp: networks drawn in the box stay inside the enclosure, and their margins
    above both margin bounds (the one through the last Linear layer included)."""
    model, shape = random_network(seed)
    model = model.double()
    graph = graph_of(model, shape)
    rng = random.Random(seed)
    boxes = _box_of(graph, rng, rng.choice((1e-3, 0.05, 0.3)))
    x = random_input(shape, seed, batch=8)
    enclosure = box_outputs(model, shape, x, boxes)
    low = torch.cat([o.low.reshape(8, -1) for o in enclosure], 1)
    high = torch.cat([o.high.reshape(8, -1) for o in enclosure], 1)
    y = torch.randint(low.shape[1], (8,), generator=torch.Generator().manual_seed(seed))
    bound = box_margins(model, shape, x, y, boxes)
    generic = margin_lower_bounds(enclosure, y)
    for _ in range(12):
        sample = _sample(model, graph, boxes, rng)
        out = _outputs(sample, x)
        assert bool(((low <= out) & (out <= high)).all())
        if out.shape[1] > 1:
            margin = _margins(out, y)
            assert bool((bound <= margin).all()) and bool((generic <= margin).all())


def test_box_margin_is_the_exact_range_for_one_hidden_layer():
    """An MLP with one hidden layer: the enclosure of the margin through the last layer is
    attained (up to the midpoint-radius product) by a corner of the box."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    graph = graph_of(model, (3,))
    boxes = _box_of(graph, random.Random(0), 0.02)
    x = torch.randn(5, 3, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1])
    bound = box_margins(model, (3,), x, y, boxes)
    rng = random.Random(1)
    worst = torch.full((5,), math.inf, dtype=torch.float64)
    for _ in range(2000):
        sample = _sample(model, graph, boxes, rng)
        worst = torch.minimum(worst, _margins(_outputs(sample, x), y))
    assert bool((bound <= worst).all())
    assert float((worst - bound).max()) < 0.25 * float((worst.abs()).max())


def test_logit_margins_and_box_errors():
    model = nn.Sequential(nn.Linear(2, 3))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3, 2))
        model[0].bias.zero_()
    x = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    m, size = logit_margins(model, x, torch.tensor([0, 0]))
    assert m.tolist() == [1.0, -3.0] and size.tolist() == [2.0, 3.0]
    assert input_scale(torch.tensor([[0.5, -0.2], [-4.0, 1.0]])).tolist() == [1.0, 4.0]
    graph = graph_of(model, (2,))
    boxes = _box_of(graph, random.Random(0), 0.1)
    bad = {"0": {"weight": (boxes["0"]["weight"][1], boxes["0"]["weight"][0]),
                 "bias": boxes["0"]["bias"]}}
    with pytest.raises(InvalidParameterError, match="low > high"):
        box_outputs(model, (2,), x, bad)
    with pytest.raises(UnsupportedModelError, match="no box"):
        box_outputs(model, (2,), x, {})
