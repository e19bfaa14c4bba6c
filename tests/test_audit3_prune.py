"""Issue 40, prune: what pruning will refuse is refused before any training (the same
checks run on the untrained model first), and ``--output`` picks the logits of a model
returning several tensors, as ``bounds --output`` does."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from cli_runner import invoke
from pathlift.errors import UnsupportedModelError
from pathlift.jobs.prune import PruneConfig, RunFolder, prune_rewind_retrain

MODELS = '''
import torch
from torch import nn
import torch.nn.functional as F


class Twice(nn.Module):
    """A subclassed model calling one hidden layer twice."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.inp, self.hidden = nn.Linear(64, 16), nn.Linear(16, 16)
        self.out = nn.Linear(16, num_classes)

    def forward(self, x):
        h = F.relu(self.inp(x.flatten(1)))
        h = F.relu(self.hidden(h))
        return self.out(F.relu(self.hidden(h)))


def shared_sequential(num_classes=10):
    """A Sequential holding the same Linear twice."""
    shared = nn.Linear(16, 16)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), shared, nn.ReLU(),
                         shared, nn.ReLU(), nn.Linear(16, num_classes))


class Heads(nn.Module):
    """A two-headed model in functional style returning a dict, or a tuple."""

    def __init__(self, as_tuple=False):
        super().__init__()
        self.trunk = nn.Linear(64, 32)
        self.logits, self.aux = nn.Linear(32, 10), nn.Linear(32, 2)
        self.as_tuple = as_tuple

    def forward(self, x):
        h = F.relu(self.trunk(x.flatten(1)))
        if self.as_tuple:
            return self.aux(h), self.logits(h)
        return {"logits": self.logits(h), "aux": self.aux(h)}


def heads_tuple():
    return Heads(as_tuple=True)
'''

FAST = ["--data", "digits", "--seeds", "1", "--amount", "0.5", "--method",
        "magnitude-global"]


@pytest.fixture
def user_models(tmp_path, monkeypatch) -> Path:
    (tmp_path / "audit_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("spec", ["audit_models:Twice", "audit_models:shared_sequential"])
def test_prune_refuses_a_layer_used_twice_before_training(user_models, spec):
    out = user_models / "out"
    start = time.perf_counter()
    result = invoke("prune", "--model", spec, *FAST, "--epochs", "100000", "--out", str(out))
    seconds = time.perf_counter() - start
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "called several times" in lines[0]
    assert seconds < 60  # 100000 epochs of training would take hours
    assert not out.exists()  # nothing written, no folder left


@pytest.mark.parametrize("methods", [("magnitude-global",),
                                     ("path-magnitude-layerwise", "magnitude-layerwise")])
def test_the_protocol_never_trains_a_model_it_cannot_prune(user_models, methods):
    from audit_models import Twice

    trained = []

    def train(model, epochs, phase):  # the marker: never called
        trained.append(phase.seed)

    config = PruneConfig(amounts=(0.5,), methods=methods, seeds=(0,), epochs=2,
                         rewind_epoch=1, rescaled=(False,))
    out = user_models / "run"
    with pytest.raises(UnsupportedModelError, match="hidden"):
        prune_rewind_retrain(Twice, (1, 8, 8), train, lambda m: 0.5, config,
                             folder=RunFolder(out))
    assert trained == [] and not out.exists()


def test_prune_without_output_names_the_outputs_and_the_option(user_models):
    result = invoke("prune", "--model", "audit_models:Heads", *FAST, "--epochs", "2",
                    "--rewind-epoch", "1", "--out", "out")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "'logits': (10,)" in lines[0] and "'aux': (2,)" in lines[0]
    assert "--output" in lines[0] and "12 outputs" not in lines[0]


@pytest.mark.parametrize(("spec", "key"), [
    pytest.param("audit_models:Heads", "logits", marks=pytest.mark.slow),
    ("audit_models:heads_tuple", "1")])
def test_prune_output_selects_the_logits(user_models, spec, key):
    result = invoke("prune", "--model", spec, *FAST, "--epochs", "2", "--rewind-epoch", "1",
                    "--output", key, "--out", "out")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(Path("out/runs.csv").read_text().splitlines()))
    assert len(rows) == 2 and all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    # the pruned network's logits: the dense network (trained on the selected output)
    # predicts the digits well above chance (1 in 10)
    assert float(rows[0]["dense_accuracy"]) > 0.3
    bad = invoke("prune", "--model", spec, *FAST, "--epochs", "2", "--rewind-epoch", "1",
                 "--output", "nope", "--out", "out2")
    assert bad.exit_code == 2 and "nope" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert not Path("out2").exists()


def test_check_prunable_accepts_what_prunes():
    """The preflight itself: a supported model passes, untouched."""
    from pathlift.jobs.prune.protocol import check_prunable
    from pathlift.models import mlp

    model = mlp(4, (3,), 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_prunable(lambda: model, (4,), PruneConfig(amounts=(0.5,), seeds=(0,), epochs=2,
                                                   rewind_epoch=1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(isinstance(m, nn.Module) and hasattr(m, "weight_mask")
                   for m in model.modules())
