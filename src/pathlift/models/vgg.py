"""VGG-11/16 with and without BatchNorm (Simonyan & Zisserman 2015), torchvision's names."""

from __future__ import annotations

from torch import Tensor, nn

from pathlift.models._init import init_like_torchvision

__all__ = ["VGG", "vgg11", "vgg11_bn", "vgg16", "vgg16_bn"]

# conv widths per stage; each stage ends with a 2x2/2 max-pool (configurations A and D)
_STAGES = {
    11: ((64,), (128,), (256, 256), (512, 512), (512, 512)),
    16: ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)),
}


class VGG(nn.Module):
    """``features`` (3x3 convs, ReLU, max-pools), 7x7 adaptive average pool, 3 Linear layers."""

    input_shape = (3, 224, 224)  # what path-norms read without a shape

    def __init__(self, depth: int, batch_norm: bool, num_classes: int = 1000,
                 dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for stage in _STAGES[depth]:
            for width in stage:
                layers.append(nn.Conv2d(in_ch, width, kernel_size=3, padding=1))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(width))
                layers.append(nn.ReLU(inplace=True))
                in_ch = width
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )
        init_like_torchvision(self, linear_std=0.01)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def vgg11(num_classes: int = 1000) -> VGG:
    """VGG-11 (configuration A); 132,863,336 parameters at 1000 classes."""
    return VGG(11, False, num_classes)


def vgg11_bn(num_classes: int = 1000) -> VGG:
    """VGG-11 with BatchNorm; 132,868,840 parameters at 1000 classes."""
    return VGG(11, True, num_classes)


def vgg16(num_classes: int = 1000) -> VGG:
    """VGG-16 (configuration D); 138,357,544 parameters at 1000 classes."""
    return VGG(16, False, num_classes)


def vgg16_bn(num_classes: int = 1000) -> VGG:
    """VGG-16 with BatchNorm; 138,365,992 parameters at 1000 classes."""
    return VGG(16, True, num_classes)
