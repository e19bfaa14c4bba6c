"""Surrogates for the disagreement route (``pathlift.bounds.disagreement``): a compact
network trained by a recipe (``pathlift.train.recipes``) to reproduce a trained target's
predictions on its own training inputs. The target is read, never retrained or modified;
the surrogate sees only the training inputs, so held-out unlabeled inputs stay unused."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from pathlift.graph import copy_model, unwrap
from pathlift.graph.boundary import flat_outputs
from pathlift.train.recipes import compact_model, train_recipe

__all__ = ["distil_surrogate", "predictions"]


def predictions(model: nn.Module, x: Tensor, batch: int = 4096) -> Tensor:
    """The top class of ``model`` (an eval-mode copy) on each input."""
    net = copy_model(unwrap(model)).eval()
    with torch.no_grad():
        return torch.cat([flat_outputs(net(xb), len(xb)).argmax(1) for xb in x.split(batch)])


def distil_surrogate(target: nn.Module, x: Tensor, num_classes: int, *,
                     kind: str = "cnn-small", method: str = "prune-retrain",
                     strength: float = 0.5, epochs: int = 20, batch_size: int = 128,
                     lr: float = 3e-3, seed: int = 0,
                     shape: Sequence[int] | None = None) -> nn.Module:
    """A ``compact_model(kind)`` trained with the recipe ``method`` at ``strength`` on
    (x, the target's top class on x): a surrogate that agrees with the target where the
    compression certificate can afford it. ``seed`` fixes its initialisation and batches."""
    labels = predictions(target, x)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        surrogate = compact_model(kind, tuple(shape or x.shape[1:]), num_classes)
    train_recipe(surrogate, x, labels, method, strength, epochs, batch_size, lr, seed)
    return surrogate.eval()
