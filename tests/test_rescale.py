"""Rescaling symmetries (Def. 2.4.1): function and path-norms unchanged, parameters not."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.utils.prune as prune
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph import trace
from pathlift.graph.channels import channel_map
from pathlift.lift import path_norm, path_norms
from pathlift.symmetry import random_rescale, rescale
from random_nets import randomise_batchnorm_


# --------------------------------------------------------------------------- a small zoo
class Residual(nn.Module):
    """ResNet-like: conv-BN stem, a basic block with identity skip, a downsampling block."""

    def __init__(self, width: int = 6, classes: int = 5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(2)
        self.a1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.abn1 = nn.BatchNorm2d(width)
        self.a2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.abn2 = nn.BatchNorm2d(width)
        self.b1 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False)
        self.bbn1 = nn.BatchNorm2d(2 * width)
        self.b2 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.bbn2 = nn.BatchNorm2d(2 * width)
        self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 1, stride=2, bias=False),
                                  nn.BatchNorm2d(2 * width))
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.relu(self.abn2(self.a2(torch.relu(self.abn1(self.a1(x))))) + x)
        y = self.bbn2(self.b2(torch.relu(self.bbn1(self.b1(x)))))
        x = torch.relu(y + self.down(x))
        return self.fc(torch.flatten(self.avg(x), 1))


class UNetLike(nn.Module):
    """Encoder-decoder with a cat skip, transposed conv, nearest upsampling, 1x1 head."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(6, 4, 2, stride=2)
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")
        self.mix = nn.Conv2d(4 + 4 + 6, 5, 3, padding=1)
        self.head = nn.Conv2d(5, 3, 1)

    def forward(self, x):
        e = self.enc(x)
        d = self.down(e)
        u = torch.relu(self.up(d))
        return self.head(torch.relu(self.mix(torch.cat([e, u, self.up2(d)], dim=1))))


class Depthwise(nn.Module):
    """MobileNet-like: depthwise (groups = channels) then pointwise, BN everywhere."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 12, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU(),
            nn.Conv2d(12, 12, 3, padding=1, groups=4), nn.ReLU(), nn.AvgPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(12 * 4 * 4, 4))

    def forward(self, x):
        return self.classifier(self.features(x))


class Tokens(nn.Module):
    """Linear layers acting on the last dim of (N, T, F), a permute and a mean."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(5, 7), nn.Linear(4, 6), nn.Linear(7, 3)

    def forward(self, x):  # x: (N, 4, 5)
        h = torch.relu(self.fc1(x))  # (N, 4, 7)
        h = torch.relu(self.fc2(h.permute(0, 2, 1)))  # (N, 7, 6)
        return self.fc3(h.mean(dim=2))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 7), nn.ReLU(), nn.Linear(7, 3))


def vgg_like() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10), nn.ReLU(), nn.Linear(10, 4))


ZOO = {
    "mlp": (mlp, (6,)),
    "vgg_like": (vgg_like, (3, 8, 8)),
    "residual": (Residual, (3, 8, 8)),
    "unet_like": (UNetLike, (2, 8, 8)),
    "depthwise": (Depthwise, (3, 8, 8)),
    "tokens": (Tokens, (4, 5)),
}


def build(name: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Module:
    """A zoo network in eval mode with non-trivial BatchNorm statistics."""
    torch.manual_seed(seed)
    return randomise_batchnorm_(ZOO[name][0]().to(dtype))


def inputs(name: str, dtype: torch.dtype = torch.float64, n: int = 5) -> torch.Tensor:
    return torch.randn((n, *ZOO[name][1]), dtype=dtype, generator=torch.Generator().manual_seed(1))


def param_norm(model: nn.Module) -> float:
    return math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in model.parameters()))


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bit_identical(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


def assert_same_outputs(model: nn.Module, out: nn.Module, shape) -> None:
    """Every output of ``out`` equals ``model``'s to 1e-9 relative on float64 samples."""
    x = torch.randn((3, *shape), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ys, ys2 = model(x), out(x)
    ys = ys if isinstance(ys, tuple) else (ys,)
    ys2 = ys2 if isinstance(ys2, tuple) else (ys2,)
    for y, y2 in zip(ys, ys2, strict=True):
        assert float((y - y2).abs().max()) <= 1e-9 * max(float(y.abs().max()), 1e-300)


def random_lambdas(model: nn.Module, shape, seed: int = 0) -> dict[str, torch.Tensor]:
    """Non-power-of-two factors spanning 1e-3..1e3 for every free channel (ties respected)."""
    cmap = channel_map(trace(model, shape))
    g = torch.Generator().manual_seed(seed)
    per_group = torch.exp(torch.empty(cmap.num_groups, dtype=torch.float64).uniform_(
        -7.0, 7.0, generator=g))
    per_group[0] = 1.0
    return {p.name: per_group[cmap.group[p.neurons]] for p in cmap.producers
            if not p.passthrough}


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_rescale_keeps_function_and_path_norms(name, dtype, tol):
    model = build(name, dtype)
    shape = ZOO[name][1]
    before = snapshot(model)
    lambdas = random_lambdas(model, shape)
    rescaled = rescale(model, lambdas, shape)
    x = inputs(name, dtype)
    with torch.no_grad():
        y, y2 = model(x), rescaled(x)
    assert float((y - y2).abs().max()) <= tol * float(y.abs().max())
    if dtype == torch.float64:
        norms, norms2 = path_norms(model, shape), path_norms(rescaled, shape)
        for q in norms:
            assert abs(norms[q].log10 - norms2[q].log10) * math.log(10) <= 1e-9
    assert param_norm(rescaled) > 10 * param_norm(model) or \
        param_norm(rescaled) < param_norm(model) / 10
    assert_bit_identical(model, before)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_random_rescale_thesis_factors(name):
    model = build(name)
    shape = ZOO[name][1]
    before = snapshot(model)
    rescaled = random_rescale(model, seed=3, input_shape=shape)
    x = inputs(name)
    with torch.no_grad():
        y, y2 = model(x), rescaled(x)
    assert float((y - y2).abs().max()) <= 1e-10 * float(y.abs().max())
    assert abs(path_norm(model, shape).log10 - path_norm(rescaled, shape).log10) < 1e-9
    assert param_norm(rescaled) > 10 * param_norm(model)
    assert_bit_identical(model, before)
    # every changed parameter changed by a product/quotient of the factors {1, 128, 4096}
    for (k, v), v2 in zip(model.state_dict().items(), rescaled.state_dict().values(), strict=True):
        if v.is_floating_point() and "var" not in k:
            nz = v.abs() > 1e-12
            ratio = torch.log2((v2[nz] / v[nz]).abs())
            assert torch.allclose(ratio, ratio.round(), atol=1e-9), k


def test_rescale_matches_the_formula_on_an_mlp():
    """lambda <> theta by hand: W1 <- diag(l) W1, b1 <- l b1, W2 <- W2 diag(1/l)."""
    model = mlp().double()
    lam = torch.tensor([0.5, 2, 3, 7, 0.1, 1, 4, 9, 0.25], dtype=torch.float64)
    out = rescale(model, {"0": lam}, (6,))
    assert torch.allclose(out[0].weight, model[0].weight * lam[:, None], rtol=1e-15)
    assert torch.allclose(out[0].bias, model[0].bias * lam, rtol=1e-15)
    assert torch.allclose(out[2].weight, model[2].weight / lam[None, :], rtol=1e-15)
    assert torch.equal(out[2].bias, model[2].bias)
    assert torch.equal(out[4].weight, model[4].weight)


def test_batchnorm_follows_the_thesis_rule():
    """Appendix E.1.2: a rescaled conv channel multiplies the next BN's running mean and
    bias by lambda, its weight and running var unchanged, the next conv divided by lambda."""
    model = build("vgg_like")
    lam = torch.tensor([2.0, 3.0, 5.0, 0.5, 10.0, 1.5], dtype=torch.float64)
    out = rescale(model, {"0": lam}, (3, 8, 8))
    bn, bn2 = model[1], out[1]
    assert torch.allclose(bn2.running_mean, bn.running_mean * lam, rtol=1e-15)
    assert torch.allclose(bn2.bias, bn.bias * lam, rtol=1e-15)
    assert torch.equal(bn2.weight, bn.weight)
    assert torch.equal(bn2.running_var, bn.running_var)
    assert torch.allclose(out[4].weight, model[4].weight / lam[None, :, None, None], rtol=1e-15)


def test_flatten_maps_a_channel_to_a_block_of_features():
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 4 * 4, 2)).double()
    lam = torch.tensor([2.0, 5.0, 7.0], dtype=torch.float64)
    out = rescale(model, {"0": lam}, (2, 4, 4))
    expected = model[3].weight / lam.repeat_interleave(16)[None, :]
    assert torch.allclose(out[3].weight, expected, rtol=1e-15)


def test_residual_ties_and_fixed_outputs():
    model = build("residual")
    cmap = channel_map(trace(model, (3, 8, 8)))
    group = {p.name: cmap.group[p.neurons] for p in cmap.producers}
    assert torch.equal(group["bn1"], group["abn2"])  # identity skip ties the stream
    assert torch.equal(group["bbn2"], group["down.1"])  # projection skip ties the two BNs
    assert not set(group["bn1"].tolist()) & set(group["bbn2"].tolist())
    assert (group["fc"] == 0).all()  # output neurons are fixed
    assert (group["a1"] != 0).all() and len(set(group["a1"].tolist())) == 6  # free, untied
    with pytest.raises(InvalidParameterError, match="tied"):
        rescale(model, {"bn1": 2.0, "abn2": 3.0}, (3, 8, 8))
    with pytest.raises(InvalidParameterError, match="output neuron"):
        rescale(model, {"fc": 2.0}, (3, 8, 8))
    tied = rescale(model, {"bn1": 2.0, "abn2": 2.0}, (3, 8, 8))
    x = inputs("residual")
    assert torch.allclose(tied(x), model(x), rtol=1e-12, atol=1e-12)


def test_bad_factors_are_refused():
    model = mlp()
    with pytest.raises(InvalidParameterError, match="positive"):
        rescale(model, {"0": -1.0}, (6,))
    with pytest.raises(InvalidParameterError, match="not a rescalable layer"):
        rescale(model, {"1": 2.0}, (6,))
    with pytest.raises(ShapeError, match="9 output channels"):
        rescale(model, {"0": [1.0, 2.0]}, (6,))
    with pytest.raises(InvalidParameterError):
        random_rescale(model, factors=(0.0, 1.0), input_shape=(6,))


def test_pruned_model_keeps_its_mask():
    model = build("vgg_like")
    prune.l1_unstructured(model[4], "weight", amount=0.5)
    before = snapshot(model)
    out = random_rescale(model, seed=1, input_shape=(3, 8, 8))
    assert torch.equal(out[4].weight_mask, model[4].weight_mask)
    x = inputs("vgg_like")
    assert torch.allclose(out(x), model(x), rtol=1e-10, atol=1e-12)
    assert_bit_identical(model, before)


def test_input_shape_is_the_models_declaration_or_refused():
    """No guess from the first layer: without a shape, the model's input_shape attribute,
    else a ShapeError saying how to give one."""
    model = build("vgg_like")
    with pytest.raises(ShapeError, match="does not declare its input shape"):
        random_rescale(model, seed=2)
    model.input_shape = (3, 8, 8)
    out = random_rescale(model, seed=2)
    x = inputs("vgg_like")
    assert torch.allclose(out(x), model(x), rtol=1e-10, atol=1e-12)
    given = random_rescale(model, seed=2, input_shape=(3, 8, 8))
    assert torch.equal(out[0].weight, given[0].weight)


# --------------------------------------------------------------------------- reference models
_FAST = {"mlp": (1, 8, 8), "small_cnn": (1, 8, 8), "unet": (1, 32, 32)}
_SLOW = {"resnet18": (3, 32, 32), "mobilenet_relu": (3, 32, 32), "resnet34": (3, 32, 32),
         "resnet50": (3, 32, 32), "resnet101": (3, 32, 32),
         "resnet152": (3, 32, 32), "vgg11": (3, 32, 32), "vgg11_bn": (3, 32, 32),
         "vgg16": (3, 32, 32), "vgg16_bn": (3, 32, 32), "alexnet": (3, 64, 64)}
_REFERENCE = [pytest.param(n, s, id=n) for n, s in _FAST.items()] + [
    pytest.param(n, s, id=n, marks=pytest.mark.slow) for n, s in _SLOW.items()]


@pytest.mark.parametrize("name,shape", _REFERENCE)
def test_reference_architectures(name, shape):
    """rescale(random lambda), then normalize(q) of it: same outputs as the original (float64
    1e-10, float32 1e-5), same path-norms (1e-9 relative); the rescaling moves the raw
    parameter norm by orders of magnitude."""
    from pathlift.models import get_model
    from pathlift.symmetry import normalize

    torch.manual_seed(0)
    # float64: a float32 copy cannot hold lambda <> theta exactly, and the rounding of its
    # parameters alone moves the path-norms by ~1e-8 (the float32 case is tested on the zoo)
    dtype, tol = torch.float64, 1e-10
    model = randomise_batchnorm_(get_model(name, num_classes=10).to(dtype))
    before = snapshot(model)
    x = torch.rand((2, *shape), dtype=dtype, generator=torch.Generator().manual_seed(1))
    norms = path_norms(model, shape, qs=(1.0, 2.0))
    with torch.no_grad():
        y = model(x)
    rescaled = rescale(model, random_lambdas(model, shape), shape)
    ratio = param_norm(rescaled) / param_norm(model)
    assert ratio > 10 or ratio < 0.1, (name, ratio)
    for transformed in (rescaled, normalize(rescaled, shape, q=2.0)):
        with torch.no_grad():
            y2 = transformed(x)
        assert float((y - y2).abs().max()) <= tol * float(y.abs().max()), name
        after = path_norms(transformed, shape, qs=(1.0, 2.0))
        for q in norms:
            assert abs(norms[q].log10 - after[q].log10) * math.log(10) <= 1e-9, (name, q)
    assert_bit_identical(model, before)


# --------------------------------------------------------------------------- adversarial
@pytest.mark.parametrize("name", ["mlp", "vgg_like", "residual", "depthwise"])
def test_adversarial_rescale_hurts_magnitude_pruning(name):
    """Same function and path-norm; magnitude pruning of 30% then loses more of ||Phi||_1
    (exact path-metric, Lemma 3.4.1) than without rescaling and than a random rescaling."""
    from pathlift.lift import path_metric
    from pathlift.symmetry.adversarial import adversarial_rescale, magnitude_prune

    model = build(name)
    shape = ZOO[name][1]
    before = snapshot(model)
    adversarial = adversarial_rescale(model, 0.3, input_shape=shape)
    x = inputs(name)
    with torch.no_grad():
        assert torch.allclose(adversarial(x), model(x), rtol=1e-9, atol=1e-12)

    def damage(m: nn.Module) -> float:
        result = path_metric(m, magnitude_prune(m, 0.3, shape), shape)
        assert result.exact
        return result.lower

    plain, attacked = damage(model), damage(adversarial)
    randomised = damage(random_rescale(model, seed=0, input_shape=shape))
    assert attacked > 2 * plain and attacked > randomised
    assert attacked <= path_norm(model, shape).value * (1 + 1e-9)
    assert_bit_identical(model, before)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_random_networks_of_every_layer(seed):
    """Every supported op (ConvTranspose, cat, upsampling, permute, pools, +, ...): random
    non-power-of-two factors keep the function, the path-norm and the caller's model."""
    from random_nets import random_network

    model, shape = random_network(seed)
    model = model.double()
    before = snapshot(model)
    out = random_rescale(model, factors=(0.37, 3.1, 250.0), seed=seed, input_shape=shape)
    assert_same_outputs(model, out, shape)
    a, b = path_norm(model, shape).log10, path_norm(out, shape).log10
    assert a == b or abs(a - b) * math.log(10) <= 1e-9
    assert_bit_identical(model, before)


def test_compare_random_rescale_is_the_command_in_one_call(tmp_path):
    """random_rescale, compare_models and save_like by hand give the same copy, numbers and
    file (same tensors and metadata) as compare_random_rescale; the model is untouched."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from pathlift.jobs.transform import compare_random_rescale
    from pathlift.models import mlp, save_like
    from pathlift.symmetry import compare_models

    net, shape = mlp(), (1, 8, 8)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = compare_random_rescale(net, shape, (1.0, 8.0), 3, samples=5,
                                    out=tmp_path / "a.safetensors", spec="mlp")
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    copy = random_rescale(net, (1.0, 8.0), 3, shape)
    assert all(torch.equal(a, b) for a, b in zip(result.model.state_dict().values(),
                                                 copy.state_dict().values(), strict=True))
    assert result.comparison == compare_models(net, copy, shape, 5)
    by_hand = save_like(copy, "mlp", tmp_path / "b.safetensors", shape)
    assert result.path == tmp_path / "a.safetensors" and result.normalized is None
    a, b = load_file(result.path), load_file(by_hand)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert safe_open(result.path, "pt").metadata() == safe_open(by_hand, "pt").metadata()
    assert compare_random_rescale(net, shape, samples=5).path is None
    assert "\n" not in repr(result) and repr(result).startswith("Transformed(rescaled")


@pytest.mark.parametrize("name", list(ZOO))
def test_group_members_and_batchnorm_only_groups_are_their_definitions(name: str) -> None:
    """``ChannelMap.members`` (one sort per producer) and ``diagonal_only`` against their
    definitions read channel by channel: each free group's producers with the channels
    holding it, and the groups only BatchNorm-like layers hold."""
    from pathlift.symmetry.rescale import diagonal_only

    cmap = channel_map(trace(build(name), ZOO[name][1]))
    want: dict[int, list] = {}
    for p in cmap.producers:
        if p.passthrough:
            continue
        for c, g in enumerate(cmap.group[p.neurons].tolist()):
            if g:
                rows = want.setdefault(g, [])
                if not rows or rows[-1][0] is not p:
                    rows.append((p, []))
                rows[-1][1].append(c)
    got = cmap.members()
    assert got.keys() == want.keys()
    for g, rows in want.items():
        assert [(p, c.tolist()) for p, c in got[g]] == rows
    assert diagonal_only(cmap) == {g for g, rows in want.items()
                                   if all(p.diagonal for p, _ in rows)}
