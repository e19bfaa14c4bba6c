"""Functional layers over tensors under any name, as users write them (``F.linear(x,
self.w, self.b)``, ``F.conv2d(x, self.kernel, self.offset)``, ``einsum`` over ``self.W``,
one module's tensor read by two calls): the op of the module form, each tensor known by
its own state_dict key (pathlift.graph.functional). Every number is checked against path
enumeration or autograd; pruning, rescaling, normalisation, quantisation and a
safetensors checkpoint reach ``fc.w``, never a made-up ``fc.weight``; the caller's model
is never touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.bounds.code import quantized_tensors
from pathlift.errors import UnsupportedModelError
from pathlift.graph import copy_model, trace
from pathlift.graph.boundary import structure_key
from pathlift.lift import path_norm
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.models.checkpoints import load_weights, read_checkpoint, save_checkpoint
from pathlift.prune import (
    channel_path_magnitude,
    channel_scores,
    magnitude_scores,
    path_magnitude_scores,
    prune_model,
)
from pathlift.quant import quantize
from pathlift.symmetry import (
    adversarial_rescale,
    conserved_quantities,
    equivalent,
    magnitude_prune,
    normalize,
    permute,
    random_rescale,
)
from pathlift.testing.neurons import NeuronDAG

SHAPE = (1, 4, 4)


class Dense(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.w = nn.Parameter(torch.empty(o, i))
        self.b = nn.Parameter(torch.empty(o))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.w, self.b)


class Kernel(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(o, i, 3, 3))
        self.offset = nn.Parameter(torch.empty(o))

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.kernel, self.offset, padding=1)


class Ein(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.W = nn.Parameter(torch.empty(o, i))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("bi,oi->bo", x, self.W)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = Kernel(1, 2), Dense(8, 5)
        self.mix, self.out = Ein(5, 4), Dense(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1)
        return self.out(torch.relu(self.mix(torch.relu(self.fc(h)))))


KEYS = {"conv.kernel", "conv.offset", "fc.w", "fc.b", "mix.W", "out.w", "out.b"}


@pytest.fixture
def net() -> Net:
    return randomised(Net(), seed=1)


def test_path_norms_equal_enumeration_and_layers_are_module_forms(net):
    assert_norms_equal_enumeration(net, SHAPE)
    assert [type(m).__name__ for _, m in trace(net, SHAPE).layers()] == [
        "FunctionalConv2d", "FunctionalLinear", "FunctionalLinear", "FunctionalLinear"]


def test_scores_keyed_by_the_modules_own_names_equal_autograd(net):
    scores = path_magnitude_scores(net, SHAPE, include_biases=True)
    assert set(scores.tensors) == KEYS - {"mix.b"}
    assert set(magnitude_scores(net, SHAPE).tensors) == {"conv.kernel", "fc.w", "mix.W",
                                                          "out.w"}
    copy = copy_model(net)
    log_norm = differentiable_path_norm(copy, SHAPE, q=1.0)  # ln ||Phi||_1
    log_norm.backward()
    for key, p in copy.named_parameters():  # theta_i d||Phi||_1/d theta_i (Sec. 3.5.1)
        expected = (p * p.grad).detach() * log_norm.exp() / 10 ** scores.log10_scale
        torch.testing.assert_close(scores.tensors[key], expected, rtol=1e-10, atol=1e-12)


def test_pruning_masks_land_on_the_owner_under_its_names(net, tmp_path: Path):
    pruned = copy_model(net)
    prune_model(pruned, SHAPE, 0.5)
    for owner, name in (("conv", "kernel"), ("fc", "w"), ("mix", "W"), ("out", "w")):
        module = pruned.get_submodule(owner)
        assert hasattr(module, f"{name}_orig") and hasattr(module, f"{name}_mask")
        assert not hasattr(module, "weight") and not hasattr(module, "weight_mask")
    zeros = sum(int((m == 0).sum()) for k, m in pruned.state_dict().items()
                if k.endswith("_mask"))
    assert zeros > 0
    # the same weights written in place of the masks: an independent pruned network
    plain = copy_model(net)
    with torch.no_grad():
        for key, m in pruned.state_dict().items():
            if key.endswith("_mask"):
                plain.get_parameter(key.removesuffix("_mask")).mul_(m)
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(pruned(x), plain(x), rtol=0, atol=1e-12)
    assert path_norm(pruned, SHAPE).log10 == pytest.approx(
        NeuronDAG.from_module(plain, SHAPE).path_norm_log10(1.0, 1.0), abs=1e-12)
    # a safetensors checkpoint of the pruned model loads back, masks re-attached
    path = save_checkpoint(pruned, tmp_path / "net.safetensors", f"{__file__}:Net")
    loaded = load_weights(Net().double().eval(), read_checkpoint(path).state_dict)
    assert hasattr(loaded.fc, "w_mask") and torch.equal(loaded.fc.w_mask, pruned.fc.w_mask)
    torch.testing.assert_close(loaded(x), pruned(x), rtol=0, atol=0)
    assert path_norm(loaded, SHAPE).log10 == path_norm(pruned, SHAPE).log10


def test_rescaling_and_normalisation_change_the_modules_tensors(net):
    assert_rescaling_keeps_function_and_norms(net, SHAPE, lambda m: m.fc.w)
    rescaled = random_rescale(net, seed=5, input_shape=SHAPE)
    for key in ("conv.kernel", "conv.offset", "mix.W"):
        assert not torch.equal(rescaled.get_parameter(key), net.get_parameter(key))


def test_quantisation_rounds_the_modules_tensors(net):
    quantized = quantize(net, SHAPE, bits=4)
    assert set(quantized.codes) == KEYS
    for key, code in quantized.codes.items():
        torch.testing.assert_close(quantized.model.get_parameter(key), code.dequantize(),
                                   rtol=0, atol=0)
        assert not torch.equal(quantized.model.get_parameter(key), net.get_parameter(key))


def test_the_callers_model_is_never_touched(net):
    before = {k: v.clone() for k, v in net.state_dict().items()}
    key = structure_key(net)
    path_magnitude_scores(net, SHAPE, include_biases=True)
    random_rescale(net, seed=2, input_shape=SHAPE)
    normalize(net, SHAPE)
    quantize(net, SHAPE, bits=4)
    prune_model(copy_model(net), SHAPE, 0.3)
    assert structure_key(net) == key
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


class Twice(nn.Module):
    """One module's tensor read by two calls: a layer called twice (shared weights)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 4))
        self.b = nn.Parameter(torch.empty(4))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(torch.relu(F.linear(x, self.w, self.b)), self.w, self.b)


def test_a_tensor_read_by_two_calls_is_one_shared_layer():
    net = randomised(nn.Sequential(Dense(4, 4), nn.ReLU(), Twice(), nn.ReLU(),
                                   nn.Linear(4, 2)), seed=3)
    assert_norms_equal_enumeration(net, (4,))
    assert_rescaling_keeps_function_and_norms(net, (4,), lambda m: m[2].w)


class _Hidden(nn.Module):
    """Holds a ``weight`` (a scale of its own) that its functional layer does not read."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))
        self.weight = nn.Parameter(torch.randn(3))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.w)


class _Swapped(nn.Module):
    """Its weight named ``bias`` and its bias named ``weight``."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(3, 4))
        self.weight = nn.Parameter(torch.empty(3))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.bias, self.weight)


def test_swapped_names_are_read_by_role():
    net = randomised(nn.Sequential(_Swapped(), nn.ReLU(), Dense(3, 2)), seed=4)
    assert_norms_equal_enumeration(net, (4,))
    assert set(path_magnitude_scores(net, (4,), include_biases=True).tensors) == {
        "0.bias", "0.weight", "2.w", "2.b"}
    assert_rescaling_keeps_function_and_norms(net, (4,), lambda m: m[0].bias)


def test_a_hidden_role_name_is_refused_in_one_line():
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(nn.Sequential(_Hidden()).eval(), (4,))
    assert "module '0' also holds a tensor named weight" in str(info.value)
    assert len(info.value.problems) == 1


class _Beit(nn.Module):
    """timm's BEiT attention input: a bias concatenated from q_bias, zeros and v_bias."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 6, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
        self.register_buffer("k_bias", torch.zeros(2), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        return F.linear(x, self.qkv.weight, bias)


def test_a_bias_concatenated_from_several_tensors_is_refused_saying_so():
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(nn.Sequential(_Beit(), nn.ReLU(), nn.Linear(6, 2)).eval(), (4,))
    assert "its bias is computed in forward from 0.k_bias, 0.q_bias, 0.v_bias" in str(
        info.value) and len(info.value.problems) == 1


class _Norm(nn.Module):
    """A user's own eval BatchNorm over tensors of its own names, with BatchNorm's
    settings as attributes (which quantisation rewrites: eps)."""

    def __init__(self, c: int):
        super().__init__()
        self.num_features, self.eps, self.affine = c, 1e-3, True
        self.register_buffer("mu", torch.zeros(c))
        self.register_buffer("var", torch.ones(c))
        self.g, self.b = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x: Tensor) -> Tensor:
        return F.batch_norm(x, self.mu, self.var, self.g, self.b, False, 0.1, self.eps)


def test_quantising_a_renamed_batch_norm_reaches_its_settings():
    net = randomised(nn.Sequential(nn.Linear(3, 4), _Norm(4), nn.ReLU(), nn.Linear(4, 2)),
                     seed=6)
    with torch.no_grad():
        net[1].mu.uniform_(-1, 1)
        net[1].var.uniform_(0.5, 2)
    assert_norms_equal_enumeration(net, (3,))
    quantized = quantize(net, (3,), bits=4)
    a, c = (quantized.codes[k].dequantize() for k in ("1.g", "1.b"))
    model = quantized.model
    assert model[1].eps == 0.0 and net[1].eps == 1e-3
    x = torch.randn(5, 3, dtype=torch.float64)
    h = model[0](x) * a + c  # x * Q(a) + Q(c) exactly, by hand
    torch.testing.assert_close(model(x), model[3](torch.relu(h)), rtol=0, atol=1e-12)


class Twin(nn.Module):
    """``Net`` written with modules: the same function under nn's names."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 3, padding=1), nn.Linear(8, 5)
        self.mix, self.out = nn.Linear(5, 4, bias=False), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1)
        return self.out(torch.relu(self.mix(torch.relu(self.fc(h)))))


_NN_NAMES = {"kernel": "weight", "offset": "bias", "w": "weight", "b": "bias", "W": "weight"}


def _twin(net: Net) -> Twin:
    twin = Twin().double().eval()
    twin.load_state_dict({k.rpartition(".")[0] + "." + _NN_NAMES[k.rpartition(".")[2]]: v
                          for k, v in net.state_dict().items()})
    return twin


def test_permutations_and_conserved_quantities_reach_the_modules_tensors(net):
    permuted = permute(net, {"fc": [4, 2, 0, 1, 3]}, SHAPE)
    torch.testing.assert_close(permuted.fc.w, net.fc.w[[4, 2, 0, 1, 3]], rtol=0, atol=0)
    torch.testing.assert_close(permuted.mix.W, net.mix.W[:, [4, 2, 0, 1, 3]], rtol=0, atol=0)
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(permuted(x), net(x), rtol=0, atol=1e-12)
    rescaled = random_rescale(permuted, seed=4, input_shape=SHAPE)
    assert equivalent(net, rescaled, SHAPE).equivalent
    twin = _twin(net)
    torch.testing.assert_close(twin(x), net(x), rtol=0, atol=1e-12)
    mine, theirs = conserved_quantities(net, SHAPE), conserved_quantities(twin, SHAPE)
    torch.testing.assert_close(mine.incoming, theirs.incoming, rtol=1e-12, atol=0)
    torch.testing.assert_close(mine.outgoing, theirs.outgoing, rtol=1e-12, atol=0)


def test_magnitude_pruning_and_adversarial_rescaling_reach_the_modules_tensors(net):
    twin = _twin(net)
    pruned, twin_pruned = magnitude_prune(net, 0.5, SHAPE), magnitude_prune(twin, 0.5, SHAPE)
    assert int((pruned.fc.w == 0).sum()) > 0
    for key, value in pruned.state_dict().items():  # the same zeros as the module form's
        owner, _, leaf = key.rpartition(".")
        torch.testing.assert_close(value, twin_pruned.get_parameter(
            f"{owner}.{_NN_NAMES[leaf]}"), rtol=0, atol=0)
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    adversarial = adversarial_rescale(net, 0.5, input_shape=SHAPE)
    twin_adversarial = adversarial_rescale(twin, 0.5, input_shape=SHAPE)
    assert not all(torch.equal(v, net.state_dict()[k])
                   for k, v in adversarial.state_dict().items())
    for key, value in adversarial.state_dict().items():  # the module form's factors
        owner, _, leaf = key.rpartition(".")
        torch.testing.assert_close(value, twin_adversarial.get_parameter(
            f"{owner}.{_NN_NAMES[leaf]}"), rtol=1e-12, atol=0)
    torch.testing.assert_close(adversarial(x), net(x), rtol=1e-10, atol=1e-10)


def test_structured_pruning_masks_whole_channels_of_the_modules_tensors(net):
    pruned, twin = copy_model(net), _twin(net)
    scores = channel_path_magnitude(pruned, SHAPE, 0.5)
    channel_path_magnitude(twin, SHAPE, 0.5)
    assert set(channel_scores(scores)) == {"conv", "fc", "mix", "out"}
    for owner, name in (("conv", "kernel"), ("fc", "w"), ("mix", "W")):
        mask = pruned.get_buffer(f"{owner}.{name}_mask")
        rows = mask.reshape(mask.shape[0], -1)
        assert bool(((rows == 0).all(1) | (rows == 1).all(1)).all()) and bool((rows == 0).any())
        torch.testing.assert_close(mask, twin.get_buffer(f"{owner}.weight_mask"), rtol=0, atol=0)
    assert not hasattr(pruned.out, "w_mask")  # the output layer keeps its neurons
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(pruned(x), twin(x), rtol=0, atol=1e-12)


def test_the_compression_codes_tensors_are_the_modules_own(net):
    found = quantized_tensors(trace(net, SHAPE))
    assert [name for name, *_ in found] == list(quantize(net, SHAPE, bits=4).codes)
    for name, _, _, value in found:
        torch.testing.assert_close(value, net.get_parameter(name), rtol=0, atol=0)
