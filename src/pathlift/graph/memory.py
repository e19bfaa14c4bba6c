"""Fail fast on size: estimate a pass's peak memory from the traced shapes, refuse it when
it cannot fit (``pathlift.memory``'s limit), before anything is allocated.

Every pass over a ``LayerGraph`` (the |θ|^q pass of path-norms, the path-magnitude
gradient, path-metrics) runs the graph at batch 1 in float64 and may keep every node's
output for a backward pass. ``estimate(graph)`` adds those outputs (known from the meta
tensors the trace was validated on) to twice the parameters (the |θ|^q copy and its
gradient). ``check(graph)`` raises ``MemoryLimitError`` when that exceeds the limit;
``graph_of`` checks each model and input shape once, when it traces them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathlift.memory import PASS_BYTES, check_bytes, show_size

if TYPE_CHECKING:
    from pathlift.graph.layer_graph import LayerGraph

__all__ = ["MemoryEstimate", "check", "estimate"]


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of a pass over a graph: ``parameters`` (the |θ|^q copy and its gradient)
    plus ``activations`` (every node's output at batch 1); ``largest`` names the node with
    the largest output, ``largest_shape`` and ``largest_bytes`` give it."""

    parameters: int
    activations: int
    largest: str
    largest_shape: tuple[int, ...]
    largest_bytes: int

    @property
    def total(self) -> int:
        return self.parameters + self.activations



def estimate(graph: LayerGraph) -> MemoryEstimate:
    """The peak memory of a pass over ``graph`` (see the module docstring), from the
    shapes recorded when it was traced: nothing is allocated."""
    parameters = sum(p.numel() for p in graph.module.parameters()) * 2 * PASS_BYTES
    activations, largest, largest_shape, largest_bytes = 0, "", (), -1
    for node in graph.graph.nodes:
        meta = node.meta.get("tensor_meta")
        if node.op == "placeholder":
            name, shape = "<input>", graph.input_shape
        elif node.op != "output" and hasattr(meta, "shape"):
            name, shape = str(node.target if node.op == "call_module" else node.name), \
                tuple(meta.shape[1:])
        else:
            continue
        size = math.prod(shape) * PASS_BYTES
        activations += size
        if size > largest_bytes:
            largest, largest_shape, largest_bytes = name, shape, size
    return MemoryEstimate(parameters, activations, largest, largest_shape, largest_bytes)


def check(graph: LayerGraph) -> MemoryEstimate:
    """``estimate(graph)``, after checking that it fits (see ``check_bytes``)."""
    found = estimate(graph)
    if graph.device.type != "meta":
        model = graph.source() if graph.source is not None else None
        check_bytes(found.total, f"a pass over {type(model).__name__ if model else 'the model'} "
                    f"at input shape {graph.input_shape}",
                    f"its largest layer '{found.largest}' outputs {found.largest_shape} "
                    f"({show_size(found.largest_bytes)}); ", str(graph.device))
    return found
