"""Path-SGD, the path-norm budget, the certified bound and the frontier experiment
(pathlift.train)."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.bounds.top1 import certified_top1
from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.lift import path_norm
from pathlift.lift.differentiable import magnitude_gradients
from pathlift.models import mlp, small_cnn, unet
from pathlift.symmetry.rescale import random_rescale
from pathlift.train import PathNormBudget, PathSGD
from pathlift.train.path_sgd import RATIO_WARNING


class _ResidualCNN(nn.Module):
    """conv, max-pool, a residual block (two convs and a skip), average pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        y = self.pool(torch.relu(self.stem(x)))
        y = torch.relu(y + self.b(torch.relu(self.a(y))))
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


def _step(model: nn.Module, shape, x, y, momentum=0.0, steps=1):
    opt = PathSGD(model, shape, lr=0.1, momentum=momentum)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("make, shape", [(lambda: mlp(16, (12, 8), 3), (16,)),
                                         (lambda: small_cnn(1, 3), (1, 8, 8)),
                                         (_ResidualCNN, (1, 8, 8))])
def test_path_sgd_step_commutes_with_rescaling(make, shape):
    torch.manual_seed(0)
    model = make().double()
    rescaled = random_rescale(model, (0.01, 1.0, 50.0), seed=3, input_shape=shape)
    x = torch.randn(10, *shape, dtype=torch.float64)
    y = torch.randint(3, (10,))
    assert torch.allclose(model(x), rescaled(x), rtol=1e-12, atol=1e-12)
    before = model(x).detach()
    _step(model, shape, x, y, momentum=0.9, steps=2)
    _step(rescaled, shape, x, y, momentum=0.9, steps=2)
    after = model(x)
    assert (after - before).abs().max() > 1e-3  # the step moved the function
    scale = after.abs().max().item()
    assert torch.allclose(after, rescaled(x), rtol=0, atol=1e-10 * scale)
    # and the parameters differ: the two are not the same representative
    assert any(not torch.allclose(p, q) for p, q in zip(model.parameters(),
                                                         rescaled.parameters(), strict=True))


def test_path_sgd_scales_match_the_two_layer_formula():
    """||Phi||_2^2 = sum_k sum_j V_kj^2 (sum_i W_ji^2 + b_j^2) + sum_k c_k^2 for x -> V relu(Wx
    + b) + c, so gamma_W[j, i] = gamma_b[j] = sum_k V_kj^2, gamma_V[k, j] = ||(W_j, b_j)||^2,
    gamma_c = 1."""
    torch.manual_seed(0)
    model = mlp(5, (4,), 3).double()
    w, b, v, c = model[1].weight, model[1].bias, model[3].weight, model[3].bias
    gammas = magnitude_gradients(model, (5,), q=2.0)
    got = {p: g * math.exp(gammas.log_scale) for p, g in gammas.mantissas.items()}
    col = v.detach().pow(2).sum(0)
    assert torch.allclose(got[w], col[:, None].expand_as(w), rtol=1e-12)
    assert torch.allclose(got[b], col, rtol=1e-12)
    rows = w.detach().pow(2).sum(1) + b.detach().pow(2)
    assert torch.allclose(got[v], rows[None, :].expand_as(v), rtol=1e-12)
    assert torch.allclose(got[c], torch.ones_like(c), rtol=1e-12)


def test_path_sgd_refuses_bad_settings():
    with pytest.raises(InvalidParameterError):
        PathSGD(mlp(4, (3,), 2), (4,), lr=0.0)


def test_budget_projects_onto_the_ball():
    torch.manual_seed(0)
    model = small_cnn().double()
    shape = (1, 8, 8)
    x = torch.randn(5, *shape, dtype=torch.float64)
    norm = path_norm(model, shape).value
    untouched = copy.deepcopy(model)
    assert PathNormBudget(shape, 10 * norm).project_(untouched) == pytest.approx(norm, rel=1e-12)
    assert torch.allclose(untouched(x), model(x), rtol=1e-10, atol=1e-12)  # Lemma 3.2.1
    budget = norm / 7.0
    assert PathNormBudget(shape, budget).project_(model) == pytest.approx(budget, rel=1e-12)
    assert path_norm(model, shape).value == pytest.approx(budget, rel=1e-10)
    assert torch.allclose(model(x), untouched(x) / 7.0, rtol=1e-10, atol=1e-12)


def test_budget_needs_a_linear_output():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with pytest.raises(UnsupportedModelError, match=r"nn\.Linear"):
        PathNormBudget((3,), 1.0).project_(model)
    with pytest.raises(InvalidParameterError):
        PathNormBudget((3,), -1.0)


def test_certified_bound_terms_add_up():
    torch.manual_seed(0)
    model = mlp(6, (8,), 3)
    x = torch.rand(200, 6)
    y = model(x).argmax(1)  # a network that fits its labels: train error 0
    valid = certified_top1(model, (6,), x, y)
    fixed = certified_top1(model, (6,), x, y, form="fixed-class")
    for b in (valid, fixed):
        assert b.train_error == 0.0
        assert sum(b.terms_log10().values()) == pytest.approx(b.complexity_log10, abs=1e-12)
        expected = math.log10(10 ** b.complexity_log10 + b.train_margin_loss + b.confidence)
        assert b.log10 == pytest.approx(expected, rel=1e-12)
        assert b.path_norm_log10 == pytest.approx(path_norm(model, (6,)).log10, rel=1e-12)
    assert fixed.n == 200 and fixed.confidence == pytest.approx(3 * math.sqrt(math.log(40) / 400))
    assert fixed.radius_log10 == fixed.path_norm_log10 <= valid.radius_log10
    assert valid.confidence > fixed.confidence and valid.log10 >= fixed.log10
    assert "valid as stated" in valid.validity and "NOT a certificate" in fixed.validity
    with pytest.raises(InvalidParameterError):
        certified_top1(model, (6,), x, y, form="thesis")


def test_path_sgd_on_a_unet_commutes_with_rescaling():
    """Skip connections over max-pooling, transposed convolutions or upsampling, eval
    BatchNorm (fresh statistics: running_mean = 0, where the fold keeps the invariance)."""
    torch.manual_seed(0)
    shape = (1, 8, 8)
    model = unet(1, 2, 4, 2).double().eval()
    rescaled = random_rescale(model, (0.1, 1.0, 20.0), seed=1, input_shape=shape).eval()
    x = torch.randn(3, *shape, dtype=torch.float64)
    y = torch.randint(2, (3, 8, 8))
    before = model(x).detach()
    for net in (model, rescaled):
        opt = PathSGD(net, shape, lr=0.1)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    after = model(x)
    assert (after - before).abs().max() > 1e-3
    assert torch.allclose(after, rescaled(x), rtol=0, atol=1e-10 * after.abs().max().item())


def test_budget_projects_a_batchnorm_network():
    """BatchNorm models were refused ('magnitude gradients are defined for q = 2'): the
    budget needs the output layer's q = 1 gammas only, and BatchNorm is normalised as its
    affine map."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 3)).double()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.train()
    shape, x = (1, 8, 8), torch.randn(5, 1, 8, 8, dtype=torch.float64)
    before = copy.deepcopy(model).eval()
    budget = path_norm(before, shape).value / 5.0
    assert PathNormBudget(shape, budget).project_(model) == pytest.approx(budget, rel=1e-12)
    assert model.training  # flags restored
    assert path_norm(model.eval(), shape).value == pytest.approx(budget, rel=1e-10)
    assert torch.allclose(model(x), before(x) / 5.0, rtol=1e-9, atol=1e-12)
    gammas = magnitude_gradients(model, shape, q=1.0)
    assert model[1].weight not in gammas.mantissas and model[5].weight in gammas.mantissas


def test_path_sgd_warns_with_the_lr_that_matches_sgd():
    """Small gamma_p (deep or small-weight networks: a DenseNet-BC diverged at lr 0.05)
    make a Path-SGD step many times as long as SGD's: the first step measures the median
    |step| / |SGD step| over the coordinates, warns with lr / ratio, and match_sgd=True
    takes that lr (its first step is then as long as SGD's, in the median)."""
    torch.manual_seed(0)
    model = mlp(6, (8, 8, 8), 3).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.2)
    x, y = torch.randn(16, 6, dtype=torch.float64), torch.randint(3, (16,))
    nets = {match: copy.deepcopy(model) for match in (False, True)}
    for match, net in nets.items():
        opt = PathSGD(net, (6,), lr=0.05, match_sgd=match)
        F.cross_entropy(net(x), y).backward()
        grads = [p.grad.clone() for p in net.parameters()]
        before = [p.detach().clone() for p in net.parameters()]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        ratio = opt.sgd_ratio
        assert ratio > RATIO_WARNING
        steps = torch.cat([((p.detach() - b) / (0.05 * g)).abs().flatten()[g.flatten() != 0]
                           for p, b, g in zip(net.parameters(), before, grads, strict=True)])
        if match:
            assert not caught and float(steps.median()) == pytest.approx(1.0, rel=1e-9)
        else:
            [warning] = caught
            assert f"lr={0.05 / ratio:.3g}" in str(warning.message)
            assert warning.filename == __file__  # points at the caller's opt.step()
            assert float(steps.median()) == pytest.approx(ratio, rel=1e-9)


@pytest.mark.slow
def test_path_sgd_on_a_densenet_diverges_at_sgds_lr_and_not_matched():
    """docs/training.md's measured example: a DenseNet-BC on the digits, lr 0.05. Path-SGD
    as given diverges (SGD's lr is 3.7e4 times too long for it) and says so; matched to
    SGD's step it stays finite and learns."""
    import user_zoo
    from pathlift.data import load_data, loaders

    train, _ = loaders(load_data("digits", seed=0), 64, 0)
    torch.manual_seed(0)
    dense = user_zoo.DenseNetBC(growth=4, layers=(3, 3), num_classes=10, in_channels=1)
    losses = {}
    for match in (False, True):
        torch.manual_seed(1)
        net = copy.deepcopy(dense)
        opt = PathSGD(net, (1, 8, 8), lr=0.05, match_sgd=match)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses[match] = []
            for _ in range(2):
                for x, y in train:
                    opt.zero_grad()
                    loss = F.cross_entropy(net(x), y)
                    loss.backward()
                    opt.step()
                    losses[match].append(loss.item())
        assert opt.sgd_ratio > 1e4
        assert (len(caught) == 1) != match
    assert max(losses[False][1:]) > 100  # diverged after one step
    assert max(losses[True]) < 3 and losses[True][-1] < losses[True][0]
