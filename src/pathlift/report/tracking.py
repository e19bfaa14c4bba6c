"""Training-time tracking of path-norms, the average-case path-norm and the bound."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from pathlift.bounds import (
    ArchitectureConstants,
    architecture_constants,
    cross_entropy_gap_log10,
    rademacher_peeling,
)
from pathlift.graph import eval_mode, graph_of
from pathlift.lift import average_case_path_norm, path_norm


class PathNormTracker:
    """A plain-PyTorch callback: ``on_epoch_end(model, epoch, logs)`` adds to ``logs``
    ``path_norm_log10_q{q}`` (thesis Thm 3.1.1) for each q, ``average_case`` (E_x
    ||A^T Phi||_1 on ``probe``, Sec. 7.2.2) and ``bound_ce_log10``, the log10 of the bound
    on the expected cross-entropy gap (Thm 4.1.1 with Thm 4.4.1, sigma = ``sigma``).

    Measures the model as in eval mode (its flags are restored); it is never modified, and
    its graph is traced once for the whole run. Call it once with epoch 0 before training
    to record the initialisation. ``history`` keeps every log.
    """

    def __init__(self, input_shape: Sequence[int], probe: torch.Tensor, n_train: int,
                 sigma: float, qs: Sequence[float] = (1.0, 2.0, 4.0)):
        self.input_shape = tuple(input_shape)
        self.probe, self.n_train, self.sigma, self.qs = probe, n_train, sigma, tuple(qs)
        self.constants: ArchitectureConstants | None = None
        self.history: list[dict[str, Any]] = []

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        with eval_mode(model):
            graph = graph_of(model, self.input_shape)
            if self.constants is None:
                self.constants = architecture_constants(graph)
            for q in self.qs:
                logs[f"path_norm_log10_q{q:g}"] = path_norm(graph, q=q, r=q).log10
            l1 = logs["path_norm_log10_q1"] if 1.0 in self.qs else path_norm(graph).log10
            logs["average_case"] = average_case_path_norm(graph, None, self.probe,
                                                          max_samples=None).mean
        logs["bound_ce_log10"] = cross_entropy_gap_log10(
            rademacher_peeling(self.constants, self.sigma, l1), self.n_train)
        self.history.append({"epoch": epoch, **logs})
