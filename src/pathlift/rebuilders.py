"""Layers whose structure is part of their state, rebuilt before a state_dict is loaded.

A ``KSLinear`` keeps its chain of patterns in its state (the ``chain`` buffer), so a
state_dict is enough to build it in a dense architecture; a loader cannot know every such
layer. The package that defines one registers, at import, a rebuilder for the state_dict
entry that marks it (``register_rebuilder("chain", pathlift.kron.rebuild_layers)``), and
the loader (``pathlift.models.load_weights``) calls ``rebuild`` before it loads the
weights. The dependency points from the layer's package to this module, never from the
loader to the layer's package. ``pathlift.kron`` registers when it is imported, and
``pathlift.graph`` imports it with its op table (``pathlift.graph.ops.kron``), so it has
registered before ``pathlift.models`` (which imports the engine) reads a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import Tensor, nn

__all__ = ["Rebuilder", "rebuild", "register_rebuilder"]

Rebuilder = Callable[[nn.Module, Mapping[str, Tensor]], nn.Module]
_REBUILDERS: dict[str, Rebuilder] = {}


def register_rebuilder(entry: str, rebuilder: Rebuilder) -> None:
    """Have ``rebuild`` call ``rebuilder(model, state_dict)`` when ``state_dict`` holds an
    entry named ``entry`` (a key ``entry`` or ``<module>.entry``). The rebuilder changes the
    layers those entries describe in ``model``, in place, and returns ``model`` (or the
    layer replacing it when ``model`` itself is one); it leaves other modules alone. A
    second registration of the same entry replaces the first."""
    _REBUILDERS[entry] = rebuilder


def rebuild(model: nn.Module, state_dict: Mapping[str, Tensor]) -> nn.Module:
    """``model`` with the layers ``state_dict`` describes rebuilt by their registered
    rebuilders (in place; returns the model, or the layer that replaced it), ready for
    ``load_state_dict``. A state_dict with no registered entry leaves it as it is."""
    for entry, rebuilder in _REBUILDERS.items():
        suffix = "." + entry
        if any(key == entry or key.endswith(suffix) for key in state_dict):
            model = rebuilder(model, state_dict)
    return model
