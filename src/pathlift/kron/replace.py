"""Swap a model's ``nn.Linear`` layers for Kronecker-sparse layers designed for this machine
(``pathlift.kron.design``, thesis Sec. 7.4.1), and load such models anywhere.

A ``KSLinear`` saves its chain in its state (the ``chain`` buffer), so a state_dict or a
pathlift checkpoint is enough to rebuild the layers: ``load_state`` (or
``pathlift.models.load_model``) puts a ``KSLinear`` of the saved chain wherever the
checkpoint has one, on any machine, with no cache and no timing.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.kron.design import design as design_chain
from pathlift.kron.layer import KSLinear, chain_from_tensor
from pathlift.kron.pattern import KSPattern, check_chain
from pathlift.rebuilders import register_rebuilder

__all__ = ["LayerChoice", "Replacement", "load_state", "rebuild_layers", "replace_linears"]

Include = Sequence[str] | Callable[[str, nn.Linear], bool] | None
# per layer name: a chain of patterns, or None to keep the dense layer
Chains = Mapping[str, Sequence[KSPattern | Sequence[int]] | None]


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


@dataclass(frozen=True)
class LayerChoice:
    """What ``replace_linears`` did with one ``nn.Linear``: the chain it installed (empty
    where the dense layer was kept), its parameters against the dense layer's, and the
    measured speed-up t(dense)/t(chain) of the same run (None where the chain was given)."""

    name: str
    in_features: int
    out_features: int
    patterns: tuple[KSPattern, ...]
    params: int
    speedup: float | None

    @property
    def replaced(self) -> bool:
        return bool(self.patterns)

    def __str__(self) -> str:
        what = (" ".join(map(str, self.patterns)) + f" ({self.params:,} of "
                f"{self.in_features * self.out_features:,} weights)" if self.replaced
                else "kept dense: no chain within the budget beats it")
        pace = "" if self.speedup is None else (
            f", measured {self.speedup:.2f}x faster than dense" if self.speedup >= 1
            else f", its best chain measured {1 / self.speedup:.2f}x slower than dense")
        return f"{self.name or '<model>'} {self.out_features}x{self.in_features}: {what}{pace}"


@dataclass(frozen=True)
class Replacement:
    """The model ``replace_linears`` returns and what it did per layer. ``chains`` is the
    design to pass as ``replace_linears(model, design=...)`` to build the same model
    elsewhere without timing."""

    model: nn.Module
    layers: tuple[LayerChoice, ...]

    @property
    def chains(self) -> dict[str, tuple[KSPattern, ...] | None]:
        return {c.name: c.patterns or None for c in self.layers}

    def __str__(self) -> str:
        return "\n".join(map(str, self.layers))

    def __repr__(self) -> str:
        done = sum(c.replaced for c in self.layers)
        return (f"Replacement({done} of {len(self.layers)} Linear layers replaced, "
                f"model={type(self.model).__name__})")


def _choose(name: str, linear: nn.Linear, chains: Chains | None, budget: float, batch: int,
            design_options: dict[str, Any]) -> tuple[tuple[KSPattern, ...], float | None]:
    """The chain for one layer (empty: keep it dense) and its measured speed-up."""
    if chains is not None:
        if name not in chains:
            raise InvalidParameterError(
                f"layer {name!r}: the design gives no chain for it (it names "
                f"{sorted(chains)}); add it, with None to keep it dense")
        given = chains[name]
        return (() if given is None else check_chain(given)), None
    dtype = linear.weight.dtype
    try:
        found = design_chain(linear.in_features, linear.out_features, budget, batch,
                             dtype if dtype in (torch.float32, torch.float64)
                             else torch.float32, **design_options)
    except InvalidParameterError as err:
        raise InvalidParameterError(f"layer {name!r}: {err}") from err
    return found.chosen.patterns, found.best_chain.speedup


def replace_linears(model: nn.Module, budget: float = 0.25, include: Include = None,
                    batch: int = 256, init: str = "project", design: Chains | None = None,
                    **design_options: Any) -> Replacement:
    """A copy of ``model`` in which the chosen ``nn.Linear`` layers are ``KSLinear`` layers
    whose chain is ``design(in_features, out_features, budget, batch, ...)``: the fastest
    on this machine among chains with a dense support product and at most ``budget`` of
    the layer's weights, where it is faster than the dense layer measured in the same run
    (else the layer stays dense). The model is not modified.

    Args:
        model: any module; its Linear layers are found by ``named_modules``.
        budget: parameter budget of each replaced layer, as a fraction of its weights.
        include: which layers: None (every nn.Linear), qualified names or fnmatch patterns
            (``["blocks.*.mlp.fc1"]``), or a predicate ``f(name, linear) -> bool``.
        batch: rows each layer sees per forward (tokens × sequences), for the timings.
        init: ``"project"`` (the hierarchical block-SVD projection of the dense weight,
            ``pathlift.kron.project``; the bias is kept) or ``"random"`` (fresh factors and
            bias, for training from scratch).
        design: the chain of every selected layer by name (None: keep it dense), e.g. an
            earlier ``Replacement.chains``: nothing is timed, the same model is built on
            any machine.
        design_options: passed on to ``design`` (lengths, top_k, repeats, ...).

    Returns:
        A ``Replacement``: ``.model`` (layers on the Linear's device and dtype; designed
        ones tuned for ``batch`` on this machine, given ones untimed: call their
        ``tune``) and ``.layers``, what was done to each layer with the measured speed-up
        (``print(result)`` lists them).

    Raises:
        InvalidParameterError: unknown ``init``, an include pattern that matches nothing,
            a layer for which no chain fits the budget or ``design`` has no entry (the
            message names it), or a chain the projection cannot handle (use
            ``init="random"``).

    Example:
        >>> from pathlift.models import mlp
        >>> out = replace_linears(mlp(64, (256, 256)), 0.25, include=["3"])  # doctest: +SKIP
        >>> print(out)  # doctest: +SKIP
        3 256x256: (1,16,16,16) (16,16,16,1) (8,192 of 65,536 weights), 3.10x ...
    """
    if init not in ("project", "random"):
        raise InvalidParameterError(f"init must be 'project' or 'random', got {init!r}")
    out = copy.deepcopy(model)
    choices = []
    for name, linear in _selected(out, include):
        chain, speedup = _choose(name, linear, design, budget, batch, design_options)
        choices.append(LayerChoice(name, linear.in_features, linear.out_features, chain,
                                   sum(p.nnz for p in chain), speedup))
        if not chain:
            continue
        layer = _layer(name, linear, chain, init)
        if design is None:
            layer.tune(batch)
        if not name:  # the model is itself the Linear
            return Replacement(layer, tuple(choices))
        parent, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent), child, layer)
    return Replacement(out, tuple(choices))


def _layer(name: str, linear: nn.Linear, chain: tuple[KSPattern, ...], init: str) -> KSLinear:
    if chain[0].out_features != linear.out_features or \
            chain[-1].in_features != linear.in_features:
        raise InvalidParameterError(
            f"layer {name!r}: the chain {' '.join(map(str, chain))} is "
            f"{chain[0].out_features} x {chain[-1].in_features}, the layer "
            f"{linear.out_features} x {linear.in_features}; give a chain of its shape")
    if init == "random":
        return KSLinear(chain, bias=linear.bias is not None, dtype=linear.weight.dtype,
                        device=linear.weight.device)
    try:
        return KSLinear.from_linear(linear, chain)
    except InvalidParameterError as err:
        raise InvalidParameterError(
            f"layer {name!r}: cannot project its weight onto {list(map(str, chain))} "
            f"({err}); pass init='random'") from err


def rebuild_layers(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """In place, for loaders that own ``model``: every ``nn.Linear`` or ``KSLinear`` whose
    entry in ``state_dict`` has a ``chain`` (L, 4) becomes a ``KSLinear`` of that chain
    (same bias presence, dtype and device; ``algorithm="auto"`` with what this machine's
    cache knows, nothing timed), ready for ``load_state_dict``. Other modules and entries
    are left alone. Returns ``model`` (or the new layer if ``model`` itself is replaced)."""
    for key, value in state_dict.items():
        prefix = key[:-len("chain")]
        if not (key == "chain" or key.endswith(".chain")) or not torch.is_tensor(value):
            continue
        name = prefix.rstrip(".")
        try:
            old = model.get_submodule(name)
        except AttributeError:
            continue  # reported by load_state_dict as an unexpected key
        if not isinstance(old, nn.Linear | KSLinear):
            continue
        try:
            chain = chain_from_tensor(value)
        except InvalidParameterError as err:
            raise InvalidParameterError(f"layer {name!r}: {err}") from err
        if isinstance(old, KSLinear) and old.patterns == chain:
            continue
        _check_factors(name, prefix, chain, state_dict)
        ref = old.weight if isinstance(old, nn.Linear) else old.factors[0]
        algorithm = old.algorithm if isinstance(old, KSLinear) else "auto"
        layer = KSLinear(chain, bias=prefix + "bias" in state_dict, algorithm=algorithm,
                         dtype=ref.dtype, device=ref.device)
        if not name:
            return layer
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    return model


def _check_factors(name: str, prefix: str, chain: tuple[KSPattern, ...],
                   state_dict: Mapping[str, torch.Tensor]) -> None:
    """Refuse a ``chain`` whose factors are not the ones ``state_dict`` holds, before the
    layer is built: a chain read from a file never allocates more than the file's own
    factors (a chain of huge patterns is refused, not built)."""
    count = sum(1 for k in state_dict if k.startswith(prefix + "factors.")
                and k[len(prefix) + 8:].isdigit())
    held = [tuple(getattr(state_dict.get(f"{prefix}factors.{i}"), "shape", ()))
            for i in range(count)]
    wanted = [(p.a, p.b, p.c, p.d) for p in chain]
    if held != wanted:
        raise ArchitectureMismatchError(
            f"layer {name!r}: its saved chain {[list(s) for s in wanted][:4]} needs factors "
            f"of those shapes, the checkpoint holds {[list(s) for s in held][:4]}; the file "
            "is damaged: save it again")


def load_state(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """A copy of ``model`` (for instance the dense architecture the Kronecker-sparse model
    was made from) with ``state_dict`` loaded strictly, its ``KSLinear`` layers rebuilt
    from the chains saved in it (``rebuild_layers``): needs no cache and no timing, and
    gives the saved model's outputs on any machine. The model is not modified."""
    out = rebuild_layers(copy.deepcopy(model), state_dict)
    out.load_state_dict(state_dict, strict=True)
    return out


# pathlift.models.load_weights rebuilds the layers of a state_dict with a chain through it
register_rebuilder("chain", rebuild_layers)
