"""What the compiled chain's tests share (test_chain_kernel, test_chain_step): a user's
MLP written in functional style, the plans recorded for a model, and Path-SGD's gamma
against the walked pass."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pathlift.graph import graph_of
from pathlift.lift.differentiable import magnitude_gradients
from pathlift.lift.replay import _PLANS


class Subclassed(nn.Module):
    """Functional style: F.relu between subclassed Linear layers, a dict output."""

    class Dense(nn.Linear):
        pass

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = self.Dense(12, 9), self.Dense(9, 7, bias=False)
        self.c = self.Dense(7, 3)

    def forward(self, x):
        return {"logits": self.c(F.relu(self.b(F.relu(self.a(x.flatten(1))))))}


def plans(model: nn.Module) -> list:
    """The recorded plans of ``model`` (a ``Chain``, a transpose or None each)."""
    return [plan for _, _, plan in _PLANS[model].values()]


def assert_gamma_walked(model: nn.Module, shape: tuple[int, ...]) -> None:
    """Path-SGD's gamma = d||Phi||_2^2 / d|p|^2 equals the walked pass's (1e-12)."""
    got = magnitude_gradients(model, shape, 2.0)
    want = magnitude_gradients(graph_of(model, shape), q=2.0)
    assert got.mantissas.keys() == want.mantissas.keys()
    for p, gamma in want.mantissas.items():
        torch.testing.assert_close(got.mantissas[p] * math.exp(got.log_scale),
                                   gamma * math.exp(want.log_scale), rtol=1e-12, atol=0)
