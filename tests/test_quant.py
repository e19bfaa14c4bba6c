"""Quantisers, quantised copies and the certified error (thesis Sec. 6.1, Lemma 3.4.1,
Cor. 3.4.1), each checked against an independent computation."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune

from pathlift.bounds import certified_error
from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.quant import Rounding, max_code, quantize, quantize_tensor
from random_nets import randomise_batchnorm_

ROUNDINGS = [Rounding.ZERO, Rounding.NEAREST, Rounding.DOWN]
REFERENCE_ROUND = {Rounding.ZERO: np.trunc, Rounding.NEAREST: np.rint, Rounding.DOWN: np.floor}


def _tensors(max_side: int = 6):
    shapes = st.lists(st.integers(1, max_side), min_size=1, max_size=3)
    scales = st.sampled_from([1e-3, 1.0, 1e3])
    return st.tuples(shapes, scales, st.integers(0, 2**31 - 1)).map(
        lambda a: torch.randn(a[0], generator=torch.Generator().manual_seed(a[2])) * a[1])


@settings(max_examples=60, deadline=None)
@given(t=_tensors(), bits=st.integers(2, 16), rounding=st.sampled_from(ROUNDINGS),
       per_channel=st.booleans())
def test_quantize_tensor_matches_numpy_reference(t, bits, rounding, per_channel):
    dim = 0 if per_channel else None
    q = quantize_tensor(t, bits=bits, rounding=rounding, channel_dim=dim)
    values = q.dequantize()
    assert values.dtype == t.dtype
    # independent reference: step = max|t| / (2^(bits-1) - 1), codes = round(t / step)
    a = t.double().numpy()
    amax = np.abs(a).reshape(a.shape[0], -1).max(axis=1) if per_channel else np.abs(a).max()
    step = np.float32(amax / (2 ** (bits - 1) - 1)).astype(np.float64)
    step = step.reshape((-1,) + (1,) * (a.ndim - 1)) if per_channel else step
    expected = REFERENCE_ROUND[rounding](a / step)
    codes = q.codes.long().numpy()
    # the reference may sit one code further from zero only where the float product
    # overshoots |t| (the magnitude guard of rounding towards zero)
    assert np.all(np.abs(codes - expected) <= (1 if rounding is Rounding.ZERO else 0))
    assert codes.min() >= -(2 ** (bits - 1)) and codes.max() <= 2 ** (bits - 1) - 1
    assert np.array_equal(np.sign(codes) * np.sign(a) >= 0, np.ones_like(a, bool))
    err = np.abs(values.double().numpy() - a)
    step = np.broadcast_to(step, a.shape)
    slack = 2.4e-7 * np.abs(a)  # float32 rounding of codes * step (two ulps)
    assert np.all(err <= (step / 2 if rounding is Rounding.NEAREST else step) + slack)
    if rounding is Rounding.ZERO:
        assert torch.all(values.abs() <= t.abs())  # exact, in float32
    if rounding is Rounding.DOWN:
        assert torch.all(values <= t)


def test_code_dtype_and_range():
    t = torch.linspace(-1, 1, 101)
    for bits, dtype in ((4, torch.int8), (8, torch.int8), (9, torch.int16), (16, torch.int16)):
        q = quantize_tensor(t, bits=bits, rounding="nearest")
        assert q.codes.dtype == dtype
        assert int(q.codes.max()) == max_code(bits) == -int(q.codes.min())


def test_fixed_step_is_the_thesis_quantiser():
    """Q_eta(x) = floor(x / eta) * eta (Sec. 6.1), on a dyadic step where it is exact."""
    t = torch.tensor([-1.3, -0.25, -0.1, 0.0, 0.1, 0.3, 0.75, 2.0], dtype=torch.float64)
    q = quantize_tensor(t, step=0.25, rounding="down").dequantize()
    assert q.tolist() == [-1.5, -0.25, -0.25, 0.0, 0.0, 0.25, 0.75, 2.0]
    q = quantize_tensor(t, step=0.25, rounding="zero").dequantize()
    assert q.tolist() == [-1.25, -0.25, 0.0, 0.0, 0.0, 0.25, 0.75, 2.0]


def test_bad_arguments_are_refused():
    t = torch.ones(3)
    with pytest.raises(InvalidParameterError, match="exactly one"):
        quantize_tensor(t, bits=4, step=0.1)
    with pytest.raises(InvalidParameterError, match="bits"):
        quantize_tensor(t, bits=1)
    with pytest.raises(InvalidParameterError, match="positive"):
        quantize_tensor(t, step=0.0)
    with pytest.raises(InvalidParameterError, match="nearest"):
        quantize_tensor(t, bits=4, rounding="stochastic")
    with pytest.raises(InvalidParameterError, match="resolution"):
        quantize_tensor(torch.tensor([0.7, 1 / 3, 0.9999999999999], dtype=torch.float64),
                        step=3 * 2.0**-60)


# --------------------------------------------------------------------------- whole models


class _Net(nn.Module):
    """Conv, eval BatchNorm, ReLU, max-pool, residual add, ConvTranspose and Linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.up = nn.ConvTranspose2d(4, 3, 2, stride=2)
        self.fc = nn.Linear(3 * 4 * 4, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = h + torch.relu(self.conv2(h))
        h = nn.functional.max_pool2d(h, 2)
        return self.fc(torch.relu(self.up(h)).flatten(1))


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomise_batchnorm_(_Net())


SHAPE = (2, 4, 4)


def _bitwise_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize_copies_and_codes_reproduce_the_copy(rounding, per_channel):
    net = _net()
    before = copy.deepcopy(net.state_dict())
    qm = quantize(net, SHAPE, bits=5, rounding=rounding, per_channel=per_channel)
    assert _bitwise_equal(net.state_dict(), before)  # the caller's model is untouched
    assert set(qm.codes) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias",
                             "conv2.weight", "up.weight", "up.bias", "fc.weight", "fc.bias"}
    params = dict(qm.model.named_parameters())
    for name, q in qm.codes.items():
        assert torch.equal(q.dequantize(), params[name].detach())
        assert int(q.codes.abs().max()) <= 2**4
    assert qm.codes["up.weight"].step.shape == ((3,) if per_channel else ())  # out channels
    assert qm.num_quantized == sum(p.numel() for p in net.parameters())


def test_batchnorm_is_quantised_in_its_affine_form():
    net = _net()
    qm = quantize(net, SHAPE, bits=6)
    bn, qbn = net.bn, qm.model.bn
    a = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    c = bn.bias - bn.running_mean * a
    x = torch.randn(3, 4, 4, 4)
    expected = x * qm.codes["bn.weight"].dequantize()[:, None, None] + \
        qm.codes["bn.bias"].dequantize()[:, None, None]
    torch.testing.assert_close(qbn(x), expected, rtol=1e-6, atol=1e-7)  # fused kernel
    assert torch.all(qbn.weight.abs() <= a.abs()) and torch.all(qbn.bias.abs() <= c.abs())
    assert torch.allclose(qbn.weight, a, atol=float(a.detach().abs().max()) / 31)


def test_pruned_weights_stay_zero():
    net = _net()
    prune.l1_unstructured(net.fc, "weight", amount=0.5)
    qm = quantize(net, SHAPE, bits=4, rounding="nearest")
    mask = net.fc.weight_mask.bool()
    assert torch.all(qm.model.fc.weight[~mask] == 0)
    assert torch.equal(qm.codes["fc.weight"].dequantize(), qm.model.fc.weight.detach())


def test_step_and_bits_arguments():
    net = _net()
    with pytest.raises(InvalidParameterError, match="not both"):
        quantize(net, SHAPE, bits=4, step=0.1)
    with pytest.raises(InvalidParameterError, match="bits"):
        quantize(net, SHAPE)
    qm = quantize(net, SHAPE, step=2.0**-6)
    w = qm.model.conv.weight.detach().double()
    assert torch.equal(w, torch.trunc(net.conv.weight.double() * 64) / 64)


# --------------------------------------------------------------------------- certified error


def _mlp_paths_l1(model: nn.Sequential) -> tuple[float, list[list[float]]]:
    """Explicit path enumeration of a Linear/ReLU MLP (Def. 2.3.3): every path from an
    input or from a hidden neuron's bias to an output, with the product of its weights."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    per_output = []
    for v in range(linears[-1].out_features):
        values = []
        for start in range(len(linears) + 1):
            # paths starting at layer `start`: an input (start == 0) or a bias of layer start
            widths = [lin.in_features for lin in linears[start:]]
            for idx in itertools.product(*[range(w) for w in widths]):
                chain = [*idx, v]
                prod = 1.0 if start == 0 else float(linears[start - 1].bias[chain[0]].detach())
                for layer, (i, j) in enumerate(itertools.pairwise(chain)):
                    prod *= float(linears[start + layer].weight[j, i].detach())
                values.append(prod)
        per_output.append(values)
    return sum(abs(p) for vals in per_output for p in vals), per_output


def test_two_pass_metric_equals_path_enumeration():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU(),
                          nn.Linear(3, 2)).double()
    _, phi = _mlp_paths_l1(model)
    for bits in (2, 3, 6, 12):
        qm = quantize(model, (3,), bits=bits)
        _, phi_q = _mlp_paths_l1(qm.model)
        enumerated = sum(abs(a - b) for p, pq in zip(phi, phi_q, strict=True)
                         for a, b in zip(p, pq, strict=True))
        ce = certified_error(model, qm, (3,))
        assert ce.exact
        assert ce.value == pytest.approx(enumerated, rel=1e-10)
        # rounding to nearest: a certified interval that contains the enumerated value
        qn = quantize(model, (3,), bits=bits, rounding="nearest")
        _, phi_n = _mlp_paths_l1(qn.model)
        enumerated = sum(abs(a - b) for p, pq in zip(phi, phi_n, strict=True)
                         for a, b in zip(p, pq, strict=True))
        interval = certified_error(model, qn, (3,)).metric
        assert interval.lower * (1 - 1e-9) <= enumerated <= interval.upper * (1 + 1e-9)


def _check_bound(net: nn.Module, shape: tuple[int, ...], bits: int, per_channel: bool,
                 samples: int = 32) -> None:
    """Cor. 3.4.1 on sampled inputs of every scale, outputs computed in float64."""
    qm = quantize(net, shape, bits=bits, per_channel=per_channel)
    ce = certified_error(net, qm, shape)
    assert 0 < ce.relative <= 1
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn((samples, *shape), generator=gen, dtype=torch.float64)
    x = x * torch.logspace(-1, 1, samples, dtype=torch.float64).view(-1, *[1] * len(shape))
    with torch.no_grad():
        diff = copy.deepcopy(net).double()(x) - qm.model.double()(x)
    assert torch.all(diff.abs().flatten(1).sum(1) <= ce.bound(x))


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 16])
def test_certified_bound_holds_on_sampled_inputs(bits):
    _check_bound(_net(bits), SHAPE, bits, per_channel=bits % 2 == 0)


@pytest.mark.slow
@pytest.mark.parametrize("per_channel", [False, True])
def test_certified_bound_holds_for_every_bit_width(per_channel):
    for bits in range(2, 17):
        _check_bound(_net(bits), SHAPE, bits, per_channel)


def test_certified_error_shrinks_with_bits():
    net = _net()
    values = [certified_error(net, quantize(net, SHAPE, bits=b), SHAPE).value
              for b in (2, 6, 10, 16)]
    assert values == sorted(values, reverse=True)
    assert values[-1] < 1e-3 * values[0]


def test_certified_error_refuses_what_it_cannot_certify():
    net = _net()
    nearest = certified_error(net, quantize(net, SHAPE, bits=4, rounding="nearest"), SHAPE)
    assert not nearest.exact  # max-pool: no Lemma F.3 bound, the triangle inequality
    metric = nearest.metric
    assert "triangle" in metric.reason and metric.upper == pytest.approx(
        10 ** metric.norm_a_log10 + 10 ** metric.norm_b_log10, rel=1e-12)
    flipped = copy.deepcopy(net)
    with torch.no_grad():
        flipped.fc.weight[0, 0] *= -1
    with pytest.raises(InvalidParameterError, match="sign"):
        certified_error(net, flipped, SHAPE)
    other = nn.Sequential(nn.Flatten(), nn.Linear(32, 5))
    with pytest.raises(ArchitectureMismatchError):
        certified_error(net, other, SHAPE)


def test_certified_error_in_log_space_for_deep_networks():
    """A 200-layer chain whose l1 path-norm (~1e340) is beyond float64."""
    torch.manual_seed(0)
    layers = []
    for _ in range(200):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for m in model:
            if isinstance(m, nn.Linear):
                m.weight.mul_(35.0)
    ce = certified_error(model, quantize(model, (8,), bits=8), (8,))
    assert ce.path_norm_log10 > 308 and math.isfinite(ce.log10)
    assert 0 < ce.relative < 1


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), bits=st.integers(2, 16), per_channel=st.booleans(),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_cor_3_4_1_property_on_random_mlps(seed, bits, per_channel, scale):
    """||R_theta(x) - R_Q(theta)(x)||_1 <= max(1, ||x||_inf) d(theta, Q(theta))."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.ReLU(),
                          nn.Linear(4, 3)).double()
    qm = quantize(model, (5,), bits=bits, per_channel=per_channel)
    ce = certified_error(model, qm, (5,))
    x = torch.randn(16, 5, dtype=torch.float64) * scale
    with torch.no_grad():
        diff = (model(x) - qm.model(x)).abs().sum(1)
    assert torch.all(diff <= ce.bound(x) * (1 + 1e-12))
