"""LeakyReLU networks: path-norms equal explicit path enumeration of the lowered DAG
(ReLU(z) - a ReLU(-z)), the function and every path-norm survive a random rescaling and
normalisation (the activation is positively homogeneous), and the functional form is the
same op."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.graph import check
from pathlift.graph.normalize import normalize
from pathlift.lift import path_norm
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG

PAIRS = [(1.0, 1.0), (2.0, 2.0), (1.0, math.inf), (4.0, 1.0), (0.5, 2.0)]


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
    torch.manual_seed(seed)
    net = Disc(slope).double()
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(-1, 1)
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    return net.eval()


@pytest.mark.parametrize("slope", [0.2, -0.3, 1.7])
def test_path_norms_equal_enumeration(slope):
    net, shape = _net(slope, 0), (2, 6, 6)
    dag = NeuronDAG.from_module(net, shape)
    x = torch.randn(1, *shape, dtype=torch.float64)
    torch.testing.assert_close(torch.as_tensor(dag.output(x)), net(x).detach().reshape(-1),
                               rtol=0, atol=1e-12)
    for q, r in PAIRS:
        assert path_norm(net, shape, q=q, r=r).log10 == pytest.approx(
            dag.path_norm_log10(q, r), abs=1e-12)


def test_rescaling_and_normalisation_keep_function_and_norms():
    net, shape = _net(0.1, 1), (2, 6, 6)
    x = torch.randn(5, *shape, dtype=torch.float64)
    for other in (random_rescale(net, seed=3, input_shape=shape), normalize(net, shape, q=2.0)):
        assert not torch.equal(other.c1.weight, net.c1.weight)
        torch.testing.assert_close(other(x), net(x), rtol=0, atol=1e-12)
        for q, r in PAIRS:
            assert path_norm(other, shape, q=q, r=r).log10 == pytest.approx(
                path_norm(net, shape, q=q, r=r).log10, abs=1e-12)


def test_supported_without_problems():
    assert check(_net(0.2, 2), (2, 6, 6)).ok
