"""Functional layers over their own module's tensors, as users and timm write them
(``F.linear(x, self.weight, self.bias)``, ``F.conv2d``, ``F.conv_transpose2d``, a
BatchNorm subclass calling ``F.batch_norm`` then its activation, ``x @ self.weight.T``,
``einsum``): the same ops as their module forms (pathlift.graph.functional). Each number
is checked against the same network written with modules (same state_dict keys) and
against explicit path enumeration; pruning, rescaling, normalisation, quantisation and a
checkpoint round trip reach the module's own tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import prune

from activation_checks import (
    PAIRS,
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.errors import UnsupportedModelError
from pathlift.graph import copy_model, trace
from pathlift.lift import path_norm
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.models.checkpoints import load_weights
from pathlift.prune import channel_path_magnitude, path_magnitude_scores, prune_model
from pathlift.quant import quantize
from pathlift.testing.neurons import NeuronDAG

SHAPE = (1, 3, 3)


class Dense(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(o, i))
        self.bias = nn.Parameter(torch.empty(o))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Transposed(nn.Module):
    """``x @ self.weight.T``."""

    def __init__(self, i: int, o: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(o, i))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T


class Einsum(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(o, i))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("bi,oi->bo", x, self.weight)


class Stored(nn.Module):
    """A weight stored (in, out): ``torch.matmul(x, self.weight)``."""

    def __init__(self, i: int, o: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(i, o))

    def forward(self, x: Tensor) -> Tensor:
        return torch.matmul(x, self.weight)


class Conv(nn.Module):
    def __init__(self, i: int, o: int, k: int, padding: int = 0, groups: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(o, i // groups, k, k))
        self.bias = nn.Parameter(torch.empty(o))
        self.padding, self.groups = padding, groups

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, 1, self.padding, 1, self.groups)


class Up(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(i, o, 2, 2))
        self.bias = nn.Parameter(torch.empty(o))

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, stride=2)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: F.batch_norm with its own statistics, then drop and act."""

    def __init__(self, channels: int):
        super().__init__(channels)
        self.drop, self.act = nn.Dropout(0.1), nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        training = self.training or self.running_mean is None
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         training, self.momentum, self.eps)
        return self.act(self.drop(x))


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = Conv(1, 2, 3, padding=1), BatchNormAct(2)
        self.gconv, self.up = Conv(2, 2, 3, padding=1, groups=2), Up(2, 2)
        self.fc1, self.fc2 = Dense(8, 4), Transposed(4, 3)
        self.fc3, self.fc4 = Einsum(3, 3), Stored(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(F.relu(self.gconv(self.bn(self.conv(x)))), 2)
        h = F.relu(self.fc1(F.relu(self.up(h)).flatten(1)))
        return self.fc4(F.relu(self.fc3(F.relu(self.fc2(h)))))


class Modules(nn.Module):
    """``Functional`` written with modules: same state_dict keys (fc4's weight
    transposed)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2)
        self.gconv = nn.Conv2d(2, 2, 3, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(2, 2, 2, stride=2)
        self.fc1, self.fc2 = nn.Linear(8, 4), nn.Linear(4, 3, bias=False)
        self.fc3, self.fc4 = nn.Linear(3, 3, bias=False), nn.Linear(3, 2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(F.relu(self.gconv(F.relu(self.bn(self.conv(x))))), 2)
        h = F.relu(self.fc1(F.relu(self.up(h)).flatten(1)))
        return self.fc4(F.relu(self.fc3(F.relu(self.fc2(h)))))


def _twin(net: Functional) -> Modules:
    state = {k: v.t() if k.startswith("fc4.") else v for k, v in net.state_dict().items()}
    twin = Modules().double().eval()
    twin.load_state_dict(state)
    return twin


@pytest.fixture
def net() -> Functional:
    return randomised(Functional(), seed=0)


def test_same_function_and_path_norms_as_the_module_form_and_enumeration(net):
    twin = _twin(net)
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(net(x), twin(x), rtol=0, atol=1e-12)
    assert_norms_equal_enumeration(net, SHAPE)
    for q, r in PAIRS:
        assert path_norm(net, SHAPE, q=q, r=r).log10 == pytest.approx(
            path_norm(twin, SHAPE, q=q, r=r).log10, abs=1e-12)
    graph = trace(net, SHAPE)  # each functional layer is its module form's op
    assert [type(m).__name__ for _, m in graph.layers()] == [
        "FunctionalConv2d", "FunctionalBatchNorm2d", "FunctionalConv2d",
        "FunctionalConvTranspose2d", "FunctionalLinear", "FunctionalLinear",
        "FunctionalLinear", "FunctionalLinear"]


def test_path_magnitude_scores_by_state_dict_key_equal_autograd(net):
    scores = path_magnitude_scores(net, SHAPE, include_biases=True).tensors
    twin = path_magnitude_scores(_twin(net), SHAPE, include_biases=True).tensors
    assert set(scores) == set(twin) and set(scores) <= set(net.state_dict())
    for key, value in scores.items():
        expected = twin[key].t() if key.startswith("fc4.") else twin[key]
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-300)
    copy = copy_model(net)
    log_norm = differentiable_path_norm(copy, SHAPE, q=1.0)  # ln ||Phi||_1
    log_norm.backward()
    for key, p in copy.named_parameters():  # theta_i d||Phi||_1/d theta_i
        if key in scores:
            torch.testing.assert_close(scores[key], (p * p.grad).detach() * log_norm.exp(),
                                       rtol=1e-10, atol=1e-12)


def test_rescaling_and_normalisation_reach_the_modules_tensors(net):
    assert_rescaling_keeps_function_and_norms(net, SHAPE, lambda m: m.fc2.weight)


def test_pruning_masks_reach_the_modules_forward(net):
    pruned = copy_model(net)
    prune_model(pruned, SHAPE, 0.5)
    assert hasattr(pruned.fc1, "weight_mask") and hasattr(pruned.conv, "weight_mask")
    twin = _twin(net)
    for name, module in pruned.named_modules():
        if hasattr(module, "weight_mask"):
            m = module.weight_mask
            prune.custom_from_mask(twin.get_submodule(name), "weight",
                                   m.t() if name == "fc4" else m)
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(pruned(x), twin(x), rtol=0, atol=1e-12)
    assert path_norm(pruned, SHAPE).log10 == pytest.approx(path_norm(twin, SHAPE).log10,
                                                           abs=1e-12)
    assert path_norm(pruned, SHAPE).log10 == pytest.approx(
        NeuronDAG.from_module(pruned, SHAPE).path_norm_log10(1.0, 1.0), abs=1e-12)
    # a checkpoint of the pruned model loads back, masks re-attached
    loaded = load_weights(Functional().double().eval(), pruned.state_dict())
    assert hasattr(loaded.fc1, "weight_mask")
    torch.testing.assert_close(loaded(x), pruned(x), rtol=0, atol=0)
    assert path_norm(loaded, SHAPE).log10 == path_norm(pruned, SHAPE).log10


def test_quantisation_rounds_the_modules_tensors(net):
    quantized = quantize(net, SHAPE, bits=4)
    twin = quantize(_twin(net), SHAPE, bits=4)
    assert set(quantized.codes) == set(twin.codes)
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(quantized.model(x), twin.model(x), rtol=0, atol=1e-12)
    assert not torch.equal(quantized.model.fc1.weight, net.fc1.weight)


class _Root(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.w)


class _Renamed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Module()
        self.fc.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.fc.w.T


class _Groups(Conv):
    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, 1, self.padding, 1, 2)


class _Training(BatchNormAct):
    def forward(self, x: Tensor) -> Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            True, self.momentum, self.eps)


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.gamma = nn.Parameter(torch.ones(3))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x) * self.gamma[:, None, None]


class _PerEntry(_Scaled):
    """A scale of every entry of the map: not per-channel."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(3, 3, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x) * self.gamma


@pytest.mark.parametrize(("model", "shape", "words"), [
    (nn.Sequential(_PerEntry()), (2, 3, 3), "not one entry per channel"),
    (_Root(), (4,), "not the model's root"),
    (nn.Sequential(_Groups(4, 4, 3)), (4, 5, 5), "groups=2 but module '0' holds groups=1"),
    (nn.Sequential(_Training(3)), (3, 4, 4), "batch statistics"),
])
def test_refused_in_one_line_naming_the_tensors(model, shape, words):
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(model.eval(), shape)
    message = str(info.value)
    assert words in message and len(info.value.problems) == 1
    assert "multiplies activations" not in message and "broadcasting" not in message


def test_a_per_channel_scale_is_measured_not_refused():
    """``self.conv(x) * self.gamma[:, None, None]`` (refused before as "scales by the
    module's tensor 0.gamma outside any layer"): identity neurons with one incoming weight
    (pathlift.graph.ops.scale; more in tests/test_channel_scale.py)."""
    net = randomised(nn.Sequential(_Scaled()), seed=3)
    assert_norms_equal_enumeration(net, (2, 3, 3))


def test_a_weight_under_another_name_is_measured_not_refused():
    """``x @ self.fc.w.T`` (refused before as "name the module's tensors as the module
    form does"): nn.Linear's op over ``fc.w``, scored by that key."""
    net = randomised(_Renamed(), seed=2)
    assert_norms_equal_enumeration(net, (4,))
    assert set(path_magnitude_scores(net, (4,)).tensors) == {"fc.w"}


def _module_form(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every BatchNorm subclass that applies its own activation
    (timm's BatchNormAct2d) replaced by a plain BatchNorm2d (same tensors) and a ReLU."""
    out = copy_model(model)
    for name, m in list(out.named_modules()):
        if type(m).__name__ == "BatchNormAct2d":
            bn = nn.BatchNorm2d(m.num_features, m.eps).double().eval()
            bn.load_state_dict(m.state_dict())
            owner, _, leaf = name.rpartition(".")
            setattr(out.get_submodule(owner), leaf, nn.Sequential(bn, nn.ReLU()))
    return out


def test_timms_own_norm_act_layers_equal_their_module_form():
    layers = pytest.importorskip("timm.layers")
    net = randomised(nn.Sequential(
        layers.ConvNormAct(1, 2, 3, act_layer="relu"),
        layers.ConvNormAct(2, 2, 3, stride=2, groups=2, act_layer="relu"),
        nn.Flatten(), nn.Linear(8, 2)), seed=7)
    twin = _module_form(net)
    x = torch.randn(3, 1, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(net(x), twin(x), rtol=0, atol=1e-12)
    assert_norms_equal_enumeration(net, (1, 4, 4))
    for q, r in PAIRS:
        assert path_norm(net, (1, 4, 4), q=q, r=r).log10 == pytest.approx(
            path_norm(twin, (1, 4, 4), q=q, r=r).log10, abs=1e-12)
    assert_rescaling_keeps_function_and_norms(net, (1, 4, 4), lambda m: m[1].conv.weight)


def test_structured_pruning_masks_the_modules_own_tensors(net):
    """``channel_path_magnitude`` prunes each layer's module under its own name (it
    pruned the functional view before: the module lost its `weight` and its forward
    raised AttributeError)."""
    pruned, twin = copy_model(net), _twin(net)
    channel_path_magnitude(pruned, SHAPE, 0.5)
    channel_path_magnitude(twin, SHAPE, 0.5)
    assert hasattr(pruned.fc1, "weight_mask") and hasattr(pruned.conv, "weight_mask")
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(pruned(x), twin(x), rtol=0, atol=1e-12)
