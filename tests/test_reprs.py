"""Results print well: a short repr with the headline numbers, never whole tensors."""

from __future__ import annotations

from pathlift.bounds import generalization_bounds
from pathlift.data import loaders, synthetic
from pathlift.jobs.report import measure_report
from pathlift.lift import path_norm
from pathlift.models import mlp
from pathlift.prune import path_magnitude_scores
from pathlift.summary import summary


def test_result_reprs_are_one_short_line() -> None:
    model = mlp(64, (32,), 4).eval()
    split = synthetic(n_train=64, n_test=32)
    scores = path_magnitude_scores(model, (1, 8, 8))
    bounds = generalization_bounds(model, (1, 8, 8), *loaders(split, 32, 0))
    report, _ = measure_report(model, (1, 8, 8), split)
    for result in (scores, bounds, report, summary(model, (1, 8, 8)), split):
        text = repr(result)
        assert "\n" not in text and len(text) < 300 and "tensor(" not in text, text
    assert f"{scores.numel():,} coordinates" in repr(scores)
    assert f"{path_norm(model, (1, 8, 8)).log10:.3f}" in repr(bounds)
