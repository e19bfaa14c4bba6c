"""Path-magnitude pruning of the factor entries of Kronecker-sparse layers, through
torch.nn.utils.prune masks (paper 002, eq. 14, with the factors as layers of the DAG).

The factors of a ``KSLinear`` are layers of the DAG (``pathlift.graph.ops.kron``): the
network in which each KSLinear is a chain of dense ``nn.Linear`` layers holding its
factors (``densify``) has the same paths, and its path-magnitude scores
(``pathlift.prune.path_magnitude_scores``) are those of the factor entries, read back on
their support. ``prune_factors`` zeroes the ``amount`` of factor entries with the
smallest scores (one threshold over all factors) with ``prune.custom_from_mask`` on
``layer.factors``, which ``KSLinear`` honours (``KSLinear.factor``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import prune

from pathlift.errors import InvalidParameterError
from pathlift.graph.boundary import copy_model
from pathlift.kron.factor import to_dense
from pathlift.kron.layer import KSLinear
from pathlift.kron.pattern import KSPattern
from pathlift.prune.scores import path_magnitude_scores

__all__ = ["densify", "factor_scores", "prune_factors"]


def _chain(layer: KSLinear) -> nn.Sequential:
    """One ``nn.Linear`` per factor, K_L first, the bias on the last (K_1)."""
    out = []
    for idx in reversed(range(len(layer.patterns))):
        p, w = layer.patterns[idx], layer.factor(idx).detach()
        linear = nn.Linear(p.in_features, p.out_features,
                           bias=idx == 0 and layer.bias is not None, dtype=w.dtype,
                           device=w.device)
        with torch.no_grad():
            linear.weight.copy_(to_dense(w, p))
            if linear.bias is not None:
                linear.bias.copy_(layer.bias)
        out.append(linear)
    return nn.Sequential(*out)


def densify(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in which every ``KSLinear`` is an ``nn.Sequential`` of dense
    ``nn.Linear`` layers holding its factors (K_L first, zeros off the support, the bias on
    the last): the same function and the same DAG (every path-norm, path-metric and bound
    of pathlift agrees), at the memory of dense factors. The model is not modified."""
    if isinstance(model, KSLinear):
        return _chain(model)
    out = copy_model(model)
    for name, module in list(out.named_modules()):
        if isinstance(module, KSLinear):
            parent, _, child = name.rpartition(".")
            setattr(out.get_submodule(parent), child, _chain(module))
    return out


def _support_index(p: KSPattern) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of the dense factor of each entry [i, k, l, j] (Def. 5.1.1)."""
    a, b, c, d = p.as_tuple()
    i = torch.arange(a)[:, None, None, None]
    j = torch.arange(d)[None, None, None, :]
    rows = (i * b + torch.arange(b)[None, :, None, None]) * d + j
    cols = (i * c + torch.arange(c)[None, None, :, None]) * d + j
    return rows.expand(a, b, c, d), cols.expand(a, b, c, d)


def factor_scores(model: nn.Module, input_shape: Sequence[int] | None = None
                  ) -> dict[str, list[torch.Tensor]]:
    """Path-magnitude score of every factor entry of every ``KSLinear`` (by module name,
    output factor first, each of its factor's shape (a, b, c, d)), on one common scale,
    computed on ``densify(model)`` in float64."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, KSLinear)}
    if not layers:
        raise InvalidParameterError("the model has no KSLinear layer; prune its layers with "
                                    "pathlift.prune")
    scores = path_magnitude_scores(densify(model), input_shape)
    out = {}
    for name, layer in layers.items():
        count = len(layer.patterns)
        per = []
        for idx, p in enumerate(layer.patterns):
            linear = f"{name}.{count - 1 - idx}" if name else str(count - 1 - idx)
            rows, cols = _support_index(p)
            per.append(scores.tensors[f"{linear}.weight"][rows, cols])
        out[name] = per
    return out


def prune_factors(model: nn.Module, amount: float, input_shape: Sequence[int] | None = None
                  ) -> nn.Module:
    """A copy of ``model`` whose ``amount`` (a fraction in [0, 1)) of Kronecker factor
    entries with the smallest path-magnitude scores (``factor_scores``, one threshold over
    every factor of every KSLinear) are masked by torch.nn.utils.prune (``<i>_orig`` and
    ``<i>_mask`` on ``layer.factors``). Entries already pruned stay pruned. The model is
    not modified."""
    if not 0 <= amount < 1:
        raise InvalidParameterError(f"amount is a fraction of the factor entries in [0, 1), "
                                    f"got {amount}")
    scores = factor_scores(model, input_shape)
    flat = torch.cat([s.reshape(-1) for per in scores.values() for s in per])
    k = round(amount * flat.numel())
    out = copy_model(model)
    if k == 0:
        return out
    order = torch.argsort(flat, stable=True)
    keep = torch.ones_like(flat, dtype=torch.bool)
    keep[order[:k]] = False
    start = 0
    for name, per in scores.items():
        layer = out.get_submodule(name)
        for idx, s in enumerate(per):
            mask = keep[start:start + s.numel()].reshape(s.shape)
            start += s.numel()
            old = getattr(layer.factors, f"{idx}_mask", None)
            if old is not None:  # one mask: the union of the pruned entries
                prune.remove(layer.factors, str(idx))
                mask = mask & old.bool()
            prune.custom_from_mask(layer.factors, str(idx), mask.to(layer.factor(idx).dtype))
    return out
