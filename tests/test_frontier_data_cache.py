"""frontier's ``--data-cache`` (issue 39): a cached MNIST-1D set records how it was made
(generator, size, split, seed, standardisation) and a digest of its tensors; a set made
otherwise (the old standardisation with train + test statistics, no record) is made again
with a warning, a changed file is refused in one line, a matching one is reused."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pathlift.errors import InvalidParameterError
from pathlift.jobs import frontier

# found, not imported: MNIST-1D imports matplotlib's pyplot, which every process collecting
# the suite would pay for; the tests import it when they run
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mnist1d") is None,
                                reason="needs mnist1d (pip install pathlift[data])")

N = 200


def _old_cache(path) -> None:
    """A cache as the old code wrote it: no record, both splits standardised with the
    statistics of train and test together."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.train_split, args.seed = N, 0.8, 42
    data = make_dataset(args)  # the package standardises with both splits
    save_file({"x_train": torch.tensor(data["x"], dtype=torch.float32)[:, None],
               "y_train": torch.tensor(data["y"], dtype=torch.int64),
               "x_test": torch.tensor(data["x_test"], dtype=torch.float32)[:, None],
               "y_test": torch.tensor(data["y_test"], dtype=torch.int64)}, str(path))


def test_a_cache_made_under_the_old_standardisation_is_made_again(tmp_path):
    path = tmp_path / f"mnist1d-{N}.safetensors"
    _old_cache(path)
    old = load_file(str(path))["x_train"].double()
    assert abs(float(old.mean())) > 1e-3  # train + test statistics: not centred on train
    with pytest.warns(UserWarning, match="made otherwise.*standardisation"):
        data = frontier._cached_mnist1d(tmp_path, N)
    x = data.train.tensors[0].double()
    # standardised with the training split's own statistics, computed here in float64
    assert abs(float(x.mean())) < 1e-6 and abs(float(x.std(unbiased=False)) - 1) < 1e-5
    assert torch.equal(x.float(), frontier.load_mnist1d(N).train.tensors[0])
    again = load_file(str(path))
    assert torch.equal(again["x_train"], data.train.tensors[0])


def test_a_matching_cache_is_reused_without_generating(tmp_path, monkeypatch):
    first = frontier._cached_mnist1d(tmp_path, N)
    monkeypatch.setattr(frontier, "load_mnist1d", lambda *a, **k: pytest.fail("regenerated"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = frontier._cached_mnist1d(tmp_path, N)
    for a, b in zip(first.train.tensors + first.test.tensors,
                    second.train.tensors + second.test.tensors, strict=True):
        assert torch.equal(a, b)


def test_a_cache_of_another_size_or_recipe_is_made_again(tmp_path, monkeypatch):
    frontier._cached_mnist1d(tmp_path, N)
    recipe = frontier._mnist1d_recipe
    monkeypatch.setattr(frontier, "_mnist1d_recipe",
                        lambda n: {**recipe(n), "seed": "7"})
    with pytest.warns(UserWarning, match=r"made otherwise \(seed\)"):
        frontier._cached_mnist1d(tmp_path, N)


@pytest.mark.parametrize("damage", ["tensor", "bytes"])
def test_a_changed_cache_is_refused_in_one_line(tmp_path, damage):
    path = tmp_path / f"mnist1d-{N}.safetensors"
    frontier._cached_mnist1d(tmp_path, N)
    if damage == "tensor":  # a value changed, the record kept
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        t = load_file(str(path))
        t["x_train"][0, 0, 0] += 1
        save_file(t, str(path), metadata=meta)
        match = "do not match the digest"
    else:
        path.write_bytes(np.arange(10, dtype=np.uint8).tobytes())
        match = "not a safetensors file"
    with pytest.raises(InvalidParameterError, match=match) as err:
        frontier._cached_mnist1d(tmp_path, N)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
