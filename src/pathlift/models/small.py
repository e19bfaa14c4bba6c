"""Small ReLU networks for the embedded 8x8 digits: an MLP and a max-pooling CNN."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import nn

from pathlift.errors import InvalidParameterError

__all__ = ["mlp", "small_cnn"]


def mlp(in_features: int = 64, hidden: Sequence[int] = (128, 64),
        num_classes: int = 10) -> nn.Sequential:
    """Flatten, then Linear-ReLU blocks of widths ``hidden``, then a Linear classifier."""
    widths = [int(in_features), *(int(h) for h in hidden), int(num_classes)]
    if any(w <= 0 for w in widths):
        raise InvalidParameterError(f"mlp widths must be positive, got {widths}")
    layers: list[nn.Module] = [nn.Flatten()]
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU(inplace=True))
    model = nn.Sequential(*layers)
    model.input_shape = (1, 8, 8) if widths[0] == 64 else (widths[0],)  # the 8x8 digits
    return model


class SmallCNN(nn.Module):
    """conv3-ReLU-maxpool2 twice (8x8 -> 4x4 -> 2x2), then a two-layer ReLU classifier."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        super().__init__()
        if in_channels <= 0 or num_classes <= 0:
            raise InvalidParameterError(
                f"small_cnn needs positive in_channels and num_classes, got "
                f"{in_channels}, {num_classes}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(inplace=True),
            nn.Linear(64, num_classes),
        )
        self.input_shape = (in_channels, 8, 8)

    def forward(self, x):
        return self.classifier(self.features(x))


def small_cnn(in_channels: int = 1, num_classes: int = 10) -> SmallCNN:
    """A small ReLU CNN with max-pooling sized for 8x8 inputs (the embedded digits)."""
    return SmallCNN(in_channels, num_classes)
