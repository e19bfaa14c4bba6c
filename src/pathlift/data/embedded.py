"""Embedded datasets that need no network: scikit-learn's 8x8 digits and a synthetic task."""

from __future__ import annotations

import gzip
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from pathlift.errors import InvalidParameterError

__all__ = ["Digits", "Split", "digit_arrays", "load_digits", "loaders", "synthetic"]


@dataclass(frozen=True)
class Split:
    """A train/test split of a classification task held in memory as TensorDatasets (or,
    from ``load_streamed``, ``FileRows`` that read an .npz's inputs a batch at a time)."""

    train: TensorDataset
    test: TensorDataset
    input_shape: tuple[int, ...]
    num_classes: int

    def __repr__(self) -> str:
        return (f"Split(train={len(self.train)}, test={len(self.test)}, "
                f"input_shape={self.input_shape}, num_classes={self.num_classes})")


Digits = Split  # the name of the first embedded set, kept for existing code


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> Split:
    """scikit-learn's bundled 8x8 digits (1,797 images, no download), split uniformly at
    random (a seeded permutation, not stratified): the training set is then a uniform
    random sample, without replacement, of the 1,797, which the certificates need (a
    stratified split fixes the class counts; Hoeffding's 1963 Thm 4 lets sampling without
    replacement stand in for i.i.d. draws in the Chernoff bounds of ``pathlift.bounds``).

    Images are float32 of shape (1, 8, 8) scaled to [0, 1]; labels are int64 in 0..9.
    """
    if not 0.0 < test_fraction < 1.0:
        raise InvalidParameterError(f"test_fraction={test_fraction} must lie in (0, 1)")
    pixels, target = digit_arrays()
    images = (pixels / 16.0).astype(np.float32)[:, None, :, :]
    labels = target.astype(np.int64)
    n_test = math.ceil(test_fraction * len(labels))
    if not 0 < n_test < len(labels):
        raise InvalidParameterError(f"test_fraction={test_fraction} leaves an empty side of "
                                    "the split; use a fraction between 0.001 and 0.999")
    order = np.random.default_rng(seed).permutation(len(labels))
    train, test = order[n_test:], order[:n_test]
    return Split(_dataset(images[train], labels[train]), _dataset(images[test], labels[test]),
                 (1, 8, 8), 10)


def digit_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as ``load_digits()`` gives them: the images (1,797 x 8 x
    8, values 0..16) and their labels, read from the file scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label per row) without
    importing ``sklearn.datasets``, which costs a command about a second; through
    ``sklearn.datasets.load_digits`` where that file is not where this scikit-learn keeps
    it."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    shipped = None if spec is None or spec.origin is None else \
        Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if shipped is not None and shipped.is_file():
        with gzip.open(shipped) as f:
            rows = np.loadtxt(f, delimiter=",")
        return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    return bunch.images, bunch.target


def synthetic(n_train: int = 512, n_test: int = 256, input_shape: tuple[int, ...] = (1, 8, 8),
              num_classes: int = 4, seed: int = 0) -> Split:
    """Gaussian class clusters in ``input_shape``: a fast, fully reproducible toy task."""
    if n_train <= 0 or n_test <= 0 or num_classes < 2:
        raise InvalidParameterError(
            f"need n_train, n_test > 0 and num_classes >= 2 (got {n_train}, {n_test}, "
            f"{num_classes})")
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn((num_classes, *input_shape), generator=gen)

    def sample(n: int) -> TensorDataset:
        y = torch.randint(num_classes, (n,), generator=gen)
        x = centers[y] + 0.5 * torch.randn((n, *input_shape), generator=gen)
        return TensorDataset(x, y)

    return Split(sample(n_train), sample(n_test), tuple(input_shape), num_classes)


def loaders(digits: Split, batch_size: int = 64,
            seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """(train loader shuffled by a generator seeded with ``seed``, unshuffled test loader).

    Raises InvalidParameterError for a ``batch_size`` that is not a positive int."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidParameterError(f"batch_size must be a positive int, got {batch_size!r}")
    gen = torch.Generator().manual_seed(seed)
    train = DataLoader(digits.train, batch_size=batch_size, shuffle=True, generator=gen)
    test = DataLoader(digits.test, batch_size=max(batch_size, 256), shuffle=False)
    return train, test


def _dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y))
