"""The headline certificates of docs/training.md, reproduced end to end (slow: minutes).

The recipes were chosen on validation splits carved from the training splits before these
runs; the test splits are only measured here. The compression certificate is for the
trained network itself, the architecture one of the frontier's two compact models (one
bit).
"""

import pytest
import torch

from pathlift.bounds.code import architecture_of
from pathlift.bounds.compression import compression_bound
from pathlift.jobs.frontier import FRONTIER_SEARCH
from pathlift.train.recipes import compact_model, train_recipe


def _certify(data, method: str, strength: float, epochs: int, batch: int):
    x, y = data.train.tensors
    xt, yt = data.test.tensors
    shape = data.input_shape
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = compact_model("mlp-small" if len(shape) == 3 else "cnn-small", shape)
    train_recipe(model, x, y, method, strength, epochs, batch, 3e-3, 0)
    model.eval()
    family = [architecture_of(compact_model(m, shape), shape)
              for m in ("mlp-small", "cnn-small")]
    cert = compression_bound(model, shape, x, y, family=family, search=FRONTIER_SEARCH)
    with torch.no_grad():
        accuracy = float((model(xt).argmax(1) == yt).double().mean())
    return cert, accuracy


@pytest.mark.slow
def test_digits_certificate_below_0_90_at_94_percent():
    from pathlift.data import load_digits

    cert, accuracy = _certify(load_digits(), "box-robust", 2**-7, 150, 64)
    assert cert.n == 1347 and cert.value <= 0.90 and accuracy >= 0.94


@pytest.mark.slow
def test_mnist1d_certificate_below_0_5_at_90_percent_with_50000_samples():
    pytest.importorskip("mnist1d")
    from pathlift.data.mnist1d import load_mnist1d

    cert, accuracy = _certify(load_mnist1d(62_500), "prune-retrain", 0.5, 20, 128)
    assert cert.n == 50_000 and cert.value <= 0.5 and accuracy >= 0.90
