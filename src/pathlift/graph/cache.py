"""The graphs traced so far, per model object and input shape: weak in the model (a graph
goes with its model), the latest graph of a model last (its shape is the default of the
next call)."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from pathlift.graph.layer_graph import LayerGraph

_GRAPHS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, ...], LayerGraph]] = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def remember(model: nn.Module, graph: LayerGraph) -> None:
    with _LOCK:
        graphs = _GRAPHS.setdefault(model, {})
        graphs.pop(graph.input_shape, None)  # the latest graph of a model comes last
        graphs[graph.input_shape] = graph


def shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The input shapes ``model`` was traced for, the latest last."""
    with _LOCK:
        return list(_GRAPHS.get(model, {}))


def lookup(model: nn.Module, shape: tuple[int, ...]) -> LayerGraph | None:
    """The graph of ``model`` for ``shape``, if it was traced (it may be out of date)."""
    with _LOCK:
        return _GRAPHS.get(model, {}).get(shape)
