"""The generated 28x28 digit images: reproducible by seed, i.i.d. draws, independent train
and test sets, standardised with training statistics only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pathlift.data.images import draw_digit_images, load_digit_images
from pathlift.errors import InvalidParameterError


def test_same_seed_same_draws_other_seed_other_draws():
    a, b, c = (draw_digit_images(300, s, size=16) for s in (5, 5, 6))
    assert torch.equal(a.tensors[0], b.tensors[0]) and torch.equal(a.tensors[1], b.tensors[1])
    assert not torch.equal(a.tensors[0], c.tensors[0])
    x, y = a.tensors
    assert x.shape == (300, 1, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_draws_are_iid_labels_follow_the_templates_and_do_not_depend_on_the_previous():
    from sklearn.datasets import load_digits

    y = draw_digit_images(6000, 0, size=8).tensors[1].numpy()
    p = np.bincount(load_digits().target, minlength=10) / 1797
    counts = np.bincount(y, minlength=10)
    chi2 = float(((counts - 6000 * p) ** 2 / (6000 * p)).sum())
    assert chi2 < 27.9  # chi-square, 9 degrees of freedom, p = 0.001
    # independence of consecutive draws: P(y_i = y_{i+1}) = sum_c p_c^2, within 4 sigma
    same = float((y[1:] == y[:-1]).mean())
    q = float((p ** 2).sum())
    assert abs(same - q) < 4 * np.sqrt(q * (1 - q) / 5999)


def test_train_and_test_are_independent_draws_standardised_with_train_statistics_only():
    split = load_digit_images(n_train=400, n_test=200, seed=3, size=12)
    x, _ = split.train.tensors
    xt, yt = split.test.tensors
    raw_train = draw_digit_images(400, 6, size=12).tensors[0].double()
    raw_test, raw_labels = draw_digit_images(200, 7, size=12).tensors
    mean, std = float(raw_train.mean()), float(raw_train.std())
    torch.testing.assert_close(x.double(), (raw_train - mean) / std, rtol=0, atol=1e-5)
    torch.testing.assert_close(xt.double(), (raw_test.double() - mean) / std, rtol=0, atol=1e-5)
    assert torch.equal(yt, raw_labels)
    assert abs(float(x.double().mean())) < 1e-5 and abs(float(x.double().std()) - 1) < 1e-5
    # the test set takes no part in the training data: another test size, same training set
    other = load_digit_images(n_train=400, n_test=50, seed=3, size=12)
    assert torch.equal(other.train.tensors[0], x)
    assert split.input_shape == (1, 12, 12) and split.num_classes == 10


def test_bad_counts_are_refused_in_one_line():
    with pytest.raises(InvalidParameterError, match="num_samples >= 1"):
        draw_digit_images(0, 0)
    with pytest.raises(InvalidParameterError, match="size >= 8"):
        draw_digit_images(10, 0, size=4)
