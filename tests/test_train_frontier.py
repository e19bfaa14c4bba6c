"""The frontier experiment on a tiny grid, and MNIST-1D generated offline."""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest
import torch

from pathlift.jobs.frontier import FrontierConfig, run_frontier, write_frontier


def test_mnist1d_is_generated_offline():
    pytest.importorskip("mnist1d")
    from pathlift.data.mnist1d import load_mnist1d

    data = load_mnist1d(200)
    x, y = data.train.tensors
    assert x.shape == (160, 1, 40) and data.test.tensors[0].shape == (40, 1, 40)
    assert x.dtype == torch.float32 and set(y.tolist()) <= set(range(10))
    assert torch.equal(load_mnist1d(200).train.tensors[0], x)  # deterministic in the seed


def test_frontier_table_and_files(tmp_path):
    config = FrontierConfig(datasets=("digits",), models=("mlp",),
                            sweep={"none": (0.0,), "log-l1": (0.1, 1.0), "path-sgd": (0.3,),
                                   "imp-rewind": (0.5,)}, epochs=3, mnist1d_sizes=(),
                            batch_size=128)
    result = run_frontier(config)
    assert [p.method for p in result.points] == ["none", "log-l1", "log-l1", "path-sgd",
                                                 "imp-rewind"]
    rows = {r["method"]: r for r in result.table()}
    ref = result.reference("digits", "mlp").train_accuracy  # chosen on training data only
    for method, row in rows.items():
        mine = [p for p in result.points if p.method == method]
        close = [p.bound_log10 for p in mine if p.train_accuracy >= ref - 0.02]
        if close:
            assert row["close_bound_log10"] == min(close)
        else:
            assert math.isnan(row["close_bound_log10"])
        above = [p.bound_log10 for p in mine if p.train_accuracy > 0.5]
        if above:
            assert row["above50_bound_log10"] == min(above)
        occam = [p.compression_bound for p in mine if p.train_accuracy > 0.5]
        if occam:
            assert row["compression_bound"] == min(occam)
    for p in result.points:  # validity costs log terms: never below the thesis' form
        assert p.bound_log10 >= p.thesis_bound_log10
        assert p.compression_bound > 0 and p.compression_bits > 0
    assert rows["none"]["close_bound_log10"] == result.reference("digits", "mlp").bound_log10
    paths = write_frontier(result, tmp_path)
    assert [p.name for p in paths] == ["frontier.csv", "frontier_table.csv", "frontier.png",
                                       "frontier.md"]
    with paths[0].open() as f:
        written = list(csv.DictReader(f))
    assert [float(r["bound_log10"]) for r in written] == \
        pytest.approx([p.bound_log10 for p in result.points])
    assert [float(r["validity_gap_log10"]) for r in written] == \
        pytest.approx([p.bound_log10 - p.thesis_bound_log10 for p in result.points])
    assert "Best compression point" in paths[3].read_text()
    best = result.best()
    assert best is None or math.isfinite(best.bound_log10)


def test_frontier_experiment_is_the_command_in_one_call(tmp_path):
    """run_frontier and write_frontier by hand give the same points, the same CSV files and
    frontier.md, whose text the result carries; the folder callable is called once."""
    from pathlift.jobs.frontier import frontier_experiment

    config = FrontierConfig(datasets=("digits",), models=("mlp",),
                            sweep={"none": (0.0,), "imp-rewind": (0.5,)}, epochs=3,
                            mnist1d_sizes=(), batch_size=256)
    seen, folders = [], []

    def folder():
        folders.append(tmp_path / "one")
        return folders[-1]

    done = frontier_experiment(config, folder, on_progress=lambda *a: seen.append(a))
    assert folders == [tmp_path / "one"] and done.folder == folders[0]
    assert [(i, n) for _, i, n in seen] == [(1, 2), (2, 2)]
    by_hand = run_frontier(config)
    untimed = [dataclasses.replace(p, seconds=0.0) for p in by_hand.points]
    assert [dataclasses.replace(p, seconds=0.0) for p in done.result.points] == untimed
    paths = write_frontier(by_hand, tmp_path / "two")
    assert [p.name for p in done.paths] == [p.name for p in paths]

    def rows(path):  # every column but the wall-clock seconds
        with path.open() as f:
            return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]

    assert rows(done.paths[0]) == rows(paths[0])
    assert done.paths[1].read_text() == paths[1].read_text()  # frontier_table.csv
    assert done.paths[3].read_text() == paths[3].read_text()  # frontier.md
    assert done.markdown == (done.folder / "frontier.md").read_text()
    assert "\n" not in repr(done) and repr(done).startswith("FrontierRun(2 points")


def test_recipes_on_compact_models(tmp_path):
    """prune-retrain and box-robust on the compact MLP: the pruned fraction is exactly 0
    afterwards (no masks left), and the points carry both certificates."""
    from pathlift.train.recipes import compact_model, train_recipe

    config = FrontierConfig(datasets=("digits",), models=("mlp-small",),
                            sweep={"prune-retrain": (0.5,), "box-robust": (2**-7,)},
                            recipe_epochs={"digits": 4}, mnist1d_sizes=())
    result = run_frontier(config)
    assert [p.method for p in result.points] == ["prune-retrain", "box-robust"]
    assert all(p.compression_bits > 0 and p.bound_log10 >= p.thesis_bound_log10
               for p in result.points)
    x = torch.rand(64, 1, 8, 8)
    y = torch.randint(10, (64,))
    model = compact_model("mlp-small", (1, 8, 8))
    train_recipe(model, x, y, "box-robust", 2**-6, 2, 32, 3e-3, 0)
    assert not hasattr(model[1], "weight_orig") and not hasattr(model[3], "weight_orig")
    zeros = int((model[1].weight == 0).sum() + (model[3].weight == 0).sum())
    assert zeros == round(0.6 * (640 + 100))  # global pruning of 60% of the weights
    assert compact_model("cnn-small", (1, 40))(torch.rand(2, 1, 40)).shape == (2, 10)
    wide = compact_model("cnn-wide", (1, 40))
    assert wide(torch.rand(2, 1, 40)).shape == (2, 10)
    convs, head = 16 * 6 + 32 * (16 * 5 + 1), (32 * 10 + 1) * 10
    assert sum(p.numel() for p in wide.parameters()) == convs + head
    assert compact_model("cnn-wide", (1, 28, 28))(torch.rand(2, 1, 28, 28)).shape == (2, 10)
