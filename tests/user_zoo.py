"""The models a researcher brings in the first hour, written from their papers the way users
write them (functional calls, loops over ModuleList/ModuleDict, concatenations, tuple and
dict outputs), scaled down so that explicit path enumeration (``pathlift.testing.neurons``)
checks every number. Not copied from any library.

- DenseNet-BC (Huang et al. 2017, Sec. 3): bottleneck layers BN-ReLU-Conv1x1(4k)-BN-ReLU-
  Conv3x3(k), each reading the concatenation of all earlier feature maps (a list grown in a
  loop), transitions BN-ReLU-Conv1x1(theta C)-AvgPool2 with compression theta = 0.5;
- an Inception network (Szegedy et al. 2015, Fig. 2b): 1x1, 1x1-3x3, 1x1-5x5 and
  3x3-max-pool-1x1 branches, each conv followed by ReLU, concatenated;
- ResNeXt (Xie et al. 2017, Fig. 3c): bottlenecks with a grouped 3x3 conv (cardinality C),
  projection shortcuts where the shape changes;
- a pre-activation Wide-ResNet (Zagoruyko & Komodakis 2016; He et al. 2016, "Identity
  mappings"): BN-ReLU-conv-BN-ReLU-dropout-conv, the shortcut projecting the pre-activated
  input;
- an EfficientNet-like network with ReLU (Tan & Le 2019, MBConv without squeeze-excitation,
  as in EfficientNet-Lite; stochastic depth in training only);
- a U-Net (Ronneberger et al. 2015, Fig. 1: conv-ReLU pairs, max-pool, 2x2 up-convolution,
  concatenation with the skip), optionally with an image-level label head returning
  ``{"mask": ..., "label": ...}``;
- a 1-D CNN for signals, a tabular MLP with BatchNorm1d and Dropout;
- a network looping over a ModuleList of residual blocks and a ModuleDict of heads;
- a CNN returning ``(logits, features)``;
- a weight_norm / spectral_norm CNN (torch.nn.utils.parametrizations).

Every factory has an ``input_shape`` attribute and ``CLASSES`` outputs (the data of
``write_data``), so ``pathlift COMMAND path/to/user_zoo.py:factory`` works as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

CLASSES = 3
IMAGE = (3, 8, 8)
SIGNAL = (2, 16)
TABULAR = (12,)


# =========================================================================== DenseNet-BC
class Bottleneck(nn.Module):
    """H_l of DenseNet-BC: BN-ReLU-Conv(1x1, 4k)-BN-ReLU-Conv(3x3, k)."""

    def __init__(self, channels: int, growth: int):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(channels)
        self.conv1 = nn.Conv2d(channels, 4 * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[Tensor]) -> Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(x)))


class DenseBlock(nn.ModuleList):
    def __init__(self, layers: int, channels: int, growth: int):
        super().__init__(Bottleneck(channels + i * growth, growth) for i in range(layers))

    def forward(self, x: Tensor) -> Tensor:
        features = [x]
        for layer in self:
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, channels: int, out: int):
        super().__init__(nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, out, 1,
                                                                        bias=False),
                         nn.AvgPool2d(2))


class DenseNetBC(nn.Module):
    def __init__(self, growth: int = 2, layers: tuple[int, ...] = (2, 2),
                 compression: float = 0.5, num_classes: int = CLASSES,
                 in_channels: int = IMAGE[0]):
        super().__init__()
        channels = 2 * growth
        blocks: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)]
        for i, n in enumerate(layers):
            blocks.append(DenseBlock(n, channels, growth))
            channels += n * growth
            if i < len(layers) - 1:
                out = int(channels * compression)
                blocks.append(Transition(channels, out))
                channels = out
        blocks += [nn.BatchNorm2d(channels), nn.ReLU()]
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def densenet_bc() -> DenseNetBC:
    return DenseNetBC()


# =========================================================================== Inception
class Inception(nn.Module):
    """GoogLeNet's inception module with dimension reductions (Fig. 2b)."""

    def __init__(self, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, pool: int):
        super().__init__()
        self.b1 = nn.Conv2d(cin, c1, 1)
        self.b3 = nn.Sequential(nn.Conv2d(cin, r3, 1), nn.ReLU(inplace=True),
                                nn.Conv2d(r3, c3, 3, padding=1))
        self.b5 = nn.Sequential(nn.Conv2d(cin, r5, 1), nn.ReLU(inplace=True),
                                nn.Conv2d(r5, c5, 5, padding=2))
        self.proj = nn.Conv2d(cin, pool, 1)

    def forward(self, x: Tensor) -> Tensor:
        branches = [self.b1(x), self.b3(x), self.b5(x),
                    self.proj(F.max_pool2d(x, 3, stride=1, padding=1))]
        return F.relu(torch.cat(branches, dim=1))


class InceptionNet(nn.Module):
    def __init__(self, num_classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Conv2d(IMAGE[0], 4, 3, padding=1)
        self.block = Inception(4, 2, 2, 2, 1, 1, 1)
        self.dropout = nn.Dropout(0.4)
        self.fc = nn.Linear(6, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.stem(x)), 2)
        x = self.block(x)
        x = F.avg_pool2d(x, x.shape[-1]).flatten(1)
        return self.fc(self.dropout(x))


def inception() -> InceptionNet:
    return InceptionNet()


# =========================================================================== ResNeXt
class ResNeXtBlock(nn.Module):
    """Fig. 3c: 1x1 (C*d) - grouped 3x3 (C groups) - 1x1, BatchNorm after each, a shortcut."""

    def __init__(self, cin: int, cout: int, cardinality: int, width: int, stride: int = 1):
        super().__init__()
        inner = cardinality * width
        self.conv1 = nn.Conv2d(cin, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride, 1, groups=cardinality, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ResNeXt(nn.Module):
    def __init__(self, cardinality: int = 2, width: int = 1, num_classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(IMAGE[0], 4, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(4), nn.ReLU())
        self.layer1 = ResNeXtBlock(4, 4, cardinality, width)
        self.layer2 = ResNeXtBlock(4, 6, cardinality, width, stride=2)
        self.fc = nn.Linear(6, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(x.mean((2, 3)))


def resnext() -> ResNeXt:
    return ResNeXt()


# =========================================================================== pre-act WRN
class PreActBlock(nn.Module):
    """WRN's basic block, pre-activation: the shortcut projects the pre-activated input."""

    def __init__(self, cin: int, cout: int, stride: int, dropout: float = 0.3):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.project = None if stride == 1 and cin == cout else \
            nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        o = F.relu(self.bn1(x))
        y = self.conv2(self.dropout(F.relu(self.bn2(self.conv1(o)))))
        return y + (x if self.project is None else self.project(o))


class WideResNet(nn.Module):
    """WRN-n-k: conv 16, three groups of widths 16k, 32k, 64k (here scaled by 1/8)."""

    def __init__(self, depth: int = 10, widen: int = 1, num_classes: int = CLASSES,
                 base: int = 2):
        super().__init__()
        n = (depth - 4) // 6
        widths = [base, base * widen, 2 * base * widen, 4 * base * widen]
        self.conv = nn.Conv2d(IMAGE[0], widths[0], 3, padding=1, bias=False)
        blocks = []
        for g in range(3):
            for i in range(n):
                blocks.append(PreActBlock(widths[g] if i == 0 else widths[g + 1],
                                          widths[g + 1], 2 if g > 0 and i == 0 else 1))
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(widths[3])
        self.fc = nn.Linear(widths[3], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn(self.blocks(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).view(x.size(0), -1))


def wide_resnet() -> WideResNet:
    return WideResNet()


# =========================================================================== EfficientNet
class MBConv(nn.Module):
    """Mobile inverted bottleneck: expand 1x1, depthwise kxk, linear project 1x1, a skip
    with stochastic depth when stride is 1 and widths agree (ReLU for swish, no SE)."""

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int,
                 drop: float = 0.2):
        super().__init__()
        mid = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU()]
        layers += [nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
                   nn.BatchNorm2d(mid), nn.ReLU(),
                   nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.skip = stride == 1 and cin == cout
        self.drop = drop

    def forward(self, x: Tensor) -> Tensor:
        y = self.block(x)
        if not self.skip:
            return y
        if self.training and self.drop > 0:  # stochastic depth, per sample
            keep = torch.rand(x.shape[0], 1, 1, 1, device=x.device) >= self.drop
            y = y * keep / (1 - self.drop)
        return x + y


class EfficientNetReLU(nn.Module):
    # (expansion, out channels, repeats, stride, kernel), EfficientNet-B0 Table 1 scaled
    SETTING = ((1, 2, 1, 1, 3), (2, 3, 2, 2, 3), (2, 4, 1, 2, 5))

    def __init__(self, num_classes: int = CLASSES, setting: tuple[tuple[int, ...], ...] = SETTING):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(IMAGE[0], 2, 3, 1, 1, bias=False),
                                   nn.BatchNorm2d(2), nn.ReLU()]
        cin = 2
        for expand, cout, repeats, stride, kernel in setting:
            for i in range(repeats):
                layers.append(MBConv(cin, cout, expand, kernel, stride if i == 0 else 1))
                cin = cout
        layers += [nn.Conv2d(cin, 6, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                                  nn.Linear(6, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def efficientnet_relu() -> EfficientNetReLU:
    return EfficientNetReLU()


# =========================================================================== U-Net
def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Fig. 1 of the U-Net paper (padded convs), ``depth`` levels: contracting path of
    conv-ReLU pairs and 2x2 max-pools, expanding path of 2x2 up-convolutions concatenated
    with the skip. With ``label_head``, also an image-level label from the bottom."""

    def __init__(self, base: int = 2, classes: int = 1, label_head: bool = False,
                 depth: int = 2):
        super().__init__()
        widths = [IMAGE[0]] + [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(_double_conv(widths[i], widths[i + 1]) for i in range(depth))
        self.bottom = _double_conv(widths[depth], widths[depth + 1])
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                for i in range(depth, 0, -1))
        self.merge = nn.ModuleList(_double_conv(2 * widths[i], widths[i])
                                   for i in range(depth, 0, -1))
        self.out = nn.Conv2d(base, classes, 1)
        self.label = nn.Linear(widths[-1], CLASSES) if label_head else None

    def forward(self, x: Tensor) -> Tensor | dict[str, Tensor]:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = bottom = self.bottom(x)
        for up, merge in zip(self.up, self.merge, strict=True):
            x = merge(torch.cat([skips.pop(), up(x)], dim=1))
        mask = self.out(x)
        if self.label is None:
            return mask
        return {"mask": mask, "label": self.label(bottom.mean((2, 3)))}


def unet() -> UNet:
    return UNet()


def unet_with_label() -> UNet:
    return UNet(label_head=True)


# =========================================================================== 1-D, tabular
class SignalCNN(nn.Module):
    """A 1-D CNN for multichannel signals: conv-BN-ReLU-max-pool twice, global average."""

    def __init__(self, num_classes: int = CLASSES):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(SIGNAL[0], 4, 5, padding=2), nn.BatchNorm1d(4),
                                  nn.ReLU(), nn.MaxPool1d(2),
                                  nn.Conv1d(4, 4, 3, padding=1), nn.BatchNorm1d(4),
                                  nn.ReLU(), nn.MaxPool1d(2))
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.adaptive_avg_pool1d(self.body(x), 1).squeeze(-1))


def signal_cnn() -> SignalCNN:
    return SignalCNN()


def tabular_mlp() -> nn.Sequential:
    """Linear-BatchNorm1d-ReLU-Dropout blocks, the usual tabular baseline."""
    return nn.Sequential(nn.Linear(TABULAR[0], 8), nn.BatchNorm1d(8), nn.ReLU(),
                         nn.Dropout(0.1), nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(),
                         nn.Dropout(0.1), nn.Linear(6, CLASSES))


# =========================================================================== loops, tuples
class LoopNet(nn.Module):
    """Residual MLP blocks in a ModuleList and one head per output group in a ModuleDict,
    both walked by Python loops in forward."""

    def __init__(self, width: int = 6, blocks: int = 2):
        super().__init__()
        self.inp = nn.Linear(TABULAR[0], width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                                  nn.Linear(width, width))
                                    for _ in range(blocks))
        self.heads = nn.ModuleDict({"first": nn.Linear(width, 1),
                                    "rest": nn.Linear(width, CLASSES - 1)})

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.inp(x))
        for block in self.blocks:
            h = F.relu(h + block(h))
        return torch.cat([head(h) for head in self.heads.values()], dim=1)


def loop_net() -> LoopNet:
    return LoopNet()


class LogitsAndFeatures(nn.Module):
    """A CNN returning ``(logits, features)``, the embedding beside the class scores
    (contrastive or distillation code)."""

    def __init__(self, num_classes: int = CLASSES, features: int = 5):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(IMAGE[0], 4, 3, padding=1), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                  nn.Linear(4 * 4 * 4, features), nn.ReLU())
        self.fc = nn.Linear(features, num_classes)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        features = self.body(x)
        return self.fc(features), features


def logits_and_features() -> LogitsAndFeatures:
    return LogitsAndFeatures()


# =========================================================================== parametrized
def bn_cnn() -> nn.Sequential:
    """conv-BN-ReLU-max-pool, then a Linear classifier."""
    return nn.Sequential(nn.Conv2d(IMAGE[0], 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, CLASSES))


def parametrized_cnn() -> nn.Sequential:
    """bn_cnn with weight_norm on the conv and spectral_norm on the classifier."""
    model = bn_cnn()
    weight_norm(model[0])
    spectral_norm(model[5])
    return model


def bn_cnn_channels_last() -> nn.Sequential:
    return bn_cnn().to(memory_format=torch.channels_last)


def bn_cnn_half() -> nn.Sequential:
    return bn_cnn().half()


def bn_cnn_compiled() -> nn.Module:
    return torch.compile(bn_cnn())


IMAGE_MODELS = (densenet_bc, inception, resnext, wide_resnet, efficientnet_relu,
                logits_and_features, parametrized_cnn, bn_cnn, bn_cnn_channels_last,
                bn_cnn_half, bn_cnn_compiled)
for _factory in (*IMAGE_MODELS, unet, unet_with_label):
    _factory.input_shape = IMAGE
signal_cnn.input_shape = SIGNAL
tabular_mlp.input_shape = loop_net.input_shape = TABULAR

# name -> factory: the models every command runs on (unet*: classes do not match their
# main output; bn_cnn_*: the wrappers of the Must-show list)
MODELS = {f.__name__: f for f in (densenet_bc, inception, resnext, wide_resnet,
                                  efficientnet_relu, unet, unet_with_label, signal_cnn,
                                  tabular_mlp, loop_net, logits_and_features,
                                  parametrized_cnn, bn_cnn_channels_last, bn_cnn_half)}


def randomise_batchnorm_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Running statistics and affine maps of every BatchNorm drawn at random (in place), so
    that eval-mode BatchNorm is not the identity; returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return model.eval()


# =========================================================================== refused
class TinyTransformer(nn.Module):
    """A pre-LN transformer encoder block (Vaswani et al. 2017; Xiong et al. 2020): LayerNorm,
    single-head attention written out (q k^T / sqrt(d), softmax, times v), a GELU MLP,
    mean over tokens. Outside the ReLU DAG model for four reasons at once."""

    def __init__(self, tokens: int = 6, features: int = 4, d: int = 8):
        super().__init__()
        self.embed = nn.Linear(features, d)
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, CLASSES)
        self.scale = d ** -0.5

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        h = h + self.proj(attention @ v)
        h = h + self.mlp(self.norm2(h))
        return self.head(h.mean(1))


def tiny_transformer() -> TinyTransformer:
    return TinyTransformer()


tiny_transformer.input_shape = (6, 4)
