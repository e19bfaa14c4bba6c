"""Model factories from a command-line spec: a model name (reference, torchvision or
import path) or a checkpoint file."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from pathlift.errors import ShapeError
from pathlift.graph import copy_model
from pathlift.models.checkpoints import _is_path, load_model, read_checkpoint, save_checkpoint
from pathlift.models.registry import REFERENCE_MODELS, get_model, is_import_path

__all__ = ["load_model_pair", "model_factory", "save_like"]


def model_factory(spec: str, num_classes: int | None = None, weights: str | None = None
                  ) -> Callable[[], nn.Module]:
    """A callable building a fresh model from ``spec``.

    - a model name (``pathlift models``, ``module:callable``, ``path/to/file.py:callable``;
      a torchvision name when torchvision is installed): a new randomly initialised model
      each call, with ``num_classes`` when a reference constructor takes that argument;
    - a checkpoint file, or a name with ``weights``: each call returns a copy of those
      weights (``load_model``), so every run starts from them.

    Raises:
        InvalidParameterError: unknown name, module or attribute, or a factory that does
            not return an ``nn.Module`` (checked here, before any training).

    Example::

        make = model_factory("small_cnn", num_classes=10)
        make = model_factory("examples.nets:tiny_cnn")
    """
    if weights is not None or _is_path(spec):
        template, _ = load_model(spec, None, weights)
        return lambda: copy_model(template)
    constructor = REFERENCE_MODELS[spec].constructor if spec in REFERENCE_MODELS else None
    takes = "num_classes" in inspect.signature(constructor).parameters if constructor \
        else not is_import_path(spec)  # torchvision constructors take num_classes
    kwargs = {"num_classes": num_classes} if num_classes is not None and takes else {}
    get_model(spec, **kwargs)  # an unknown name fails here, before any training
    return functools.partial(get_model, spec, **kwargs)


def load_model_pair(spec_a: str, spec_b: str, input_shape: Sequence[int] | None = None,
                    weights_a: str | None = None, weights_b: str | None = None, *,
                    seed: int | None = None) -> tuple[nn.Module, nn.Module, tuple[int, ...]]:
    """Two models (``load_model`` each) and their common input shape.

    Raises:
        ShapeError: they come with different input shapes and ``input_shape`` does not
            choose one.
    """
    net_a, shape = load_model(spec_a, input_shape, weights_a, seed=seed)
    net_b, shape_b = load_model(spec_b, input_shape, weights_b, seed=seed)
    if shape != shape_b:
        raise ShapeError(f"{spec_a} has input shape {shape} and {spec_b} has {shape_b} (stored "
                         "in a checkpoint, or an architecture's default): give --input-shape")
    return net_a, net_b, shape


def save_like(model: nn.Module, spec: str, path: str | Path,
              input_shape: Sequence[int]) -> Path:
    """Write ``model`` as a checkpoint of the architecture (and constructor kwargs) that
    ``spec`` names: a model name, or a checkpoint file whose architecture is reused."""
    arch, kwargs = spec, {}
    if _is_path(spec):
        ckpt = read_checkpoint(spec)
        arch, kwargs = ckpt.arch or spec, ckpt.kwargs
    return save_checkpoint(model, path, arch, input_shape=input_shape, **kwargs)
