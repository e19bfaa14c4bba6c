"""Reference architectures: torchvision's parameter counts and key names, shapes, tracing.

The key manifests below are derived from torchvision's source (torchvision/models/
resnet.py, vgg.py, alexnet.py, mobilenetv2.py): they follow its module nesting and its
Sequential indices, written independently of pathlift.models, and are themselves checked
against torchvision's published parameter counts.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from pathlift.data import load_digits, loaders
from pathlift.data.training import evaluate, train_classifier
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph import Kind, trace
from pathlift.models import (
    REFERENCE_MODELS,
    get_model,
    load_model,
    mlp,
    reference_models,
    small_cnn,
    unet,
)

PUBLISHED = {  # torchvision's documented parameter counts ("num_params") at 1000 classes
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
    "resnet101": 44_549_160, "resnet152": 60_192_808, "vgg11": 132_863_336,
    "vgg11_bn": 132_868_840, "vgg16": 138_357_544, "vgg16_bn": 138_365_992,
    "alexnet": 61_100_840, "mobilenet_relu": 3_504_872,  # = torchvision mobilenet_v2
}

# ----------------------------------------------------------------- torchvision manifests


def _conv(name, out_ch, in_ch, k, bias):
    keys = [(f"{name}.weight", (out_ch, in_ch, k, k))]
    return [*keys, (f"{name}.bias", (out_ch,))] if bias else keys


def _bn(name, ch):
    return [(f"{name}.weight", (ch,)), (f"{name}.bias", (ch,)), (f"{name}.running_mean", (ch,)),
            (f"{name}.running_var", (ch,)), (f"{name}.num_batches_tracked", ())]


def _linear(name, out_f, in_f):
    return [(f"{name}.weight", (out_f, in_f)), (f"{name}.bias", (out_f,))]


def tv_resnet(bottleneck, layers):
    keys = _conv("conv1", 64, 3, 7, False) + _bn("bn1", 64)
    expansion = 4 if bottleneck else 1
    inplanes = 64
    for li, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
        stride = 1 if li == 0 else 2
        for b in range(blocks):
            p = f"layer{li + 1}.{b}"
            if bottleneck:
                keys += _conv(f"{p}.conv1", planes, inplanes, 1, False) + _bn(f"{p}.bn1", planes)
                keys += _conv(f"{p}.conv2", planes, planes, 3, False) + _bn(f"{p}.bn2", planes)
                keys += _conv(f"{p}.conv3", planes * 4, planes, 1, False)
                keys += _bn(f"{p}.bn3", planes * 4)
            else:
                keys += _conv(f"{p}.conv1", planes, inplanes, 3, False) + _bn(f"{p}.bn1", planes)
                keys += _conv(f"{p}.conv2", planes, planes, 3, False) + _bn(f"{p}.bn2", planes)
            if b == 0 and (stride != 1 or inplanes != planes * expansion):
                keys += _conv(f"{p}.downsample.0", planes * expansion, inplanes, 1, False)
                keys += _bn(f"{p}.downsample.1", planes * expansion)
            inplanes = planes * expansion
    return keys + _linear("fc", 1000, 512 * expansion)


def tv_vgg(cfg, batch_norm):
    keys, i, in_ch = [], 0, 3
    for v in cfg:
        if v == "M":
            i += 1
            continue
        keys += _conv(f"features.{i}", v, in_ch, 3, True)
        if batch_norm:
            keys += _bn(f"features.{i + 1}", v)
        i += 3 if batch_norm else 2
        in_ch = v
    return (keys + _linear("classifier.0", 4096, 25088) + _linear("classifier.3", 4096, 4096)
            + _linear("classifier.6", 1000, 4096))


def tv_alexnet():
    return (_conv("features.0", 64, 3, 11, True) + _conv("features.3", 192, 64, 5, True)
            + _conv("features.6", 384, 192, 3, True) + _conv("features.8", 256, 384, 3, True)
            + _conv("features.10", 256, 256, 3, True) + _linear("classifier.1", 4096, 9216)
            + _linear("classifier.4", 4096, 4096) + _linear("classifier.6", 1000, 4096))


def tv_mobilenet_v2():
    def conv_bn(name, out_ch, in_ch, k, groups=1):
        return [(f"{name}.0.weight", (out_ch, in_ch // groups, k, k)), *_bn(f"{name}.1", out_ch)]

    keys = conv_bn("features.0", 32, 3, 3)
    idx, inp = 1, 32
    for t, c, n, _ in [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                       [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]:
        for _ in range(n):
            hidden, p, j = inp * t, f"features.{idx}.conv", 0
            if t != 1:
                keys += conv_bn(f"{p}.0", hidden, inp, 1)
                j = 1
            keys += conv_bn(f"{p}.{j}", hidden, hidden, 3, groups=hidden)
            keys += [(f"{p}.{j + 1}.weight", (c, hidden, 1, 1)), *_bn(f"{p}.{j + 2}", c)]
            idx, inp = idx + 1, c
    keys += conv_bn(f"features.{idx}", 1280, inp, 1)
    return keys + _linear("classifier.1", 1000, 1280)


_A = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
_D = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
MANIFESTS = {
    "resnet18": lambda: tv_resnet(False, (2, 2, 2, 2)),
    "resnet34": lambda: tv_resnet(False, (3, 4, 6, 3)),
    "resnet50": lambda: tv_resnet(True, (3, 4, 6, 3)),
    "resnet101": lambda: tv_resnet(True, (3, 4, 23, 3)),
    "resnet152": lambda: tv_resnet(True, (3, 8, 36, 3)),
    "vgg11": lambda: tv_vgg(_A, False), "vgg11_bn": lambda: tv_vgg(_A, True),
    "vgg16": lambda: tv_vgg(_D, False), "vgg16_bn": lambda: tv_vgg(_D, True),
    "alexnet": tv_alexnet, "mobilenet_relu": tv_mobilenet_v2,
}


def _meta(name, **kwargs):
    """The architecture without memory or initialisation (shapes and names only)."""
    with torch.device("meta"):
        return get_model(name, **kwargs)


def _skeleton(name):
    """Real, zero-filled tensors without running the (slow) random initialisation."""
    model = _meta(name).to_empty(device="cpu")
    with torch.no_grad():
        for t in model.state_dict().values():
            t.zero_()
    return model.eval()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_manifest_counts_match_published(name):
    manifest = MANIFESTS[name]()
    params = [shape for key, shape in manifest if not key.endswith(
        ("running_mean", "running_var", "num_batches_tracked"))]
    assert sum(math.prod(s) for s in params) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_and_state_dict_match_torchvision(name):
    model = _meta(name)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]
    ours = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    assert ours == MANIFESTS[name]()


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_relu"])
def test_torchvision_style_state_dict_loads_strictly(name, tmp_path):
    gen = torch.Generator().manual_seed(0)
    state = {k: (torch.randint(0, 9, s, generator=gen) if k.endswith("num_batches_tracked")
                 else torch.randn(s, generator=gen)) for k, s in MANIFESTS[name]()}
    path = tmp_path / f"{name}.pth"
    torch.save(state, path)
    model, shape = load_model(name, weights=path)
    assert shape == (3, 224, 224) and not model.training
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in state.items())


_HEAVY = ("vgg16", "vgg16_bn")  # 138M parameters each; same layer kinds as vgg11(_bn)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _HEAVY
                                  else n for n in sorted(REFERENCE_MODELS)])
def test_every_reference_model_traces(name):
    spec = REFERENCE_MODELS[name]
    # The traced graph does not depend on the spatial size (adaptive pooling), so the
    # ImageNet models are traced at 32x32 here; their default shape in the slow test.
    shape = (3, 32, 32) if spec.input_shape == (3, 224, 224) else spec.input_shape
    if name == "alexnet":
        shape = (3, 64, 64)  # its stride-4 stem and three 3x3/2 pools need at least 63
    model = _skeleton(name)
    graph = trace(model, shape)
    n_affine = sum(isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear, nn.BatchNorm2d))
                   for m in model.modules())
    n_relu = sum(isinstance(m, nn.ReLU) for m in model.modules())
    assert len(graph.layers(Kind.AFFINE)) == n_affine
    assert sum(graph.handler(n).kind is Kind.RELU for n in graph.nodes()) >= n_relu
    (output,) = (n for n in graph.graph.nodes if n.op == "output")
    out_shape = (2, 2, *shape[1:]) if name == "unet" else (2, 10 if spec.input_shape[1:] ==
                                                               (8, 8) else 1000)
    assert tuple(output.meta["tensor_meta"].shape) == out_shape


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS))
def test_every_reference_model_traces_at_its_default_shape(name):
    trace(_skeleton(name), REFERENCE_MODELS[name].input_shape)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_relu"])
def test_imagenet_forward_shape_at_224(name):
    model = get_model(name, num_classes=17).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 17) and torch.isfinite(out).all()


def test_torchvision_initialisation():
    model = get_model("resnet18")
    conv = model.layer1[0].conv1  # kaiming normal, fan_out mode: std sqrt(2 / (64 * 9))
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.05)
    assert torch.equal(model.bn1.weight, torch.ones(64))
    head = get_model("mobilenet_relu").classifier[1]
    assert head.weight.std().item() == pytest.approx(0.01, rel=0.05)
    assert torch.count_nonzero(head.bias) == 0


def test_mobilenet_relu_has_no_relu6_and_residual_adds():
    model = _skeleton("mobilenet_relu")
    assert not any(isinstance(m, nn.ReLU6) for m in model.modules())
    graph = trace(model, (3, 32, 32))
    adds = [n for n in graph.nodes() if graph.handler(n).kind is Kind.ADD]
    assert len(adds) == 10  # blocks with stride 1 and equal widths in MobileNetV2's table
    depthwise = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert len(depthwise) == 17 and all(m.groups == m.in_channels for m in depthwise)


def test_mobilenet_width_multiplier():
    narrow = _meta("mobilenet_relu", width_mult=0.5)
    assert narrow.features[0][0].out_channels == 16
    assert narrow.classifier[1].in_features == 1280  # last channel never shrinks


def test_unet_shapes_and_structure():
    model = unet(in_channels=3, num_classes=4, base=4, depth=2).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 16, 12)).shape == (2, 4, 16, 12)
    graph = trace(model, (3, 16, 12))
    kinds = [graph.handler(n).kind for n in graph.nodes()]
    assert kinds.count(Kind.CAT) == 2 and kinds.count(Kind.MAXPOOL) == 2
    assert sum(isinstance(m, nn.ConvTranspose2d) for m in model.modules()) == 2
    with pytest.raises(InvalidParameterError):
        unet(depth=0)


def test_unet_parameter_count_by_formula():
    def double_conv(a, b):  # two bias-free 3x3 convs, each followed by BatchNorm (2 per channel)
        return 9 * a * b + 2 * b + 9 * b * b + 2 * b

    base, depth, c_in, classes = 8, 3, 1, 2
    expected = double_conv(c_in, base) + classes * (base + 1)
    for level in range(depth):
        a, b = base * 2**level, base * 2 ** (level + 1)
        expected += double_conv(a, b) + (4 * b * a + a) + double_conv(2 * a, a)
    assert sum(p.numel() for p in unet(c_in, classes, base, depth).parameters()) == expected


def test_unet_refuses_sides_not_divisible_by_two_to_the_depth():
    with pytest.raises(ShapeError, match="cat"):
        trace(unet(depth=3).eval(), (1, 20, 20))


def test_get_model_unknown_name_lists_choices():
    with pytest.raises(InvalidParameterError, match="resnet18") as err:
        get_model("resnet19")
    assert "unknown model 'resnet19'" in str(err.value)
    with pytest.raises(InvalidParameterError, match="bad arguments"):
        get_model("mlp", hiden=(3,))


def test_default_input_shapes_follow_kwargs():
    assert REFERENCE_MODELS["resnet18"].input_shape == (3, 224, 224)
    assert REFERENCE_MODELS["small_cnn"].default_input_shape(in_channels=3) == (3, 8, 8)
    assert REFERENCE_MODELS["mlp"].default_input_shape() == (1, 8, 8)
    assert REFERENCE_MODELS["mlp"].default_input_shape(in_features=20) == (20,)


def test_torchvision_names_when_installed():
    tv = pytest.importorskip("torchvision.models")
    ours, theirs = get_model("resnet18"), tv.resnet18()
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in theirs.state_dict().items()]
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert type(get_model("resnext50_32x4d")).__module__.startswith("torchvision")


# ----------------------------------------------------------------------- small models


def test_mlp_layers_and_shapes():
    model = mlp(64, (32, 16), 10)
    assert [tuple(p.shape) for p in model.parameters()] == [
        (32, 64), (32,), (16, 32), (16,), (10, 16), (10,)]
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 10)
    assert model(torch.zeros(5, 64)).shape == (5, 10)
    assert len(trace(model.eval(), (1, 8, 8)).layers()) == 3
    with pytest.raises(InvalidParameterError):
        mlp(64, (0,), 10)


def test_small_cnn_shapes_and_trace():
    model = small_cnn(in_channels=2, num_classes=7).eval()
    assert model(torch.zeros(3, 2, 8, 8)).shape == (3, 7)
    graph = trace(model, (2, 8, 8))
    assert len(graph.layers()) == 4 and len(graph.layers(Kind.MAXPOOL)) == 2


def test_small_cnn_learns_digits():
    torch.manual_seed(0)
    digits = load_digits()
    train, test = loaders(digits, 64, seed=0)
    model = small_cnn()
    start = time.process_time()  # CPU time: wall time depends on the machine's load
    train_classifier(model, train, epochs=12, lr=0.05, progress=False, seed=0)
    assert time.process_time() - start < 30
    assert evaluate(model, test) >= 0.95


# ------------------------------------------------------------------------------ CLI


def test_cli_models_lists_every_architecture_with_its_size():
    from typer.testing import CliRunner

    from pathlift.cli import app

    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines()
            if line.count("│") >= 3}
    assert set(REFERENCE_MODELS) <= set(rows)
    for name, count in PUBLISHED.items():
        assert f"{count:,}" in rows[name]
    assert "3 224 224" in rows["resnet18"] and "1 8 8" in rows["small_cnn"]


def test_cli_norm_reads_a_checkpoint(tmp_path):
    from typer.testing import CliRunner

    from pathlift.cli import app
    from pathlift.lift import path_norm
    from pathlift.models import save_checkpoint

    torch.manual_seed(3)
    model = small_cnn()
    path = save_checkpoint(model, tmp_path / "net.safetensors", "small_cnn")
    expected = path_norm(model, (1, 8, 8), q=1).log10
    for args in (["norm", str(path), "-q", "1"],
                 ["norm", "small_cnn", "--weights", str(path), "-q", "1"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if line.startswith("│ 1 "))
        assert float(row.split("│")[3]) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS))
def test_the_listing_counts_what_the_constructor_builds(name):
    """``pathlift models`` lists the registry's counts without building anything."""
    with torch.device("meta"):
        model = REFERENCE_MODELS[name].constructor()
    assert sum(p.numel() for p in model.parameters()) == REFERENCE_MODELS[name].parameters
    [row] = [m for m in reference_models() if m.name == name]
    assert (row.parameters, row.input_shape) == (REFERENCE_MODELS[name].parameters,
                                                 REFERENCE_MODELS[name].input_shape)
