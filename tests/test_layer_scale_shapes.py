"""A learnt per-channel scale stored with its broadcast shape, as ConvNeXt-like code
stores it: ``gamma`` of shape (1, C, 1, 1) or (C, 1, 1) over an image's channels, (1, 1, C)
over the features of a token MLP (channels last), on a submodule that is called or whose
tensor its parent reads (``pathlift.graph.ops.scale``). Each is the per-channel scale of
``x * self.gamma[:, None, None]`` (identity neurons with one incoming weight, thesis Def.
2.2.2): path-norms equal explicit path enumeration at q = 1, 2 (1e-12 in log10) and
those of the twin holding gamma in a depthwise 1x1 conv; a random rescaling and the
normalisation (Alg. 3.2.1) keep the function and every path-norm and normalise gamma;
a rescaling by hand divides gamma, in its stored shape; path-magnitude scores of gamma,
in its stored shape, equal autograd of the differentiable path-norm; pruning and
quantisation write the real parameter. A scale on the model's root itself is refused
in one line (a functional layer's tensors belong to a submodule).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unseen_zoo as z
from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    assert_scores_equal_autograd,
    masks_written,
    randomised,
)
from pathlift.cli_support import one_line
from pathlift.errors import UnsupportedModelError
from pathlift.graph import copy_model
from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores, prune_model
from pathlift.quant import quantize
from pathlift.symmetry import normalize, rescale
from pathlift.testing.neurons import NeuronDAG

IMG = (2, 5, 5)
TOKENS = (3, 4)  # 3 tokens of 4 features


class Holder(nn.Module):
    """A submodule holding only the scale, read by its parent's forward (never called)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(shape))


class Scale(Holder):
    """timm's LayerScale2d with gamma stored broadcast: ``x * self.gamma``, called."""

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class ConvScaled(nn.Module):
    """conv -> ReLU -> x * gamma (stored as ``shape``) -> mean -> Linear, gamma on the
    submodule ``scale``, called (``called``) or read by this forward."""

    def __init__(self, shape: tuple[int, ...], called: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.scale = Scale(shape) if called else Holder(shape)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.conv(x))
        h = self.scale(h) if isinstance(self.scale, Scale) else h * self.scale.gamma
        return self.fc(h.mean((2, 3)))


class TokenMlp(nn.Module):
    """Linear over features of tokens, ReLU, the scale (1, 1, C) channels last on the
    left, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)
        self.ls = Holder((1, 1, 5))

    def forward(self, x: Tensor) -> Tensor:
        return self.b(F.relu(self.a(x)) * self.ls.gamma).flatten(1)


class RootScaled(ConvScaled):
    """gamma (1, C, 1, 1) on the model's root itself."""

    def __init__(self) -> None:
        super().__init__((4,), False)
        del self.scale
        self.gamma = nn.Parameter(torch.rand(1, 4, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc((F.relu(self.conv(x)) * self.gamma).mean((2, 3)))


#: name -> (builder, input shape, the scale's state_dict key)
MODELS = {
    "1c11_read": (lambda: ConvScaled((1, 4, 1, 1), False), IMG, "scale.gamma"),
    "1c11_called": (lambda: ConvScaled((1, 4, 1, 1), True), IMG, "scale.gamma"),
    "c11_read": (lambda: ConvScaled((4, 1, 1), False), IMG, "scale.gamma"),
    "c11_called": (lambda: ConvScaled((4, 1, 1), True), IMG, "scale.gamma"),
    "11c_tokens_read": (TokenMlp, TOKENS, "ls.gamma"),
}
#: the scale's module is called, so torch.nn.utils.prune's pre-hook applies its mask
CALLED = ("1c11_called", "c11_called")


def _net(name: str, seed: int = 0) -> tuple[nn.Module, tuple[int, ...], str]:
    make, shape, key = MODELS[name]
    return randomised(make(), seed), shape, key


@pytest.mark.parametrize("name", sorted(MODELS))
def test_path_norms_equal_enumeration(name: str) -> None:
    net, shape, _ = _net(name)
    assert_norms_equal_enumeration(net, shape)


def test_equal_to_the_depthwise_twin() -> None:
    net = randomised(z.LayerScale(inner=True), 0)
    twin = z.depthwise_twin(net)
    dag = NeuronDAG.from_module(twin, z.IMAGE)
    for q in (1.0, 2.0):
        assert path_norm(net, z.IMAGE, q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                                   abs=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_rescaling_and_normalisation_keep_function_and_norms(name: str) -> None:
    net, shape, key = _net(name, seed=1)
    first = "conv" if hasattr(net, "conv") else "a"
    assert_rescaling_keeps_function_and_norms(net, shape,
                                              lambda m: m.get_parameter(f"{first}.weight"))
    out = normalize(net, shape, q=1.0)
    assert out.get_parameter(key).shape == net.get_parameter(key).shape
    # Alg. 3.2.1: each scale neuron has one incoming weight, normalised to |1|
    torch.testing.assert_close(out.get_parameter(key).detach().abs(),
                               torch.ones_like(net.get_parameter(key)), rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", ["1c11_read", "c11_called"])
def test_a_rescaling_by_hand_moves_weight_through_gamma(name: str) -> None:
    """conv's neurons times lam, the scale's own kept (named with factor 1): gamma, of
    its stored shape, divided by lam (Def. 2.4.1); the function is unchanged."""
    net, shape, key = _net(name, seed=2)
    lam = torch.tensor([0.5, 2.0, 3.0, 0.25], dtype=torch.float64)
    out = rescale(net, {"conv": lam, "scale": 1.0}, shape)
    torch.testing.assert_close(out.conv.weight, net.conv.weight * lam[:, None, None, None],
                               rtol=1e-15, atol=0)
    gamma = net.get_parameter(key)
    torch.testing.assert_close(out.get_parameter(key), gamma / lam.reshape(gamma.shape),
                               rtol=1e-15, atol=0)
    torch.testing.assert_close(out.fc.weight, net.fc.weight, rtol=0, atol=0)
    x = torch.randn(3, *shape, dtype=torch.float64)
    torch.testing.assert_close(out(x), net(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_scores_of_gamma_equal_autograd(name: str) -> None:
    net, shape, key = _net(name, seed=3)
    scores = path_magnitude_scores(net, shape)
    assert key in scores.tensors and scores.tensors[key].shape == net.get_parameter(key).shape
    assert_scores_equal_autograd(net, shape, scores)


@pytest.mark.parametrize("name", CALLED)
def test_pruning_reaches_gamma(name: str) -> None:
    net, shape, key = _net(name, seed=4)
    pruned = copy_model(net)
    prune_model(pruned, shape, 0.5)
    owner, _, leaf = key.rpartition(".")
    module = pruned.get_submodule(owner)
    assert hasattr(module, f"{leaf}_mask"), sorted(pruned.state_dict())
    plain = masks_written(pruned, net)
    x = torch.randn(4, *shape, dtype=torch.float64)
    torch.testing.assert_close(pruned(x), plain(x), rtol=0, atol=1e-12)
    assert path_norm(pruned, shape).log10 == pytest.approx(
        NeuronDAG.from_module(plain, shape).path_norm_log10(1.0, 1.0), abs=1e-12)


@pytest.mark.parametrize("name", ["1c11_read", "c11_called"])
def test_quantisation_rounds_gamma_and_the_callers_model_is_untouched(name: str) -> None:
    net, shape, key = _net(name, seed=5)
    before = copy.deepcopy(net.state_dict())
    quantized = quantize(net, shape, bits=4)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    value = quantized.model.get_parameter(key)
    assert value.shape == net.get_parameter(key).shape
    torch.testing.assert_close(value, quantized.codes[key].dequantize().reshape(value.shape),
                               rtol=0, atol=0)
    assert not torch.equal(value, net.get_parameter(key))


def test_a_scale_on_the_models_root_is_refused_in_one_line() -> None:
    """The root's own (1, C, 1, 1) parameter (it was taken for a torch.fx constant):
    refused naming it and saying to move it into a submodule."""
    net = randomised(RootScaled(), 0)
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(net, IMG)
    line = one_line(info.value)
    assert "over gamma" in line and "not the model's root" in line, line
    assert "constant" not in line
