"""The prune-rewind-retrain protocol (library API, your own training) and ``pathlift prune``."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from cli_runner import invoke
from pathlift.data import load_digits, loaders
from pathlift.data.training import train_classifier
from pathlift.distributed import fingerprint
from pathlift.errors import InvalidParameterError
from pathlift.graph.boundary import prune_masks
from pathlift.jobs.prune import Method, PruneConfig, RunFolder, SGDTraining, prune_rewind_retrain
from pathlift.jobs.prune.protocol import _masked
from pathlift.models import mlp, model_factory, read_checkpoint, save_checkpoint
from pathlift.prune import magnitude_scores

SHAPE = (1, 8, 8)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _small_mlp() -> nn.Module:
    return mlp(64, (32,), 10)


def test_prune_command_short_run(tmp_path: Path) -> None:
    result = invoke(*[
        "prune", "--data", "digits", "--model", "mlp", "--epochs", "2", "--rewind-epoch",
        "1", "--seeds", "1", "--amount", "0.8", "--method", "path-magnitude-global",
        "--method", "magnitude-layerwise", "--method", "path-magnitude-layerwise",
        "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    runs = _rows(tmp_path / "runs.csv")
    assert len(runs) == 6  # 3 methods, with and without the random rescale
    by = {(r["method"], r["rescaled"]): r for r in runs}
    for method in ("path-magnitude-global", "path-magnitude-layerwise"):
        # rescaling-invariant mask + seeded retraining: the very same run
        for field in ("accuracy", "sparsity", "mask_digest"):
            assert by[method, "True"][field] == by[method, "False"][field]
    assert by["magnitude-layerwise", "True"]["mask_digest"] != \
        by["magnitude-layerwise", "False"]["mask_digest"]
    for r in runs:  # --amount 0.8: 80% of the prunable weights (of each layer, layerwise)
        assert float(r["sparsity"]) == pytest.approx(0.8, abs=1e-4)
        assert float(r["log10_path_metric"]) <= float(r["log10_bound"]) + 1e-9
        assert 0.0 <= float(r["accuracy"]) <= 1.0
        assert (r["world_size"], r["spread"]) == ("1", "data")
        assert 0.0 <= float(r["overlap"]) <= 100.0
    assert float(by["magnitude-layerwise", "False"]["overlap"]) == 100.0
    assert (tmp_path / "summary.png").stat().st_size > 10_000
    assert (tmp_path / "dense" / "seed0-trained.safetensors").is_file()


def test_rewound_model_keeps_early_weights_under_the_mask_while_retraining() -> None:
    torch.manual_seed(0)
    early = _small_mlp().state_dict()
    trained = _small_mlp()
    mask = (torch.rand(32, 64) > 0.5).float()
    nn.utils.prune.custom_from_mask(trained[1], "weight", mask)
    rewound = _masked(_small_mlp(), early, prune_masks(trained))
    torch.testing.assert_close(rewound[1].weight, early["1.weight"] * mask)
    train, _ = loaders(load_digits(), 64, 0)
    train_classifier(rewound, train, 1, 0.05, progress=False, seed=0)
    assert torch.all(rewound[1].weight[mask == 0] == 0)
    assert not torch.equal(rewound[1].weight_orig[mask == 1], early["1.weight"][mask == 1])


def test_lottery_rounds_reach_the_requested_sparsity() -> None:
    training = SGDTraining(*loaders(load_digits(), 128, 0))
    config = PruneConfig(amounts=(0.75,), methods=("magnitude-global",), seeds=(0,), epochs=2,
                         rewind_epoch=1, rounds=2, last_layer_factor=1.0)
    result = prune_rewind_retrain(_small_mlp, SHAPE, training.train, training.evaluate, config)
    assert [r.sparsity for r in result.runs] == pytest.approx([0.75, 0.75], abs=2e-3)


def test_your_training_loop_and_your_score_function(tmp_path: Path) -> None:
    """A loop that is not pathlift's (Adam, hand-made batches, no DataLoader) and a criterion
    that prunes the LARGEST weights; the masks are checked against an independent top-k."""
    digits = load_digits()
    (x_train, y_train), (x_test, y_test) = digits.train.tensors, digits.test.tensors
    calls = []

    def my_train(model: nn.Module, epochs: int, phase) -> None:
        calls.append((phase.name, epochs, phase.start_epoch))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        order = torch.Generator().manual_seed(phase.seed)
        for _ in phase.epochs(epochs):
            perm = torch.randperm(len(x_train), generator=order)
            for i in range(0, len(perm), 128):
                opt.zero_grad()
                batch = perm[i:i + 128]
                nn.functional.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
                opt.step()

    def my_evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            return float((model(x_test).argmax(1) == y_test).double().mean())

    def largest(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
        return {n: 1.0 / (s + 1e-12) for n, s in magnitude_scores(model, input_shape).tensors
                .items()}

    config = PruneConfig(amounts=(0.5,), methods=("magnitude-global",
                                                  Method("largest-global", largest)),
                         seeds=(0,), epochs=3, rewind_epoch=1, last_layer_factor=1.0,
                         rescaled=(False,))
    folder = RunFolder(tmp_path)
    result = prune_rewind_retrain(_small_mlp, SHAPE, my_train, my_evaluate, config,
                                  folder=folder)
    assert calls == [("dense", 3, 0), ("retrain", 2, 1), ("retrain", 2, 1)]
    mag, big = result.runs
    assert (mag.method, big.method) == ("magnitude-global", "largest-global")
    assert big.overlap == 0.0  # the largest half and the smallest half share nothing
    assert big.pruned_accuracy < 0.3 < mag.pruned_accuracy
    assert mag.sparsity == big.sparsity == 0.5
    # independent: the masks of the k smallest / k largest |theta_i| of the trained weights
    trained = _small_mlp()
    trained.load_state_dict(folder.load_dense(0).trained)
    names = ("1.weight", "3.weight")
    weights = [trained.state_dict()[n].abs() for n in names]
    flat = torch.cat([w.reshape(-1) for w in weights])
    k = round(0.5 * flat.numel())
    for record, largest_first in ((mag, False), (big, True)):
        keep = torch.ones_like(flat)
        keep[flat.topk(k, largest=largest_first).indices] = 0
        masks = dict(zip(names, keep.split([w.numel() for w in weights]), strict=True))
        masks = {n: m.reshape(w.shape) for (n, m), w in zip(masks.items(), weights, strict=True)}
        assert fingerprint(masks)[:16] == record.mask_digest


def test_killed_run_resumes_from_its_last_finished_run(tmp_path: Path) -> None:
    training = SGDTraining(*loaders(load_digits(), 128, 0))
    config = PruneConfig(amounts=(0.5, 0.8), methods=("magnitude-global",
                                                      "path-magnitude-global"),
                         seeds=(0, 1), epochs=2, rewind_epoch=1, rescaled=(False,))
    calls = []

    def dying(model: nn.Module, epochs: int, phase) -> None:
        calls.append(phase.name)
        if len(calls) == 6:  # 2 dense trainings and 3 runs done: killed in the 4th run
            raise KeyboardInterrupt
        training.train(model, epochs, phase)

    with pytest.raises(KeyboardInterrupt):
        prune_rewind_retrain(_small_mlp, SHAPE, dying, training.evaluate, config,
                             folder=RunFolder(tmp_path / "killed"))
    before = (tmp_path / "killed" / "runs.csv").read_text()
    assert before.count("\n") == 1 + 3
    calls.clear()
    resumed = prune_rewind_retrain(_small_mlp, SHAPE, dying, training.evaluate, config,
                                   folder=RunFolder(tmp_path / "killed"))
    assert calls == ["retrain"] * 5  # the dense weights are read back, 5 runs remain
    after = (tmp_path / "killed" / "runs.csv").read_text()
    assert after.startswith(before)  # appended, never rewritten
    whole = prune_rewind_retrain(_small_mlp, SHAPE, training.train, training.evaluate, config,
                                 folder=RunFolder(tmp_path / "whole"))
    assert (tmp_path / "whole" / "runs.csv").read_text() == after
    assert resumed == whole
    with pytest.raises(InvalidParameterError, match="other settings"):
        prune_rewind_retrain(_small_mlp, SHAPE, training.train, training.evaluate,
                             dataclasses.replace(config, epochs=3),
                             folder=RunFolder(tmp_path / "killed"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["small_cnn", "mlp"])
def test_digits_experiment_meets_the_issue_targets(tmp_path: Path, model: str) -> None:
    """The README experiment: 3 seeds, 40/60/80% pruned (minutes on 2 CPU cores)."""
    result = invoke(*[
        "prune", "--data", "digits", "--model", model, "--epochs", "20", "--out",
        str(tmp_path)])
    assert result.exit_code == 0, result.output
    runs = _rows(tmp_path / "runs.csv")
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


def test_a_score_function_of_the_wrong_shape_is_refused() -> None:
    def bad(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
        return {"1.weight": torch.ones(3)}

    with pytest.raises(InvalidParameterError, match=r"bad.*shape \(32, 64\) for '1.weight'"):
        Method("bad-global", bad).prune(_small_mlp(), SHAPE, 0.5)


def test_model_factory_from_a_name_a_module_and_a_checkpoint(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    assert model_factory("small_cnn", num_classes=7)().classifier[-1].out_features == 7
    (tmp_path / "my_nets.py").write_text(
        "from torch import nn\n"
        "def tiny():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))\n"
        "def broken():\n"
        "    return 3\n")
    monkeypatch.chdir(tmp_path)
    make = model_factory("my_nets:tiny")
    assert make() is not make() and make()[-1].out_features == 4
    with pytest.raises(InvalidParameterError, match="returned a int"):
        model_factory("my_nets:broken")()
    with pytest.raises(InvalidParameterError, match="cannot import 'my_nets:absent'"):
        model_factory("my_nets:absent")
    saved = save_checkpoint(mlp(), tmp_path / "net.safetensors", "mlp")
    first, second = model_factory(str(saved))(), model_factory(str(saved))()
    assert first is not second
    state = read_checkpoint(saved).state_dict
    assert all(torch.equal(v, state[k]) for k, v in first.state_dict().items())


def test_prune_command_takes_your_factory_and_synthetic_data(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    (tmp_path / "cli_nets.py").write_text(
        "from torch import nn\n"
        "def four():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))\n"
        "def ten():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(12, 10))\n")
    monkeypatch.chdir(tmp_path)
    common = ["prune", "--data", "synthetic", "--input-shape", "3", "--input-shape", "4",
              "--epochs", "2", "--rewind-epoch", "1", "--seeds", "1", "--amount", "0.5",
              "--method", "path-magnitude-layerwise"]
    result = invoke(*[*common, "--model", "cli_nets:four", "--out", "out"])
    assert result.exit_code == 0, result.output
    (row, rescaled) = _rows(tmp_path / "out" / "runs.csv")
    assert row["accuracy"] == rescaled["accuracy"] and float(row["accuracy"]) > 0.5
    result = invoke(*[*common, "--model", "cli_nets:ten"])
    assert result.exit_code == 2 and "10 outputs, synthetic has 4 classes" in result.output
    assert not (tmp_path / "runs").exists()


def test_the_digits_default_gives_the_same_numbers_whatever_the_thread_count() -> None:
    """Float sums are ordered by the thread count: SGDTraining fixes it (and restores the
    caller's settings), so runs agree to the last digit."""
    train, test = loaders(load_digits(), 128, 0)
    config = PruneConfig(amounts=(0.5,), methods=("magnitude-global",), seeds=(0,), epochs=2,
                         rewind_epoch=1)
    results = []
    for threads in (2, 1):
        torch.set_num_threads(threads)
        try:
            training = SGDTraining(train, test)
            results.append(prune_rewind_retrain(lambda: mlp(64, (32,), 10), (1, 8, 8),
                                                training.train, training.evaluate, config))
            assert torch.get_num_threads() == threads
            assert not torch.are_deterministic_algorithms_enabled()
        finally:
            torch.set_num_threads(1)
    assert results[0].runs == results[1].runs
