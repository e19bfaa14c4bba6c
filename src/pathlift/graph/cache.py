"""The graphs traced so far, per model object and input shape: weak in the model (a graph
goes with its model), the latest graph of a model last (its shape is the default of the
next call). It knows a graph only by its input shape, so it sits below the layer graph
(``pathlift.graph.layer_graph``, whose ``bind`` remembers) and the tracer."""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from torch import nn


class Traced(Protocol):
    """A traced graph as the cache sees it (``LayerGraph``)."""

    input_shape: tuple[int, ...]


_GRAPHS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, ...], Traced]] = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def remember(model: nn.Module, graph: Traced) -> None:
    with _LOCK:
        graphs = _GRAPHS.setdefault(model, {})
        graphs.pop(graph.input_shape, None)  # the latest graph of a model comes last
        graphs[graph.input_shape] = graph


def shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The input shapes ``model`` was traced for, the latest last."""
    with _LOCK:
        return list(_GRAPHS.get(model, {}))


def lookup(model: nn.Module, shape: tuple[int, ...]) -> Traced | None:
    """The graph of ``model`` for ``shape``, if it was traced (it may be out of date)."""
    with _LOCK:
        return _GRAPHS.get(model, {}).get(shape)
