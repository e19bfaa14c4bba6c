"""The data behind the published certificates: MNIST-1D standardised with its training
split's statistics only (issue 39)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_mnist1d_is_standardised_by_its_training_split_only():
    """Train inputs have mean 0 and std 1 exactly (to float32); they equal the raw
    package signals standardised by their own statistics, whatever the test split holds;
    the test split uses the training statistics."""
    pytest.importorskip("mnist1d")
    from mnist1d.data import get_dataset_args, make_dataset

    from pathlift.data.mnist1d import load_mnist1d

    data = load_mnist1d(500)
    x_tr, x_te = (t.tensors[0].double() for t in (data.train, data.test))
    assert abs(float(x_tr.mean())) < 1e-6 and abs(float(x_tr.std(unbiased=False)) - 1) < 1e-6
    assert abs(float(x_te.mean())) > 1e-4  # not standardised on itself
    args = get_dataset_args()
    args.num_samples, args.train_split, args.seed = 500, 0.8, 42
    raw = make_dataset(args)
    own = raw["x"] - raw["x"].mean()
    own = own / own.std()
    assert np.allclose(x_tr[:, 0].numpy(), own, atol=1e-5)
    test = (raw["x_test"] - raw["x"].mean()) / raw["x"].std()
    assert np.allclose(x_te[:, 0].numpy(), test, atol=1e-5)
    assert torch.equal(data.train.tensors[1], torch.from_numpy(raw["y"].astype(np.int64)))
