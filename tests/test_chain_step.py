"""The compiled chain inside training steps (pathlift.lift.chain: ln ||Phi||_q and its
gradient by one kernel call in the forward, scaled by the upstream gradient in the
backward). Every step's loss gradient equals autograd of the walked pass (a LayerGraph,
walked at each call) to 1e-12 in float64 and to float32's rounding in float32, through
the public ``differentiable_path_norm`` and ``PathSGD``, with an optimizer moving the
parameters in place between steps (the gradient is computed anew at every step, never a
stale one), and after each change the chain must notice: a parameter replaced, pruned,
rescaled in place (Def. 2.4.1), ``.data`` reassigned (new storage), made
non-contiguous, a train/eval flip. Gradients handed to the caller are never written
again: a later step leaves them as they were."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from chain_checks import CHANGES, Subclassed, assert_gamma_walked, plans
from pathlift.graph import graph_of
from pathlift.lift.chain import Chain
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.models import mlp
from pathlift.train import PathSGD

NETS = {"digits 64-128-64-10": (lambda: mlp(64, (128, 64), 10), (1, 8, 8)),
        "narrow, 5 layers": (lambda: mlp(16, (8, 8, 8, 8), 4), (16,)),
        "functional, dict output": (Subclassed, (3, 4))}


def _net(name: str, dtype: torch.dtype = torch.float64) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    build, shape = NETS[name]
    return build().to(dtype), shape


def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out["logits"] if isinstance(out, dict) else out


def _loss_grads(model: nn.Module, shape, x, y, q: float, penalty) -> list[torch.Tensor]:
    """d/d theta of cross-entropy + 0.1 ln ||Phi||_q, the penalty given by ``penalty``."""
    model.zero_grad(set_to_none=True)
    (F.cross_entropy(_logits(model, x), y) + 0.1 * penalty()).backward()
    return [p.grad.clone() for p in model.parameters()]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], rel: float) -> None:
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= rel * float(w.abs().max())


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("q", [1.0, 2.0])
def test_steps_with_an_optimizer_equal_the_walked_penalty(name: str, q: float) -> None:
    """Three SGD steps with momentum: each step's gradient of the regularised loss is the
    walked one (1e-12), the kernel's gradient recomputed on the moved parameters."""
    model, shape = _net(name)
    torch.manual_seed(1)
    x, y = torch.randn(8, *shape, dtype=torch.float64), torch.randint(3, (8,))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        walked = _loss_grads(model, shape, x, y, q, lambda: differentiable_path_norm(
            graph_of(model, shape, as_eval=True), q=q))
        fast = _loss_grads(model, shape, x, y, q,
                           lambda: differentiable_path_norm(model, shape, q))
        assert all(type(p) is Chain for p in plans(model))
        _assert_close(fast, walked, 1e-12)
        sgd.step()


def test_float32_steps_equal_the_walked_penalty_to_float32_rounding() -> None:
    model, shape = _net("digits 64-128-64-10", torch.float32)
    torch.manual_seed(1)
    x, y = torch.randn(16, *shape), torch.randint(10, (16,))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        ln = float(differentiable_path_norm(model, shape).detach())
        exact = differentiable_path_norm(graph_of(model.double(), shape, as_eval=True))
        model.float()  # the float64 copy walked, the float32 model back (recorded again)
        assert ln == pytest.approx(float(exact.detach()), rel=1e-6)
        walked = _loss_grads(model, shape, x, y, 1.0, lambda: differentiable_path_norm(
            graph_of(model, shape, as_eval=True)))
        fast = _loss_grads(model, shape, x, y, 1.0, lambda: differentiable_path_norm(
            model, shape))
        assert all(type(p) is Chain for p in plans(model))
        _assert_close(fast, walked, 1e-5)
        sgd.step()


@pytest.mark.parametrize("change", list(CHANGES))
def test_after_each_change_the_step_is_the_walked_one(change: str) -> None:
    """A step, the change, two more steps: the regularised loss's gradient is the walked
    one each time (the chain's addresses follow a new storage; a replaced, pruned or
    flipped model is recorded again)."""
    model, shape = _net("digits 64-128-64-10")
    torch.manual_seed(1)
    x, y = torch.randn(8, *shape, dtype=torch.float64), torch.randint(10, (8,))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    _loss_grads(model, shape, x, y, 1.0, lambda: differentiable_path_norm(model, shape))
    sgd.step()
    before = plans(model)
    CHANGES[change](model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)  # a replaced parameter included
    for _ in range(2):
        walked = _loss_grads(model, shape, x, y, 1.0, lambda: differentiable_path_norm(
            graph_of(model, shape, as_eval=True)))
        fast = _loss_grads(model, shape, x, y, 1.0,
                           lambda: differentiable_path_norm(model, shape))
        _assert_close(fast, walked, 1e-12)
        sgd.step()
    after = plans(model)
    if change in ("rescaled in place", ".data new storage", ".data non-contiguous"):
        assert after == before  # the same plan: its addresses or the tape's replay
    else:
        assert after[0] is not before[0]


def test_gradients_handed_over_are_never_written_again() -> None:
    """torch.autograd.grad gives the kernel's tensors to the caller: a later penalty (on
    moved parameters) writes new ones."""
    model, shape = _net("narrow, 5 layers")
    params = list(model.parameters())
    differentiable_path_norm(model, shape)
    first = torch.autograd.grad(differentiable_path_norm(model, shape), params)
    kept = [g.clone() for g in first]
    with torch.no_grad():
        for p in params:
            p.mul_(1.1)
    second = torch.autograd.grad(3.0 * differentiable_path_norm(model, shape), params)
    assert all(torch.equal(g, k) for g, k in zip(first, kept, strict=True))
    assert not any(torch.equal(g, 3.0 * k) for g, k in zip(second, kept, strict=True)
                   if bool(k.any()))


def test_two_penalties_in_one_loss_and_a_second_backward() -> None:
    """Two penalties of one graph each get their own gradient (q = 1 and q = 2: two
    chains; q = 1 twice: one chain, two calls); retain_graph's second backward gives the
    first's gradient again."""
    model, shape = _net("functional, dict output")
    graph = graph_of(model, shape, as_eval=True)
    params = list(model.parameters())

    def grads(measure) -> list[torch.Tensor]:
        loss = measure(1.0) + 0.5 * measure(2.0) - 2.0 * measure(1.0)
        once = torch.autograd.grad(loss, params, retain_graph=True)
        twice = torch.autograd.grad(loss, params)
        _assert_close(twice, once, 0.0)
        return list(once)

    differentiable_path_norm(model, shape, 1.0)
    differentiable_path_norm(model, shape, 2.0)
    fast = grads(lambda q: differentiable_path_norm(model, shape, q))
    walked = grads(lambda q: differentiable_path_norm(graph, q=q))
    _assert_close(fast, walked, 1e-12)
    assert all(type(p) is Chain for p in plans(model))


def test_frozen_parameters_and_no_grad_give_plain_numbers() -> None:
    """No parameter requiring grad, or grad mode off: the value alone, no graph."""
    model, shape = _net("narrow, 5 layers")
    want = float(differentiable_path_norm(graph_of(model, shape, as_eval=True)).detach())
    differentiable_path_norm(model, shape)
    with torch.no_grad():
        plain = differentiable_path_norm(model, shape)
    model.requires_grad_(False)
    frozen = differentiable_path_norm(model, shape)
    for ln in (plain, frozen):
        assert not ln.requires_grad and float(ln) == pytest.approx(want, rel=1e-12)


def test_a_partly_frozen_model_gets_the_walked_gradient_on_the_rest() -> None:
    """The first layer frozen: its parameters get no .grad, the others the walked one."""
    model, shape = _net("narrow, 5 layers")
    model[1].requires_grad_(False)
    differentiable_path_norm(model, shape)
    graph = graph_of(model, shape, as_eval=True)
    grads = []
    for measure in (lambda: differentiable_path_norm(model, shape),
                    lambda: differentiable_path_norm(graph)):
        model.zero_grad(set_to_none=True)
        (0.5 * measure()).backward()
        assert model[1].weight.grad is None and model[1].bias.grad is None
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    assert all(type(p) is Chain for p in plans(model))
    _assert_close(grads[0], grads[1], 1e-12)


@pytest.mark.parametrize("change", [".data new storage", "rescaled in place", "replaced"])
def test_path_sgd_steps_follow_the_walked_scales_across_changes(change: str) -> None:
    """PathSGD's steps move the parameters by grad / gamma; gamma by the chain equals the
    walked one before and after the change, with steps in between."""
    model, shape = _net("digits 64-128-64-10")
    torch.manual_seed(1)
    x, y = torch.randn(8, *shape, dtype=torch.float64), torch.randint(10, (8,))
    for round_ in range(2):
        opt = PathSGD(model, shape, lr=1e-3)
        for _ in range(2):
            assert_gamma_walked(model, shape)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            before = [p.detach().clone() for p in model.parameters()]
            gammas = magnitude_gradients(model, shape, 2.0)
            opt.step()
            moved = [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]
            assert any(bool(m.any()) for m in moved)
            for p, m in zip(model.parameters(), moved, strict=True):
                gamma = gammas.mantissas[p] * math.exp(gammas.log_scale)
                assert bool(((m * gamma).sign() * p.grad.sign() <= 0).all())
        if round_ == 0:
            CHANGES[change](model)
    assert all(type(p) is Chain for p in plans(model))


@pytest.mark.parametrize("missing", ["_APPLY", "_TRANSFORMS_ACTIVE"])
def test_a_torch_without_autograds_private_entry_takes_function_apply(monkeypatch, missing):
    """The node enters autograd by a private C entry point where this torch has it; a torch
    without it (the package takes torch >= 2.3) runs ``Function.apply``: the same step."""
    from pathlift.lift import chain

    model, shape = _net("digits 64-128-64-10")
    torch.manual_seed(1)
    x, y = torch.randn(8, *shape, dtype=torch.float64), torch.randint(10, (8,))
    fast = _loss_grads(model, shape, x, y, 1.0, lambda: differentiable_path_norm(model, shape))
    monkeypatch.setattr(chain, missing, None)
    fallback = _loss_grads(model, shape, x, y, 1.0,
                           lambda: differentiable_path_norm(model, shape))
    assert all(type(p) is Chain for p in plans(model))
    _assert_close(fallback, fast, 1e-15)
