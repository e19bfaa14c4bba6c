"""load_data: .npz, CSV, image folders and callables as one seeded train/test Split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from pathlift.data import Split, load_data
from pathlift.errors import InvalidParameterError, ShapeError
from user_files import write_project


@pytest.fixture
def project(tmp_path, monkeypatch):
    arrays = write_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    return arrays


def _all(split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.cat([split.train.tensors[0], split.test.tensors[0]]),
            torch.cat([split.train.tensors[1], split.test.tensors[1]]))


def test_npz_and_csv_hold_the_same_samples_split_the_same_way(project) -> None:
    npz, table = load_data("data.npz", seed=1), load_data("data.csv", seed=1)
    assert npz.input_shape == table.input_shape == (20,) and npz.num_classes == 3
    assert len(npz.test) == 38  # ceil(0.25 * 150)
    for a, b in zip(npz.train.tensors + npz.test.tensors,
                    table.train.tensors + table.test.tensors, strict=True):
        assert torch.equal(a, b)
    x, y = _all(npz)
    order = np.lexsort(project["x"].T[::-1])  # the same multiset of rows, labels attached
    mine = np.lexsort(x.numpy().T[::-1])
    assert np.array_equal(x.numpy()[mine], project["x"][order])
    assert np.array_equal(y.numpy()[mine], project["y"][order])
    assert not torch.equal(load_data("data.npz", seed=2).test.tensors[1], npz.test.tensors[1])


def test_a_csv_without_header_takes_the_last_column_as_label(tmp_path) -> None:
    (tmp_path / "plain.csv").write_text("0.5,1.5,1\n2.0,3.0,0\n1.0,1.0,1\n4.0,0.0,0\n")
    split = load_data(str(tmp_path / "plain.csv"), test_fraction=0.5)
    x, y = _all(split)
    pairs = {tuple(r): int(c) for r, c in zip(x.tolist(), y.tolist(), strict=True)}
    assert pairs == {(0.5, 1.5): 1, (2.0, 3.0): 0, (1.0, 1.0): 1, (4.0, 0.0): 0}


def test_an_npz_with_its_own_split_is_kept(tmp_path) -> None:
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.savez(tmp_path / "s.npz", x_train=x[:4], y_train=[0, 1, 0, 1], x_test=x[4:],
             y_test=[1, 0])
    split = load_data(str(tmp_path / "s.npz"), input_shape=(2, 2))
    assert split.input_shape == (2, 2) and torch.equal(split.test.tensors[0].reshape(2, 4),
                                                       torch.from_numpy(x[4:]))


def test_image_folders_are_channels_first_in_zero_one(project) -> None:
    from PIL import Image

    split = load_data("images", test_fraction=0.5)
    assert split.input_shape == (1, 8, 8) and split.num_classes == 3
    x, y = _all(split)
    first = np.asarray(Image.open("images/class0/0.png"), dtype=np.float32) / 255
    assert any(torch.allclose(img[0], torch.from_numpy(first)) and label == 0
               for img, label in zip(x, y, strict=True))
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_standardisation_uses_the_training_statistics(project) -> None:
    raw, split = load_data("data.npz"), load_data("data.npz", normalize="standard")
    mean, std = raw.train.tensors[0].mean(0), raw.train.tensors[0].std(0)
    assert torch.allclose(split.train.tensors[0].mean(0), torch.zeros(20), atol=1e-5)
    assert torch.allclose(split.test.tensors[0], (raw.test.tensors[0] - mean) / std, atol=1e-5)


def test_a_callable_returns_datasets(tmp_path, monkeypatch) -> None:
    (tmp_path / "mydata.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def load():\n"
        "    x = torch.arange(12.).reshape(6, 2)\n"
        "    return TensorDataset(x[:4], torch.tensor([0, 1, 2, 0])), \\\n"
        "        [(x[i], i % 3) for i in (4, 5)]\n")
    monkeypatch.chdir(tmp_path)
    split = load_data("mydata:load")
    assert split.num_classes == 3 and isinstance(split.test, TensorDataset)
    assert split.test.tensors[1].tolist() == [1, 2]


@pytest.mark.parametrize(("spec", "error", "match"), [
    ("nothing.npz", InvalidParameterError, "no data at"),
    ("mnist", InvalidParameterError, "unknown data 'mnist'"),
])
def test_wrong_data_says_what_to_give(spec, error, match, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=match):
        load_data(spec)


def test_bad_labels_and_shapes_are_refused(tmp_path) -> None:
    np.savez(tmp_path / "f.npz", x=np.zeros((8, 3)), y=np.full(8, 0.5))
    with pytest.raises(InvalidParameterError, match="integer class index"):
        load_data(str(tmp_path / "f.npz"))
    np.savez(tmp_path / "g.npz", x=np.zeros((8, 3)), y=np.arange(8) % 2)
    with pytest.raises(ShapeError, match="give an --input-shape"):
        load_data(str(tmp_path / "g.npz"), input_shape=(2, 2))
    with pytest.raises(InvalidParameterError, match="normalize"):
        load_data(str(tmp_path / "g.npz"), normalize="minmax")
