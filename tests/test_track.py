"""Path-norms along training: ``PathNormTracker`` in a plain loop, and the Lightning
callback (skipped without Lightning)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch import nn

from pathlift.data import load_digits, loaders
from pathlift.graph import copy_model
from pathlift.graph.boundary import prune_masks
from pathlift.lift import path_norms
from pathlift.models import mlp, small_cnn
from pathlift.prune import prune_model
from pathlift.track import PathNormTracker

SHAPE = (1, 8, 8)


def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 10))


def test_tracker_in_a_plain_loop_equals_path_norms_and_leaves_training_alone() -> None:
    torch.manual_seed(0)
    model, train = _bn_net(), loaders(load_digits(), 64, 0)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tracker = PathNormTracker(SHAPE, n_train=1347, sigma=30.0)
    for step, (x, y) in zip(range(5), train, strict=False):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        stats = model[1].running_mean.clone()
        row = tracker(model, step)  # between backward and step: nothing may move
        assert model.training and model[1].training
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(),
                                                          strict=True))
        assert torch.equal(stats, model[1].running_mean)
        for q, norm in path_norms(copy_model(model).eval(), SHAPE).items():
            assert row[f"path_norm_log10_q{q:g}"] == pytest.approx(norm.log10, rel=1e-12)
        opt.step()
    assert [r["step"] for r in tracker.history] == list(range(5))
    shifts = {round(r["bound_ce_log10"] - r["path_norm_log10_q1"], 10) for r in tracker.history}
    assert len(shifts) == 1  # the bound is C * ||Phi||_1: log-affine in the path-norm


def test_sparsity_and_path_magnitude_sparsity_count_cut_off_weights() -> None:
    torch.manual_seed(0)
    model = mlp(64, (16,), 10)
    with torch.no_grad():
        model[1].weight[0] = 0.0  # hidden neuron 0 gets no input and no bias:
        model[1].bias[0] = 0.0    # its 10 outgoing weights carry no path
        model[3].weight[3, 5] = 0.0
    row = PathNormTracker(SHAPE)(model)
    total = 64 * 16 + 16 * 10
    assert row["sparsity"] == (64 + 1) / total
    assert row["path_magnitude_sparsity"] == (64 + 1 + 10) / total


def test_lightning_callback_logs_path_norms_and_prunes_like_the_library(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger

    from pathlift.integrations.lightning import PathNormCallback

    class Digits(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = small_cnn()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, index):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    torch.manual_seed(0)
    module, train = Digits(), loaders(load_digits(), 64, 0)[0]
    callback = PathNormCallback(SHAPE, n_train=len(train.dataset), sigma=30.0, prune_epoch=2,
                                amount=0.5, network="net")
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[callback],
                         logger=CSVLogger(tmp_path), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1)
    trainer.fit(module, train)
    with (Path(trainer.logger.log_dir) / "metrics.csv").open() as f:
        logged = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in logged] == [0, 1]
    final = path_norms(module.net, SHAPE)
    for q, norm in final.items():  # the logger keeps float32
        assert float(logged[-1][f"pathlift/path_norm_log10_q{q:g}"]) == \
            pytest.approx(norm.log10, rel=1e-6, abs=1e-6)
        assert callback.tracker.history[-1][f"path_norm_log10_q{q:g}"] == norm.log10
    zeros = sum(int((m.weight == 0).sum()) for m in module.net.modules()
                if isinstance(m, nn.Linear | nn.Conv2d))
    total = sum(m.weight.numel() for m in module.net.modules()
                if isinstance(m, nn.Linear | nn.Conv2d))
    assert float(logged[-1]["pathlift/sparsity"]) == pytest.approx(zeros / total) == 0.5
    # pruned after the last epoch: weight_orig are the weights the masks were chosen on
    dense = small_cnn()
    dense.load_state_dict({k.replace("_orig", ""): v for k, v in module.net.state_dict().items()
                           if not k.endswith("_mask")})
    prune_model(dense, SHAPE, 0.5, "path-magnitude", "global")
    ours, theirs = prune_masks(module.net), prune_masks(dense)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
