"""Piecewise-linear activations and the structural ops of the framework, against the
explicit neuron DAG (which learns each activation's pieces by probing the op): outputs by
Thm 2.4.2 and every (q, r) path-norm at 1e-12; clipping activations fix their neurons'
scale, homogeneous ones keep the rescaling symmetry; PReLU slopes are quantised with a
certificate that holds on sampled inputs."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.bounds import certified_error, lipschitz_input
from pathlift.errors import UnsupportedModelError
from pathlift.graph.channels import analyse
from pathlift.lift import path_norm
from pathlift.quant import quantize
from pathlift.symmetry import canonicalize, equivalent, permute, random_rescale
from pathlift.testing.neurons import NeuronDAG

PAIRS = [(1.0, 1.0), (2.0, 2.0), (1.0, math.inf), (4.0, 1.0), (0.5, 2.0), (16.0, 16.0)]


class Mixed(nn.Module):
    """Every new op at once: PReLU per channel, chunk and size arithmetic, slicing,
    ReLU6, reflection padding, bilinear and bicubic resampling, clamp, hardsigmoid,
    Hardtanh, constant scales, subtraction, a dict output."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1)
        self.p = nn.PReLU(4)
        self.c2 = nn.Conv2d(2, 2, 3)
        self.r6 = nn.ReLU6()
        self.pad = nn.ReflectionPad2d(1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")
        self.fc = nn.Linear(2 * 4 * 4 + 2, 3)
        self.ht = nn.Hardtanh(-0.5, 0.7)

    def forward(self, x):
        h = self.p(self.c1(x))
        a, b = h.chunk(2, dim=1)
        n = h.size(1) // 2
        a = self.r6(self.c2(self.pad(a[:, :n])))
        b = torch.clamp(self.up(F.avg_pool2d(b, 2)), min=-0.3)
        b = F.interpolate(b, size=(4, 4), mode="bicubic", align_corners=True)
        z = torch.cat([(a - b).flatten(1), F.hardsigmoid(b.mean((2, 3)))], dim=1)
        return {"logits": self.ht(self.fc(z)) * 2.0, "aux": -b[:, 0]}


def _mixed(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = Mixed().double()
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(-1, 1)
    return net.eval()


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_network_equals_enumeration(seed):
    net, shape = _mixed(seed), (2, 4, 4)
    dag = NeuronDAG.from_module(net, shape)
    x = torch.randn(3, *shape, dtype=torch.float64)
    for row in x:
        out = net(row[None])
        flat = torch.cat([out["logits"].reshape(-1), out["aux"].reshape(-1)]).detach()
        torch.testing.assert_close(torch.as_tensor(dag.output(row)), flat, rtol=0, atol=1e-12)
    for q, r in PAIRS:
        assert path_norm(net, shape, q=q, r=r).log10 == pytest.approx(
            dag.path_norm_log10(q, r), abs=1e-12)


def _mlp(act: nn.Module, second: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(3, 5), act, nn.Linear(5, 4), second or copy.deepcopy(act),
                         nn.Linear(4, 2)).double()


@pytest.mark.parametrize("act", [nn.ReLU6(), nn.Hardtanh(-2, 1.5), nn.Hardsigmoid(),
                                 nn.PReLU(), nn.LeakyReLU(0.3)], ids=type)
def test_activation_modules_equal_enumeration_and_lipschitz_bounds_hold(act):
    net = _mlp(act)
    dag = NeuronDAG.from_module(net, (3,))
    for q, r in PAIRS:
        assert path_norm(net, (3,), q=q, r=r).log10 == pytest.approx(
            dag.path_norm_log10(q, r), abs=1e-12)
    bound = lipschitz_input(net, (3,), r=1.0)
    x, y = torch.randn(200, 3, dtype=torch.float64), torch.randn(200, 3, dtype=torch.float64)
    gaps = ((net(x) - net(y)).abs().sum(1) / (x - y).abs().amax(1)).detach()
    assert float(gaps.max()) <= bound.path_norm.value * (1 + 1e-12)
    if bound.layer_product is not None:  # Thm 3.3.2: ||Phi||_{1,r} <= Pi_{1,r}
        assert bound.path_norm.log10 <= bound.layer_product.log10 + 1e-12


def test_clipping_fixes_scale_and_homogeneous_keeps_it():
    clipped, leaky = _mlp(nn.ReLU6()), _mlp(nn.PReLU())
    assert analyse(clipped, (3,)).num_groups == 1  # every hidden neuron fixed
    assert analyse(leaky, (3,)).num_groups == 1 + 5 + 4
    x = torch.randn(7, 3, dtype=torch.float64)
    for net in (clipped, leaky):
        other = random_rescale(net, seed=1, input_shape=(3,))
        torch.testing.assert_close(other(x), net(x), rtol=0, atol=1e-12)
    moved = random_rescale(leaky, seed=1, input_shape=(3,))
    assert not torch.equal(moved[0].weight, leaky[0].weight)
    assert path_norm(moved, (3,), q=2).log10 == pytest.approx(
        path_norm(leaky, (3,), q=2).log10, abs=1e-12)


def test_prelu_slopes_are_quantised_and_certified():
    net = _mlp(nn.PReLU(5), nn.PReLU(4))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([0.2371, -0.113, 0.9, 0.0415, -0.6]))
    q = quantize(net, (3,), bits=4)
    slopes, rounded = net[1].weight.detach(), q.model[1].weight.detach()
    assert "1.weight" in q.codes and not torch.equal(rounded, slopes)
    assert bool((rounded.abs() <= slopes.abs()).all() and (rounded * slopes >= 0).all())
    cert = certified_error(net, q, (3,))
    x = torch.rand(300, 3, dtype=torch.float64) * 2 - 1
    gap = (net(x) - q.model(x)).abs().sum(1).max().detach()
    assert float(gap) <= cert.metric.upper * (1 + 1e-9)


def test_products_and_tensor_bounds_are_refused_with_one_line_per_cause():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x) * torch.sigmoid(self.b(x))
            return torch.clamp(h, min=x) * self.a(h)

    with pytest.raises(UnsupportedModelError) as info:
        path_norm(Gate(), (4,))
    *lines, supported = str(info.value).splitlines()[1:]
    assert len(lines) == 3 and sum("2 nodes" in line for line in lines) == 1
    assert any("tensor bounds" in line for line in lines)
    assert supported.startswith("  supported: ") and "pooling:" not in " ".join(lines)


@pytest.mark.parametrize("act", [nn.ReLU6(), nn.PReLU(6), nn.LeakyReLU(0.1)], ids=type)
def test_permuted_copy_is_equivalent_and_canonical_form_keeps_function(act):
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(3, 6), act, nn.Linear(6, 2)).double().eval()
    with torch.no_grad():
        if isinstance(act, nn.PReLU):
            act.weight.uniform_(-1, 1)
    perm = torch.tensor([3, 1, 0, 5, 4, 2])
    other = permute(net, {"0": perm}, (3,))
    x = torch.randn(9, 3, dtype=torch.float64)
    torch.testing.assert_close(other(x), net(x), rtol=0, atol=1e-12)
    assert not torch.equal(other[0].weight, net[0].weight)
    assert equivalent(net, other, (3,)).equivalent
    torch.testing.assert_close(canonicalize(net, (3,)).model(x), net(x), rtol=0, atol=1e-12)
