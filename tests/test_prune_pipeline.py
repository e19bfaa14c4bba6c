"""The prune-rewind-retrain pipeline and the ``pathlift prune`` command."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from pathlift.cli import app
from pathlift.data import load_digits, loaders
from pathlift.graph.boundary import prune_masks
from pathlift.models import mlp
from pathlift.prune.pipeline import PruneConfig, _masked, run_experiment


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_prune_command_short_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "prune", "--dataset", "digits", "--model", "mlp", "--epochs", "2", "--rewind-epoch",
        "1", "--seeds", "1", "--amount", "0.8", "--method", "path-magnitude-global",
        "--method", "magnitude-layerwise", "--method", "path-magnitude-layerwise",
        "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    runs = _rows(tmp_path / "prune_digits_mlp.csv")
    assert len(runs) == 6  # 3 methods, with and without the random rescale
    by = {(r["method"], r["rescaled"]): r for r in runs}
    for method in ("path-magnitude-global", "path-magnitude-layerwise"):
        # rescaling-invariant mask + seeded retraining: the very same accuracy
        assert by[method, "True"]["accuracy"] == by[method, "False"]["accuracy"]
        assert by[method, "True"]["sparsity"] == by[method, "False"]["sparsity"]
    for r in runs:  # 80% of the hidden layers, 40% of the last one (thesis convention)
        assert 0.75 < float(r["sparsity"]) < 0.8
        assert float(r["log10_path_metric"]) <= float(r["log10_bound"]) + 1e-9
        assert 0.0 <= float(r["accuracy"]) <= 1.0
    overlaps = _rows(tmp_path / "prune_digits_mlp_overlap.csv")
    assert [o["scope"] for o in overlaps] == ["layerwise"]
    assert all(0.0 <= float(o["overlap"]) <= 100.0 for o in overlaps)
    assert (tmp_path / "prune_digits_mlp.png").stat().st_size > 10_000
    # the printed table has the README's rows: dense accuracy and the mask overlap
    printed = {line.split("│")[1].strip(): line.split("│")[2].strip()
               for line in result.output.splitlines() if line.count("│") == 3}
    assert printed["dense (not pruned)"] == f"{100 * float(runs[0]['dense_accuracy']):.1f} ± 0.0"
    assert printed["mask overlap magnitude/path-magnitude, layerwise"] == \
        f"{float(overlaps[0]['overlap']):.0f}%"
    assert "mask overlap magnitude/path-magnitude, global" not in printed  # one method only


def test_the_experiment_gives_the_same_numbers_whatever_the_thread_count() -> None:
    """Float sums are ordered by the thread count: the pipeline fixes it (and restores the
    caller's settings), so runs agree to the last digit."""
    digits = load_digits()
    train, test = loaders(digits, 128, 0)
    config = PruneConfig(amounts=(0.5,), methods=("magnitude-global",), seeds=(0,), epochs=2,
                         rewind_epoch=1)
    results = []
    for threads in (2, 1):
        torch.set_num_threads(threads)
        try:
            results.append(run_experiment(lambda: mlp(64, (32,), 10), train, test,
                                          digits.input_shape, config))
            assert torch.get_num_threads() == threads
            assert not torch.are_deterministic_algorithms_enabled()
        finally:
            torch.set_num_threads(1)
    assert results[0].runs == results[1].runs
    assert results[0].dense_accuracy() == (results[0].runs[0].dense_accuracy, 0.0)


def test_rewound_model_keeps_early_weights_under_the_mask_while_retraining() -> None:
    torch.manual_seed(0)
    early = mlp(64, (16,), 10).state_dict()
    trained = mlp(64, (16,), 10)
    mask = (torch.rand(16, 64) > 0.5).float()
    nn.utils.prune.custom_from_mask(trained[1], "weight", mask)
    rewound = _masked(lambda: mlp(64, (16,), 10), early, prune_masks(trained))
    torch.testing.assert_close(rewound[1].weight, early["1.weight"] * mask)
    digits = load_digits()
    train, _ = loaders(digits, 64, 0)
    from pathlift.data.training import train_classifier

    train_classifier(rewound, train, 1, 0.05, progress=False, seed=0)
    assert torch.all(rewound[1].weight[mask == 0] == 0)
    assert not torch.equal(rewound[1].weight_orig[mask == 1], early["1.weight"][mask == 1])


def test_lottery_rounds_reach_the_requested_sparsity() -> None:
    digits = load_digits()
    train, test = loaders(digits, 128, 0)
    config = PruneConfig(amounts=(0.75,), methods=("magnitude-global",), seeds=(0,), epochs=2,
                         rewind_epoch=1, rounds=2, last_layer_factor=1.0)
    result = run_experiment(lambda: mlp(64, (32,), 10), train, test, digits.input_shape,
                            config)
    assert [r.sparsity for r in result.runs] == pytest.approx([0.75, 0.75], abs=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["small_cnn", "mlp"])
def test_digits_experiment_meets_the_issue_targets(tmp_path: Path, model: str) -> None:
    """The README experiment: 3 seeds, 40/60/80% pruned (minutes on 2 CPU cores)."""
    result = CliRunner().invoke(app, [
        "prune", "--dataset", "digits", "--model", model, "--epochs", "20", "--out",
        str(tmp_path)])
    assert result.exit_code == 0, result.output
    runs = _rows(tmp_path / f"prune_digits_{model}.csv")
    mean: dict[tuple[str, str, str], float] = {}
    for key in {(r["method"], r["rescaled"], r["amount"]) for r in runs}:
        accs = [float(r["accuracy"]) for r in runs if (r["method"], r["rescaled"],
                                                       r["amount"]) == key]
        mean[key] = 100 * sum(accs) / len(accs)
    for amount in ("0.4", "0.6", "0.8"):
        for scope in ("global", "layerwise"):
            path, mag = f"path-magnitude-{scope}", f"magnitude-{scope}"
            assert abs(mean[path, "False", amount] - mean[mag, "False", amount]) <= 2.0
            assert mean[path, "True", amount] == mean[path, "False", amount]
    for scope in ("global", "layerwise"):
        assert mean[f"magnitude-{scope}", "True", "0.8"] <= \
            mean[f"magnitude-{scope}", "False", "0.8"] - 10.0
