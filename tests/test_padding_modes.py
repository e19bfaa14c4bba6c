"""Convolutions with ``padding_mode`` reflect, replicate or circular (issue 38), in 1, 2
and 3 dims, as users write them: torch computes them as ``F.pad(mode=...)`` (copies of
weight 1: identity neurons, Def. 2.2.2) and an unpadded convolution, and pathlift reads
them as those two ops. Each model is checked against explicit path enumeration of its
twin written with the padding modules (``nn.ReflectionPad2d``...) and unpadded
convolutions, at q = 1, 2 in float64 to 1e-12; a random rescaling and the q = 2
normalisation keep its function and enumerated norms (Thm 2.4.1, Alg. 3.2.1);
path-magnitude scores equal autograd of the independent |theta|^q pass (sec. 3.5); the
path-metric to a pruned copy is enumerated (Lemma 3.4.1)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from abs_pow_oracle import path_magnitude_oracle
from activation_checks import randomised
from pathlift.graph.normalize import normalize
from pathlift.lift import path_metric, path_norm
from pathlift.prune import global_path_magnitude, path_magnitude_scores
from pathlift.quant import quantize
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG

SHAPES = {1: (2, 7), 2: (2, 5, 4), 3: (2, 3, 4, 3)}
PADS = {"reflect": "ReflectionPad", "replicate": "ReplicationPad", "circular": "CircularPad"}


class Net(nn.Module):
    """Two convolutions with ``padding_mode`` (the second one subclassed, with keyword
    arguments and asymmetric padding), ReLU, a global max, a Linear head."""

    def __init__(self, dims: int, mode: str) -> None:
        super().__init__()
        conv = getattr(nn, f"Conv{dims}d")

        class MyConv(conv):  # a user's subclass inheriting forward
            pass

        self.dims = dims
        self.a = conv(2, 3, kernel_size=3, padding=1, padding_mode=mode)
        self.b = MyConv(3, 2, 2, padding=(1,) + (0,) * (dims - 1), padding_mode=mode,
                        dilation=1, bias=False)
        self.head = nn.Linear(2, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.b(F.relu(self.a(x)))
        return self.head(torch.amax(h, dim=tuple(range(2, 2 + self.dims))))


class Twin(nn.Module):
    """``Net``'s function with the padding modules before unpadded convolutions."""

    def __init__(self, net: Net, mode: str) -> None:
        super().__init__()
        d = net.dims
        pad = getattr(nn, f"{PADS[mode]}{d}d")
        conv = getattr(nn, f"Conv{d}d")
        self.dims = d
        self.pad_a = pad(net.a._reversed_padding_repeated_twice)
        self.pad_b = pad(net.b._reversed_padding_repeated_twice)
        self.a, self.b = conv(2, 3, 3), conv(3, 2, 2, bias=False)
        self.head = nn.Linear(2, 2)
        self.double().eval()
        self.load_state_dict(net.state_dict())

    def forward(self, x: Tensor) -> Tensor:
        h = self.b(self.pad_b(F.relu(self.a(self.pad_a(x)))))
        return self.head(torch.amax(h, dim=tuple(range(2, 2 + self.dims))))


CASES = [(d, m) for d in SHAPES for m in PADS]


def _net(dims: int, mode: str) -> Net:
    torch.manual_seed(0)
    return randomised(Net(dims, mode), 0)


@pytest.mark.parametrize(("dims", "mode"), CASES)
def test_a_padded_convolution_is_its_pad_and_convolution(dims: int, mode: str) -> None:
    net = _net(dims, mode)
    shape = SHAPES[dims]
    twin = Twin(net, mode)
    x = torch.randn(3, *shape, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), net(x), rtol=0, atol=1e-12)
    dag, twin_dag = NeuronDAG.from_module(net, shape), NeuronDAG.from_module(twin, shape)
    torch.testing.assert_close(torch.as_tensor(dag.output(x[:1])), net(x[:1]).reshape(-1),
                               rtol=0, atol=1e-12)
    for q, r in ((1.0, None), (2.0, None), (1.0, math.inf), (2.0, 1.0)):
        assert path_norm(net, shape, q=q, r=r).log10 == pytest.approx(
            twin_dag.path_norm_log10(q, r), abs=1e-12)


@pytest.mark.parametrize(("dims", "mode"), CASES)
def test_a_padded_convolution_is_rescaled_normalised_and_scored(dims: int, mode: str
                                                                 ) -> None:
    net = _net(dims, mode)
    shape = SHAPES[dims]
    x = torch.randn(4, *shape, dtype=torch.float64)
    for other in (random_rescale(net, seed=1, input_shape=shape), normalize(net, shape, q=2.0)):
        assert not torch.equal(other.a.weight, net.a.weight)
        with torch.no_grad():
            torch.testing.assert_close(other(x), net(x), rtol=1e-10, atol=1e-10)
        dag = NeuronDAG.from_module(Twin(other, mode), shape)  # the copy, enumerated anew
        for q in (1.0, 2.0):
            assert path_norm(net, shape, q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                                     abs=1e-12)
    scores = path_magnitude_scores(net, shape)
    for key, expected in path_magnitude_oracle(net, shape).items():
        torch.testing.assert_close(scores.value(key), expected, rtol=1e-12,
                                   atol=1e-12 * float(expected.abs().max()))


@pytest.mark.parametrize("mode", sorted(PADS))
def test_the_path_metric_of_a_padded_convolution_is_enumerated(mode: str) -> None:
    net = _net(2, mode)
    shape = SHAPES[2]
    pruned = copy.deepcopy(net)
    with torch.no_grad():
        pruned.a.weight[0].zero_()
        pruned.b.weight[:, 1].zero_()
    metric = path_metric(net, pruned, shape)
    assert metric.case == "exact"
    enumerated = (NeuronDAG.from_module(Twin(net, mode), shape).path_norm(1.0)
                  - NeuronDAG.from_module(Twin(pruned, mode), shape).path_norm(1.0))
    assert metric.upper_log10 == pytest.approx(math.log10(enumerated), abs=1e-12)


@pytest.mark.parametrize("mode", sorted(PADS))
def test_quantisation_reaches_a_padded_convolution_and_is_certified(mode: str) -> None:
    """4-bit rounding towards zero writes both convolutions' weights (codes under their
    state_dict names), and the path-metric certifying it is the enumerated difference of
    the twins' l1 path-norms (Lemma 3.4.1)."""
    net = _net(2, mode)
    shape = SHAPES[2]
    quantized = quantize(net, shape, bits=4)
    assert {"a.weight", "b.weight"} <= set(quantized.codes)
    assert not torch.equal(quantized.model.b.weight, net.b.weight)
    metric = path_metric(net, quantized.model, shape)
    assert metric.case == "exact"
    enumerated = (NeuronDAG.from_module(Twin(net, mode), shape).path_norm(1.0)
                  - NeuronDAG.from_module(Twin(quantized.model, mode), shape).path_norm(1.0))
    assert metric.upper_log10 == pytest.approx(math.log10(enumerated), abs=1e-12)


def _effective_twin(net: Net, pruned: Net, mode: str) -> Twin:
    """``Twin`` of ``net`` holding ``pruned``'s effective (masked) weights."""
    twin = Twin(net, mode)
    with torch.no_grad():
        for name in ("a", "b"):
            getattr(twin, name).weight.copy_(getattr(pruned, name).weight)
    return twin


@pytest.mark.parametrize("mode", sorted(PADS))
def test_path_magnitude_pruning_of_a_padded_convolution_is_certified(mode: str) -> None:
    """pathlift's own pruning (torch.nn.utils.prune masks on the conv, whose pre-hooks
    validation runs before the padding, as the module's call does) gives the pruned
    network's enumerated path-norm and the exact path-metric of eq. 3.19."""
    net = _net(2, mode)
    shape = SHAPES[2]
    pruned = copy.deepcopy(net)
    result = global_path_magnitude(pruned, shape, 0.3)
    assert result.pruned > 0 and hasattr(pruned.a, "weight_mask")
    twin = _effective_twin(net, pruned, mode)
    dense = NeuronDAG.from_module(Twin(net, mode), shape).path_norm(1.0)
    sparse = NeuronDAG.from_module(twin, shape).path_norm(1.0)
    assert result.log10_path_norm == pytest.approx(math.log10(dense), abs=1e-12)
    assert result.log10_path_metric == pytest.approx(math.log10(dense - sparse), abs=1e-12)
    assert path_norm(pruned, shape, q=2.0).log10 == pytest.approx(
        NeuronDAG.from_module(twin, shape).path_norm_log10(2.0), abs=1e-12)


class PaddedFunctional(nn.Module):
    """A user's layer padding in its forward before ``F.conv2d`` over its own weight."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 2, 3, 3))
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), self.weight, self.bias)


def test_a_pruned_functional_layer_padding_before_its_conv_is_measured() -> None:
    """The prune mask of a layer whose forward pads before its conv used to be refused as
    "computes another function than model.forward" (the mask ran after the padding)."""
    torch.manual_seed(0)
    net = randomised(nn.Sequential(PaddedFunctional(), nn.ReLU(), nn.Flatten(),
                                   nn.Linear(48, 2)), 0)
    torch.nn.utils.prune.l1_unstructured(net[0], "weight", 0.3)
    twin = nn.Sequential(nn.ReplicationPad2d(1), nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(48, 2)).double().eval()
    with torch.no_grad():
        twin[1].weight.copy_(net[0].weight)
        twin[1].bias.copy_(net[0].bias)
        twin[4].load_state_dict(net[3].state_dict())
    dag = NeuronDAG.from_module(twin, (2, 4, 4))
    for q in (1.0, 2.0):
        assert path_norm(net, (2, 4, 4), q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                                     abs=1e-12)
