"""Model factories from a command-line spec: a registered name, ``module:callable``, or a
checkpoint file."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path

from torch import nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import copy_model
from pathlift.models.checkpoints import _is_path, load_model
from pathlift.models.registry import REFERENCE_MODELS, get_model

__all__ = ["model_factory"]


def model_factory(spec: str, num_classes: int | None = None, weights: str | None = None
                  ) -> Callable[[], nn.Module]:
    """A callable building a fresh model from ``spec``.

    - a registered name (``pathlift models``; a torchvision name when torchvision is
      installed): a new randomly initialised model each call, with ``num_classes`` when
      its constructor takes that argument;
    - ``module:callable`` (``mypackage.nets:make_net``; the current folder is importable):
      the callable, called with no argument, must return an ``nn.Module``;
    - a checkpoint file, or a name with ``weights``: each call returns a copy of those
      weights (``load_model``), so every run starts from them.

    Raises:
        InvalidParameterError: unknown name, module or attribute, or a factory that does
            not return an ``nn.Module``.

    Example::

        make = model_factory("small_cnn", num_classes=10)
        make = model_factory("examples.nets:tiny_cnn")
    """
    if weights is not None or _is_path(spec):
        template, _ = load_model(spec, None, weights)
        return lambda: copy_model(template)
    if ":" in spec:
        return _imported(spec)
    constructor = REFERENCE_MODELS[spec].constructor if spec in REFERENCE_MODELS else None
    takes = constructor is None or "num_classes" in inspect.signature(constructor).parameters
    kwargs = {"num_classes": num_classes} if num_classes is not None and takes else {}
    get_model(spec, **kwargs)  # an unknown name fails here, before any training
    return functools.partial(get_model, spec, **kwargs)


def _imported(spec: str) -> Callable[[], nn.Module]:
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # as `python -m` does, so local modules import
        sys.path.insert(0, os.getcwd())
    try:
        target = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise InvalidParameterError(
            f"cannot import '{spec}' ({err}); give module:callable with the module on the "
            f"Python path (current folder: {Path.cwd()})") from err
    if not callable(target):
        raise InvalidParameterError(f"'{spec}' is a {type(target).__name__}, not a callable")

    def make() -> nn.Module:
        model = target()
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(
                f"'{spec}' returned a {type(model).__name__}; it must return an nn.Module")
        return model

    return make
