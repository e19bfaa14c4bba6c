"""Regularised training through Lightning (PathNormRegularizer) against the same training
written by hand, and the tracker's certified top-1 bound."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pathlift.bounds import (
    architecture_constants,
    margins,
    rademacher_peeling,
    sigma_of,
)
from pathlift.bounds.union import fixed_class_margin_bound, union_margin_bound
from pathlift.lift import path_norm
from pathlift.models import mlp, small_cnn
from pathlift.track import PathNormTracker
from pathlift.train import PathNormBudget, make_penalty

SHAPE = (1, 8, 8)


@pytest.mark.parametrize("penalty, budget", [("log-l1", None), ("average-case", None),
                                             (None, 500.0)])
def test_lightning_regularizer_equals_the_hand_written_loop(tmp_path, penalty, budget):
    pl = pytest.importorskip("lightning.pytorch")
    from pathlift.integrations.lightning import PathNormRegularizer

    class Module(pl.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, index):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x, y = torch.rand(48, *SHAPE), torch.randint(10, (48,))
    net = small_cnn()
    mine = copy.deepcopy(net)
    strength = 0.5
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         callbacks=[PathNormRegularizer(SHAPE, penalty, strength, budget,
                                                        network="net")],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(Module(net), DataLoader(TensorDataset(x, y), batch_size=16))

    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    project = PathNormBudget(SHAPE, budget) if budget is not None else None
    term = make_penalty(penalty, SHAPE) if penalty is not None else None
    for xb, yb in zip(x.split(16), y.split(16), strict=True):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(mine(xb), yb)
        if term is not None:
            loss = loss + strength * term(mine, xb)
        loss.backward()
        opt.step()
        if project is not None:
            project.project_(mine)
    for a, b in zip(net.parameters(), mine.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    if budget is not None:
        assert path_norm(net, SHAPE).value == pytest.approx(budget, rel=1e-5)


def test_tracker_top1_bound():
    torch.manual_seed(0)
    model = mlp(64, (16,), 10)
    x, y = torch.rand(300, *SHAPE), torch.randint(10, (300,))
    row = PathNormTracker(SHAPE, sparsity=False, train_data=(x, y))(model, 0)
    m = margins(model, DataLoader(TensorDataset(x, y), batch_size=50))
    rademacher = rademacher_peeling(architecture_constants(model, SHAPE), sigma_of(x).peeling,
                                    path_norm(model, SHAPE).log10)
    expected = union_margin_bound(rademacher, m)
    assert row["bound_top1_log10"] == pytest.approx(expected.log10, rel=1e-12)
    fixed = PathNormTracker(SHAPE, sparsity=False, train_data=(x, y),
                            top1_form="fixed-class")(model, 0)
    assert fixed["bound_top1_log10"] == pytest.approx(
        fixed_class_margin_bound(rademacher, m).log10, rel=1e-12)
    assert fixed["bound_top1_log10"] <= row["bound_top1_log10"]


def test_lightning_callback_logs_the_top1_bound(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from pathlift.integrations.lightning import PathNormCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(64, (16,), 10)

        def training_step(self, batch, index):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x, y = torch.rand(64, *SHAPE), torch.randint(10, (64,))
    module = Module()
    callback = PathNormCallback(SHAPE, network="net", qs=(1.0,), train_data=(x, y))
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                         callbacks=[callback], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32))
    rows = callback.tracker.history
    assert [r["step"] for r in rows] == [1, 2]
    m = margins(module.net, DataLoader(TensorDataset(x, y), batch_size=64))
    rademacher = rademacher_peeling(architecture_constants(module.net, SHAPE),
                                    sigma_of(x).peeling, path_norm(module.net, SHAPE).log10)
    expected = union_margin_bound(rademacher, m)
    assert rows[-1]["bound_top1_log10"] == pytest.approx(expected.log10, rel=1e-12)


def test_lightning_prunes_a_batchnorm_resnet_as_global_path_magnitude_in_eval_mode(tmp_path):
    """A training epoch ends in training mode, where BatchNorm is not a neuron: the callback
    prunes in eval mode and gets exactly global_path_magnitude's masks on the same weights
    (a BatchNorm ResNet), training flags restored."""
    pl = pytest.importorskip("lightning.pytorch")
    from pathlift.integrations.lightning import PathNormCallback
    from pathlift.models import resnet18
    from pathlift.prune import global_path_magnitude

    shape = (3, 16, 16)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = resnet18(num_classes=4)

        def training_step(self, batch, index):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Snapshot(pl.Callback):  # runs before PathNormCallback: the weights it prunes
        def on_train_epoch_end(self, trainer, pl_module):
            self.state = copy.deepcopy(pl_module.net.state_dict())
            self.training = pl_module.net.training

    torch.manual_seed(0)
    x, y = torch.randn(16, *shape), torch.randint(4, (16,))
    module, snapshot = Module(), Snapshot()
    callback = PathNormCallback(shape, network="net", qs=(1.0,), prune_epoch=1, amount=0.5)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         callbacks=[snapshot, callback], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    assert snapshot.training and module.net.training  # flags as they were
    reference = resnet18(num_classes=4)
    reference.load_state_dict(snapshot.state)
    expected = global_path_magnitude(reference.eval(), shape, 0.5)
    got = {n: b for n, b in module.net.named_buffers() if n.endswith("_mask")}
    want = {n: b for n, b in reference.named_buffers() if n.endswith("_mask")}
    assert got.keys() == want.keys() and len(got) == 21
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert callback.pruning.pruned == expected.pruned
    assert callback.pruning.sparsity == pytest.approx(0.5, abs=1e-6)
