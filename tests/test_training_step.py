"""Measuring a network in the middle of a training step leaves the step alone: path-norms
and path-magnitude scores computed between ``loss = model(x).sum()`` and
``loss.backward()`` keep the backward working and the gradients bit-identical."""

from __future__ import annotations

import pytest
import torch

from nets import SHAPE, residual_cnn
from pathlift.graph import eval_mode
from pathlift.lift import path_norm, path_norms
from pathlift.prune import path_magnitude_scores


def _measure(model) -> None:
    path_norm(model, SHAPE)
    path_norms(model, SHAPE, dtype=torch.float32)
    path_magnitude_scores(model, SHAPE, dtype=torch.float32)


@pytest.mark.parametrize("training", [False, True])
def test_gradients_are_bit_identical_with_and_without_the_measurement(training):
    x = torch.randn((6, *SHAPE), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads, buffers = [], []
    for measure in (False, True):
        model = residual_cnn()  # same seed: same weights and statistics
        model.train(training)
        loss = model(x).square().sum()
        if measure:
            with eval_mode(model):  # BatchNorm counts with its running statistics
                _measure(model)
            assert model.training is training
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        buffers.append([b.clone() for b in model.buffers()])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(*buffers, strict=True):
        assert torch.equal(a, b)  # running statistics untouched by the measurement


def test_the_parameters_versions_and_grads_are_untouched():
    model = residual_cnn()
    versions = [p._version for p in (*model.parameters(), *model.buffers())]
    _measure(model)
    assert [p._version for p in (*model.parameters(), *model.buffers())] == versions
    assert all(p.grad is None for p in model.parameters())
