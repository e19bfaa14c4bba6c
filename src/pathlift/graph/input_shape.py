"""The input shape of a traced model (without the batch dimension): checked when given,
else the model's own declaration, never guessed and never an earlier call's.

A path-norm depends on the input shape (a global average pool over an h x w map weighs
each path by (1/hw)^q, Thm 3.1.1), so a wrong shape is a silent wrong number. Without a
shape pathlift reads what the model declares, in this order (after the graph's own, for a
copy pathlift made from a traced graph): an ``input_shape`` attribute
(pathlift's reference architectures set it; so may any user's model), timm's
``pretrained_cfg["input_size"]``, torchvision's documented input of its classification
models; with none it refuses (``ShapeError``) saying how to give one. The shape records
where it came from (``InputShape.source``), which results and the command line print.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from pathlift.errors import ShapeError
from pathlift.graph import cache

GIVEN = "given"
_HINT = "give the input shape without the batch dimension, e.g. (3, 224, 224)"


class InputShape(tuple):
    """An input shape (a tuple of sizes, equal to and hashed as the plain tuple) with
    ``source``: where it came from ("given", "model.input_shape", ...)."""

    source: str

    def __new__(cls, sizes: Sequence[int], source: str = GIVEN) -> InputShape:
        shape = super().__new__(cls, sizes)
        shape.source = source
        return shape

    def __reduce__(self) -> tuple[Any, ...]:
        return InputShape, (tuple(self), self.source)

    def __repr__(self) -> str:
        return repr(tuple(self))

    def described(self) -> str:
        """``(3, 224, 224) (from timm's pretrained_cfg['input_size'])``: what results print."""
        return f"{tuple(self)} (from {self.source})"


def as_input_shape(input_shape: Sequence[int], source: str | None = None) -> InputShape:
    """``input_shape`` as positive int sizes, keeping its source (``source`` when given,
    else that of an ``InputShape``, else "given"); ShapeError for anything else."""
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise ShapeError(f"input_shape must be a sequence of sizes, got {input_shape!r}; {_HINT}")
    sizes = []
    for s in input_shape:
        if isinstance(s, bool) or not (isinstance(s, int) or (
                isinstance(s, (float, Tensor)) and float(s).is_integer())):
            raise ShapeError(f"input_shape {tuple(input_shape)} must hold whole sizes; {_HINT}")
        sizes.append(int(s))
    if not sizes or any(s <= 0 for s in sizes):
        raise ShapeError(f"input_shape {tuple(input_shape)} must be positive sizes; {_HINT}")
    if source is None:
        source = getattr(input_shape, "source", GIVEN)
    return InputShape(sizes, source)


def shape_used(graph_shape: Sequence[int], given: Sequence[int] | None) -> InputShape:
    """The shape a result was computed at (its graph's) with its source: the caller's when
    it gave a shape (the graph of a model traced at its declared shape is also the graph
    of that shape given, and says "given" then), else the graph's own."""
    return as_input_shape(graph_shape, None if given is None else getattr(given, "source", GIVEN))


#: the documented input of torchvision's classification models (their weights' transforms
#: crop 224, Inception-v3's 299).
_TORCHVISION = "torchvision.models."
_TORCHVISION_INPUT = {"Inception3": (3, 299, 299)}


def declared_input_shape(model: nn.Module) -> InputShape | None:
    """The input shape ``model`` declares, with its source, or None (see the module
    docstring for the order). A declaration that is not a shape is a ShapeError naming it."""
    declared = getattr(model, "input_shape", None)
    if declared is not None:
        return _declared(declared, f"{type(model).__name__}.input_shape")
    config = getattr(model, "pretrained_cfg", None)
    if isinstance(config, dict) and config.get("input_size") is not None:
        return _declared(config["input_size"], "timm's pretrained_cfg['input_size']")
    cls = type(model)
    # classification models live in torchvision.models.NAME, the others one package deeper
    if cls.__module__.startswith(_TORCHVISION) and cls.__module__.count(".") == 2:
        return InputShape(_TORCHVISION_INPUT.get(cls.__name__, (3, 224, 224)),
                          f"torchvision's documented input of {cls.__name__}")
    return None


def _declared(declared: object, where: str) -> InputShape:
    try:
        return as_input_shape(declared, where)  # type: ignore[arg-type]
    except ShapeError:
        raise ShapeError(f"{where} = {declared!r} is not an input shape; set it to the sizes "
                         "without the batch dimension, e.g. (3, 224, 224), or pass "
                         "input_shape") from None


def resolve_input_shape(model: nn.Module, input_shape: Sequence[int] | None) -> InputShape:
    """``input_shape`` itself when given; else, for a copy pathlift made from a graph (a
    normalised, rescaled or quantised model), the shape of that graph; else the model's
    declaration (``declared_input_shape``); else a one-line ShapeError saying how to give
    one."""
    if input_shape is not None:
        return as_input_shape(input_shape)
    made = cache.made_at(model)
    if made is not None:
        return InputShape(made, "the graph pathlift made this copy from")
    declared = declared_input_shape(model)
    if declared is None:
        raise ShapeError(f"{type(model).__name__} does not declare its input shape and none "
                         "was given: pass input_shape (without the batch dimension, e.g. "
                         "input_shape=(3, 32, 32); --input-shape 3 32 32 on the command "
                         "line), or set model.input_shape")
    return declared
