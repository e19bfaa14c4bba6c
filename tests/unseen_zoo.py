"""Networks none of pathlift's other tests wrote, each in the style of the code it comes
from (torchvision's segmentation heads, U-Nets, ShuffleNet's channel shuffle, TCNs, video
nets, ``OrderedDict`` Sequentials, parametrized and pruned layers, scripted submodules,
hooks): the models the last "Must show" line of issue 38 is judged on.

Each builder returns a fresh float32 module in train mode, as its author would; the tests
randomise it (``activation_checks.randomised``) and put it in eval mode.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations, prune

IMAGE = (2, 6, 6)


class DilatedFCN(nn.Module):
    """torchvision's FCN layout: a backbone whose last stage trades stride for dilation
    (``replace_stride_with_dilation``), an ``FCNHead`` (conv-BN-ReLU-Dropout-conv), the
    logits upsampled bilinearly to the input size and returned as ``{"out": ...}``."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(OrderedDict([
            ("conv1", nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False)),
            ("bn1", nn.BatchNorm2d(3)), ("relu", nn.ReLU(inplace=True)),
            ("layer4", nn.Conv2d(3, 3, 3, padding=2, dilation=2, bias=False)),
            ("bn4", nn.BatchNorm2d(3)), ("relu4", nn.ReLU(inplace=True))]))
        self.classifier = nn.Sequential(nn.Conv2d(3, 2, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(2), nn.ReLU(), nn.Dropout(0.1),
                                        nn.Conv2d(2, 2, 1))

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        size = x.shape[-2:]
        h = self.classifier(self.backbone(x))
        return {"out": F.interpolate(h, size=size, mode="bilinear", align_corners=False)}


class ASPPPooling(nn.Sequential):
    """DeepLabV3's image-pooling branch, written as torchvision writes it."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class DeepLabHead(nn.Module):
    """ASPP: a 1x1 branch, a dilated branch, the pooling branch, concatenated, projected."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(2, 3, 3, padding=1)
        self.convs = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3, 2, 1, bias=False), nn.BatchNorm2d(2), nn.ReLU()),
            nn.Sequential(nn.Conv2d(3, 2, 3, padding=2, dilation=2, bias=False),
                          nn.BatchNorm2d(2), nn.ReLU()),
            ASPPPooling(3, 2)])
        self.project = nn.Sequential(nn.Conv2d(6, 2, 1, bias=False), nn.BatchNorm2d(2),
                                     nn.ReLU(), nn.Dropout(0.5))

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.stem(x))
        return self.project(torch.cat([conv(x) for conv in self.convs], dim=1))


class UNet(nn.Module):
    """A two-level U-Net: max-pool down, ``ConvTranspose2d`` up, skip concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.inc = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(inplace=True))
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(3, 3, 3, padding=1),
                                  nn.ReLU(inplace=True))
        self.up = nn.ConvTranspose2d(3, 3, kernel_size=2, stride=2)
        self.conv = nn.Sequential(nn.Conv2d(6, 3, 3, padding=1), nn.ReLU(inplace=True))
        self.outc = nn.Conv2d(3, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.inc(x)
        x2 = self.down(x1)
        x = self.up(x2)
        diff_y, diff_x = x1.size()[2] - x.size()[2], x1.size()[3] - x.size()[3]
        x = F.pad(x, [diff_x // 2, diff_x - diff_x // 2, diff_y // 2, diff_y - diff_y // 2])
        return self.outc(self.conv(torch.cat([x1, x], dim=1)))


def ordered_autoencoder() -> nn.Module:
    """An ``OrderedDict`` Sequential with ``nn.Flatten`` and ``nn.Unflatten``."""
    return nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()), ("enc", nn.Linear(18, 5)), ("act", nn.ReLU()),
        ("dec", nn.Linear(5, 18)), ("unflatten", nn.Unflatten(1, (2, 3, 3))),
        ("conv", nn.Conv2d(2, 2, 3, padding=1))]))


class ViewHead(nn.Module):
    """The classic LeNet-style ``x.view(x.size(0), -1)`` and ``torch.flatten`` heads."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(12, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(F.relu(self.conv(x)))
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        return self.fc2(torch.flatten(x, 1))


class TokenMLP(nn.Module):
    """``nn.Flatten(start_dim=2)`` then ``permute`` before a Linear (patch tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(2, 3, 2, stride=2)
        self.flat = nn.Flatten(start_dim=2)
        self.token = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.flat(self.patch(x)).permute(0, 2, 1)  # (B, tokens, channels)
        h = F.relu(self.token(h))
        return self.head(h.mean(dim=1))


class Upsampler(nn.Module):
    """``F.interpolate(scale_factor=2)`` (nearest), ``nn.Upsample`` and
    ``F.adaptive_avg_pool2d(x, (2, 2))``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, stride=2, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv2 = nn.Conv2d(2, 2, 3, padding=1)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.conv(x))
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = F.relu(self.conv2(self.up(h)))
        return self.fc(F.adaptive_avg_pool2d(h, (2, 2)).flatten(1))


class SeparableBlock(nn.Module):
    """MobileNet-v1's depthwise-separable convolution (``groups=in_channels``) and a
    strided 1x1 shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(2, 2, 3, stride=2, padding=1, groups=2, bias=False)
        self.bn1 = nn.BatchNorm2d(2)
        self.pw = nn.Conv2d(2, 4, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)
        self.shortcut = nn.Sequential(nn.Conv2d(2, 4, 1, stride=2, bias=False),
                                      nn.BatchNorm2d(4))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.dw(x)))
        out = self.bn2(self.pw(out))
        return F.relu(out + self.shortcut(x)).mean((2, 3))


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """ShuffleNet's shuffle, as torchvision writes it."""
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batch, -1, height, width)


class ShuffleUnit(nn.Module):
    """Grouped 1x1 convolution, channel shuffle, grouped 3x3, ``reshape`` head."""

    def __init__(self) -> None:
        super().__init__()
        self.g1 = nn.Conv2d(2, 4, 1, groups=2)
        self.g2 = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = channel_shuffle(F.relu(self.g1(x)), 2)
        h = F.relu(self.g2(h))
        return self.fc(F.adaptive_avg_pool2d(h, 1).reshape(h.shape[0], -1))


class LeakyNet(nn.Module):
    """DCGAN's discriminator activations: ``nn.LeakyReLU(0.2)`` and ``F.leaky_relu``."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 3, 4, stride=2, padding=1)
        self.act = nn.LeakyReLU(0.2, inplace=True)
        self.c2 = nn.Conv2d(3, 2, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = F.leaky_relu(self.c2(self.act(self.c1(x))), 0.1)
        return self.fc(h.flatten(1))


def mlp_with(act: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), act, nn.Linear(3, 2))


class PReLUCNN(nn.Module):
    """A per-channel ``nn.PReLU`` (learnt slopes) after a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.act = nn.PReLU(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.act(self.conv(x)), 1).flatten(1))


def padded_convs(mode: str) -> nn.Module:
    """Convolutions with ``padding_mode`` ``mode`` (reflect, circular, replicate)."""
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode), nn.ReLU(),
                         nn.Conv2d(3, 2, 3, padding=1, padding_mode=mode),
                         nn.AdaptiveMaxPool2d(1), nn.Flatten())


class SharedTuple(nn.Module):
    """One layer called on two inputs (a Siamese trunk) and ``nn.ModuleDict`` heads chosen
    by key; returns a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(3, 4)
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 2), "reg": nn.Linear(4, 1)})

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        ha, hb = F.relu(self.trunk(x[:, :3])), F.relu(self.trunk(x[:, 3:]))
        return self.heads["cls"](ha + hb), self.heads["reg"](hb)


class IdentityDropout(nn.Module):
    """``nn.Identity`` placeholders and ``nn.Dropout2d``, identity in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.norm = nn.Identity()
        self.drop = nn.Dropout2d(0.3)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Identity(),
                                  nn.Linear(3, 2))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.drop(F.relu(self.norm(self.conv(x)))))


def odd_pools() -> nn.Module:
    """``AvgPool2d(ceil_mode=True, count_include_pad=False)`` and ``MaxPool2d(dilation=2)``."""
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(),
                         nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True,
                                      count_include_pad=False),
                         nn.Conv2d(3, 3, 1), nn.ReLU(),
                         nn.MaxPool2d(2, stride=1, dilation=2), nn.Flatten(),
                         nn.Linear(12, 2))


VIDEO = (2, 4, 6, 6)


class C3D(nn.Module):
    """A C3D-style video net: ``nn.Conv3d``, ``nn.MaxPool3d`` (spatial only first), head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(2, 3, 3, padding=1)
        self.pool1 = nn.MaxPool3d((1, 2, 2), (1, 2, 2))
        self.conv2 = nn.Conv3d(3, 3, 3, padding=1)
        self.pool2 = nn.MaxPool3d(2, 2)
        self.fc = nn.Linear(3 * 2 * 1 * 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.pool1(F.relu(self.conv1(x)))
        h = self.pool2(F.relu(self.conv2(h)))
        return self.fc(h.view(-1, 3 * 2 * 1 * 1))


SEQUENCE = (2, 7)


class CausalTCN(nn.Module):
    """A 1-D TCN block (Bai et al.): causal padding by ``F.pad(x, (k - 1, 0))`` with a
    dilation, a 1x1 residual, the last step read by ``x[:, :, -1]``."""

    def __init__(self, k: int = 3) -> None:
        super().__init__()
        self.k = k
        self.c1 = nn.Conv1d(2, 3, k)
        self.c2 = nn.Conv1d(3, 3, k, dilation=2)
        self.res = nn.Conv1d(2, 3, 1)
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.c1(F.pad(x, (self.k - 1, 0))))
        h = F.relu(self.c2(F.pad(h, (2 * (self.k - 1), 0))))
        return self.fc(F.relu(h + self.res(x))[:, :, -1])


def bilinear_layer() -> nn.Module:
    """``nn.Bilinear`` multiplies two activations: outside Def. 2.2.2."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)
            self.bil = nn.Bilinear(3, 3, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.bil(F.relu(self.a(x)), F.relu(self.b(x)))

    return Net()


def embedding_bag() -> nn.Module:
    """``nn.Embedding`` indexes a table by the input's values: outside Def. 2.2.2."""
    return nn.Sequential(nn.Embedding(10, 3), nn.Flatten(), nn.Linear(12, 2))


def weight_normed() -> nn.Module:
    """``parametrizations.weight_norm`` (the new API) on a Linear and a Conv."""
    conv = parametrizations.weight_norm(nn.Conv2d(2, 3, 3))
    fc = parametrizations.weight_norm(nn.Linear(3 * 4 * 4, 2))
    return nn.Sequential(conv, nn.ReLU(), nn.Flatten(), fc)


def spectral_normed() -> nn.Module:
    """``parametrizations.spectral_norm``: W / sigma(W), sigma by power iteration."""
    return nn.Sequential(parametrizations.spectral_norm(nn.Linear(4, 3)), nn.ReLU(),
                         nn.Linear(3, 2))


def pruned_convnet() -> nn.Module:
    """``nn.utils.prune`` masks on a conv (structured ln) and a Linear (l1)."""
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 2))
    prune.ln_structured(net[0], "weight", amount=0.5, n=2, dim=0)
    prune.l1_unstructured(net[3], "weight", amount=0.3)
    return net


class ScriptedBlock(nn.Module):
    """A ``torch.jit.script``-ed submodule inside an eager model."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 3)
        self.block = torch.jit.script(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
        self.out = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.block(F.relu(self.inp(x))))


def pre_hooked() -> nn.Module:
    """A forward pre-hook that scales the second layer's input by 2 (changes the result)."""
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    net[2].register_forward_pre_hook(lambda module, args: (args[0] * 2.0,))
    return net


def hardtanh_net() -> nn.Module:
    """``F.hardtanh`` in its default [-1, 1]: piecewise-linear, not homogeneous."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.b(F.hardtanh(self.a(x)))

    return Net()


def noop_pre_hooked() -> nn.Module:
    """A forward pre-hook that only looks (returns None): the result is unchanged."""
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    net[2].register_forward_pre_hook(lambda module, args: None)
    return net


def forward_hooked() -> nn.Module:
    """A forward hook that scales the first layer's output by 3 (changes the result)."""
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    net[0].register_forward_hook(lambda module, args, out: out * 3.0)
    return net


def padded_by_module(pad: nn.Module) -> nn.Module:
    """A padding module (``nn.ReflectionPad2d``, ...) before unpadded convolutions."""
    return nn.Sequential(pad, nn.Conv2d(2, 3, 3), nn.ReLU(), copy.deepcopy(pad),
                         nn.Conv2d(3, 2, 3), nn.AdaptiveMaxPool2d(1), nn.Flatten())


def padded_twin(net: nn.Module, mode: str) -> nn.Module:
    """``padded_convs(mode)``'s function written as ``F.pad(mode=...)`` + unpadded convs
    (what torch's own ``Conv2d._conv_forward`` does for a non-zero ``padding_mode``)."""
    pads = {"reflect": nn.ReflectionPad2d, "circular": nn.CircularPad2d,
            "replicate": nn.ReplicationPad2d}[mode]
    twin = padded_by_module(pads(1)).double().eval()
    twin[1].load_state_dict(net[0].state_dict())
    twin[4].load_state_dict(net[2].state_dict())
    return twin


class CircularFPad(nn.Module):
    """Circular padding by ``F.pad(mode="circular")`` (a torus-shaped image), as
    written without ``padding_mode``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.fc = nn.Linear(3 * 6 * 6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.relu(self.conv(F.pad(x, (1, 1, 1, 1), mode="circular"))).flatten(1))


class Spelled(nn.Module):
    """Two Linear layers and a head around one way of writing a ReLU-network op
    (``SPELLINGS``); ``twin_of`` writes the same function with ops pathlift reads."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.spelling = spelling
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(SPELLINGS[self.spelling](self, self.a(x)))


SPELLINGS = {
    "relu": lambda net, h: F.relu(net.b(F.relu(h))),
    "clamp_and_methods": lambda net, h: net.b(torch.clamp(h, min=0).relu()).clip(0, None),
    "clamp_min": lambda net, h: net.b(h.clamp_min(0)).clamp_min(0),
    "maximum": lambda net, h: torch.maximum(net.b(torch.maximum(h, torch.zeros_like(h))),
                                            torch.zeros(4, dtype=h.dtype)),
    "abs": lambda net, h: net.b(h).abs(),
    "abs_twin": lambda net, h: F.relu(net.b(h)) + F.relu(-net.b(h)),
    "stack_sum": lambda net, h: torch.stack([F.relu(h), net.b(F.relu(h))]).sum(0),
    "stack_twin": lambda net, h: F.relu(h) + net.b(F.relu(h)),
}

#: what each spelling's twin is written with
TWINS = {"clamp_min": "relu", "maximum": "relu", "abs": "abs_twin", "stack_sum": "stack_twin"}


def AcceptedSpellings() -> nn.Module:  # noqa: N802  (a builder named as the model)
    """``torch.clamp(min=0)``, ``.relu()``, ``.clip(0, None)``: read as ReLU today."""
    return Spelled("clamp_and_methods")


def where_leaky() -> nn.Module:
    """A LeakyReLU written as ``torch.where(h > 0, h, 0.1 * h)``: a select on values
    (refused at an earlier stop; ``pathlift.graph.ops.selection`` reads it)."""
    net = Spelled("relu")
    net.spelling = "where"
    return net


SPELLINGS["where"] = lambda net, h: torch.where(h > 0, h, 0.1 * h)
SPELLINGS["leaky_twin"] = lambda net, h: F.leaky_relu(h, 0.1)
TWINS["where"] = "leaky_twin"


class EagerBlock(ScriptedBlock):
    """``ScriptedBlock`` with its block left eager (its twin)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 3), nn.ReLU())


WRONGLY_REFUSED = {
    "clamp_min_zero": lambda: Spelled("clamp_min"),
    "maximum_with_zeros": lambda: Spelled("maximum"),
    "abs": lambda: Spelled("abs"),
    "torch_stack_sum": lambda: Spelled("stack_sum"),
    "jit_script_submodule": ScriptedBlock,
    "scalar_times_tensor": lambda: ScalarFirst(),
    "where_leaky": where_leaky,
}


def twin_of(net: nn.Module) -> nn.Module:
    """The same function as ``net`` (a ``WRONGLY_REFUSED`` model) written with ops
    pathlift reads, holding the same parameters, float64, eval."""
    if isinstance(net, ScriptedBlock):
        twin = EagerBlock()
    elif isinstance(net, ScalarFirst):
        twin = ScalarFirst(first=False)
    else:
        twin = Spelled(TWINS[net.spelling])
    twin = twin.double().eval()
    twin.load_state_dict(net.state_dict())
    return twin


class ScalarFirst(nn.Module):
    """A constant written before the tensor: ``2.0 * h`` (``mul(2.0, h)`` in the graph);
    ``twin_of`` writes it ``h * 2.0``."""

    def __init__(self, first: bool = True) -> None:
        super().__init__()
        self.first = first
        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.a(x))
        return self.b(2.0 * h if self.first else h * 2.0)


class Reciprocal(ScalarFirst):
    """``2.0 / h``: a reciprocal, not piecewise linear."""

    def forward(self, x: Tensor) -> Tensor:
        return self.b(2.0 / F.relu(self.a(x)))


class LayerScale(nn.Module):
    """A learnt per-channel scale ``gamma`` stored as (1, C, 1, 1) (ConvNeXt-style layer
    scale), on the root module itself or on a submodule (``inner=True``)."""

    def __init__(self, inner: bool = False, shape: tuple[int, ...] = (1, 4, 1, 1)) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        holder = nn.Module() if inner else self
        holder.gamma = nn.Parameter(torch.rand(shape))
        if inner:
            self.scale = holder
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        gamma = self.scale.gamma if hasattr(self, "scale") else self.gamma
        return self.fc((F.relu(self.conv(x)) * gamma).mean((2, 3)))


#: fixed linear maps of weight 1 (inside Def. 2.2.2 as identity neurons) refused today
FIXED_MAPS = {
    "flip": lambda h: h.flip(-1),
    "roll": lambda h: torch.roll(h, 1, dims=3),
    "repeat": lambda h: h.repeat(1, 2, 1, 1),
    "expand": lambda h: h.mean((2, 3), keepdim=True).expand(-1, -1, 3, 3),
    "unfold": lambda h: F.unfold(h, 2),
    "cumsum": lambda h: torch.cumsum(h, dim=3),
    "amin": lambda h: -torch.amin(-h, dim=(2, 3)),
    "amax": lambda h: torch.amax(h, dim=(2, 3)),  # amin's twin, read today
}


class FixedMap(nn.Module):
    """A conv, ReLU, one of ``FIXED_MAPS``, a Linear head."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.fc = nn.LazyLinear(2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(FIXED_MAPS[self.name](F.relu(self.conv(x))).flatten(1))


def fixed_map(name: str) -> FixedMap:
    """``FixedMap(name)`` with its lazy head sized by one call on zeros."""
    net = FixedMap(name)
    net(torch.zeros(1, *IMAGE))
    return net


class DepthwiseScale(nn.Module):
    """``LayerScale``'s function with the scale as a depthwise 1x1 convolution (its twin)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.gamma = nn.Conv2d(4, 4, 1, groups=4, bias=False)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.gamma(F.relu(self.conv(x))).mean((2, 3)))


def depthwise_twin(net: LayerScale) -> DepthwiseScale:
    twin = DepthwiseScale().double().eval()
    twin.conv.load_state_dict(net.conv.state_dict())
    twin.fc.load_state_dict(net.fc.state_dict())
    gamma = net.scale.gamma if hasattr(net, "scale") else net.gamma
    with torch.no_grad():
        twin.gamma.weight.copy_(gamma.reshape(4, 1, 1, 1))
    return twin


def same_padding_even_kernels() -> nn.Module:
    """``padding="same"`` with an even kernel and a dilation (asymmetric padding)."""
    return nn.Sequential(nn.Conv2d(2, 3, 4, padding="same"), nn.ReLU(),
                         nn.Conv2d(3, 2, 2, padding="same", dilation=2), nn.Flatten())


def transposed_convs() -> nn.Module:
    """``ConvTranspose2d`` with ``output_padding`` and groups, then one with a dilation."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, stride=2), nn.ReLU(),
                         nn.ConvTranspose2d(4, 4, 3, stride=2, output_padding=1, groups=2),
                         nn.ReLU(), nn.ConvTranspose2d(4, 2, 2, dilation=2, padding=1),
                         nn.Flatten())


def adaptive_overlapping(pool: type[nn.Module]) -> nn.Module:
    """An adaptive pool to (4, 5) from 6 x 6: windows of unequal size that overlap."""
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), pool((4, 5)), nn.Flatten())


def padded_max_pool() -> nn.Module:
    """ResNet's stem pool ``MaxPool2d(3, 2, padding=1)`` straight after a conv (no ReLU:
    negative values meet the padding)."""
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.MaxPool2d(3, 2, padding=1),
                         nn.Flatten())


def trilinear_upsampling() -> nn.Module:
    """``nn.Upsample(mode="trilinear")`` on a video-shaped tensor."""
    return nn.Sequential(nn.Conv3d(2, 2, 1), nn.ReLU(),
                         nn.Upsample(scale_factor=(1, 2, 2), mode="trilinear"), nn.Flatten())


def linear_upsampling_1d() -> nn.Module:
    """``nn.Upsample(mode="linear", align_corners=True)`` on a sequence."""
    return nn.Sequential(nn.Conv1d(2, 2, 1), nn.ReLU(),
                         nn.Upsample(scale_factor=2, mode="linear", align_corners=True),
                         nn.Flatten())


class TiedLayers(nn.Module):
    """Two distinct Linear layers holding one weight (``b.weight = a.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.out = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(F.relu(self.b(F.relu(self.a(x)))))


def batchnorm_without_affine() -> nn.Module:
    """``BatchNorm2d(affine=False)``: running statistics only."""
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, affine=False), nn.ReLU(),
                         nn.Flatten(), nn.Linear(48, 2))


class BatchNorm1dNet(nn.Module):
    """``BatchNorm1d`` on (B, C, L) and on (B, F), a max over the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3)
        self.fc, self.bn2 = nn.Linear(3, 2), nn.BatchNorm1d(2)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn2(self.fc(F.relu(self.bn(self.conv(x))).amax(2)))


class CatTwice(nn.Module):
    """``torch.cat([h, h])``: one activation read twice by the head."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.out = nn.Linear(4, 3), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.a(x))
        return self.out(torch.cat([h, h], -1))


def batchnorm_without_running_stats() -> nn.Module:
    """``track_running_stats=False``: eval still normalises by the batch's statistics."""
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, track_running_stats=False),
                         nn.ReLU(), nn.Flatten(), nn.Linear(48, 2))


def instance_norm_with_running_stats() -> nn.Module:
    """``InstanceNorm2d(track_running_stats=True)``: refused as a data-dependent norm."""
    return nn.Sequential(nn.Conv2d(2, 3, 3),
                         nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
                         nn.ReLU(), nn.Flatten(), nn.Linear(48, 2))


class MaskedLinear(nn.Linear):
    """A pruning paper's masked layer: ``F.linear(x, self.weight * self.mask, self.bias)``."""

    def __init__(self, *args: int) -> None:
        super().__init__(*args)
        self.register_buffer("mask", (torch.rand_like(self.weight) > 0.5).to(self.weight))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight * self.mask, self.bias)


class ScaledLinear(nn.Linear):
    """An equalised-learning-rate layer (StyleGAN): the weight times a constant in forward."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight * 3.0, self.bias)


class FlippedConv(nn.Conv2d):
    """A conv subclass convolving with its kernel flipped (``_conv_forward``)."""

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.weight.flip(-1), self.bias)


class ConvReLU(nn.Conv2d):
    """A fused conv + ReLU subclass calling ``super().forward``."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(super().forward(x))


class DoubledConv(nn.Conv2d):
    """A conv subclass doubling its output."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * 2


class BiasIgnored(nn.Linear):
    """A Linear subclass that ignores its own bias."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


def subclassed_layers() -> nn.Module:
    """Subclassed layers whose forward changes what the base class computes."""
    return nn.Sequential(ConvReLU(2, 3, 3), DoubledConv(3, 3, 1), nn.ReLU(), nn.Flatten(),
                         BiasIgnored(48, 2))


def computed_weights(layer: type[nn.Module]) -> nn.Module:
    """A layer computing its weight in forward (masked, scaled or flipped), then a head."""
    if issubclass(layer, nn.Conv2d):
        return nn.Sequential(layer(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 2))
    return nn.Sequential(layer(4, 3), nn.ReLU(), layer(3, 2))


class NoGradInside(nn.Module):
    """A forward with a ``torch.no_grad()`` block (a frozen feature extractor)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            h = self.a(x)
        return self.b(F.relu(h))


class NormalisedInput(nn.Module):
    """The input normalised in forward by buffers: ``(x - self.mean) / self.std``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.5, 0.2]).view(1, 2, 1, 1))
        self.register_buffer("std", torch.tensor([0.3, 0.4]).view(1, 2, 1, 1))
        self.conv = nn.Conv2d(2, 2, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv((x - self.mean) / self.std).flatten(1)


class NormalisedInputTwin(nn.Module):
    """``NormalisedInput``'s function with the normalisation as a depthwise 1x1 conv."""

    def __init__(self, net: NormalisedInput) -> None:
        super().__init__()
        self.norm = nn.Conv2d(2, 2, 1, groups=2, dtype=torch.float64)
        self.conv = copy.deepcopy(net.conv)
        with torch.no_grad():
            self.norm.weight.copy_((1 / net.std).reshape(2, 1, 1, 1))
            self.norm.bias.copy_((-net.mean / net.std).reshape(2))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(self.norm(x)).flatten(1)
