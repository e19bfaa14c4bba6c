"""Swap a model's ``nn.Linear`` layers for Kronecker-sparse layers designed for this machine
(``pathlift.kron.designer``, thesis Sec. 7.4.1)."""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pathlift.errors import InvalidParameterError
from pathlift.kron.designer import design
from pathlift.kron.layer import KSLinear

__all__ = ["replace_linears"]

Include = Sequence[str] | Callable[[str, nn.Linear], bool] | None


def _selected(model: nn.Module, include: Include) -> list[tuple[str, nn.Linear]]:
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if include is None:
        return linears
    if callable(include):
        return [(name, m) for name, m in linears if include(name, m)]
    patterns = [include] if isinstance(include, str) else list(include)
    chosen = [(name, m) for name, m in linears
              if any(fnmatch.fnmatchcase(name, pat) for pat in patterns)]
    unmatched = [pat for pat in patterns
                 if not any(fnmatch.fnmatchcase(name, pat) for name, _ in linears)]
    if unmatched:
        raise InvalidParameterError(
            f"include patterns {unmatched} match no nn.Linear; the model's Linear layers are "
            f"{[name for name, _ in linears]}")
    return chosen


def replace_linears(model: nn.Module, budget: float = 0.25, include: Include = None,
                    batch: int = 256, init: str = "project", **design_options: Any
                    ) -> nn.Module:
    """A copy of ``model`` in which the chosen ``nn.Linear`` layers are ``KSLinear`` layers
    whose chain is ``design(in_features, out_features, budget, batch, ...)``: the fastest
    on this machine among chains with a dense support product and at most ``budget`` of
    the layer's weights. The model is not modified.

    Args:
        model: any module; its Linear layers are found by ``named_modules``.
        budget: parameter budget of each replaced layer, as a fraction of its weights.
        include: which layers: None (every nn.Linear), qualified names or fnmatch patterns
            (``["blocks.*.mlp.fc1"]``), or a predicate ``f(name, linear) -> bool``.
        batch: rows each layer sees per forward (tokens × sequences), for the timings.
        init: ``"project"`` (the hierarchical block-SVD projection of the dense weight,
            ``pathlift.kron.project``; the bias is kept) or ``"random"`` (fresh factors and
            bias, for training from scratch).
        design_options: passed on to ``design`` (lengths, top_k, repeats, ...).

    Returns:
        The new model (layers on the Linear's device and dtype).

    Raises:
        InvalidParameterError: unknown ``init``, an include pattern that matches nothing,
            a layer for which no chain fits the budget (the message names it), or a chain
            the projection cannot handle (use ``init="random"``).

    Example:
        >>> from pathlift.models import mlp
        >>> net = replace_linears(mlp(64, (256, 256)), 0.25, include=["3"])  # doctest: +SKIP
    """
    if init not in ("project", "random"):
        raise InvalidParameterError(f"init must be 'project' or 'random', got {init!r}")
    out = copy.deepcopy(model)
    for name, linear in _selected(out, include):
        dtype = linear.weight.dtype
        try:
            chain = design(linear.in_features, linear.out_features, budget, batch,
                           dtype if dtype in (torch.float32, torch.float64) else torch.float32,
                           **design_options).chosen.patterns
        except InvalidParameterError as err:
            raise InvalidParameterError(f"layer {name!r}: {err}") from err
        if init == "project":
            try:
                layer = KSLinear.from_linear(linear, chain)
            except InvalidParameterError as err:
                raise InvalidParameterError(
                    f"layer {name!r}: cannot project its weight onto {list(map(str, chain))} "
                    f"({err}); pass init='random'") from err
        else:
            layer = KSLinear(chain, bias=linear.bias is not None, dtype=dtype,
                             device=linear.weight.device)
        if not name:  # the model is itself the Linear
            return layer
        parent, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent), child, layer)
    return out
