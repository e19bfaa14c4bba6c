"""Generated 28x28 digit images: an i.i.d. image distribution with a seed, for experiments
on 2-d inputs where no image set can be downloaded.

One draw: an image of scikit-learn's bundled 8x8 digits chosen uniformly at random (its
label is the draw's label), resampled to ``size`` x ``size`` under a random affine map
(rotation, scale, shear, translation: bilinear ``grid_sample``), its stroke thickened or
thinned by a random amount (a blend with a 3x3 dilation or erosion), Gaussian pixel noise,
clipped to [0, 1]. Draws are independent given the generator, so ``draw_digit_images(n,
seed)`` is an i.i.d. sample of size n of one fixed distribution, the same for one seed.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import TensorDataset

from pathlift.data.embedded import Split, digit_arrays
from pathlift.errors import InvalidParameterError

__all__ = ["draw_digit_images", "load_digit_images"]

_CHUNK = 4096
ROTATION = math.radians(15.0)  # |angle| <= 15 degrees
SCALE = (0.65, 0.85)  # of the digit against the frame (MNIST: 20 of 28 pixels)
SHEAR = 0.2
SHIFT = 0.12  # of the half-width
NOISE = 0.1


def draw_digit_images(num_samples: int, seed: int, size: int = 28) -> TensorDataset:
    """``num_samples`` i.i.d. images (float32, shape (1, size, size), in [0, 1]) and their
    labels (int64 in 0..9), drawn by a ``torch.Generator`` seeded with ``seed`` (module
    docstring). Raises InvalidParameterError for a non-positive count or a size below 8."""
    if num_samples < 1 or size < 8:
        raise InvalidParameterError(f"need num_samples >= 1 and size >= 8, got {num_samples}, "
                                    f"{size}")
    pixels, target = digit_arrays()
    templates = torch.from_numpy((pixels / 16.0).astype(np.float32))[:, None]
    targets = torch.from_numpy(target.astype(np.int64))
    gen = torch.Generator().manual_seed(seed)
    images, labels = [], []
    for start in range(0, num_samples, _CHUNK):
        count = min(_CHUNK, num_samples - start)
        pick = torch.randint(len(templates), (count,), generator=gen)
        images.append(_transformed(templates[pick], size, gen))
        labels.append(targets[pick])
    return TensorDataset(torch.cat(images), torch.cat(labels))


def load_digit_images(n_train: int = 50_000, n_test: int = 10_000, seed: int = 0,
                      size: int = 28) -> Split:
    """Training and test sets drawn independently (``draw_digit_images`` with seeds
    2·seed and 2·seed + 1), both standardised with the mean and standard deviation of
    the training images only."""
    train = draw_digit_images(n_train, 2 * seed, size)
    test = draw_digit_images(n_test, 2 * seed + 1, size)
    (x, y), (xt, yt) = train.tensors, test.tensors
    mean, std = float(x.double().mean()), float(x.double().std())
    return Split(TensorDataset((x - mean) / std, y), TensorDataset((xt - mean) / std, yt),
                 (1, size, size), 10)


def _transformed(images: Tensor, size: int, gen: torch.Generator) -> Tensor:
    n = len(images)

    def uniform(low: float, high: float) -> Tensor:
        return low + (high - low) * torch.rand(n, generator=gen)

    angle, scale = uniform(-ROTATION, ROTATION), uniform(*SCALE)
    shear = uniform(-SHEAR, SHEAR)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin + shear * cos, uniform(-SHIFT, SHIFT)], 1),
                         torch.stack([sin, cos + shear * sin, uniform(-SHIFT, SHIFT)], 1)], 1)
    grid = F.affine_grid(theta, [n, 1, size, size], align_corners=False)
    x = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros",
                      align_corners=False)
    thick = uniform(-1.0, 1.0)[:, None, None, None]
    dilated = F.max_pool2d(x, 3, 1, 1)
    eroded = -F.max_pool2d(-x, 3, 1, 1)
    x = torch.where(thick > 0, x + thick * (dilated - x), x - thick * (eroded - x))
    x = x + NOISE * torch.randn(x.shape, generator=gen)
    return x.clamp(0.0, 1.0)
