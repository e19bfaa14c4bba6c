"""RReLU in eval mode (``pathlift.graph.ops.rrelu``): LeakyReLU with slope (lower + upper)
/ 2. The path-norms of one |theta|^q pass equal explicit path enumeration of the DAG the
neuron oracle builds by probing torch's own RReLU (``pathlift.testing.neurons``), whose
outputs equal the model's; the function and every path-norm survive a random rescaling
and normalisation (the activation is positively homogeneous); training mode, and the
functional form with training=True, are refused with a typed error naming the node."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.errors import UnsupportedModelError
from pathlift.graph import check, trace
from pathlift.lift import path_norm

SHAPE = (2, 6, 6)


class Net(nn.Module):
    """Conv, RReLU module, BatchNorm, functional rrelu (own bounds), a residual sum and an
    in-place torch.rrelu_ before the head, as a user writes it."""

    def __init__(self, lower: float, upper: float):
        super().__init__()
        self.c1 = nn.Conv2d(2, 3, 3, stride=2, padding=1)
        self.act = nn.RReLU(lower, upper)
        self.c2 = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.head = nn.Linear(27, 4)

    def forward(self, x):
        h = self.act(self.c1(x))
        h = h + F.rrelu(self.bn(self.c2(h)), lower=0.05, upper=0.6)
        return self.head(torch.rrelu_(torch.flatten(h, 1)))


def _net(lower: float, upper: float, seed: int) -> nn.Module:
    return randomised(Net(lower, upper), seed)


@pytest.mark.parametrize(("lower", "upper"), [(0.1, 0.3), (1 / 8, 1 / 3), (-0.5, 0.2),
                                              (0.4, 2.0)])
def test_path_norms_equal_enumeration(lower, upper):
    assert_norms_equal_enumeration(_net(lower, upper, 0), SHAPE)


def test_the_slope_is_the_mean_of_the_bounds():
    """A one-neuron network: ||Phi||_1 = |w_2| (|a| |w_1| + |w_1|) with a = (l + u) / 2."""
    net = nn.Sequential(nn.Linear(1, 1, bias=False), nn.RReLU(0.1, 0.5),
                        nn.Linear(1, 1, bias=False)).double().eval()
    with torch.no_grad():
        net[0].weight.fill_(2.0)
        net[2].weight.fill_(-3.0)
    assert path_norm(net, (1,)).value == pytest.approx(3.0 * 2.0 * (1 + 0.3), rel=1e-14)


def test_rescaling_and_normalisation_keep_function_and_norms():
    assert_rescaling_keeps_function_and_norms(_net(0.1, 0.3, 1), SHAPE, lambda m: m.c1.weight)


def test_supported_in_eval_mode():
    assert check(_net(0.2, 0.4, 2), SHAPE).ok


def test_training_mode_is_refused_typed():
    net = _net(0.1, 0.3, 3)
    net.act.train()
    with pytest.raises(UnsupportedModelError, match=r"'act' .*RReLU in training mode"):
        trace(net, SHAPE)


def test_functional_rrelu_with_training_true_is_refused_typed():
    class Random(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return F.rrelu(self.fc(x), training=True)

    report = check(Random().eval(), (3,))
    assert [p.node for p in report.problems] == ["rrelu"]
    assert "training=True" in report.problems[0].reason
