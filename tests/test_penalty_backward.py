"""``path_norm_backward`` / ``PathNormPenalty.backward``: the regularised step as
``loss.backward()`` then the penalty's gradient added to ``.grad`` (one kernel call on an
MLP, ``pathlift.lift.chain``; autograd's route elsewhere). Each step's ``.grad`` equals
autograd of ``loss + weight * penalty`` through the walked pass (a LayerGraph, walked at
each call) to 1e-12 in float64, with an optimizer moving the parameters between steps and
after each change the chain must notice; the compiled route is checked to be the one
taken, and where it must not be (a tensor hook, a non-contiguous ``.grad``, NaN weights)
autograd's route gives autograd's answer, or its refusal with ``.grad`` untouched."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from chain_checks import CHANGES, Subclassed
from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import graph_of
from pathlift.lift import chain as chain_module
from pathlift.lift.differentiable import differentiable_path_norm, path_norm_backward
from pathlift.models import mlp, small_cnn
from pathlift.train import AverageCasePenalty, PathNormPenalty

NETS = {"digits 64-128-64-10": (lambda: mlp(64, (128, 64), 10), (1, 8, 8)),
        "narrow, 5 layers": (lambda: mlp(16, (8, 8, 8, 8), 4), (16,)),
        "functional, dict output": (Subclassed, (3, 4)),
        "small_cnn (autograd's route)": (small_cnn, (1, 8, 8))}


def _net(name: str) -> tuple[nn.Module, tuple[int, ...], torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    build, shape = NETS[name]
    model = build().double().eval()  # small_cnn's BatchNorm as its affine map
    x = torch.randn(8, *shape, dtype=torch.float64)
    return model, shape, x, torch.randint(3, (8,))


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out["logits"] if isinstance(out, dict) else out


class _Routes:
    """Counts the steps ``Chain.add_gradient`` took (a value) and passed on (None)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compiled = self.declined = 0
        original = chain_module.Chain.add_gradient

        def counted(chain, *args):
            got = original(chain, *args)
            self.compiled += got is not None
            self.declined += got is None
            return got

        monkeypatch.setattr(chain_module.Chain, "add_gradient", counted)


def _walked(model, shape, x, y, weight, q, log) -> tuple[list[torch.Tensor], float]:
    """.grad of cross-entropy + weight * penalty through the walked pass, and the penalty."""
    model.zero_grad(set_to_none=True)
    ln = differentiable_path_norm(graph_of(model, shape), q=q)
    penalty = ln if log else ln.exp()
    (F.cross_entropy(_logits(model, x), y) + weight * penalty).backward()
    return [p.grad.clone() for p in model.parameters()], float(penalty.detach())


def _stepped(model, shape, x, y, weight, q, log) -> tuple[list[torch.Tensor], float]:
    """The same by ``loss.backward()`` then ``path_norm_backward``."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(_logits(model, x), y).backward()
    value = path_norm_backward(model, shape, weight, q, log=log)
    return [p.grad.clone() for p in model.parameters()], value


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], rel: float) -> None:
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= rel * float(w.abs().max())


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize(("q", "log"), [(1.0, True), (2.0, True), (1.0, False), (2.0, False)])
def test_steps_equal_autograd_of_the_walked_penalty(name, q, log, monkeypatch) -> None:
    """Three SGD steps with momentum: each step's .grad and penalty are the walked ones
    (1e-12), by the kernel on the MLPs from the second call on."""
    model, shape, x, y = _net(name)
    routes = _Routes(monkeypatch)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        want, value = _walked(model, shape, x, y, 0.1, q, log)
        got, mine = _stepped(model, shape, x, y, 0.1, q, log)
        _assert_close(got, want, 1e-12)
        assert mine == pytest.approx(value, rel=1e-12)
        sgd.step()
    assert routes.compiled == (0 if "autograd" in name else 2) and routes.declined == 0


@pytest.mark.parametrize("change", list(CHANGES))
def test_after_each_change_the_step_is_the_walked_one(change: str) -> None:
    model, shape, x, y = _net("digits 64-128-64-10")
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    _stepped(model, shape, x, y, 0.5, 1.0, True)
    sgd.step()
    CHANGES[change](model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        want, value = _walked(model, shape, x, y, 0.5, 1.0, True)
        got, mine = _stepped(model, shape, x, y, 0.5, 1.0, True)
        _assert_close(got, want, 1e-12)
        assert mine == pytest.approx(value, rel=1e-12)
        sgd.step()


def test_missing_grads_are_made_frozen_ones_left_and_grad_mode_ignored(monkeypatch) -> None:
    """.grad None becomes the gradient; a frozen layer keeps None; under no_grad the
    same numbers; negative, zero and tensor weights as autograd's."""
    model, shape, _, _ = _net("narrow, 5 layers")
    model[1].requires_grad_(False)
    graph = graph_of(model, shape)
    path_norm_backward(model, shape)  # records the pass
    routes = _Routes(monkeypatch)
    for weight in (-2.0, 0.0, torch.tensor(3.0)):
        model.zero_grad(set_to_none=True)
        (weight * differentiable_path_norm(graph)).backward()
        want = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            path_norm_backward(model, shape, weight)
        assert model[1].weight.grad is None and model[1].bias.grad is None
        _assert_close([p.grad for p in model.parameters() if p.requires_grad],
                      [w for w in want if w is not None], 1e-12)
    assert routes.compiled == 3


def _hooked(model: nn.Module) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    model[3].weight.register_hook(lambda g: seen.append(g.clone()))
    return seen


def _non_contiguous_grad(model: nn.Module) -> None:
    w = model[3].weight
    w.grad = torch.zeros(w.shape[1], w.shape[0], dtype=w.dtype).t()


@pytest.mark.parametrize("make", [_hooked, _non_contiguous_grad])
def test_what_the_kernel_must_not_write_takes_autograds_route(make, monkeypatch) -> None:
    """A tensor hook is called (with the penalty's gradient), a non-contiguous .grad is
    accumulated by autograd: the same .grad as the walked penalty's."""
    model, shape, _, _ = _net("digits 64-128-64-10")
    (0.5 * differentiable_path_norm(graph_of(model, shape))).backward()
    want = [p.grad.clone() for p in model.parameters()]
    differentiable_path_norm(model, shape)  # records the chain
    model.zero_grad(set_to_none=True)
    seen = make(model)
    routes = _Routes(monkeypatch)
    path_norm_backward(model, shape, 0.5)
    _assert_close([p.grad for p in model.parameters()], want, 1e-12)
    assert routes.declined == 1 and routes.compiled == 0
    if seen is not None:
        assert len(seen) == 1
        _assert_close(seen, [want[2]], 1e-12)


def test_nan_weights_are_refused_with_grads_untouched() -> None:
    model, shape, x, y = _net("digits 64-128-64-10")
    path_norm_backward(model, shape)
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    kept = [p.grad.clone() for p in model.parameters()]
    model[1].bias.grad = None
    with torch.no_grad():
        model[3].weight[0, 0] = math.nan
    with pytest.raises(UnsupportedModelError, match="NaN"):
        path_norm_backward(model, shape)
    assert model[1].bias.grad is None
    for p, k in zip(model.parameters(), kept, strict=True):
        if p.grad is not None:
            assert torch.equal(p.grad, k)


def test_penalty_objects_step_as_their_loss_term() -> None:
    """PathNormPenalty.backward (log and plain) and AverageCasePenalty.backward give the
    .grad of ``(weight * penalty(model, x)).backward()``."""
    model, shape, x, _ = _net("functional, dict output")
    for penalty in (PathNormPenalty(shape, 1.0, log=True), PathNormPenalty(shape, 2.0),
                    AverageCasePenalty(samples=4)):
        model.zero_grad(set_to_none=True)
        value = penalty(model, x)
        (0.25 * value).backward()
        value = float(value.detach())
        want = [p.grad.clone() for p in model.parameters()]
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            assert penalty.backward(model, 0.25, x) == pytest.approx(value, rel=1e-12)
            _assert_close([p.grad for p in model.parameters()], want, 1e-12)


def test_a_weight_that_is_not_finite_is_refused() -> None:
    model, shape, _, _ = _net("narrow, 5 layers")
    with pytest.raises(InvalidParameterError, match="weight"):
        path_norm_backward(model, shape, math.inf)
