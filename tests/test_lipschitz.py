"""Lipschitz bounds: Thm 3.3.1 (in x), Thm 3.3.2 / Lemma 3.3.3 (Pi_{q,r}), Cor. 3.4.1 (in theta)."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds.lipschitz import lipschitz_input, lipschitz_params
from pathlift.graph.boundary import flat_outputs
from pathlift.lift import path_norm
from pathlift.lift.layer_norm import layer_norm_product
from pathlift.symmetry import normalize
from test_path_metric import masked, rounded_towards_zero
from test_rescale import ZOO, build


def layered(seed: int, widths: list[int], bias: bool, conv: bool) -> tuple[nn.Module, tuple]:
    """A random network without residual sums nor pooling (whose fixed weights cannot be
    normalised for q != 1): Linear, or Conv1d without padding, and ReLU."""
    torch.manual_seed(seed)
    if conv:
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths[:-1]):
            layers += [nn.Conv1d(a, b, 2, bias=bias), nn.ReLU()]
        length = 6 - (len(widths) - 2)
        model = nn.Sequential(*layers, nn.Flatten(),
                              nn.Linear(widths[-2] * length, widths[-1], bias=bias))
        return model.double(), (widths[0], 6)
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b, bias=bias), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).double(), (widths[0],)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), widths=st.lists(st.integers(1, 5), min_size=3, max_size=5),
       bias=st.booleans(), conv=st.booleans(), q=st.sampled_from([1.0, 2.0, 3.0]),
       r=st.sampled_from([1.0, 2.0, math.inf]))
def test_product_of_layer_norms_dominates_and_meets_after_normalisation(
        seed, widths, bias, conv, q, r):
    """Thm 3.3.2: ||Phi||_{q,r} <= Pi_{q,r}, with equality for q-normalized parameters."""
    model, shape = layered(seed, widths, bias, conv)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(torch.exp(2 * torch.randn_like(p)))  # unbalanced scales
    before = path_norm(model, shape, q, r).log10
    assert before <= layer_norm_product(model, shape, q, r).log10 + 1e-12
    normalized = normalize(model, shape, q)
    after = layer_norm_product(normalized, shape, q, r).log10
    assert math.isclose(after, path_norm(normalized, shape, q, r).log10, abs_tol=1e-9)
    assert math.isclose(after, before, abs_tol=1e-9)


@pytest.mark.parametrize("q", [1.0, 2.0, 0.5])
def test_lemma_3_3_3_product_of_matrix_norms(q):
    """Bias-free LFCN: Pi_{q,inf} = prod_l ||M_l||_{q,inf} (max row l^q norm)."""
    model, shape = layered(3, [4, 6, 5, 3], bias=False, conv=False)
    expected = sum(math.log10(float(m.weight.detach().abs().pow(q).sum(1).pow(1 / q).max()))
                   for m in model if isinstance(m, nn.Linear))
    assert math.isclose(layer_norm_product(model, shape, q, math.inf).log10, expected,
                        rel_tol=1e-12)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_input_lipschitz_holds_on_samples(name):
    """Thm 3.3.1: ||R(x) - R(x')||_r <= ||Phi||_{1,r} ||x - x'||_inf on sampled pairs."""
    model = build(name)
    shape = ZOO[name][1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn((64, *shape), dtype=torch.float64, generator=g)
    x2 = x + 0.1 * torch.randn(x.shape, dtype=torch.float64, generator=g)
    with torch.no_grad():
        gap = (model(x) - model(x2)).flatten(1)
    dx = (x - x2).flatten(1).abs().amax(1)
    for r in (1.0, 2.0, math.inf):
        bound = lipschitz_input(model, shape, r)
        lhs = gap.norm(p=r, dim=1)
        assert (lhs <= bound.path_norm.value * dx * (1 + 1e-9)).all()
        if bound.layer_product is not None:
            assert bound.layer_product.log10 >= bound.log10 - 1e-12


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("change", ["prune", "round"])
def test_parameter_lipschitz_holds_on_samples(name, change):
    """Cor. 3.4.1: ||R_theta(x) - R_theta'(x)||_1 <= max(||x||_inf, 1) d(theta, theta')."""
    model = build(name)
    shape = ZOO[name][1]
    other = masked(model, 0.6, 1) if change == "prune" else rounded_towards_zero(model, 0.1)
    x = 3.0 * torch.rand((64, *shape), dtype=torch.float64,
                         generator=torch.Generator().manual_seed(2)) - 1.5
    result = lipschitz_params(model, other, shape, x_inf=1.5)
    assert (result.applies and math.isfinite(result.log10)) or math.isinf(result.metric.upper)
    with torch.no_grad():
        gap = (model(x) - other(x)).flatten(1).abs().sum(1)
    assert (gap <= result.value * (1 + 1e-9) + 1e-12).all()


def test_figure_3_4_counterexample_gets_no_bound():
    """theta = (1, 1) vs theta' = (-1, -1): Phi equal, functions ReLU(x) and -ReLU(-x)."""
    a = nn.Sequential(nn.Linear(1, 1, bias=False), nn.ReLU(), nn.Linear(1, 1, bias=False))
    b = nn.Sequential(nn.Linear(1, 1, bias=False), nn.ReLU(), nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        for m in a:
            if isinstance(m, nn.Linear):
                m.weight.fill_(1.0)
        for m in b:
            if isinstance(m, nn.Linear):
                m.weight.fill_(-1.0)
    result = lipschitz_params(a, b, (1,), x_inf=1.0)
    assert not result.applies and math.isnan(result.value)
    assert "Figure 3.4" in result.reason
    assert result.metric.lower == 0.0  # Phi(theta) = Phi(theta') ...
    x = torch.tensor([[1.0]])
    with torch.no_grad():
        assert float((a(x) - b(x)).abs()) == 1.0  # ... yet the outputs differ: no bound is right
    assert result.lfcn_log10 is not None and 10**result.lfcn_log10 >= 1.0  # eq. 3.7 holds


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), keep=st.sampled_from([0.5, 0.9]))
def test_path_metric_bound_is_finer_than_the_classical_one(seed, keep):
    """Bias-free LFCN, pruned: Cor. 3.4.1 <= (W||x||+1) W L^2 R^{L-1} ||theta - theta'||_inf."""
    model, shape = layered(seed, [5, 6, 6, 2], bias=False, conv=False)
    pruned = masked(model, keep, seed)
    result = lipschitz_params(model, pruned, shape, x_inf=2.0)
    assert result.applies and result.metric.exact
    assert result.log10 <= result.lfcn_log10 + 1e-12
    x = 4.0 * torch.rand((32, 5), dtype=torch.float64) - 2.0
    with torch.no_grad():
        gap = (model(x) - pruned(x)).abs().sum(1)
    assert (gap <= result.value * (1 + 1e-9) + 1e-15).all()


_REFERENCE = [pytest.param("mlp", (1, 8, 8), id="mlp"),
              pytest.param("small_cnn", (1, 8, 8), id="small_cnn")] + [
    pytest.param(n, s, id=n, marks=pytest.mark.slow)
    for n, s in (("unet", (1, 32, 32)), ("resnet18", (3, 32, 32)),
                 ("mobilenet_relu", (3, 32, 32)), ("vgg11_bn", (3, 32, 32)))]


@pytest.mark.parametrize("name,shape", _REFERENCE)
def test_bounds_hold_on_reference_architectures(name, shape):
    """Thm 3.3.1 on sampled (x, x') and Cor. 3.4.1 on (theta, magnitude-pruned theta')."""
    from pathlift.models import get_model
    from pathlift.symmetry import magnitude_prune

    torch.manual_seed(0)
    model = get_model(name).double().eval()
    pruned = magnitude_prune(model, 0.3)
    g = torch.Generator().manual_seed(1)
    x = 2 * torch.rand((8, *shape), dtype=torch.float64, generator=g) - 1
    x2 = x + 0.05 * torch.randn(x.shape, dtype=torch.float64, generator=g)
    with torch.no_grad():
        y, y2, yp = model(x), model(x2), pruned(x)
    in_x = lipschitz_input(model, shape, r=1.0)
    dx = (x - x2).flatten(1).abs().amax(1)
    assert ((y - y2).flatten(1).abs().sum(1) <= in_x.path_norm.value * dx * (1 + 1e-9)).all()
    in_theta = lipschitz_params(model, pruned, shape, x_inf=1.0)
    assert in_theta.applies and in_theta.metric.exact
    assert ((y - yp).flatten(1).abs().sum(1) <= in_theta.value * (1 + 1e-9)).all()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_bounds_hold_on_random_networks(seed):
    """Thm 3.3.1 and Cor. 3.4.1 (pruned copy) on random networks of every supported op."""
    from random_nets import random_network

    model, shape = random_network(seed)
    model = model.double()
    pruned = masked(model, 0.6, seed)
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand((16, *shape), dtype=torch.float64, generator=g) - 1
    x2 = x + 0.1 * torch.randn(x.shape, dtype=torch.float64, generator=g)
    with torch.no_grad():
        y, y2, yp = (flat_outputs(out, len(x)) for out in (model(x), model(x2), pruned(x)))
    bound = lipschitz_input(model, shape, 1.0).path_norm.value
    dx = (x - x2).flatten(1).abs().amax(1)
    assert ((y - y2).abs().sum(1) <= bound * dx * (1 + 1e-9) + 1e-12).all()
    in_theta = lipschitz_params(model, pruned, shape, x_inf=1.0)
    assert in_theta.applies
    assert ((y - yp).abs().sum(1) <= in_theta.value * (1 + 1e-9) + 1e-12).all()


def test_layer_norm_product_of_a_float32_cnn_equals_its_float64_copy():
    """The max-product pass runs in float64 whatever the model's dtype (a float32 conv
    used to be called on float64 values)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(12, 2)).eval()
    single = layer_norm_product(model, (2, 4, 4)).log10
    double = layer_norm_product(copy.deepcopy(model).double(), (2, 4, 4)).log10
    assert single == pytest.approx(double, abs=1e-6)
    assert lipschitz_input(model, (2, 4, 4)).layer_product is not None


def test_lipschitz_bounds_is_the_two_calls_in_one():
    from pathlift.bounds import lipschitz_bounds
    from pathlift.models import mlp

    a, b = mlp(16, (8,), 3), mlp(16, (8,), 3)
    shape = (1, 4, 4)
    alone = lipschitz_bounds(a, shape, 2.0)
    assert alone.params is None and alone.input == lipschitz_input(a, shape, 2.0)
    both = lipschitz_bounds(a, shape, 1.0, other=b, x_inf=3.0)
    assert both.input == lipschitz_input(a, shape, 1.0)
    by_hand = lipschitz_params(a, b, shape, 3.0)
    assert both.params.applies == by_hand.applies and both.params.reason == by_hand.reason
    assert both.params.log10 == by_hand.log10 or (math.isnan(both.params.log10)
                                                  and math.isnan(by_hand.log10))
    assert both.params.lfcn_log10 == by_hand.lfcn_log10
    assert "\n" not in repr(both) and repr(both).startswith("LipschitzBounds(in x: log10 ")
