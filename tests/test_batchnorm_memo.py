"""The fold x*a + c of an eval BatchNorm (``batchnorm_affine``) is kept per module and dtype,
and found again only while nothing it was computed from changed: every in-place update of
the statistics, the affine pair or eps, an assignment, a training step's running statistics,
a checkpoint load and a write into the kept fold itself recompute it. Each case is checked
against the formula computed here and the path-norm against explicit path enumeration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.graph.ops import batchnorm_affine
from pathlift.lift import path_norm
from pathlift.testing.neurons import NeuronDAG


class Net(nn.Module):
    """A user's small CNN: conv -> BN -> ReLU, then a functional head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.head = nn.Linear(3 * 9, 2)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).flatten(1))


SHAPE = (2, 3, 3)


def _model(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    model = Net()
    with torch.no_grad():
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.running_mean.normal_()
        model.bn.weight.normal_()
        model.bn.bias.normal_()
    return model.eval()


def _expected(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    v, m = bn.running_var.double(), bn.running_mean.double()
    a = bn.weight.detach().double() / torch.sqrt(v + bn.eps)
    return a, bn.bias.detach().double() - m * a


def _assert_current(model: Net) -> None:
    a, c = batchnorm_affine(model.bn, torch.float64)
    want_a, want_c = _expected(model.bn)
    torch.testing.assert_close(a, want_a, rtol=1e-14, atol=0)
    torch.testing.assert_close(c, want_c, rtol=1e-14, atol=1e-15)
    for q in (1.0, 2.0):
        expected = NeuronDAG.from_module(model, SHAPE).path_norm_log10(q)
        assert path_norm(model, SHAPE, q=q).log10 == pytest.approx(expected, abs=1e-12)


def _scale_var(m):
    m.bn.running_var.mul_(3.0)


def _shift_mean(m):
    m.bn.running_mean.add_(1.5)


def _scale_weight(m):
    m.bn.weight.mul_(-2.0)


def _shift_bias(m):
    m.bn.bias.sub_(0.75)


def _eps(m):
    m.bn.eps = 0.5


def _assign_var(m):
    m.bn.running_var = torch.full((3,), 4.0)


def _assign_weight(m):
    m.bn.weight = nn.Parameter(torch.tensor([1.0, -3.0, 0.25]))


def _train_step(m):  # a forward in training mode updates the running statistics in place
    m.train()
    with torch.enable_grad():
        m(torch.randn(8, *SHAPE) * 3 + 1)
    m.eval()


def _load_checkpoint(m):
    m.load_state_dict(_model(seed=7).state_dict())


def _set_data(m):
    m.bn.running_mean.data = torch.randn(3)


UPDATES = [_scale_var, _shift_mean, _scale_weight, _shift_bias, _eps, _assign_var,
           _assign_weight, _train_step, _load_checkpoint, _set_data]


@pytest.mark.parametrize("update", UPDATES, ids=lambda f: f.__name__.strip("_"))
def test_the_fold_is_computed_again_after_every_change_of_what_it_reads(update):
    model = _model()
    _assert_current(model)  # the folds of float64 (and those of the pass) now kept
    kept = batchnorm_affine(model.bn, torch.float64)
    with torch.no_grad():
        update(model)
    assert batchnorm_affine(model.bn, torch.float64)[0] is not kept[0]
    _assert_current(model)


def test_an_unchanged_batchnorm_gives_the_kept_fold_per_dtype():
    model = _model()
    first64, first32 = (batchnorm_affine(model.bn, d) for d in (torch.float64, torch.float32))
    again64, again32 = (batchnorm_affine(model.bn, d) for d in (torch.float64, torch.float32))
    assert again64[0] is first64[0] and again64[1] is first64[1]
    assert again32[0] is first32[0] and first32[0].dtype == torch.float32
    assert batchnorm_affine(model.bn)[0] is first32[0]  # the buffers' dtype by default


def test_a_caller_writing_into_the_kept_fold_does_not_change_the_next_one():
    model = _model()
    a, c = batchnorm_affine(model.bn, torch.float64)
    a.zero_()
    c.fill_(1e9)
    _assert_current(model)


def test_inference_mode_and_the_differentiable_fold_are_never_kept():
    model = _model()
    with torch.inference_mode():
        first = batchnorm_affine(model.bn, torch.float64)
        assert batchnorm_affine(model.bn, torch.float64)[0] is not first[0]
        torch.testing.assert_close(first[0], _expected(model.bn)[0], rtol=1e-14, atol=0)
    live = batchnorm_affine(model.bn, torch.float64, detach=False)
    assert live[0].requires_grad and batchnorm_affine(model.bn, torch.float64,
                                                      detach=False)[0] is not live[0]
    live[0].sum().backward()
    torch.testing.assert_close(model.bn.weight.grad.double(),
                               1 / torch.sqrt(model.bn.running_var.double() + model.bn.eps))


class FusedBNReLU(nn.BatchNorm2d):
    """timm's way: a BatchNorm2d subclass whose forward calls F.batch_norm on its own
    tensors, then its activation."""

    def forward(self, x):
        return F.relu(F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                   self.bias, False, 0.0, self.eps))


class FusedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = FusedBNReLU(3)
        self.head = nn.Linear(3 * 9, 2)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).flatten(1))


@pytest.mark.parametrize("update", [_scale_var, _shift_mean, _scale_weight, _eps],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_functional_batchnorm_reading_its_own_tensors_is_measured_after_each_update(update):
    torch.manual_seed(3)
    model = FusedNet().eval()
    with torch.no_grad():
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.running_mean.normal_()
    for _ in range(2):  # measured, updated, measured again: never the kept fold
        for q in (1.0, 2.0):
            expected = NeuronDAG.from_module(model, SHAPE).path_norm_log10(q)
            assert path_norm(model, SHAPE, q=q).log10 == pytest.approx(expected, abs=1e-12)
        with torch.no_grad():
            update(model)
