"""A zoo of public architectures, written from their papers, for the tests of issue 21.

Each architecture is written here from its paper (not copied from any library), with
torchvision's parameter names where torchvision has the model. Each has a full-size
constructor (the paper's widths and depths) and a scaled-down one (a few channels, tiny
inputs) small enough for the explicit neuron DAG of ``pathlift.testing.neurons``: about 20k
paths or fewer for most, at most ``SMALL_MAX_PATHS`` (a 3x3 conv on a 2x2 map already
multiplies the paths by 4, and every LeakyReLU/PReLU/ReLU6 lowered to two ReLU neurons by
2), which enumeration handles in about a second:

- ShuffleNetV2 (Ma et al. 2018): channel split ``x.chunk(2, dim=1)``, channel shuffle by
  view/transpose with shape arithmetic (``x.size()``, ``c // 2``);
- MobileNetV2 (Sandler et al. 2018) with ReLU6;
- DeepLabV3 (Chen et al. 2017): ASPP (dilated 3x3 convs and an image-pooling branch
  upsampled bilinearly), a final bilinear upsampling to the input size, an FCN auxiliary
  head (Long et al. 2015); returns a dict ``{"out", "aux"}`` as torchvision's does;
- a 3-D ResNet (Hara et al. 2018, R3D-18) built from ``nn.Conv3d`` subclasses that only
  change ``__init__``;
- a PatchGAN discriminator (Isola et al. 2017, pix2pix) with LeakyReLU(0.2);
- SRResNet (Ledig et al. 2017) with PReLU (one slope in the stem, one per channel in the
  blocks). Its sub-pixel convolution is a conv followed by a pixel shuffle. The pixel
  shuffle ``out[c, h*r + i, w*r + j] = in[c*r*r + i*r + j, h, w]`` moves entries and computes
  nothing: it is a pure relabelling of neurons (like view/permute), so it is inside the
  ReLU DAG model (Def. 2.2.2) and creates no neuron. The zoo spells it out as
  view/permute/reshape (``pixel_shuffle="view"``, the default); ``pixel_shuffle="module"``
  uses ``nn.PixelShuffle`` instead, which must give the same numbers or a typed refusal;
- a U-Net (Ronneberger et al. 2015) with bilinear upsampling and ``F.pad`` to match the
  skip's size (odd sizes);
- a two-head classifier returning a namedtuple (GoogLeNet-style auxiliary logits);
- a MobileNetV3-like network (Howard et al. 2019: hardswish, hardsigmoid gates and
  squeeze-excitation products), outside the theory: it must be refused.

``ZOO`` maps a name to a ``ZooEntry`` (full and small constructors with their input shapes).
"""

from __future__ import annotations

import math
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SMALL_MAX_PATHS = 100_000


def randomise_(model: nn.Module, seed: int) -> nn.Module:
    """Random weights with mixed signs, BatchNorm statistics and affine maps, PReLU slopes
    of both signs, in place; returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5, generator=g)
                    m.bias.uniform_(-0.5, 0.5, generator=g)
            elif isinstance(m, nn.PReLU):
                m.weight.uniform_(-0.5, 1.5, generator=g)
            elif isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
                bound = 1.5 / math.sqrt(m.weight[0].numel())
                m.weight.uniform_(-bound, bound, generator=g)
                if m.bias is not None:
                    m.bias.uniform_(-0.5, 0.5, generator=g)
    return model.eval()


# =========================================================================== ShuffleNetV2
def channel_shuffle(x: Tensor, groups: int = 2) -> Tensor:
    """Interleave ``groups`` channel groups (ShuffleNet Sec. 3): view, transpose, view."""
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width)
    return x.transpose(1, 2).contiguous().view(batch, -1, height, width)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit (Fig. 3 c, d): stride 1 splits the channels in two halves and
    transforms one; stride 2 transforms the input in two branches. Both concatenate and
    shuffle."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.stride = stride
        half = out_ch // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(in_ch, in_ch, 3, stride, 1, groups=in_ch, bias=False),
                nn.BatchNorm2d(in_ch),
                nn.Conv2d(in_ch, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(True))
        else:
            self.branch1 = nn.Sequential()
        side = in_ch if stride > 1 else half
        self.branch2 = nn.Sequential(
            nn.Conv2d(side, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(True),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(True))

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 (Table 5): conv1, max-pool, three stages of units, conv5, global mean, fc."""

    def __init__(self, stages_repeats: Sequence[int] = (4, 8, 4),
                 stages_out_channels: Sequence[int] = (24, 116, 232, 464, 1024),
                 num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        first = stages_out_channels[0]
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, first, 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(first), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_ch = first
        self.num_stages = len(stages_repeats)
        for i, (repeats, out_ch) in enumerate(
                zip(stages_repeats, stages_out_channels[1:-1], strict=True)):
            units = [ShuffleUnit(in_ch, out_ch, 2)]
            units += [ShuffleUnit(out_ch, out_ch, 1) for _ in range(repeats - 1)]
            setattr(self, f"stage{i + 2}", nn.Sequential(*units))
            in_ch = out_ch
        last = stages_out_channels[-1]
        self.conv5 = nn.Sequential(nn.Conv2d(in_ch, last, 1, bias=False),
                                   nn.BatchNorm2d(last), nn.ReLU(inplace=True))
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.conv1(x))
        for i in range(self.num_stages):
            x = getattr(self, f"stage{i + 2}")(x)
        x = self.conv5(x).mean([2, 3])
        return self.fc(x)


def shufflenet_v2() -> ShuffleNetV2:
    return ShuffleNetV2()


def shufflenet_v2_small() -> ShuffleNetV2:
    return ShuffleNetV2((2,), (2, 4, 2), num_classes=2, in_channels=1)


# =========================================================================== MobileNetV2
def _conv_bn_relu6(in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1,
                   groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """MobileNetV2 bottleneck (Table 1): 1x1 expansion + ReLU6, 3x3 depthwise + ReLU6,
    linear 1x1 projection; the input is added when the shapes allow."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = in_ch * expand_ratio
        self.use_res_connect = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(in_ch, hidden, 1))
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


# (t, c, n, s) of MobileNetV2 Table 2
MOBILENET_V2_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000,
                 inverted_residual_setting: Sequence[tuple[int, int, int, int]] =
                 MOBILENET_V2_SETTING,
                 first_channel: int = 32, last_channel: int = 1280, in_channels: int = 3):
        super().__init__()
        features: list[nn.Module] = [_conv_bn_relu6(in_channels, first_channel, stride=2)]
        in_ch = first_channel
        for t, c, n, s in inverted_residual_setting:
            for i in range(n):
                features.append(InvertedResidual(in_ch, c, s if i == 0 else 1, t))
                in_ch = c
        features.append(_conv_bn_relu6(in_ch, last_channel, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last_channel, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2() -> MobileNetV2:
    return MobileNetV2()


def mobilenet_v2_small() -> MobileNetV2:
    return MobileNetV2(1, ((1, 1, 1, 1), (2, 2, 1, 2)), first_channel=1, last_channel=1,
                       in_channels=1)


# =========================================================================== DeepLabV3
class BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016) with optional dilation (DeepLabV3 Sec. 3.2)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, dilation, dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, dilation, dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False),
                                            nn.BatchNorm2d(out_ch))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class DilatedResNet(nn.Module):
    """ResNet backbone whose last stages trade stride for dilation (output stride 8);
    returns the features of its last two stages (layer3 and layer4 at full size: the
    auxiliary head reads the first)."""

    def __init__(self, widths: Sequence[int] = (64, 128, 256, 512),
                 blocks: Sequence[int] = (2, 2, 2, 2), in_channels: int = 3,
                 stem_pool: bool = True,
                 settings: Sequence[tuple[int, int]] = ((1, 1), (2, 1), (1, 2), (1, 4))):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 7 if stem_pool else 3, 2,
                               3 if stem_pool else 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if stem_pool else nn.Identity()
        in_ch = widths[0]
        self.num_stages = len(widths)
        for i, (width, n) in enumerate(zip(widths, blocks, strict=True)):
            stride, dilation = settings[i]
            layer = [BasicBlock(in_ch, width, stride, dilation)]
            layer += [BasicBlock(width, width, 1, dilation) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
            in_ch = width

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages - 1):
            x = getattr(self, f"layer{i + 1}")(x)
        return x, getattr(self, f"layer{self.num_stages}")(x)


class ASPPConv(nn.Sequential):
    def __init__(self, in_ch: int, out_ch: int, dilation: int):
        super().__init__(nn.Conv2d(in_ch, out_ch, 3, padding=dilation, dilation=dilation,
                                   bias=False),
                         nn.BatchNorm2d(out_ch), nn.ReLU())


class ASPPPooling(nn.Sequential):
    """Image-level features (DeepLabV3 Sec. 3.3): global average, 1x1 conv, BN, ReLU,
    upsampled bilinearly back to the feature map's size."""

    def __init__(self, in_ch: int, out_ch: int):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(in_ch, out_ch, 1, bias=False),
                         nn.BatchNorm2d(out_ch), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        size = x.shape[-2:]
        for module in self:
            x = module(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: a 1x1 conv, three dilated 3x3 convs and image
    pooling, concatenated and projected by a 1x1 conv."""

    def __init__(self, in_ch: int, rates: Sequence[int], out_ch: int = 256):
        super().__init__()
        branches: list[nn.Module] = [nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, bias=False),
                                                   nn.BatchNorm2d(out_ch), nn.ReLU())]
        branches += [ASPPConv(in_ch, out_ch, rate) for rate in rates]
        branches.append(ASPPPooling(in_ch, out_ch))
        self.convs = nn.ModuleList(branches)
        self.project = nn.Sequential(
            nn.Conv2d(len(branches) * out_ch, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch),
            nn.ReLU(), nn.Dropout(0.5))

    def forward(self, x: Tensor) -> Tensor:
        return self.project(torch.cat([conv(x) for conv in self.convs], dim=1))


class DeepLabHead(nn.Sequential):
    def __init__(self, in_ch: int, num_classes: int, rates: Sequence[int], width: int):
        super().__init__(ASPP(in_ch, rates, width),
                         nn.Conv2d(width, width, 3, padding=1, bias=False),
                         nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, num_classes, 1))


class FCNHead(nn.Sequential):
    """FCN's head (Long et al. 2015): 3x3 conv, BN, ReLU, dropout, 1x1 classifier."""

    def __init__(self, in_ch: int, num_classes: int):
        inter = max(in_ch // 4, 1)
        super().__init__(nn.Conv2d(in_ch, inter, 3, padding=1, bias=False),
                         nn.BatchNorm2d(inter), nn.ReLU(), nn.Dropout(0.1),
                         nn.Conv2d(inter, num_classes, 1))


class DeepLabV3(nn.Module):
    """DeepLabV3: dilated backbone, ASPP head, FCN auxiliary head on layer3, both
    upsampled bilinearly to the input size; returns ``{"out": ..., "aux": ...}``."""

    def __init__(self, num_classes: int = 21, widths: Sequence[int] = (64, 128, 256, 512),
                 blocks: Sequence[int] = (2, 2, 2, 2), rates: Sequence[int] = (12, 24, 36),
                 aspp_width: int = 256, in_channels: int = 3, stem_pool: bool = True,
                 settings: Sequence[tuple[int, int]] = ((1, 1), (2, 1), (1, 2), (1, 4))):
        super().__init__()
        self.backbone = DilatedResNet(widths, blocks, in_channels, stem_pool, settings)
        self.classifier = DeepLabHead(widths[-1], num_classes, rates, aspp_width)
        self.aux_classifier = FCNHead(widths[-2], num_classes)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        size = x.shape[-2:]
        aux, features = self.backbone(x)
        result = OrderedDict()
        out = self.classifier(features)
        result["out"] = F.interpolate(out, size=size, mode="bilinear", align_corners=False)
        aux = self.aux_classifier(aux)
        result["aux"] = F.interpolate(aux, size=size, mode="bilinear", align_corners=False)
        return result


def deeplabv3() -> DeepLabV3:
    return DeepLabV3()


def deeplabv3_small() -> DeepLabV3:
    return DeepLabV3(num_classes=1, widths=(1, 1), blocks=(1, 1), rates=(1, 2, 3),
                     aspp_width=1, in_channels=1, stem_pool=False,
                     settings=((1, 1), (1, 2)))


# =========================================================================== 3-D ResNet
class Conv3DSimple(nn.Conv3d):
    """A full 3x3x3 convolution: a subclass of nn.Conv3d that only changes __init__."""

    def __init__(self, in_planes: int, out_planes: int, stride: int = 1, padding: int = 1):
        super().__init__(in_planes, out_planes, kernel_size=(3, 3, 3),
                         stride=stride, padding=padding, bias=False)


class Conv3DPointwise(nn.Conv3d):
    """The 1x1x1 projection of a downsampling shortcut, also a subclass of nn.Conv3d."""

    def __init__(self, in_planes: int, out_planes: int, stride: int = 1):
        super().__init__(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock3d(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Sequential(Conv3DSimple(in_planes, planes, stride),
                                   nn.BatchNorm3d(planes), nn.ReLU(inplace=True))
        self.conv2 = nn.Sequential(Conv3DSimple(planes, planes), nn.BatchNorm3d(planes))
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(Conv3DPointwise(in_planes, planes, stride),
                                            nn.BatchNorm3d(planes))

    def forward(self, x: Tensor) -> Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        return self.relu(self.conv2(self.conv1(x)) + residual)


class VideoResNet(nn.Module):
    """R3D (Hara et al. 2018; Tran et al. 2018): 3-D stem, four stages of 3-D basic blocks,
    global 3-D average pooling, fc."""

    def __init__(self, widths: Sequence[int] = (64, 128, 256, 512),
                 blocks: Sequence[int] = (2, 2, 2, 2), num_classes: int = 400,
                 in_channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv3d(in_channels, widths[0], (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
            nn.BatchNorm3d(widths[0]), nn.ReLU(inplace=True))
        in_ch = widths[0]
        for i, (width, n) in enumerate(zip(widths, blocks, strict=True)):
            layer = [BasicBlock3d(in_ch, width, 1 if i == 0 else 2)]
            layer += [BasicBlock3d(width, width) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
            in_ch = width
        self.avgpool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return self.fc(self.avgpool(x).flatten(1))


def r3d_18() -> VideoResNet:
    return VideoResNet()


def r3d_small() -> VideoResNet:
    return VideoResNet((1, 1, 1, 1), (1, 1, 1, 1), num_classes=2, in_channels=1)


# =========================================================================== PatchGAN
class PatchGAN(nn.Module):
    """pix2pix's 70x70 PatchGAN discriminator (Isola et al. 2017, Sec. 3.2.2 and App. 6.1.2):
    C64-C128-C256-C512 (4x4 convs, stride 2 but the last, BatchNorm but the first,
    LeakyReLU 0.2), then a 4x4 conv to one logit per patch."""

    def __init__(self, input_nc: int = 6, ndf: int = 64, n_layers: int = 3):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(input_nc, ndf, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        mult = 1
        for n in range(1, n_layers + 1):
            prev, mult = mult, min(2**n, 8)
            stride = 2 if n < n_layers else 1
            layers += [nn.Conv2d(ndf * prev, ndf * mult, 4, stride, 1, bias=False),
                       nn.BatchNorm2d(ndf * mult), nn.LeakyReLU(0.2, True)]
        layers.append(nn.Conv2d(ndf * mult, 1, 4, 1, 1))
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


def patchgan() -> PatchGAN:
    return PatchGAN()


def patchgan_small() -> PatchGAN:
    return PatchGAN(input_nc=2, ndf=1, n_layers=1)


# =========================================================================== SRResNet
def pixel_shuffle_view(x: Tensor, r: int) -> Tensor:
    """Pixel shuffle spelled out as the relabelling it is: view, permute, reshape."""
    b, c, h, w = x.shape
    x = x.view(b, c // (r * r), r, r, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c // (r * r), h * r, w * r)


class PixelShuffleView(nn.Module):
    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return pixel_shuffle_view(x, self.upscale_factor)


class ResidualBlock(nn.Module):
    """SRResNet block (Ledig et al. 2017, Fig. 4): conv-BN-PReLU-conv-BN and a skip."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.prelu = nn.PReLU(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.bn2(self.conv2(self.prelu(self.bn1(self.conv1(x)))))


class SRResNet(nn.Module):
    """SRResNet: 9x9 conv + PReLU, B residual blocks, conv-BN and a long skip, log2(scale)
    sub-pixel upsampling steps (conv to 4x channels, pixel shuffle, PReLU), 9x9 conv."""

    def __init__(self, channels: int = 64, num_blocks: int = 16, scale: int = 4,
                 in_channels: int = 3, large_kernel: int = 9, pixel_shuffle: str = "view"):
        super().__init__()
        pad = large_kernel // 2
        self.conv_input = nn.Conv2d(in_channels, channels, large_kernel, padding=pad)
        self.prelu = nn.PReLU()
        self.residual = nn.Sequential(*(ResidualBlock(channels) for _ in range(num_blocks)))
        self.conv_mid = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn_mid = nn.BatchNorm2d(channels)
        shuffle = {"view": PixelShuffleView, "module": nn.PixelShuffle}[pixel_shuffle]
        upsampling: list[nn.Module] = []
        for _ in range(int(math.log2(scale))):
            upsampling += [nn.Conv2d(channels, 4 * channels, 3, padding=1), shuffle(2),
                           nn.PReLU()]
        self.upscale = nn.Sequential(*upsampling)
        self.conv_output = nn.Conv2d(channels, in_channels, large_kernel, padding=pad)

    def forward(self, x: Tensor) -> Tensor:
        x = self.prelu(self.conv_input(x))
        x = x + self.bn_mid(self.conv_mid(self.residual(x)))
        return self.conv_output(self.upscale(x))


def srresnet() -> SRResNet:
    return SRResNet()


def srresnet_small(pixel_shuffle: str = "view") -> SRResNet:
    return SRResNet(channels=2, num_blocks=1, scale=2, in_channels=1, large_kernel=3,
                    pixel_shuffle=pixel_shuffle)


# =========================================================================== U-Net
class DoubleConv(nn.Sequential):
    def __init__(self, in_ch: int, out_ch: int, mid: int | None = None):
        mid = mid or out_ch
        super().__init__(nn.Conv2d(in_ch, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid),
                         nn.ReLU(inplace=True),
                         nn.Conv2d(mid, out_ch, 3, padding=1, bias=False),
                         nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True))


class Down(nn.Sequential):
    def __init__(self, in_ch: int, out_ch: int):
        super().__init__(nn.MaxPool2d(2), DoubleConv(in_ch, out_ch))


class Up(nn.Module):
    """Bilinear x2 upsampling, zero padding to the skip's size (odd sizes), concatenation
    with the skip, double conv (U-Net Fig. 1 with upsampling in place of up-convolution)."""

    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = DoubleConv(in_ch, out_ch, in_ch // 2)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        x = self.up(x)
        dy = skip.size(2) - x.size(2)
        dx = skip.size(3) - x.size(3)
        x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([skip, x], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels: int = 3, n_classes: int = 2, base: int = 64,
                 depth: int = 4):
        super().__init__()
        self.depth = depth
        self.inc = DoubleConv(n_channels, base)
        widths = [base * 2**i for i in range(depth + 1)]
        widths[-1] //= 2  # bilinear: the bottom doubles no more (its output is concatenated)
        for i in range(depth):
            out = widths[i + 1] if i < depth - 1 else widths[-1]
            setattr(self, f"down{i + 1}", Down(widths[i], out))
        for i in range(depth):
            skip = widths[depth - 1 - i]
            below = widths[-1] if i == 0 else widths[depth - i] // 2
            out = skip // 2 if i < depth - 1 else base
            setattr(self, f"up{i + 1}", Up(skip + below, out))
        self.outc = nn.Conv2d(base, n_classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        skips = [self.inc(x)]
        for i in range(self.depth):
            skips.append(getattr(self, f"down{i + 1}")(skips[-1]))
        x = skips.pop()
        for i in range(self.depth):
            x = getattr(self, f"up{i + 1}")(x, skips.pop())
        return self.outc(x)


def unet() -> UNet:
    return UNet()


def unet_small() -> UNet:
    return UNet(n_channels=1, n_classes=1, base=1, depth=1)  # at 2x3: pool, up, pad


# =========================================================================== namedtuple
ClassifierOutputs = namedtuple("ClassifierOutputs", ["logits", "aux_logits"])


class AuxClassifierNet(nn.Module):
    """A small CNN with an auxiliary classifier on intermediate features (GoogLeNet,
    Szegedy et al. 2015, Sec. 5) returning ``ClassifierOutputs(logits, aux_logits)``."""

    def __init__(self, in_channels: int = 3, width: int = 64, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1),
                                  nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2))
        self.body = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1))
        self.aux = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(width, num_classes))
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> ClassifierOutputs:
        h = self.stem(x)
        return ClassifierOutputs(self.fc(self.body(h).flatten(1)), self.aux(h))


def aux_classifier() -> AuxClassifierNet:
    return AuxClassifierNet()


def aux_classifier_small() -> AuxClassifierNet:
    return AuxClassifierNet(in_channels=1, width=2, num_classes=2)


# =========================================================================== MobileNetV3
class SqueezeExcitation(nn.Module):
    """Squeeze-and-excitation (MobileNetV3 Sec. 5.3): pool, 1x1 conv, ReLU, 1x1 conv,
    hardsigmoid gate, and the gate times the input: a product of two neurons' values."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = F.hardsigmoid(self.fc2(F.relu(self.fc1(scale))))
        return scale * x


class V3Block(nn.Module):
    def __init__(self, in_ch: int, expand: int, out_ch: int, kernel: int, se: bool,
                 hardswish: bool, stride: int):
        super().__init__()
        act = nn.Hardswish if hardswish else nn.ReLU
        layers: list[nn.Module] = []
        if expand != in_ch:
            layers += [nn.Conv2d(in_ch, expand, 1, bias=False), nn.BatchNorm2d(expand), act()]
        layers += [nn.Conv2d(expand, expand, kernel, stride, kernel // 2, groups=expand,
                             bias=False), nn.BatchNorm2d(expand), act()]
        if se:
            layers.append(SqueezeExcitation(expand, max(8, expand // 4)))
        layers += [nn.Conv2d(expand, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)]
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and in_ch == out_ch

    def forward(self, x: Tensor) -> Tensor:
        y = self.block(x)
        return x + y if self.use_res_connect else y


# MobileNetV3-Large, Table 1: (kernel, expansion, out, SE, hardswish, stride)
MOBILENET_V3_LARGE = ((3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2),
                      (3, 72, 24, False, False, 1), (5, 72, 40, True, False, 2),
                      (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
                      (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1),
                      (3, 184, 80, False, True, 1), (3, 184, 80, False, True, 1),
                      (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
                      (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1),
                      (5, 960, 160, True, True, 1))


class MobileNetV3Like(nn.Module):
    def __init__(self, setting: Sequence[tuple] = MOBILENET_V3_LARGE, num_classes: int = 1000,
                 in_channels: int = 3, first: int = 16, last: int = 1280):
        super().__init__()
        layers: list[nn.Module] = [nn.Sequential(
            nn.Conv2d(in_channels, first, 3, 2, 1, bias=False), nn.BatchNorm2d(first),
            nn.Hardswish())]
        in_ch = first
        for kernel, expand, out_ch, se, hs, stride in setting:
            layers.append(V3Block(in_ch, expand, out_ch, kernel, se, hs, stride))
            in_ch = out_ch
        layers.append(nn.Sequential(nn.Conv2d(in_ch, 6 * in_ch, 1, bias=False),
                                    nn.BatchNorm2d(6 * in_ch), nn.Hardswish()))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * in_ch, last), nn.Hardswish(),
                                        nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def mobilenet_v3_like() -> MobileNetV3Like:
    return MobileNetV3Like()


def mobilenet_v3_like_small() -> MobileNetV3Like:
    setting = ((3, 4, 4, True, True, 1), (3, 8, 4, True, False, 2), (3, 8, 4, True, True, 1),
               (3, 8, 4, False, True, 1))
    return MobileNetV3Like(setting, num_classes=2, in_channels=1, first=4, last=8)


# =========================================================================== the registry
@dataclass(frozen=True)
class ZooEntry:
    full: Callable[[], nn.Module]
    full_shape: tuple[int, ...]  # the paper's input, no batch dimension
    small: Callable[[], nn.Module]
    small_shape: tuple[int, ...]
    activations: frozenset[str]  # piecewise-linear activations other than ReLU it uses
    heavy: bool = False  # the full-size forward pass takes seconds on one thread


ZOO: dict[str, ZooEntry] = {
    "shufflenet_v2": ZooEntry(shufflenet_v2, (3, 224, 224), shufflenet_v2_small, (1, 6, 6),
                              frozenset()),
    "mobilenet_v2": ZooEntry(mobilenet_v2, (3, 224, 224), mobilenet_v2_small, (1, 4, 4),
                             frozenset({"relu6"})),
    "deeplabv3": ZooEntry(deeplabv3, (3, 224, 224), deeplabv3_small, (1, 2, 3), frozenset(),
                          heavy=True),
    "r3d_18": ZooEntry(r3d_18, (3, 16, 112, 112), r3d_small, (1, 1, 4, 4), frozenset(),
                       heavy=True),
    "patchgan": ZooEntry(patchgan, (6, 256, 256), patchgan_small, (2, 6, 6),
                         frozenset({"leaky_relu"})),
    "srresnet": ZooEntry(srresnet, (3, 24, 24), srresnet_small, (1, 1, 1),
                         frozenset({"prelu"})),
    "unet": ZooEntry(unet, (3, 572, 572), unet_small, (1, 2, 3), frozenset(), heavy=True),
    "aux_classifier": ZooEntry(aux_classifier, (3, 32, 32), aux_classifier_small, (1, 4, 4),
                               frozenset()),
}

REFUSED: dict[str, ZooEntry] = {
    "mobilenet_v3_like": ZooEntry(mobilenet_v3_like, (3, 224, 224), mobilenet_v3_like_small,
                                  (1, 8, 8), frozenset({"hardswish", "hardsigmoid"})),
}


def build(name: str, small: bool = True, seed: int = 0,
          dtype: torch.dtype = torch.float64) -> tuple[nn.Module, tuple[int, ...]]:
    """A zoo model with random weights (eval mode, ``dtype``) and its input shape."""
    entry = ZOO[name] if name in ZOO else REFUSED[name]
    torch.manual_seed(seed)
    model = entry.small() if small else entry.full()
    if small:
        randomise_(model, seed)
    else:  # full size: keep the default init (sane scales), randomise BatchNorm only
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.running_mean.uniform_(-0.1, 0.1, generator=g)
                    m.running_var.uniform_(0.5, 2.0, generator=g)
    return model.to(dtype).eval(), entry.small_shape if small else entry.full_shape
