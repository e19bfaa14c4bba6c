"""Training-time tracking of path-norms, the average-case path-norm and the bound."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from pathlift.bounds import (
    ArchitectureConstants,
    constants_of_graph,
    cross_entropy_gap_log10,
    rademacher_peeling,
)
from pathlift.graph import trace
from pathlift.lift import average_case_path_norm, path_norm_of_graph


class PathNormTracker:
    """A plain-PyTorch callback: ``on_epoch_end(model, epoch, logs)`` adds to ``logs``
    ``path_norm_log10_q{q}`` (thesis Thm 3.1.1) for each q, ``average_case`` (E_x
    ||A^T Phi||_1 on ``probe``, Sec. 7.2.2) and ``bound_ce_log10``, the log10 of the bound
    on the expected cross-entropy gap (Thm 4.1.1 with Thm 4.4.1, sigma = ``sigma``).

    Works on an eval-mode copy; the trained model is never touched. Call it once with
    epoch 0 before training to record the initialisation. ``history`` keeps every log.
    """

    def __init__(self, input_shape: Sequence[int], probe: torch.Tensor, n_train: int,
                 sigma: float, qs: Sequence[float] = (1.0, 2.0, 4.0)):
        self.input_shape = tuple(input_shape)
        self.probe, self.n_train, self.sigma, self.qs = probe, n_train, sigma, tuple(qs)
        self.constants: ArchitectureConstants | None = None
        self.history: list[dict[str, Any]] = []

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        net = copy.deepcopy(model).eval()
        graph = trace(net, self.input_shape)
        if self.constants is None:
            self.constants = constants_of_graph(graph)
        for q in self.qs:
            logs[f"path_norm_log10_q{q:g}"] = path_norm_of_graph(graph, q, r=q).log10
        l1 = logs["path_norm_log10_q1"] if 1.0 in self.qs else path_norm_of_graph(graph).log10
        logs["average_case"] = average_case_path_norm(net, self.input_shape, self.probe,
                                                      max_samples=None).mean
        logs["bound_ce_log10"] = cross_entropy_gap_log10(
            rademacher_peeling(self.constants, self.sigma, l1), self.n_train)
        self.history.append({"epoch": epoch, **logs})
