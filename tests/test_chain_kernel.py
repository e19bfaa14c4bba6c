"""The compiled chain (pathlift.lift.chain, path_chain.c): an MLP's recorded |theta|^q pass
run with its gradient by one C call. Its ln ||Phi||_q and gradient equal the walked pass's
(a LayerGraph is walked at each call, through autograd) to 1e-12 in float64, and the
value equals explicit path enumeration (NeuronDAG); Path-SGD's gamma equals the walked
one; the plan is rebuilt when a parameter is replaced, pruned or sharded away, and keeps
giving the walked numbers after an in-place rescaling (Phi unchanged, Def. 2.4.1) without
a scale of its own to drift; tapes that are no chain (a prune mask, LeakyReLU, a
convolution, tied weights) keep the replayed tape; without a compiler the tape runs
(one warning)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune

from chain_checks import Subclassed, assert_gamma_walked, plans
from nets import step_, tied_mlp
from pathlift.graph import graph_of
from pathlift.kron import cpu_kernel
from pathlift.lift.chain import Chain
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.lift.replay import _PLANS
from pathlift.models import mlp, small_cnn
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG

NETS = {"digits mlp 64-128-64-10": (lambda: mlp(64, (128, 64), 10), (1, 8, 8)),
        "784-256-256-10": (lambda: mlp(784, (256, 256), 10), (784,)),
        "narrow, 5 layers": (lambda: mlp(16, (8, 8, 8, 8), 4), (16,)),
        "subclassed, functional, no bias, dict": (Subclassed, (3, 4))}


def _model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    build, shape = NETS[name]
    return build().double().eval(), shape


def _value_and_grads(model: nn.Module, measure) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    ln = measure()
    ln.backward()
    return float(ln.detach()), [p.grad.clone() for p in model.parameters()]


def _assert_walked(model: nn.Module, shape: tuple[int, ...], q: float) -> None:
    """The penalty and its gradient against the graph walked through autograd (1e-12)."""
    graph = graph_of(model, shape, as_eval=True)
    got = _value_and_grads(model, lambda: differentiable_path_norm(model, shape, q))
    want = _value_and_grads(model, lambda: differentiable_path_norm(graph, q=q))
    assert got[0] == pytest.approx(want[0], rel=1e-12, abs=1e-12)
    for g, w in zip(got[1], want[1], strict=True):
        assert float((g - w).abs().max()) <= 1e-12 * float(w.abs().max())


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("q", [1.0, 2.0, 3.5])
def test_the_chain_penalty_equals_the_walked_one(name: str, q: float) -> None:
    model, shape = _model(name)
    differentiable_path_norm(model, shape, q)  # recorded
    assert [type(p) for p in plans(model)] == [Chain]
    for seed in range(3):  # run by the kernel on new values
        step_(model, seed)
        _assert_walked(model, shape, q)
    assert all(type(p) is Chain for p in plans(model))


@pytest.mark.parametrize("name", ["narrow, 5 layers", "subclassed, functional, no bias, dict"])
def test_the_chain_penalty_equals_path_enumeration(name: str) -> None:
    model, shape = _model(name)
    dag = NeuronDAG.from_module(model, shape)
    for q in (1.0, 2.0):
        differentiable_path_norm(model, shape, q)
        with torch.no_grad():
            ln = differentiable_path_norm(model, shape, q)
        assert not ln.requires_grad
        assert float(ln) == pytest.approx(math.log(dag.path_norm(q)), rel=1e-12)
    assert all(type(p) is Chain for p in plans(model))


@pytest.mark.parametrize("name", list(NETS))
def test_chain_path_sgd_scales_equal_the_walked_ones(name: str) -> None:
    model, shape = _model(name)
    for seed in range(3):
        assert_gamma_walked(model, shape)
        step_(model, seed)
    assert [type(p) for p in plans(model)] == [Chain]


@settings(max_examples=15, deadline=None)
@given(widths=st.lists(st.integers(1, 9), min_size=2, max_size=6),
       q=st.sampled_from([1.0, 2.0, 3.0]), scale=st.floats(-3.0, 3.0))
def test_any_mlp_chain_equals_the_walk(widths: list[int], q: float, scale: float) -> None:
    """Any widths and depth, weights of any magnitude (10^scale): the kernel's scales per
    layer keep it exact where the walk takes units."""
    torch.manual_seed(len(widths))
    model = mlp(widths[0], tuple(widths[1:-1]), widths[-1]).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10.0 ** scale)
    shape = (widths[0],)
    differentiable_path_norm(model, shape, q)
    _assert_walked(model, shape, q)


def test_a_rescaling_in_place_keeps_the_chain_and_its_number() -> None:
    """Phi is invariant under rescaling (Def. 2.4.1): factors up to 2^+-40 written into the
    parameters leave ln ||Phi|| as it was, and the gradient is the walked one."""
    model, shape = _model("digits mlp 64-128-64-10")
    before = float(differentiable_path_norm(model, shape).detach())
    recorded = plans(model)
    rescaled = random_rescale(model, factors=(2.0 ** -40, 1.0, 2.0 ** 40), seed=1)
    with torch.no_grad():
        for p, new in zip(model.parameters(), rescaled.parameters(), strict=True):
            p.copy_(new)
    assert float(differentiable_path_norm(model, shape).detach()) == pytest.approx(
        before, rel=1e-12)
    _assert_walked(model, shape, 1.0)
    assert plans(model) == recorded


def _replace(model: nn.Module) -> None:
    model[1].weight = nn.Parameter(torch.randn_like(model[1].weight))


def _prune(model: nn.Module) -> None:
    prune.l1_unstructured(model[1], "weight", amount=0.5)


def _leaky(model: nn.Module) -> None:
    model[2] = nn.LeakyReLU(0.1)


@pytest.mark.parametrize("change, chain", [(_replace, True), (_prune, False), (_leaky, False)],
                         ids=["replaced", "pruned", "LeakyReLU"])
def test_the_chain_is_rebuilt_when_the_model_changes(change, chain: bool) -> None:
    """A new parameter: a new chain; a prune mask or a LeakyReLU (no plain chain): the
    tape. Both give the walked numbers."""
    model, shape = _model("digits mlp 64-128-64-10")
    differentiable_path_norm(model, shape)
    magnitude_gradients(model, shape, 2.0)
    before = plans(model)
    change(model)
    _assert_walked(model, shape, 1.0)
    magnitude_gradients(model, shape, 2.0)
    after = plans(model)
    assert all(a is not b for a, b in zip(after, before, strict=True))
    assert all((type(p) is Chain) == chain for p in after)


def test_tied_weights_and_convolutions() -> None:
    """Tied weights: the penalty's chain takes a weight once per use (autograd sums the
    kernel's gradients); gamma's pass of a module applied twice has one leaf in two
    layers and keeps the transposed tape; a convolution is no chain. All give the walked
    numbers."""
    torch.manual_seed(0)
    cnn = small_cnn().double().eval()
    differentiable_path_norm(cnn, (1, 8, 8))
    magnitude_gradients(cnn, (1, 8, 8))
    assert not any(type(p) is Chain for p in plans(cnn))
    reused = tied_mlp()  # one module called twice
    shared = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6)).double()
    shared[2].weight = shared[0].weight  # one weight in two modules
    for model, shape in ((reused, (5,)), (shared, (6,))):
        for _ in range(2):  # recorded, then run by the chain or the tape
            _assert_walked(model, shape, 1.0)
            assert_gamma_walked(model, shape)
    kinds = {key[0]: type(plan) for key, (_, _, plan) in _PLANS[reused].items()}
    assert kinds["norm"] is Chain and kinds["gamma"] is not Chain
    assert all(type(p) is Chain for p in plans(shared))


@pytest.mark.parametrize("retained", [False, True], ids=["first backward", "second backward"])
def test_an_in_place_change_before_backward_is_refused(retained: bool) -> None:
    """The gradient is that of the values of the forward: autograd's version check, also
    for retain_graph's second backward (which computes the gradient anew)."""
    model, shape = _model("narrow, 5 layers")
    differentiable_path_norm(model, shape)
    ln = differentiable_path_norm(model, shape)
    if retained:
        ln.backward(retain_graph=True)
    with torch.no_grad():
        model[1].weight.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ln.backward()


def test_a_second_derivative_is_refused() -> None:
    """The kernel's gradient is no autograd graph: differentiating it raises."""
    model, shape = _model("narrow, 5 layers")
    differentiable_path_norm(model, shape)
    ln = differentiable_path_norm(model, shape)
    (grad,) = torch.autograd.grad(ln, [model[1].weight], create_graph=True)
    with pytest.raises(RuntimeError, match=r"once_differentiable|does not require grad"):
        grad.sum().backward()


def test_a_non_contiguous_parameter_runs_the_tape() -> None:
    model, shape = _model("narrow, 5 layers")
    differentiable_path_norm(model, shape)
    w = model[1].weight
    w.data = w.data.t().contiguous().t()  # the same values, the same shape, other strides
    assert not w.is_contiguous()
    _assert_walked(model, shape, 1.0)
    _assert_walked(model, shape, 2.0)


def test_float32_chain_is_the_walk_to_float32_rounding() -> None:
    torch.manual_seed(0)
    model, shape = mlp(64, (128, 64), 10).eval(), (1, 8, 8)
    differentiable_path_norm(model, shape)
    assert [type(p) for p in plans(model)] == [Chain]
    exact = differentiable_path_norm(graph_of(model.double(), shape), q=1.0)
    model.float()
    assert float(differentiable_path_norm(model, shape).detach()) == pytest.approx(
        float(exact.detach()), rel=1e-6)


def test_without_a_compiler_the_tape_runs_with_one_warning(monkeypatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/pathlift-test-cc")
    cpu_kernel._library_for.cache_clear()
    try:
        model, shape = _model("narrow, 5 layers")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            differentiable_path_norm(model, shape)
            differentiable_path_norm(model, shape, 2.0)
        assert len([w for w in caught if "path_chain.c could not be built" in str(w.message)]
                   ) == 1
        assert not any(type(p) is Chain for p in plans(model))
        _assert_walked(model, shape, 1.0)
    finally:
        cpu_kernel._library_for.cache_clear()
