"""Path-magnitude and magnitude pruning through torch.nn.utils.prune (thesis Sec. 3.5.1).

IN PLACE, like torch.nn.utils.prune: every function here prunes the model it is given,
adding the usual ``weight_orig`` / ``weight_mask`` reparametrisation (remove it with
``torch.nn.utils.prune.remove``). Deep-copy the model first to keep the dense one; the
pipeline of ``pathlift.jobs.prune.pipeline`` always works on copies.

Amounts follow torch's convention: a float in [0, 1] is the fraction of the coordinates
that are still unpruned, so repeated calls compound as in lottery-ticket rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import prune

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import LayerGraph, graph_of, unwrap
from pathlift.graph.boundary import mask
from pathlift.graph.sharded import is_sharded_graph
from pathlift.lift import path_norm
from pathlift.lift.pruning_bound import PruningCertificate, pruning_certificate
from pathlift.prune.scores import (
    Scores,
    magnitude_scores,
    path_magnitude_scores,
    prunable_parameters,
    refuse_parametrized,
)

Criterion = Literal["path-magnitude", "magnitude"]
Scope = Literal["global", "layerwise"]
ScoreFunction = Callable[[nn.Module, tuple[int, ...]], "Scores | Mapping[str, Tensor]"]
"""A user's pruning criterion: ``(model, input_shape) -> scores`` of every prunable
weight (``Scores``, or a dict ``"layer.weight" -> tensor`` of the weight's shape); the
coordinates with the smallest absolute scores are pruned (torch's L1Unstructured ranking)."""


class PathMagnitudeUnstructured(prune.L1Unstructured):
    """torch.nn.utils.prune method: zero the entries of one tensor with the smallest
    Path-Mag(theta, i) (paper 002 Sec. 4.3, eq. 14), invariant under rescalings.

    Path-Mag depends on the whole network, so ``apply`` takes it as well (or precomputed
    ``scores``). As a ``global_unstructured`` method it ranks the ``importance_scores``
    it is given, which must be path-magnitudes (see ``global_path_magnitude``).
    """

    @classmethod
    def apply(cls, module: nn.Module, name: str, amount: int | float,  # type: ignore[override]
              model: nn.Module | None = None, input_shape: Sequence[int] | None = None,
              scores: Scores | None = None, importance_scores: Tensor | None = None):
        if importance_scores is None:
            if scores is None:
                if model is None or input_shape is None:
                    raise InvalidParameterError(
                        "PathMagnitudeUnstructured needs the whole network: pass model and "
                        "input_shape, or precomputed scores")
                scores = path_magnitude_scores(model, input_shape)
            importance_scores = scores.tensors[_qualified_name(model, module, name, scores)]
        return super().apply(module, name, amount, importance_scores=importance_scores)


def _qualified_name(model: nn.Module | None, module: nn.Module, name: str, scores: Scores
                    ) -> str:
    if model is not None:
        for prefix, m in unwrap(model).named_modules():
            if m is module and f"{prefix}.{name}" in scores.tensors:
                return f"{prefix}.{name}"
    raise InvalidParameterError(
        f"parameter '{name}' of {type(module).__name__} has no path-magnitude score: pass the "
        "model that contains it (only Linear/Conv weights, and biases on request, are scored)")


def path_magnitude_unstructured(module: nn.Module, name: str, amount: int | float,
                                model: nn.Module, input_shape: Sequence[int]) -> nn.Module:
    """Like ``prune.l1_unstructured`` with Path-Mag scores of ``model`` (IN PLACE)."""
    PathMagnitudeUnstructured.apply(module, name, amount, model, input_shape)
    return module


@dataclass(frozen=True)
class PruningResult:
    """One pruning of a model and its guarantees (thesis eq. 3.19, Lemma 3.4.1; the
    ``certificate``, ``pathlift.lift.pruning_bound``).

    For every input x, ||R_theta(x) - R_theta'(x)||_1 <= path_metric * max(1, ||x||_inf)
    <= bound * max(1, ||x||_inf). ``path_metric`` = ||Phi(theta)||_1 - ||Phi(theta')||_1
    is exact for pruning (two passes); ``bound`` sums the Path-Mag of the pruned
    coordinates, each taken at the step that pruned it (telescoping eq. 3.17 over steps).
    Both are also given in log10, as they exceed float64 on deep networks.
    """

    criterion: str
    scope: str
    steps: int
    pruned: int
    total: int
    log10_path_norm: float
    log10_path_metric: float
    log10_bound: float

    @property
    def sparsity(self) -> float:
        return self.pruned / self.total

    @property
    def certificate(self) -> PruningCertificate:
        return PruningCertificate(self.log10_path_norm, self.log10_path_metric,
                                  self.log10_bound)

    @property
    def path_metric(self) -> float:
        return self.certificate.path_metric

    @property
    def bound(self) -> float:
        return self.certificate.bound


def _masks(targets: list[tuple[str, nn.Module, str]]) -> dict[str, Tensor]:
    """Which coordinates of every target are still unpruned (a boolean copy)."""
    return {f"{m}.{p}": mask(module, p) != 0 if mask(module, p) is not None
            else torch.ones_like(getattr(module, p), dtype=torch.bool)
            for m, module, p in targets}


def _contiguous_masks_(targets: list[tuple[str, nn.Module, str]]) -> None:
    """Give every unmasked tensor stored in another memory format (channels_last) an
    all-ones mask (``prune.identity``) in the contiguous format: ``prune.global_unstructured``
    flattens the masks, or ``torch.ones_like(weight)``, with ``view(-1)``, which fails on
    such tensors."""
    for _, module, p in targets:
        if mask(module, p) is None and not getattr(module, p).is_contiguous():
            prune.identity(module, p)
            module._buffers[p + "_mask"] = module._buffers[p + "_mask"].contiguous()


def _split(total: int, steps: int) -> list[int]:
    """``total`` split into ``steps`` integer parts as equal as possible."""
    return [total * (j + 1) // steps - total * j // steps for j in range(steps)]


def prune_model(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None, amount: float,
                criterion: Criterion | ScoreFunction = "path-magnitude", scope: Scope = "global",
                steps: int = 1, last_layer_factor: float = 1.0,
                include_biases: bool = False) -> PruningResult:
    """Prune ``amount`` of the unpruned prunable coordinates of ``model``, IN PLACE.

    ``criterion`` is "path-magnitude", "magnitude" or a ``ScoreFunction`` of your own,
    called on the model (its current, possibly pruned, weights) before each step.

    ``scope="layerwise"`` prunes ``amount`` of each layer, ``last_layer_factor * amount``
    of the last one (0.5 is the thesis' convention, Appendix E.1: p% of each conv, p/2 %
    of the final fully connected layer); ``"global"`` prunes the same number of
    coordinates ranked across all layers. ``steps > 1`` prunes in that many equal steps,
    recomputing the scores after each (paper 002 Sec. 5's suggested improvement).
    Path-magnitude masks are rescaling-invariant (paper 002 Lemma 4.2); magnitude masks are
    not. Returns the counts and the certificate of eq. 3.19.
    """
    if not 0.0 <= amount <= 1.0:
        raise InvalidParameterError(f"amount must be a fraction in [0, 1], got {amount}")
    if last_layer_factor < 0 or amount * last_layer_factor > 1.0:
        raise InvalidParameterError(
            f"last_layer_factor * amount must be in [0, 1], got {last_layer_factor} * {amount}")
    if steps < 1:
        raise InvalidParameterError(f"steps must be a positive integer, got {steps}")
    if not (callable(criterion) or criterion in ("path-magnitude", "magnitude")) or \
            scope not in ("global", "layerwise"):
        raise InvalidParameterError(
            f"criterion must be 'path-magnitude', 'magnitude' or a score function, and scope "
            f"'global' or 'layerwise', got {criterion!r}, {scope!r}")
    graph = graph_of(model, input_shape)
    if is_sharded_graph(graph):
        raise UnsupportedModelError(
            "torch.nn.utils.prune cannot reparametrise the DTensor parameters of a sharded "
            "(FSDP2) model; prune the plain model before fully_shard (pathlift then measures "
            "its weight_orig shards and masks), or choose masks on the sharded scores with "
            "pathlift.prune.global_masks")
    graph.check_values()
    targets = prunable_parameters(graph, include_biases)
    refuse_parametrized(targets, graph)
    last = targets[-1][0]
    masks = _masks(targets)
    fractions = {n: amount * (last_layer_factor if n.rsplit(".", 1)[0] == last else 1.0)
                 for n in masks}
    wanted = {n: fractions[n] * int(m.sum()) for n, m in masks.items()}
    per_step = {n: _split(round(c), steps) for n, c in wanted.items()}
    global_steps = _split(round(sum(wanted.values())), steps)
    dense_norm = path_norm(graph).log10
    method = PathMagnitudeUnstructured if criterion == "path-magnitude" else prune.L1Unstructured
    step_costs = []
    for step in range(steps):
        graph = graph_of(graph)  # a new reparametrisation re-traces, once
        path_mag = path_magnitude_scores(graph, None, include_biases)
        scores = path_mag if criterion == "path-magnitude" else \
            magnitude_scores(graph, None, include_biases) if criterion == "magnitude" else \
            _user_scores(criterion, graph, targets)
        before = _masks(targets)
        if scope == "global":
            importance = {(module, p): scores.tensors[f"{m}.{p}"].contiguous()
                          for m, module, p in targets}
            _contiguous_masks_(targets)
            prune.global_unstructured([(module, p) for _, module, p in targets],
                                      pruning_method=method, importance_scores=importance,
                                      amount=global_steps[step])
        else:
            for m, module, p in targets:
                name = f"{m}.{p}"
                method.apply(module, p, per_step[name][step],
                             importance_scores=scores.tensors[name].contiguous())
        after = _masks(targets)
        step_costs.append(path_mag.log10_sum({n: before[n] & ~after[n] for n in before}))
    certificate = pruning_certificate(dense_norm, path_norm(graph).log10, step_costs)
    total = sum(m.numel() for m in masks.values())
    remaining = sum(int(m.sum()) for m in _masks(targets).values())
    name = criterion if isinstance(criterion, str) else getattr(criterion, "__name__", "custom")
    return PruningResult(name, scope, steps, total - remaining, total,
                         certificate.log10_path_norm, certificate.log10_path_metric,
                         certificate.log10_bound)


def layer_sparsity(model: nn.Module) -> dict[str, float]:
    """The fraction of zeros of every torch.nn.utils.prune mask of ``model``
    (``{"layer.weight": fraction}``), and of all of them together under ``"all"``."""
    masks = {name[: -len("_mask")]: m for name, m in unwrap(model).named_buffers()
             if name.endswith("_mask")}
    out = {name: float((m == 0).double().mean()) for name, m in masks.items()}
    total = sum(m.numel() for m in masks.values())
    out["all"] = sum(int((m == 0).sum()) for m in masks.values()) / total if total else 0.0
    return out


def _user_scores(score: ScoreFunction, graph: LayerGraph,
                 targets: list[tuple[str, nn.Module, str]]) -> Scores:
    """A user's scores, checked: one finite tensor of the right shape per target."""
    found = score(graph.model, graph.input_shape)
    tensors = found.tensors if isinstance(found, Scores) else found
    for m, module, p in targets:
        name, value = f"{m}.{p}", getattr(module, p)
        t = tensors.get(name) if isinstance(tensors, Mapping) else None
        if not isinstance(t, Tensor) or t.shape != value.shape or not torch.isfinite(t).all():
            raise InvalidParameterError(
                f"score function {getattr(score, '__name__', score)!r} must return a finite "
                f"tensor of shape {tuple(value.shape)} for '{name}' (one per prunable weight: "
                f"{', '.join(f'{a}.{b}' for a, _, b in targets)})")
    return Scores(getattr(score, "__name__", "custom"),
                  {f"{m}.{p}": tensors[f"{m}.{p}"].to(getattr(module, p).device)
                   for m, module, p in targets})


def global_path_magnitude(model: nn.Module, input_shape: Sequence[int], amount: float,
                          **options) -> PruningResult:
    """Prune ``amount`` of the coordinates with the smallest Path-Mag network-wide (IN PLACE)."""
    return prune_model(model, input_shape, amount, "path-magnitude", "global", **options)


def layerwise_path_magnitude(model: nn.Module, input_shape: Sequence[int], amount: float,
                             **options) -> PruningResult:
    """Prune ``amount`` of each layer by smallest Path-Mag (IN PLACE); see ``prune_model``."""
    return prune_model(model, input_shape, amount, "path-magnitude", "layerwise", **options)


def global_magnitude(model: nn.Module, input_shape: Sequence[int], amount: float,
                     **options) -> PruningResult:
    """Prune ``amount`` of the coordinates with the smallest |theta_i| network-wide (IN PLACE)."""
    return prune_model(model, input_shape, amount, "magnitude", "global", **options)


def layerwise_magnitude(model: nn.Module, input_shape: Sequence[int], amount: float,
                        **options) -> PruningResult:
    """Prune ``amount`` of each layer by smallest |theta_i| (IN PLACE); see ``prune_model``."""
    return prune_model(model, input_shape, amount, "magnitude", "layerwise", **options)
