"""Depth-scaled ResNet of eq. (4.1): hand-written backward (d = 1 and d > 1), inits, GD training."""

from __future__ import annotations

import math

import pytest
import torch

from pathlift.depth.model import MEMORY_BUDGET, DepthResNet, initial_scale, residual_stack
from pathlift.depth.train import train
from pathlift.errors import InvalidParameterError

DT = torch.float64


def plain_stack(h0: torch.Tensor, weight: torch.Tensor, delta: float, act: str) -> torch.Tensor:
    """Independent reference: the recursion in plain autograd, one layer at a time."""
    sigma = {"tanh": torch.tanh, "relu": torch.relu}[act]
    h = h0
    for k in range(weight.shape[0]):
        h = h + delta * sigma(h @ weight[k].T)
    return h


# d = 1: the vectorised scalar adjoint; d = 3: the matrix loop. Depth 37: a partial last
# checkpoint segment (d = 1: two blocks of layers, the last partial); 1100 (d = 1 only, the
# matrix loop has no blocks): segments of isqrt(1100) = 33 layers, a full block and a partial.
_SHAPES = [(1, 1), (1, 5), (1, 37), (1, 1100), (3, 1), (3, 5), (3, 37)]


@pytest.mark.parametrize("budget", [0, MEMORY_BUDGET])  # 0: checkpointed recomputation
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize(("d", "depth"), _SHAPES)
def test_forward_and_gradients_match_plain_autograd(activation: str, d: int, depth: int,
                                                    budget: int) -> None:
    gen = torch.Generator().manual_seed(depth)
    weight = torch.randn(depth, d, d, generator=gen, dtype=DT).requires_grad_()
    h0 = torch.randn(6, d, generator=gen, dtype=DT).requires_grad_()
    probe = torch.randn(6, d, generator=gen, dtype=DT)
    delta = depth**-0.5
    ours = residual_stack(h0, weight, delta, activation, budget)
    ref = plain_stack(h0, weight, delta, activation)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    g_ours = torch.autograd.grad((ours * probe).sum(), [h0, weight])
    g_ref = torch.autograd.grad((ref * probe).sum(), [h0, weight])
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2])
def test_gradcheck_against_finite_differences(d: int) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = (0.5 * torch.randn(40, d, d, generator=gen, dtype=DT)).requires_grad_()
    h0 = torch.randn(4, d, generator=gen, dtype=DT).requires_grad_()
    for budget in (0, MEMORY_BUDGET):
        assert torch.autograd.gradcheck(lambda h, w, b=budget: residual_stack(h, w, 0.3, "tanh", b),
                                        (h0, weight))


def test_workspace_is_reused_and_a_stale_backward_raises() -> None:
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(50, 1, 1, generator=gen, dtype=DT).requires_grad_()
    h0 = torch.randn(7, 1, generator=gen, dtype=DT)
    workspace = torch.empty(0, dtype=DT)
    first = residual_stack(h0, weight, 0.2, workspace=workspace)
    (grad,) = torch.autograd.grad(first.sum(), [weight])
    storage = workspace.data_ptr()
    assert workspace.numel() >= 50 * 7
    again = residual_stack(h0, weight, 0.2, workspace=workspace)
    assert workspace.data_ptr() == storage  # no new buffer
    (grad_again,) = torch.autograd.grad(again.sum(), [weight])
    (fresh,) = torch.autograd.grad(residual_stack(h0, weight, 0.2).sum(), [weight])
    assert torch.equal(grad, grad_again) and torch.equal(grad, fresh)
    stale = residual_stack(h0, weight, 0.2, workspace=workspace)
    residual_stack(2 * h0, weight, 0.2, workspace=workspace)  # overwrites the kept a_k
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(stale.sum(), [weight])
    with pytest.raises(InvalidParameterError, match="workspace"):
        residual_stack(h0, weight, 0.2, workspace=torch.empty(0, dtype=torch.float32))


def test_constant_init_is_eq_4_2_and_embeddings_depend_on_the_seed_only() -> None:
    a = DepthResNet(4, 2, depth=64, d=3, alpha=0.75, gamma=2.0, seed=5)
    b = DepthResNet(4, 2, depth=256, d=3, alpha=0.75, gamma=2.0, seed=5)
    c = DepthResNet(4, 2, depth=64, d=3, alpha=0.75, gamma=2.0, seed=6)
    expected = 64 ** (-1 / 2.0 - 0.25) / 9
    assert initial_scale(64, 3, 0.75, 2.0) == pytest.approx(expected)
    assert torch.all(a.weight == expected) and a.weight.shape == (64, 3, 3)
    assert a.delta == pytest.approx(64**-0.75)
    assert torch.equal(a.u_in, b.u_in) and torch.equal(a.u_out, b.u_out)
    assert not torch.equal(a.u_in, c.u_in)
    assert a.u_in.abs().max() <= 4**-0.5 and a.u_out.abs().max() <= 3**-0.5  # phi = 1/#features


def test_truncated_init_stays_in_its_range_and_is_rough() -> None:
    net = DepthResNet(1, 1, depth=4096, d=1, alpha=0.975, gamma=1.0, init="truncated", seed=0)
    scale = initial_scale(4096, 1, 0.975, 1.0)
    w = net.weight.detach().flatten()
    assert w.abs().max() <= scale and w.std() > 0.5 * scale  # std sqrt(s) >> s: ~U[-s, s]
    assert (w.mean() / (scale / math.sqrt(3 * 4096))).abs() < 5


def test_forward_is_eq_4_1() -> None:
    net = DepthResNet(3, 2, depth=9, d=4, alpha=0.5, gamma=1.0, init="truncated", seed=1)
    x = torch.randn(7, 3, dtype=DT)
    h = x @ net.u_in.T
    for k in range(9):
        h = h + 9**-0.5 * torch.tanh(h @ net.weight[k].T)
    torch.testing.assert_close(net(x), h @ net.u_out.T, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("d", [1, 2])
def test_training_is_plain_gradient_descent_and_leaves_the_model_alone(d: int) -> None:
    net = DepthResNet(1, 1, depth=40, d=d, alpha=0.5, gamma=1.0, init="truncated", seed=2)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.rand(50, 1, dtype=DT) * 2 - 1
    y = torch.full_like(x, 0.01)
    result = train(net, x, y, steps=2, learning_rate=3.0, loss="squared_error")
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    # one step by hand with plain autograd
    w = net.weight.detach().clone().requires_grad_()
    yhat = plain_stack(x @ net.u_in.T, w, net.delta, "tanh") @ net.u_out.T
    loss = (yhat - y).pow(2).sum(1).mean()
    (grad,) = torch.autograd.grad(loss, [w])
    assert result.loss[0] == pytest.approx(float(loss.detach()), rel=1e-12)
    residual = (yhat - y).detach()
    assert result.omega[0] == pytest.approx(float(4 * residual.pow(2).sum(1).mean()), rel=1e-12)
    one_step = train(net, x, y, steps=1, learning_rate=3.0, loss="squared_error").model.weight
    torch.testing.assert_close(one_step.detach(), w.detach() - 3.0 * grad, rtol=1e-12, atol=0)
    assert result.loss[1] < result.loss[0]


def test_half_mse_omega_is_mean_squared_residual() -> None:
    net = DepthResNet(2, 3, depth=4, d=2, alpha=0.5, gamma=1.0, seed=3)
    x, y = torch.randn(10, 2, dtype=DT), torch.randn(10, 3, dtype=DT)
    result = train(net, x, y, steps=1, learning_rate=0.1, loss="mse")
    with torch.no_grad():
        residual = net(x) - y
    assert result.omega[0] == pytest.approx(float(residual.pow(2).sum(1).mean()), rel=1e-12)
    assert result.loss[0] == pytest.approx(float(0.5 * residual.pow(2).sum(1).mean()), rel=1e-12)


def test_bad_arguments_raise_typed_errors() -> None:
    with pytest.raises(InvalidParameterError, match="activation"):
        DepthResNet(1, 1, 4, 1, 0.5, 1.0, activation="gelu")
    with pytest.raises(InvalidParameterError, match="init"):
        DepthResNet(1, 1, 4, 1, 0.5, 1.0, init="uniform")
    with pytest.raises(InvalidParameterError, match="weight"):
        residual_stack(torch.zeros(2, 3), torch.zeros(4, 2, 2), 0.5)
    net = DepthResNet(1, 1, 4, 1, 0.5, 1.0)
    with pytest.raises(InvalidParameterError, match="loss"):
        train(net, torch.zeros(2, 1), torch.zeros(2, 1), 1, 0.1, loss="l1")
    with pytest.raises(InvalidParameterError, match="diverged"):
        train(net, torch.full((2, 1), 1e200, dtype=DT), torch.ones(2, 1, dtype=DT), 5, 0.1)
    with pytest.raises(InvalidParameterError, match="learning_rate"):
        train(net, torch.ones(2, 1), torch.ones(2, 1), 5, math.inf)
