"""LeakyReLU networks: path-norms equal explicit path enumeration of the lowered DAG
(ReLU(z) - a ReLU(-z)), the function and every path-norm survive a random rescaling and
normalisation (the activation is positively homogeneous), and the functional form is the
same op."""

import pytest
import torch.nn.functional as F
from torch import nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.graph import check


class Disc(nn.Module):
    """A small PatchGAN-like discriminator: conv, LeakyReLU (module and functional)."""

    def __init__(self, slope: float):
        super().__init__()
        self.slope = slope
        self.c1 = nn.Conv2d(2, 3, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.LeakyReLU(slope)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Conv2d(4, 1, 2)

    def forward(self, x):
        h = self.act(self.c1(x))
        h = F.leaky_relu(self.bn(self.c2(h)), self.slope)
        return self.head(h)


def _net(slope: float, seed: int) -> nn.Module:
    return randomised(Disc(slope), seed)


@pytest.mark.parametrize("slope", [0.2, -0.3, 1.7])
def test_path_norms_equal_enumeration(slope):
    assert_norms_equal_enumeration(_net(slope, 0), (2, 6, 6))


def test_rescaling_and_normalisation_keep_function_and_norms():
    assert_rescaling_keeps_function_and_norms(_net(0.1, 1), (2, 6, 6), lambda m: m.c1.weight)


def test_supported_without_problems():
    assert check(_net(0.2, 2), (2, 6, 6)).ok
