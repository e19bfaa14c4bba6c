"""Path-SGD's gamma by the recorded pass's transpose (pathlift.lift.transpose,
pathlift.lift.adjoint): equal to the walked pass (a LayerGraph, walked and differentiated
by autograd at each call) and to autograd's replay of the same tape, 1e-12 in float64,
on user-style networks (functional, residual, concat, BatchNorm in eval, max- and
average-pooling, two outputs, DenseNet, Inception, U-Net) at q = 1, 2, 3.5; planned
anew when a parameter is replaced, pruned, rescaled (in place or by a copy) or cast;
and against an identity of Thm 3.1.1 on random MLPs (hypothesis): every path ends in the
output layer, so sum over its weights of gamma_w |w|^q plus its biases' |b|^q is
||Phi||_q^q, the path-norm computed by ``path_norm``'s own pass."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune

from nets import residual_cnn, step_
from pathlift.graph import graph_of
from pathlift.lift import path_norm
from pathlift.lift.differentiable import magnitude_gradients
from pathlift.lift.replay import _PLANS
from pathlift.lift.transpose import Transposed
from pathlift.models import mlp, small_cnn
from pathlift.symmetry import random_rescale
from user_zoo import (
    bn_cnn,
    densenet_bc,
    inception,
    logits_and_features,
    randomise_batchnorm_,
    signal_cnn,
    unet,
)


class FunctionalNet(nn.Module):
    """Functional style: F.relu, F.pad, F.avg_pool2d, a skip, a concat, adaptive pooling
    and a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.mix = nn.Conv2d(4, 4, 1)
        self.side = nn.Conv2d(4, 2, 3, padding=1, bias=False)
        self.fc = nn.Linear(6 * 2 * 2, 5)

    def forward(self, x):
        h = F.relu(self.conv(F.pad(x, (1, 1, 1, 1))))
        h = F.avg_pool2d(h + F.relu(self.mix(h)), 2)
        h = torch.cat([h, F.relu(self.side(h))], dim=1)
        return {"logits": self.fc(F.adaptive_avg_pool2d(h, 2).flatten(1))}


NETS = {"mlp": (lambda: mlp(64, (16, 8), 5), (1, 8, 8)),
        "small_cnn (max-pool)": (small_cnn, (1, 8, 8)),
        "bn_cnn (BatchNorm eval)": (lambda: randomise_batchnorm_(bn_cnn()), (3, 8, 8)),
        "residual_cnn": (residual_cnn, (2, 4, 4)),
        "functional: pad, skip, concat, pools, dict": (FunctionalNet, (1, 8, 8)),
        "two outputs": (lambda: randomise_batchnorm_(logits_and_features()), (3, 8, 8)),
        "densenet_bc": (lambda: randomise_batchnorm_(densenet_bc()), (3, 16, 16)),
        "inception": (lambda: randomise_batchnorm_(inception()), (3, 16, 16)),
        "unet": (unet, (3, 16, 16)),
        "signal_cnn (conv1d, BatchNorm1d)": (lambda: randomise_batchnorm_(signal_cnn()),
                                             (2, 64))}


def _model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    build, shape = NETS[name]
    return build().double().eval(), shape


def _gammas(result) -> dict:
    return {p: g * math.exp(result.log_scale) for p, g in result.mantissas.items()}


def _assert_same(got, want) -> None:
    got, want = _gammas(got), _gammas(want)
    assert got.keys() == want.keys()
    for p, gamma in want.items():
        scale = max(float(gamma.abs().max()), 1e-300)
        assert float((got[p] - gamma).abs().max()) <= 1e-12 * scale


def _plan(model: nn.Module, q: float) -> Transposed | None:
    found = [entry[2] for key, entry in _PLANS.get(model, {}).items()
             if key[0] == "gamma" and key[1] == q]
    return found[0] if found else None


def _transposed(model: nn.Module, shape, q: float):
    """gamma by the transpose (recording first if needed), asserting it was used."""
    magnitude_gradients(model, shape, q)
    plan = _plan(model, q)
    assert plan is not None
    calls = []
    original = plan.gradients
    plan.gradients = lambda: calls.append(1) or original()
    try:
        result = magnitude_gradients(model, shape, q)
    finally:
        del plan.gradients
    assert calls == [1]
    return result


def _by_autograd(model: nn.Module, shape, q: float):
    """gamma by autograd's replay of the same tape (the transpose set aside)."""
    key = next(k for k in _PLANS[model] if k[0] == "gamma" and k[1] == q)
    watch, tape, plan = _PLANS[model][key]
    _PLANS[model][key] = (watch, tape, None)
    try:
        return magnitude_gradients(model, shape, q)
    finally:
        _PLANS[model][key] = (watch, tape, plan)


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("q", [1.0, 2.0, 3.5])
def test_the_transposed_gamma_equals_the_walked_and_the_autograd_ones(name: str, q: float
                                                                     ) -> None:
    model, shape = _model(name)
    graph = graph_of(model, shape, as_eval=True)
    for seed in range(2):
        got = _transposed(model, shape, q)
        _assert_same(got, magnitude_gradients(graph, q=q))
        _assert_same(got, _by_autograd(model, shape, q))
        step_(model, seed)


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def _pruned(model: nn.Module) -> None:
    prune.l1_unstructured(_linears(model)[0], "weight", 0.5)


def _replaced(model: nn.Module) -> None:
    first = _linears(model)[0]
    first.weight = nn.Parameter(first.weight.detach() * 3)


def _rescaled_in_place(model: nn.Module) -> None:
    first, second = _linears(model)[:2]
    with torch.no_grad():  # neuron 0 of the first hidden layer times 1e3, compensated
        first.weight[0] *= 1e3
        first.bias[0] *= 1e3
        second.weight[:, 0] /= 1e3


CHANGES = {"pruned": _pruned, "replaced": _replaced, "rescaled in place": _rescaled_in_place}


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_transpose_follows_a_changed_parameter(change: str) -> None:
    model, shape = _model("mlp")
    before = _transposed(model, shape, 2.0)
    plan = _plan(model, 2.0)
    CHANGES[change](model)
    got = _transposed(model, shape, 2.0)
    _assert_same(got, magnitude_gradients(graph_of(model, shape, as_eval=True), q=2.0))
    if change != "rescaled in place":  # the watch records anew; a rescaling drifts peaks
        assert _plan(model, 2.0) is not plan
    if change == "replaced":
        assert got.mantissas.keys() != before.mantissas.keys()


def test_a_rescaled_copy_and_a_cast_get_their_own_transpose() -> None:
    model, shape = _model("residual_cnn")
    original = _gammas(_transposed(model, shape, 2.0))
    copy = random_rescale(model, seed=3, input_shape=shape)
    _assert_same(_transposed(copy, shape, 2.0),
                 magnitude_gradients(graph_of(copy, shape, as_eval=True), q=2.0))
    assert _plan(copy, 2.0) is not _plan(model, 2.0)
    model.float()
    got = _gammas(_transposed(model, shape, 2.0))
    assert all(g.dtype == torch.float32 for g in got.values())
    for p, gamma in got.items():
        ref = original[next(q for q in original if q.shape == p.shape
                            and torch.equal(q.detach().float(), p.detach()))]
        torch.testing.assert_close(gamma.double(), ref, rtol=1e-5, atol=0)


def test_a_call_without_adjoint_keeps_autograd() -> None:
    """A padding that torch works out ("same") is no argument the conv's adjoint takes:
    the tape stays on autograd's replay and gives the walked numbers."""

    class Same(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 3, 3, padding="same")
            self.fc = nn.Linear(3 * 4 * 4, 2)

        def forward(self, x):
            return self.fc(F.relu(self.conv(x)).flatten(1))

    torch.manual_seed(0)
    model, shape = Same().double(), (1, 4, 4)
    magnitude_gradients(model, shape, 2.0)
    assert _plan(model, 2.0) is None
    _assert_same(magnitude_gradients(model, shape, 2.0),
                 magnitude_gradients(graph_of(model, shape), q=2.0))


@settings(max_examples=25, deadline=None)
@given(widths=st.lists(st.integers(1, 12), min_size=1, max_size=4),
       inputs=st.integers(1, 10), outputs=st.integers(1, 6),
       q=st.sampled_from([1.0, 2.0, 3.5]), seed=st.integers(0, 2 ** 16))
def test_gamma_of_the_output_layer_sums_to_the_path_norm(widths, inputs, outputs, q, seed
                                                          ) -> None:
    """sum_w gamma_w |w|^q + sum_b |b|^q over the output layer = ||Phi||_q^q (Thm 3.1.1:
    each path's last edge is one of them), gamma by the transpose on random MLPs."""
    torch.manual_seed(seed)
    model = mlp(inputs, tuple(widths), outputs).double()
    shape = (inputs,)
    gammas = _gammas(_transposed(model, shape, q))
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    total = float((gammas[last.weight] * last.weight.detach().abs() ** q).sum()
                  + (last.bias.detach().abs() ** q).sum())
    assert total == pytest.approx(path_norm(model, shape, q=q).value ** q, rel=1e-12)
    _assert_same(_transposed(model, shape, q), _by_autograd(model, shape, q))
