"""Embedded digits, loaders, and the SGD training loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from pathlift.data import load_digits, loaders, synthetic
from pathlift.data.training import evaluate, train_classifier
from pathlift.errors import InvalidParameterError
from pathlift.models import mlp


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_digits_shapes_range_and_labels(digits):
    x_tr, y_tr = digits.train.tensors
    x_te, y_te = digits.test.tensors
    assert len(x_tr) + len(x_te) == 1797  # scikit-learn's bundled digits
    assert len(x_te) == 450  # ceil(0.25 * 1797), sklearn's rounding of test_size
    assert x_tr.shape[1:] == digits.input_shape == (1, 8, 8)
    assert x_tr.dtype == torch.float32 and y_tr.dtype == torch.int64
    assert float(x_tr.min()) == 0.0 and float(x_tr.max()) == 1.0
    assert set(y_tr.tolist()) == set(range(10)) == set(y_te.tolist())
    assert digits.num_classes == 10


def test_digits_are_sklearn_images_over_16(digits):
    from sklearn.datasets import load_digits as sk

    raw = sk()
    pixels = {tuple(row) for row in (raw.data / 16.0).astype(np.float32)}
    x_tr = digits.train.tensors[0].reshape(-1, 64).numpy()
    assert all(tuple(row) in pixels for row in x_tr[:50])


def test_digit_arrays_are_sklearns_read_without_importing_it(monkeypatch):
    """The shipped file read directly equals ``sklearn.datasets.load_digits`` (images and
    labels, in order), in a process that never imports ``sklearn.datasets``; where the
    file is not found, the same arrays come from ``load_digits`` itself."""
    import importlib.util
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sk

    from pathlift.data import embedded

    raw = sk()
    for finder in (importlib.util.find_spec, lambda name: None):
        monkeypatch.setattr(embedded.importlib.util, "find_spec", finder)
        pixels, target = embedded.digit_arrays()
        assert np.array_equal(pixels, raw.images) and np.array_equal(target, raw.target)
    code = ("import sys; from pathlift.data import load_digits; load_digits(); "
            "print('sklearn.datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_split_is_a_seeded_uniform_permutation_not_stratified(digits):
    """The test split is the first ceil(0.25 n) images of numpy's permutation with the
    seed, the training split the rest (so class counts are random, as an i.i.d. sample's)."""
    from sklearn.datasets import load_digits as sk

    raw = sk()
    order = np.random.default_rng(0).permutation(1797)
    test = torch.from_numpy((raw.images[order[:450]] / 16.0).astype(np.float32))
    assert torch.equal(digits.test.tensors[0][:, 0], test)
    assert torch.equal(digits.train.tensors[1], torch.from_numpy(raw.target[order[450:]]))
    again = load_digits(seed=0)
    assert torch.equal(again.test.tensors[0], digits.test.tensors[0])
    other = load_digits(seed=1)
    assert not torch.equal(other.test.tensors[0], digits.test.tensors[0])


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_bad_test_fraction(fraction):
    with pytest.raises(InvalidParameterError, match="test_fraction"):
        load_digits(test_fraction=fraction)


def test_loaders_shuffle_reproducibly(digits):
    first = [y for _, y in loaders(digits, 32, seed=3)[0]]
    second = [y for _, y in loaders(digits, 32, seed=3)[0]]
    other = [y for _, y in loaders(digits, 32, seed=4)[0]]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    test_labels = torch.cat([y for _, y in loaders(digits)[1]])
    assert torch.equal(test_labels, digits.test.tensors[1])  # test loader is not shuffled


def test_synthetic_task():
    task = synthetic(n_train=64, n_test=32, input_shape=(5,), num_classes=3, seed=1)
    assert task.train.tensors[0].shape == (64, 5) and task.test.tensors[0].shape == (32, 5)
    assert int(task.train.tensors[1].max()) < 3
    assert torch.equal(synthetic(64, 32, (5,), 3, 1).train.tensors[0], task.train.tensors[0])


def test_evaluate_matches_direct_argmax_and_restores_flag(digits):
    torch.manual_seed(0)
    model = mlp()
    model.train()
    x, y = digits.test.tensors
    with torch.no_grad():
        expected = int((model(x).argmax(1) == y).sum()) / len(y)
    acc = evaluate(model, DataLoader(digits.test, batch_size=37))
    assert acc == pytest.approx(expected, abs=1e-12)
    assert model.training
    model.eval()
    evaluate(model, DataLoader(digits.test, batch_size=37))
    assert not model.training


class _Recorder:
    def __init__(self):
        self.seen = []

    def on_epoch_end(self, model, epoch, logs):
        self.seen.append((epoch, dict(logs)))
        logs["weight_norm"] = sum(float(p.detach().abs().sum()) for p in model.parameters())


def test_training_improves_accuracy_and_calls_back(digits):
    torch.manual_seed(0)
    model = mlp()
    train, test = loaders(digits, 64, seed=0)
    before = evaluate(model, test)
    rec = _Recorder()
    logs = train_classifier(model, train, epochs=8, lr=0.05, callbacks=[rec],
                            progress=False, seed=0)
    after = evaluate(model, test)
    assert before < 0.3 and after > 0.9
    assert [log["epoch"] for log in logs] == list(range(1, 9)) == [e for e, _ in rec.seen]
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert all("weight_norm" in log and 0 <= log["accuracy"] <= 1 for log in logs)


def test_training_is_reproducible_with_a_seed(digits):
    def run(seed):
        torch.manual_seed(123)
        model = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10))
        train, _ = loaders(digits, 64, seed=0)
        train_classifier(model, train, epochs=2, lr=0.05, progress=False, seed=seed)
        return model.state_dict()

    a, b, c = run(7), run(7), run(8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_seeded_training_leaves_the_global_rng_alone(digits):
    model = mlp()
    train, _ = loaders(digits, 256, seed=0)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    train_classifier(model, train, epochs=1, lr=0.01, progress=False, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_divergence_raises(digits):
    model = mlp()
    x, y = digits.train.tensors
    bad = DataLoader(torch.utils.data.TensorDataset(x[:8] * float("nan"), y[:8]), batch_size=8)
    with pytest.raises(InvalidParameterError, match="epoch 1"):
        train_classifier(model, bad, epochs=1, lr=0.1, progress=False)


def test_progress_bar_runs(digits):
    model = mlp()
    train, _ = loaders(digits, 512, seed=0)
    logs = train_classifier(model, train, epochs=1, lr=0.01, progress=True)
    assert len(logs) == 1


def test_float64_models_train_and_evaluate_on_float32_data(digits):
    model = mlp(64, (16,), 10).double()
    train, test = loaders(digits, 128, seed=0)
    logs = train_classifier(model, train, epochs=2, lr=0.05, progress=False, seed=0)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x, y = digits.test.tensors
    with torch.no_grad():
        expected = int((model(x.double()).argmax(1) == y).sum()) / len(y)
    assert evaluate(model, test) == expected and logs[-1]["loss"] < logs[0]["loss"]
