"""What the compiled chain's tests share (test_chain_kernel, test_chain_step,
test_penalty_backward): a user's MLP written in functional style, the plans recorded for a
model, Path-SGD's gamma against the walked pass, and the changes a chain must notice."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

from pathlift.graph import graph_of
from pathlift.lift.differentiable import magnitude_gradients
from pathlift.lift.replay import _PLANS
from pathlift.symmetry import random_rescale


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


def _replace(model: nn.Module) -> None:
    model[1].weight = nn.Parameter(torch.randn_like(model[1].weight))


def _prune(model: nn.Module) -> None:
    prune.l1_unstructured(model[1], "weight", amount=0.5)


def _rescale(model: nn.Module) -> None:
    rescaled = random_rescale(model, factors=(0.25, 1.0, 8.0), seed=2)
    with torch.no_grad():
        for p, new in zip(model.parameters(), rescaled.parameters(), strict=True):
            p.copy_(new)


def _new_storage(model: nn.Module) -> None:
    w = model[3].weight
    w.data = 1.5 * w.data  # the same Parameter object, new values in a new storage


def _non_contiguous(model: nn.Module) -> None:
    w = model[3].weight
    w.data = (2.0 * w.data).t().contiguous().t()


def _flip(model: nn.Module) -> None:
    model.train(not model.training)


#: changes a recorded chain must notice (a replaced, pruned or flipped model is recorded
#: again; a rescaling in place or a new storage keeps the plan)
CHANGES = {"replaced": _replace, "pruned": _prune, "rescaled in place": _rescale,
           ".data new storage": _new_storage, ".data non-contiguous": _non_contiguous,
           "train/eval flip": _flip}
