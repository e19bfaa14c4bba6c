"""Models with several outputs, at the model boundary: pick the one a question is about.

A model may return a tuple, list or dict of tensors: logits and features, a segmentation
mask and an image label, auxiliary heads. Path-norms and Lipschitz bounds are of the whole
network and count every output neuron. A classifier's accuracy, margins and generalisation
bounds need its logits alone: ``select_output(model, outputs)`` wraps the model so that it
returns one of them, and every pathlift function then sees the sub-network of the paths
ending at that output (thesis Def. 2.2.2 with those output neurons). ``classifier_output``
is the check the data-taking functions run: one output tensor with one value per class.
The CLI exposes the selector as ``--output``.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, fx, nn

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph.boundary import eval_mode, unwrap
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.trace import graph_of

OutputKey = int | str


class SelectedOutput(nn.Module):
    """``model`` returning only ``output[key]`` (a position of a tuple or list, a key of a
    dict, a field of a namedtuple). Its parameters are the model's (``.model``)."""

    def __init__(self, model: nn.Module, key: OutputKey):
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, x: Tensor) -> Tensor:
        out = self.model(x)
        try:
            if isinstance(self.key, str) and not isinstance(out, dict):
                return getattr(out, self.key)  # a namedtuple's field
            return out[self.key]
        except (KeyError, IndexError, TypeError, AttributeError):
            raise InvalidParameterError(
                f"output {self.key!r} is not one of the model's outputs ({_keys(out)})"
                ) from None

    def extra_repr(self) -> str:
        return f"key={self.key!r}"


def output_key(text: str | int | None) -> OutputKey | None:
    """A selector as the command line gives it: digits are a position, anything else a
    key or field name."""
    if text is None or isinstance(text, int):
        return text
    return int(text) if text.strip().lstrip("-").isdigit() else text


def select_output(model: nn.Module, outputs: OutputKey | None,
                  input_shape: tuple[int, ...] | None = None) -> nn.Module:
    """``model`` itself when ``outputs`` is None, else a ``SelectedOutput`` wrapper returning
    that output only (the model is not copied: the wrapper trains and reads its
    parameters). With ``input_shape``, the key is checked against the model's traced
    outputs first (a model returning one tensor takes no selector)."""
    key = output_key(outputs)
    if key is None:
        return model
    if not isinstance(key, (int, str)):
        raise InvalidParameterError(f"outputs must be a position (int) or a key (str), got "
                                    f"{type(outputs).__name__}")
    if input_shape is not None:
        with eval_mode(model):
            graph = graph_of(model, input_shape)
        if len(graph.outputs()) == 1:
            raise InvalidParameterError(
                f"output {key!r}: the model returns a single tensor {describe_outputs(graph)};"
                " give no output selector")
    return SelectedOutput(unwrap(model), key)


def _keys(out: Any) -> str:
    """What selects each of a model's outputs (positions, keys or fields)."""
    if isinstance(out, dict):
        return "keys " + ", ".join(map(repr, out))
    if isinstance(out, (tuple, list)):
        fields = getattr(out, "_fields", None)
        return f"positions 0 to {len(out) - 1}" + (f", fields {', '.join(fields)}"
                                                  if fields else "")
    return "a single tensor: give no selector"


def describe_outputs(graph: LayerGraph) -> str:
    """``0: (3,), 1: (5,)`` or ``'mask': (1, 8, 8), 'label': (3,)``: a traced model's
    outputs as selectors name them, with their shapes per sample."""
    out = next(n for n in graph.graph.nodes if n.op == "output").args[0]
    if isinstance(out, fx.Node) and isinstance(out.target, type) and hasattr(out.target,
                                                                            "_fields"):
        out = dict(zip(out.target._fields, out.args, strict=False))  # a namedtuple
    if isinstance(out, dict):
        return ", ".join(f"{k!r}: {_shape(graph, v)}" for k, v in out.items())
    if isinstance(out, (tuple, list)):
        return ", ".join(f"{i}: {_shape(graph, v)}" for i, v in enumerate(out))
    return _shape(graph, out)


def _shape(graph: LayerGraph, value: Any) -> str:
    return str(graph.output_shape(value)) if isinstance(value, fx.Node) and \
        "tensor_meta" in value.meta else type(value).__name__


def classifier_output(graph: LayerGraph, classes: int, what: str = "the data") -> None:
    """Refuse a traced model whose output is not one tensor of ``classes`` logits per
    sample: with several outputs, say which exist and how to pick one (``outputs=`` /
    ``--output``); with one output of another size (a U-Net's per-pixel mask), say that
    cross-entropy, margins and the bounds of Thm 4.1.1-4.1.2 need one logit per class.
    Read from the graph's recorded shapes: nothing runs."""
    nodes = graph.outputs()
    if len(nodes) != 1:
        raise ShapeError(
            f"the model returns {len(nodes)} outputs ({describe_outputs(graph)}); pick the "
            f"logits of the {classes} classes of {what} with outputs=KEY (Python) or "
            "--output KEY (command line)")
    shape = graph.output_shape(nodes[0])
    if math.prod(shape) != classes:
        raise ShapeError(
            f"the model's output has {math.prod(shape)} values per sample (shape {shape}), "
            f"{what} has {classes} classes: cross-entropy, margins and the bounds of Thm "
            "4.1.1-4.1.2 need one logit per class. Pick the output holding them (outputs= / "
            "--output), or use data with one class per output")
