"""The graphs traced so far, per model object and input shape: weak in the model (a graph
goes with its model). A call without a shape never takes an earlier call's from here
(``pathlift.graph.input_shape``). It knows a graph only by its input shape, so it sits
below the layer graph (``pathlift.graph.layer_graph``, whose ``bind`` remembers) and the
tracer."""

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
_MADE: weakref.WeakKeyDictionary[nn.Module, tuple[int, ...]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def remember(model: nn.Module, graph: Traced, made: bool = False) -> None:
    """Keep ``graph`` for ``model``; ``made``: ``model`` is a copy pathlift made from a graph
    (``LayerGraph.bind``: a normalised, rescaled or quantised model), made at its shape."""
    with _LOCK:
        graphs = _GRAPHS.setdefault(model, {})
        graphs[graph.input_shape] = graph
        if made:
            _MADE[model] = graph.input_shape


def made_at(model: nn.Module) -> tuple[int, ...] | None:
    """The input shape of the graph pathlift made ``model`` from, if it made it."""
    with _LOCK:
        return _MADE.get(model)


def lookup(model: nn.Module, shape: tuple[int, ...]) -> Traced | None:
    """The graph of ``model`` for ``shape``, if it was traced (it may be out of date)."""
    with _LOCK:
        return _GRAPHS.get(model, {}).get(shape)
