"""The jobs' "trained in training mode, measured in eval mode" note asks the traced ops
(their ``training_problem``), never a list of classes: a user's BatchNorm subclass, Dropout
and RReLU (random in training mode) get it; a model whose ops compute the same in both
modes does not."""

from __future__ import annotations

import textwrap

import pytest
from torch import nn

from pathlift.graph import graph_of
from pathlift.graph.structure import training_mode_ops
from pathlift.jobs.prune import PruneConfig, prune_experiment
from pathlift.jobs.prune.experiment import EVAL_NOTE as PRUNE_NOTE
from pathlift.jobs.report.measure import EVAL_NOTE, measure_report


class MyNorm(nn.BatchNorm1d):
    """A user's BatchNorm: its own __init__, torch's forward."""

    def __init__(self, features: int):
        super().__init__(features, momentum=0.2)


def _net(middle: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), middle, nn.ReLU(), nn.Linear(6, 3))


CASES = [("Identity", nn.Identity(), False), ("LeakyReLU", nn.LeakyReLU(0.1), False),
         ("BatchNorm1d", nn.BatchNorm1d(6), True), ("MyNorm", MyNorm(6), True),
         ("Dropout", nn.Dropout(0.2), True), ("RReLU", nn.RReLU(), True)]


@pytest.mark.parametrize("middle, noted", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_report_notes_eval_mode_when_an_op_trains_otherwise(middle, noted):
    model = _net(middle)
    assert training_mode_ops(graph_of(model.eval(), (4,))) == (["1"] if noted else [])
    report, _ = measure_report(model.train(), (4,))
    assert report.notes == ((EVAL_NOTE,) if noted else ())
    assert model.training  # the caller's model is left as it was


def test_the_prune_job_notes_a_users_batchnorm_subclass(tmp_path, monkeypatch):
    (tmp_path / "usernets.py").write_text(textwrap.dedent("""
        from torch import nn

        class MyNorm(nn.BatchNorm1d):
            pass

        def net():
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), MyNorm(16), nn.ReLU(),
                                 nn.Linear(16, 10))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = PruneConfig((0.5,), ("magnitude-global",), (0,), 2, 1, rescaled=(False,))
    done = prune_experiment("usernets:net", "digits", config, tmp_path / "out")
    assert done.eval_note == PRUNE_NOTE
