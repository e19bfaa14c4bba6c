"""Differentiable path-norms and penalties (pathlift.lift.differentiable, pathlift.train):
the gradient against autograd through explicit path enumeration (NeuronDAG) and against
finite differences on a ResNet block; the average-case penalty against the library's
measurement; the model's autograd state left alone."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from nets import residual_cnn
from pathlift.errors import UnsupportedModelError
from pathlift.graph import copy_model, eval_mode
from pathlift.lift import average_case_path_norm, path_norm
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.models import mlp, small_cnn
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import Activation, NeuronDAG
from pathlift.train import AverageCasePenalty, PathNormPenalty, make_penalty
from random_nets import NEW_OPS, random_network, randomise_batchnorm_


def _dag_coordinates(dag: NeuronDAG) -> tuple[list[tuple[int, int]], list[int]]:
    """The edges (u, v) and the neurons carrying a bias (every non-input neuron)."""
    edges = [(u, v) for v, n in enumerate(dag.neurons) for u in n.antecedents]
    biased = [v for v, n in enumerate(dag.neurons) if n.activation is not Activation.INPUT]
    return edges, biased


def _dag_values(dag: NeuronDAG, edges: list[tuple[int, int]], biased: list[int]
                ) -> torch.Tensor:
    """Edge weights then biases of ``dag`` in the order of ``edges``/``biased`` (0 if absent)."""
    weights = [dict(zip(n.antecedents, n.weights, strict=True)) for n in dag.neurons]
    return torch.tensor([weights[v].get(u, 0.0) for u, v in edges]
                        + [dag.neurons[v].bias for v in biased], dtype=torch.float64)


def enumerated_log_norm_gradient(model: nn.Module, shape: tuple[int, ...], q: float
                                 ) -> torch.Tensor:
    """d ln ||Phi||_q / d theta by autograd through the explicit sum over paths of Def. 2.3.1.

    The DAG's edge weights and biases are affine in the parameters (Linear, Conv, eval
    BatchNorm, pooling), so their Jacobian is exact from unit perturbations of each
    parameter entry (one NeuronDAG each); then ln(sum_p |prod_e w_e * b_{p_0}|^q) / q is
    differentiated by autograd, path by path."""
    model = copy.deepcopy(model).double()
    params = list(model.parameters())
    theta0 = torch.cat([p.detach().reshape(-1) for p in params])
    base = NeuronDAG.from_module(model, shape)
    edges, biased = _dag_coordinates(base)
    v0 = _dag_values(base, edges, biased)
    jac = torch.zeros(len(v0), len(theta0), dtype=torch.float64)
    flat_index = 0
    with torch.no_grad():
        for p in params:
            flat = p.view(-1)
            for k in range(flat.numel()):
                flat[k] += 1.0
                jac[:, flat_index] = _dag_values(NeuronDAG.from_module(model, shape), edges,
                                                 biased) - v0
                flat[k] -= 1.0
                flat_index += 1
    theta = theta0.clone().requires_grad_()
    values = v0 + jac @ (theta - theta0)
    edge_index = {e: i for i, e in enumerate(edges)}
    bias_index = {v: len(edges) + i for i, v in enumerate(biased)}
    terms = []
    for path in base.phi().paths:
        factors = [values[edge_index[(u, v)]] for u, v in itertools.pairwise(path)]
        if path[0] in bias_index:
            factors.append(values[bias_index[path[0]]])
        terms.append(torch.stack(factors).prod() if factors else values.new_ones(()))
    log_norm = torch.stack(terms).abs().pow(q).sum().log() / q
    (grad,) = torch.autograd.grad(log_norm, theta)
    return grad


def _small_random_networks(count: int, max_params: int = 60,
                           new_ops: frozenset[str] = frozenset()
                           ) -> list[tuple[nn.Module, tuple]]:
    """Random networks with parameters, none of them PReLU slopes (refused, see below)."""
    found = []
    seed = 0
    while len(found) < count:
        model, shape = random_network(seed, max_paths=3000, new_ops=new_ops)
        seed += 1
        n = sum(p.numel() for p in model.parameters())
        if 0 < n <= max_params and not any(isinstance(m, nn.PReLU) for m in model.modules()):
            found.append((randomise_batchnorm_(model.double()), shape))
    return found


@pytest.mark.parametrize("q, new_ops", [(1.0, frozenset()), (2.0, frozenset()),
                                        (1.0, NEW_OPS - {"prelu"})])
def test_gradient_equals_autograd_through_path_enumeration(q, new_ops):
    """Every layer of random_nets; the last case adds the piecewise-linear activations,
    slicing, padding and interpolation lowered to ReLU/identity neurons."""
    for model, shape in _small_random_networks(6, new_ops=new_ops):
        expected = enumerated_log_norm_gradient(model, shape, q)
        net = copy.deepcopy(model)
        differentiable_path_norm(net, shape, q=q).backward()
        got = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
        assert torch.allclose(got, expected, rtol=1e-10, atol=1e-10 * expected.abs().max()), \
            (shape, (got - expected).abs().max())


class _ResidualBlock(nn.Module):
    """A ResNet basic block (conv-BN-ReLU-conv-BN + skip, ReLU), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(3)
        self.head = nn.Linear(3 * 4 * 4, 4)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.head(y.flatten(1))


def test_gradient_equals_finite_differences_on_a_resnet_block():
    torch.manual_seed(0)
    model = randomise_batchnorm_(_ResidualBlock().double())
    shape = (3, 4, 4)
    differentiable_path_norm(model, shape, q=1.0).backward()
    gen = torch.Generator().manual_seed(1)
    h = 1e-6
    for p in model.parameters():
        for k in torch.randint(p.numel(), (3,), generator=gen).tolist():
            with torch.no_grad():
                p.view(-1)[k] += h
                up = path_norm(model, shape).log10 * math.log(10)
                p.view(-1)[k] -= 2 * h
                down = path_norm(model, shape).log10 * math.log(10)
                p.view(-1)[k] += h
            fd = (up - down) / (2 * h)
            assert p.grad.view(-1)[k].item() == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_value_and_autograd_state():
    model = small_cnn()
    flags = [p.requires_grad for p in model.parameters()]
    model.train()
    for q in (1.0, 2.0, 4.0):
        ln = differentiable_path_norm(model, (1, 8, 8), q=q)
        assert ln.item() / math.log(10) == pytest.approx(
            path_norm(model, (1, 8, 8), q=q, r=q).log10, rel=1e-5)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert [p.requires_grad for p in model.parameters()] == flags
    penalty = make_penalty("l2", (1, 8, 8))
    assert isinstance(penalty, PathNormPenalty) and penalty.q == 2.0 and not penalty.log
    assert penalty(model).item() == pytest.approx(path_norm(model, (1, 8, 8), q=2, r=2).value,
                                                  rel=1e-5)
    with torch.no_grad():
        assert differentiable_path_norm(model, (1, 8, 8)).grad_fn is None


def test_log_penalty_survives_beyond_float64():
    model = mlp(4, (8,) * 40, 2).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e8)
    ln = PathNormPenalty((4,), q=1.0, log=True)(model)
    ln.backward()
    assert ln.item() / math.log(10) == pytest.approx(path_norm(model, (4,)).log10, rel=1e-10)
    assert ln.item() > 710  # ||Phi||_1 > 1e308: its exp overflows float64
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_average_case_penalty():
    torch.manual_seed(0)
    model = mlp(6, (5,), 3).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    penalty = AverageCasePenalty(samples=7)
    value = penalty(model, x)
    assert value.item() == pytest.approx(
        average_case_path_norm(model, (6,), x, max_samples=None).mean, rel=1e-12)
    value.backward()
    p = model[1].weight
    h = 1e-6
    for k in range(0, p.numel(), 7):
        with torch.no_grad():
            p.view(-1)[k] += h
            up = penalty(model, x).item()
            p.view(-1)[k] -= 2 * h
            down = penalty(model, x).item()
            p.view(-1)[k] += h
        assert p.grad.view(-1)[k].item() == pytest.approx((up - down) / (2 * h), rel=1e-6,
                                                          abs=1e-9)


def test_parametric_activations_are_refused():
    """PReLU's slopes are parameters the |theta|^q pass reads as constants: refused, not a
    gradient silently missing its terms."""
    model = nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2))
    with pytest.raises(UnsupportedModelError, match="constants"):
        differentiable_path_norm(model, (3,))


def test_the_cached_pass_follows_the_model_between_calls():
    """The graph and what the pass derives from it are kept from call to call; every value
    is still that of the model as it is now (against path_norm of a fresh deep copy): after
    an optimiser step, after a pruning mask added after the first call, on a rescaled copy,
    and with a Dropout and BatchNorm in training mode measured inside ``eval_mode`` (flags
    restored)."""
    shape = (2, 4, 4)
    base = residual_cnn()
    assert differentiable_path_norm(random_rescale(base, input_shape=shape), shape).item() \
        == pytest.approx(differentiable_path_norm(base, shape).item(), rel=1e-10)
    model = nn.Sequential(residual_cnn(), nn.Dropout(0.5)).train()

    def fresh_log10() -> float:
        return path_norm(copy_model(model).eval(), shape).log10

    def penalty() -> torch.Tensor:
        with eval_mode(model):
            return differentiable_path_norm(model, shape)

    first = penalty()
    assert first.item() / math.log(10) == pytest.approx(fresh_log10(), rel=1e-12)
    first.backward()
    with torch.no_grad():  # an SGD step, in place
        for p in model.parameters():
            p.sub_(0.1 * p.grad)
    model.zero_grad()
    stepped = penalty()
    assert stepped.item() / math.log(10) == pytest.approx(fresh_log10(), rel=1e-12)
    assert abs(stepped.item() - first.item()) > 1e-3
    # Dropout in training mode never drops the pass's values: two calls agree exactly
    assert penalty().item() == stepped.item()
    assert model.training and model[0].bn.training and model[1].training

    prune.l1_unstructured(model[0].a, "weight", amount=0.5)
    pruned = penalty()
    assert pruned.item() / math.log(10) == pytest.approx(fresh_log10(), rel=1e-12)
    pruned.backward()
    mask = model[0].a.weight_mask
    assert (model[0].a.weight_orig.grad[mask == 0] == 0).all()
    assert (model[0].a.weight_orig.grad[mask == 1] != 0).any()
