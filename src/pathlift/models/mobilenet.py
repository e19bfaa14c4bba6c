"""MobileNetV2 (Sandler et al. 2018) with ReLU in place of ReLU6, torchvision's names.

ReLU6 = min(max(x, 0), 6) is not positively homogeneous, so it is outside the ReLU DAG
model (thesis Def. 2.2.2); with plain ReLU every path-lifting result applies.
"""

from __future__ import annotations

from torch import Tensor, nn

from pathlift.models._init import init_like_torchvision

__all__ = ["MobileNetReLU", "mobilenet_relu"]

# (expansion t, output channels c, repeats n, first stride s), MobileNetV2 Table 2
_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))


def _divisible(v: float, divisor: int = 8) -> int:
    """Round ``v`` to the nearest multiple of ``divisor``, never more than 10% below ``v``."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def _conv_bn_relu(in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1,
                  groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True))


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, linear 1x1 projection; a skip when shapes allow."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int):
        super().__init__()
        hidden = round(in_ch * expand)
        self.use_res_connect = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = [_conv_bn_relu(in_ch, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn_relu(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetReLU(nn.Module):
    """MobileNetV2 layout: stem, 17 inverted residuals, 1x1 conv to 1280, pool, classifier."""

    input_shape = (3, 224, 224)  # what path-norms read without a shape

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0,
                 dropout: float = 0.2):
        super().__init__()
        in_ch = _divisible(32 * width_mult)
        last = _divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [_conv_bn_relu(3, in_ch, stride=2)]
        for t, c, n, s in _SETTING:
            out_ch = _divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(in_ch, out_ch, s if i == 0 else 1, t))
                in_ch = out_ch
        features.append(_conv_bn_relu(in_ch, last, 1))
        self.features = nn.Sequential(*features)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
        init_like_torchvision(self, linear_std=0.01)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def mobilenet_relu(num_classes: int = 1000, width_mult: float = 1.0) -> MobileNetReLU:
    """ReLU MobileNetV2; 3,504,872 parameters at 1000 classes and width 1 (as mobilenet_v2)."""
    return MobileNetReLU(num_classes, width_mult)
