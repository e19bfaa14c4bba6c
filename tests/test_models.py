"""Reference architectures: shapes, tracing, parameter counts and torchvision names."""

from __future__ import annotations

import time

import pytest
import torch

from pathlift.data import load_digits, loaders
from pathlift.data.training import evaluate, train_classifier
from pathlift.errors import InvalidParameterError
from pathlift.graph import trace
from pathlift.models import mlp, small_cnn


def test_mlp_layers_and_shapes():
    model = mlp(64, (32, 16), 10)
    assert [tuple(p.shape) for p in model.parameters()] == [
        (32, 64), (32,), (16, 32), (16,), (10, 16), (10,)]
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 10)
    assert model(torch.zeros(5, 64)).shape == (5, 10)
    trace(model.eval(), (1, 8, 8))
    with pytest.raises(InvalidParameterError):
        mlp(64, (0,), 10)


def test_small_cnn_shapes_and_trace():
    model = small_cnn(in_channels=2, num_classes=7).eval()
    assert model(torch.zeros(3, 2, 8, 8)).shape == (3, 7)
    graph = trace(model, (2, 8, 8))
    assert len(graph.layers()) == 4


def test_small_cnn_learns_digits():
    torch.manual_seed(0)
    digits = load_digits()
    train, test = loaders(digits, 64, seed=0)
    model = small_cnn()
    start = time.perf_counter()
    train_classifier(model, train, epochs=15, lr=0.05, progress=False, seed=0)
    assert time.perf_counter() - start < 30
    assert evaluate(model, test) >= 0.95
