"""The input shape of a traced model (without the batch dimension): checked when given,
inferred from the first layer when not."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from pathlift.errors import ShapeError, UnsupportedModelError


def as_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints; ShapeError for anything else."""
    hint = "give the input shape without the batch dimension, e.g. (3, 224, 224)"
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise ShapeError(f"input_shape must be a sequence of sizes, got {input_shape!r}; {hint}")
    sizes = []
    for s in input_shape:
        if isinstance(s, bool) or not (isinstance(s, int) or (
                isinstance(s, (float, Tensor)) and float(s).is_integer())):
            raise ShapeError(f"input_shape {tuple(input_shape)} must hold whole sizes; {hint}")
        sizes.append(int(s))
    if not sizes or any(s <= 0 for s in sizes):
        raise ShapeError(f"input_shape {tuple(input_shape)} must be positive sizes; {hint}")
    return tuple(sizes)


_SPATIAL_GUESSES = (32, 224, 64, 8, 28, 16, 96, 128, 256)


def resolve_input_shape(model: nn.Module, input_shape: Sequence[int] | None,
                        traces: Callable[[nn.Module, tuple[int, ...]], object]
                        ) -> tuple[int, ...]:
    """``input_shape`` itself, or one inferred from the first layer when it is None.

    A first Linear gives (in_features,); a first ConvNd gives (in_channels, s, ..., s) for
    the first spatial size s among common ones for which ``traces(model, shape)`` raises
    no ShapeError or UnsupportedModelError.
    """
    if input_shape is not None:
        return as_input_shape(input_shape)
    first = next((m for m in model.modules()
                  if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))), None)
    if isinstance(first, nn.Linear):
        return (first.in_features,)
    if first is not None:
        dims = len(first.kernel_size)
        for size in _SPATIAL_GUESSES:
            shape = (first.in_channels, *(size,) * dims)
            try:
                traces(model, shape)
            except (ShapeError, UnsupportedModelError):
                continue
            return shape
    raise ShapeError("cannot infer the input shape of this model; pass input_shape "
                     "(without the batch dimension), e.g. input_shape=(3, 32, 32)")

