"""Path-norms along training, from any training loop (thesis Thm 3.1.1, Thm 4.4.1; the
curves of its Figure E.2).

``PathNormTracker`` measures a model in the middle of training: the l^q path-norms, the
generalisation bound on the cross-entropy gap, the sparsity and the path-magnitude
sparsity (and the average-case path-norm on a probe batch). Call it every step or every
epoch; ``pathlift.integrations.lightning.PathNormCallback`` does so for Lightning.
"""

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
from pathlift.bounds.top1 import certified_top1
from pathlift.distributed import World
from pathlift.errors import InvalidParameterError
from pathlift.graph import AbsPowInterpreter, LayerGraph, eval_mode, graph_of, unwrap
from pathlift.graph.abs_pow import output_logs
from pathlift.graph.boundary import is_sharded
from pathlift.lift import average_case_path_norm, path_norm
from pathlift.lift.path_norm import LARGE_Q, mixed_norm_log
from pathlift.lift.replay import replayed
from pathlift.logspace import LN10
from pathlift.prune.scores import magnitude_scores, path_magnitude_scores

__all__ = ["PathNormTracker"]


class PathNormTracker:
    """Path-norms of a model along training, from any loop: ``tracker(model, step)``.

    Each call returns one row (and appends ``{"step": step, **row}`` to ``history``):

    - ``path_norm_log10_q{q}``: log10 ||Phi(theta)||_q for each q of ``qs`` (thesis Thm
      3.1.1, one |theta|^q pass each, recorded at the first call and replayed as plain
      tensor code after: ``pathlift.lift.replay``);
    - ``bound_ce_log10`` (given ``n_train`` and ``sigma``): log10 of the bound on the
      expected cross-entropy gap, Thm 4.1.1 with the Rademacher bound of Thm 4.4.1 (sigma
      is ``pathlift.bounds.Sigma.peeling``) in the thesis' fixed-class form (r = the
      network's own ||Phi||_1: a curve to follow, not a certificate);
    - ``sparsity``: the fraction of prunable coordinates (Linear/Conv weights) equal to 0;
      ``path_magnitude_sparsity``: the fraction whose Path-Mag is 0 (no path of non-zero
      weights crosses them: pruned, or cut off by pruning elsewhere; Sec. 3.5.1), one
      forward and one backward |theta| pass (``sparsity=False`` skips both);
    - ``average_case`` (given a ``probe`` batch): E_x ||A(theta, x)^T Phi(theta)||_1 (Sec.
      7.2.2);
    - ``bound_top1_log10`` (given ``train_data`` = (x, y), the training set): log10 of the
      certified top-1 error bound of Thm 4.1.2 with Thm 4.4.1, valid as stated (the union
      over radii and margins fixed in advance, ``pathlift.bounds.union``; ``top1_form=
      "fixed-class"`` for the thesis' form), by ``pathlift.bounds.top1.certified_top1``:
      one |theta| pass and a forward over x.

    The model is measured as in eval mode (its flags are restored; BatchNorm counts as its
    affine map with running statistics, Def. 2.2.2), never modified, its autograd state
    untouched (call it between ``loss.backward()`` and ``opt.step()`` if you like); its
    graph is traced at the first call and reused while its structure is unchanged, so a
    call costs one |theta|^q pass at batch 1 per q (ResNet-18 at 3x32x32 on one CPU
    thread: 1.4 float32 forward passes at batch 64 for q = 1, 2, 4 in float32, 2.5 in
    float64; the sparsities add a forward and backward pass). Under DDP only rank 0
    measures: the other ranks get None and keep no history. A sharded model (FSDP2's
    ``fully_shard``) is measured by every rank together, without gathering it
    (``pathlift.graph.sharded``): every rank must call, and rank 0 gets the row (the
    others None). ``on_epoch_end`` makes it a ``pathlift.data.training`` callback.

    Args:
        input_shape: the model's input shape, no batch dimension.
        probe: inputs (n, *input_shape) for the average-case path-norm, or None.
        n_train, sigma: training-set size and sigma of Thm 4.4.1, for the bound.
        qs: exponents q of the path-norms.
        sparsity: measure the two sparsities.
        train_data: the training inputs and labels, for ``bound_top1_log10``.
        top1_form: "union" (valid as stated) or "fixed-class" (thesis Sec. 7.2.1).
        dtype: mantissa precision of the passes (values are carried as mantissa and scale,
            so none overflows): float64 is exact to ~1e-13; float32 is ~1e-6 relative and
            about twice as fast on CPU convolutions (``benchmarks/bench_track.py``), but
            a Path-Mag below 1e-38 of the largest would count as 0 in the sparsity.

    Example::

        tracker = PathNormTracker((1, 8, 8))
        for epoch in range(epochs):
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            print(tracker(model, epoch))
    """

    def __init__(self, input_shape: Sequence[int], probe: torch.Tensor | None = None,
                 n_train: int | None = None, sigma: float | None = None,
                 qs: Sequence[float] = (1.0, 2.0, 4.0), sparsity: bool = True,
                 dtype: torch.dtype = torch.float64,
                 train_data: tuple[torch.Tensor, torch.Tensor] | None = None,
                 top1_form: str = "union"):
        self.input_shape, self.dtype, self.train_data = tuple(input_shape), dtype, train_data
        self.top1_form = top1_form
        self.probe, self.n_train, self.sigma = probe, n_train, sigma
        self.qs, self.sparsity = tuple(float(q) for q in qs), sparsity
        self.constants: ArchitectureConstants | None = None
        self.history: list[dict[str, Any]] = []

    def __call__(self, model: nn.Module, step: int | None = None) -> dict[str, float] | None:
        """Measure ``model`` now; the row, or None on ranks other than 0."""
        row = self.measure(model)
        if row is not None:
            self.history.append({"step": step, **row})
        return row

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None:
        """As a ``train_classifier`` callback: adds the row to ``logs`` and keeps
        ``{"epoch": epoch, **logs}`` in ``history``. Call it with epoch 0 before training to
        record the initialisation."""
        row = self.measure(model)
        if row is not None:
            logs.update(row)
            self.history.append({"epoch": epoch, **logs})

    def measure(self, model: nn.Module) -> dict[str, float] | None:
        """The row of ``model`` now, without adding it to ``history``. On a sharded (FSDP2)
        model every rank must call it (the passes are collective); rank 0 gets the row."""
        world, sharded = World.current(), is_sharded(unwrap(model))
        if not (world.main or sharded):
            return None
        if sharded and self.probe is not None:
            raise InvalidParameterError("the average-case path-norm (probe=) of a sharded "
                                        "(FSDP2) model is not implemented; leave probe out")
        with eval_mode(model):
            graph = graph_of(model, self.input_shape)
            bound = self.n_train is not None and self.sigma is not None
            norms = self._log10_norms(model, graph, {*self.qs, *((1.0,) if bound else ())},
                                      sharded)
            row = {f"path_norm_log10_q{q:g}": norms[q] for q in self.qs}
            if self.sparsity:
                row["sparsity"] = magnitude_scores(graph).zero_fraction()
                row["path_magnitude_sparsity"] = path_magnitude_scores(
                    graph, dtype=self.dtype).zero_fraction()
            if self.probe is not None:
                row["average_case"] = average_case_path_norm(graph, None, self.probe,
                                                             max_samples=None).mean
            if bound:
                if self.constants is None:
                    self.constants = architecture_constants(graph)
                row["bound_ce_log10"] = cross_entropy_gap_log10(
                    rademacher_peeling(self.constants, self.sigma, norms[1.0]), self.n_train)
            if self.train_data is not None:
                row["bound_top1_log10"] = certified_top1(
                    model, self.input_shape, *self.train_data, form=self.top1_form).log10
        return row if world.main else None

    def _log10_norms(self, model: nn.Module, graph: LayerGraph, qs: set[float],
                     sharded: bool) -> dict[float, float]:
        """log10 ||Phi||_q for each q (Thm 3.1.1): the |theta|^q passes for q in
        (0, LARGE_Q] recorded at the first call and replayed (``pathlift.lift.replay``)
        while they give finite numbers, else ``path_norm`` with its fallbacks and errors
        (large q, underflow, NaN, sharded models)."""
        fast = sorted(q for q in qs if q <= LARGE_Q) if not sharded else []
        logs = dict(zip(fast, replayed(
            model, self.input_shape, ("track", tuple(fast), self.dtype),
            lambda g: [output_logs(AbsPowInterpreter(g, q, self.dtype).run_all_ones())
                       for q in fast], graph_of), strict=True)) if fast else {}
        found = {}
        for q in qs:
            log_o = logs.get(q)
            if log_o is not None and bool(torch.isfinite(log_o).all()):
                found[q] = mixed_norm_log(log_o, q, q)[0] / LN10
            else:
                found[q] = path_norm(graph, None, q, None, self.dtype).log10
        return found
