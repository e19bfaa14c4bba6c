"""A U-Net (Ronneberger et al. 2015): max-pool down, ConvTranspose2d up, torch.cat skips."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError
from pathlift.models._init import init_like_torchvision

__all__ = ["UNet", "unet"]


def _double_conv(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False), nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False), nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True))


class UNet(nn.Module):
    """``depth`` 2x2 max-pool levels of widths base*2^i; input sides divisible by 2^depth."""

    def __init__(self, in_channels: int = 1, num_classes: int = 2, base: int = 8,
                 depth: int = 3):
        super().__init__()
        if min(in_channels, num_classes, base, depth) < 1:
            raise InvalidParameterError(
                f"unet needs positive in_channels, num_classes, base and depth, got "
                f"{in_channels}, {num_classes}, {base}, {depth}")
        widths = [base * 2**i for i in range(depth + 1)]
        self.stem = _double_conv(in_channels, base)
        self.pool = nn.MaxPool2d(2)
        self.down = nn.ModuleList(_double_conv(a, b) for a, b in itertools.pairwise(widths))
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2)
                                for a, b in itertools.pairwise(widths))
        self.merge = nn.ModuleList(_double_conv(2 * a, a) for a in widths[:-1])
        self.head = nn.Conv2d(base, num_classes, 1)
        self.input_shape = (in_channels, *(max(64, 2**depth),) * 2)  # sides divisible by 2^depth
        init_like_torchvision(self, linear_std=None)

    def forward(self, x: Tensor) -> Tensor:
        skips = [self.stem(x)]
        for block in self.down:
            skips.append(block(self.pool(skips[-1])))
        x = skips.pop()
        for up, merge in zip(reversed(self.up), reversed(self.merge), strict=True):
            x = merge(torch.cat([skips.pop(), up(x)], dim=1))
        return self.head(x)


def unet(in_channels: int = 1, num_classes: int = 2, base: int = 8, depth: int = 3) -> UNet:
    """A U-Net with per-pixel ``num_classes`` logits at the input resolution."""
    return UNet(in_channels, num_classes, base, depth)
