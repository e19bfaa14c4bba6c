"""ResNet-18/34/50/101/152 (He et al. 2016) with torchvision's parameter names and init."""

from __future__ import annotations

from torch import Tensor, nn

from pathlift.models._init import init_like_torchvision

__all__ = ["ResNet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> tuple[nn.Conv2d,
                                                                            nn.BatchNorm2d]:
    conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False)
    return conv, nn.BatchNorm2d(out_ch)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers and a skip: relu(bn2(conv2(relu(bn1(conv1 x)))) + skip(x))."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(in_ch, width, 3, stride)
        self.conv2, self.bn2 = _conv_bn(width, width, 3)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_ch, width * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu(out + skip)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as torchvision's v1.5), 1x1 expand by 4, and a skip."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(in_ch, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, width * self.expansion, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_ch, width * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu(out + skip)


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Sequential | None:
    """A strided 1x1 conv-BN projection where the shape changes, else the identity."""
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.Sequential(*_conv_bn(in_ch, out_ch, 1, stride))


class ResNet(nn.Module):
    """Stem (7x7/2 conv-BN-ReLU, 3x3/2 max-pool), four stages, global average pool, fc."""

    input_shape = (3, 224, 224)  # what path-norms read without a shape

    def __init__(self, block: type[BasicBlock | Bottleneck], depths: tuple[int, int, int, int],
                 num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_ch = 64
        for stage, (width, n) in enumerate(zip((64, 128, 256, 512), depths, strict=True)):
            blocks = []
            for i in range(n):
                blocks.append(block(in_ch, width, 2 if stage > 0 and i == 0 else 1))
                in_ch = width * block.expansion
            setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        init_like_torchvision(self, linear_std=None)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18: BasicBlocks (2, 2, 2, 2); 11,689,512 parameters at 1000 classes."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes)


def resnet34(num_classes: int = 1000) -> ResNet:
    """ResNet-34: BasicBlocks (3, 4, 6, 3); 21,797,672 parameters at 1000 classes."""
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50: Bottlenecks (3, 4, 6, 3); 25,557,032 parameters at 1000 classes."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes)


def resnet101(num_classes: int = 1000) -> ResNet:
    """ResNet-101: Bottlenecks (3, 4, 23, 3); 44,549,160 parameters at 1000 classes."""
    return ResNet(Bottleneck, (3, 4, 23, 3), num_classes)


def resnet152(num_classes: int = 1000) -> ResNet:
    """ResNet-152: Bottlenecks (3, 8, 36, 3); 60,192,808 parameters at 1000 classes."""
    return ResNet(Bottleneck, (3, 8, 36, 3), num_classes)
