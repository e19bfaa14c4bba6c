"""Models by name: the reference architectures, torchvision's, timm's (``timm:NAME``) and the
user's own factories named by import path (``module:callable`` or
``path/to/file.py:callable``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph.input_shape import InputShape, declared_input_shape
from pathlift.memory import check_bytes
from pathlift.models.alexnet import alexnet
from pathlift.models.mobilenet import mobilenet_relu
from pathlift.models.resnet import resnet18, resnet34, resnet50, resnet101, resnet152
from pathlift.models.small import mlp, small_cnn
from pathlift.models.timm_models import is_timm_spec, timm_model
from pathlift.models.unet import unet
from pathlift.models.vgg import vgg11, vgg11_bn, vgg16, vgg16_bn

__all__ = ["REFERENCE_MODELS", "ModelSpec", "ReferenceModel", "check_model_size",
           "default_input_shape", "get_model", "import_callable", "is_import_path",
           "model_input_shape",
           "reference_models"]

_IMAGENET = (3, 224, 224)


@dataclass(frozen=True)
class ModelSpec:
    """A constructor, the input shape (no batch dimension) its model is meant for, and the
    parameter count of its default configuration (what ``pathlift models`` lists without
    building anything; tests/test_models.py builds each model and checks it)."""

    constructor: Callable[..., nn.Module]
    input_shape: tuple[int, ...]
    parameters: int

    def default_input_shape(self, **kwargs: Any) -> tuple[int, ...]:
        """``input_shape`` adapted to an ``in_channels`` or ``in_features`` keyword."""
        shape = self.input_shape
        if "in_channels" in kwargs:
            shape = (int(kwargs["in_channels"]), *shape[1:])
        if "in_features" in kwargs and int(kwargs["in_features"]) != math.prod(shape):
            shape = (int(kwargs["in_features"]),)
        return shape


REFERENCE_MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(mlp, (1, 8, 8), 17_226),
    "small_cnn": ModelSpec(small_cnn, (1, 8, 8), 13_706),
    "unet": ModelSpec(unet, (1, 64, 64), 121_042),
    "resnet18": ModelSpec(resnet18, _IMAGENET, 11_689_512),
    "resnet34": ModelSpec(resnet34, _IMAGENET, 21_797_672),
    "resnet50": ModelSpec(resnet50, _IMAGENET, 25_557_032),
    "resnet101": ModelSpec(resnet101, _IMAGENET, 44_549_160),
    "resnet152": ModelSpec(resnet152, _IMAGENET, 60_192_808),
    "vgg11": ModelSpec(vgg11, _IMAGENET, 132_863_336),
    "vgg11_bn": ModelSpec(vgg11_bn, _IMAGENET, 132_868_840),
    "vgg16": ModelSpec(vgg16, _IMAGENET, 138_357_544),
    "vgg16_bn": ModelSpec(vgg16_bn, _IMAGENET, 138_365_992),
    "alexnet": ModelSpec(alexnet, _IMAGENET, 61_100_840),
    "mobilenet_relu": ModelSpec(mobilenet_relu, _IMAGENET, 3_504_872),
}


def get_model(name: str, **kwargs: Any) -> nn.Module:
    """A fresh, randomly initialised model from its name.

    ``name`` is a reference architecture (``pathlift models``), an import path
    ``module:callable`` or ``path/to/file.py:callable`` (a class or factory returning an
    ``nn.Module``, called with ``kwargs``; the current folder is importable, as with
    ``python -m``), ``timm:NAME`` for a timm architecture when timm is installed
    (``pathlift.models.timm_models``), or, when torchvision is installed, a torchvision
    classification model name (pathlift's own names win; detection, segmentation, video and
    quantised models, which download weights when asked, are not taken). Every model comes
    with random weights.

    Raises:
        InvalidParameterError: unknown name, module or attribute, bad ``kwargs``, or a
            factory that does not return an ``nn.Module``.

    Example:
        >>> net = get_model("mlp", num_classes=4)
        >>> net = get_model("mymodels:relu_mlp")  # mymodels.py in the current folder
    """
    spec = REFERENCE_MODELS.get(name)
    if is_timm_spec(name):
        return timm_model(name, **kwargs)
    constructor = spec.constructor if spec is not None else \
        import_callable(name) if is_import_path(name) else None
    if constructor is not None:
        try:
            model = constructor(**kwargs)
        except TypeError as err:
            missing = _missing_arguments(constructor, kwargs)
            if missing:
                wanted = json.dumps(kwargs)[:-1] + ", " * bool(kwargs) + \
                    ", ".join(f'"{arg}": ...' for arg in missing) + "}"
                raise InvalidParameterError(
                    f"model '{name}' needs {', '.join(missing)}, not given: pass "
                    f"{'it' if len(missing) == 1 else 'them'} with --model-kwargs "
                    f"'{wanted}' (in Python, as keyword arguments)") from err
            raise InvalidParameterError(f"bad arguments {kwargs} for model '{name}': {err}") \
                from err
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(
                f"'{name}' returned a {type(model).__name__}; it must return an nn.Module")
        return model
    torchvision_models = _torchvision_models()
    if torchvision_models is not None and \
            name in torchvision_models.list_models(module=torchvision_models):
        try:
            return torchvision_models.get_model(name, weights=None, **kwargs)
        except TypeError as err:
            raise InvalidParameterError(f"bad arguments {kwargs} for model '{name}': {err}") \
                from err
    known = ", ".join(sorted(REFERENCE_MODELS))
    extra = "" if torchvision_models is None else ", a torchvision model name"
    raise InvalidParameterError(f"unknown model {name!r}; choose one of: {known}{extra}, "
                                "timm:NAME, or module:callable / path/to/file.py:callable for "
                                "your own")


def _missing_arguments(constructor: Callable[..., Any], kwargs: dict[str, Any]) -> list[str]:
    """The parameters ``constructor`` requires (no default) that ``kwargs`` leaves out."""
    try:
        parameters = inspect.signature(constructor).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters
            if p.kind in named and p.default is p.empty and p.name not in kwargs]


def check_model_size(name: str, kwargs: dict[str, Any]) -> None:
    """Build ``name`` on the meta device (no memory, no initialisation) and refuse it,
    before it is built for real, when its parameters and buffers exceed the memory limit
    (``pathlift.memory.check_bytes``): huge constructor arguments from a checkpoint
    or a class count from data never allocate.

    Raises:
        MemoryLimitError: too large; InvalidParameterError: as ``get_model``, or sizes
            torch cannot build (negative, overflowing).
    """
    try:
        with torch.device("meta"):
            skeleton = get_model(name, **kwargs)
    except (RuntimeError, ValueError, OverflowError) as err:  # torch refusing the sizes
        raise InvalidParameterError(
            f"model {name!r} cannot be built with {kwargs} ({str(err).splitlines()[0][:200]}); "
            "check its constructor arguments") from err
    size = sum(t.numel() * t.element_size() for t in skeleton.state_dict().values())
    check_bytes(size, f"model '{name}'" + (f" {kwargs}" if kwargs else ""))


def is_import_path(name: str) -> bool:
    """Whether ``name`` reads ``module:callable`` or ``path/to/file.py:callable`` (a
    ``timm:NAME`` spec is a model name, not an import path)."""
    if is_timm_spec(name):
        return False
    module, colon, attr = str(name).rpartition(":")
    return bool(colon and module and attr.replace(".", "_").isidentifier())


def import_callable(path: str) -> Callable[..., Any]:
    """The object named by ``module:callable`` or ``path/to/file.py:callable``.

    A ``.py`` file is imported under its absolute path as module name, so a class defined
    there has ``__module__`` = that path and ``save_checkpoint`` can name it again.
    """
    module_name, _, attr = str(path).rpartition(":")
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name))
        else:
            if os.getcwd() not in sys.path:  # as `python -m` does, so local modules import
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
        target: Any = module
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, FileNotFoundError) as err:
        raise InvalidParameterError(
            f"cannot import '{path}' ({err}); give module:callable with the module on the "
            f"Python path (current folder: {Path.cwd()}) or path/to/file.py:callable") from err
    if not callable(target):
        raise InvalidParameterError(f"'{path}' is a {type(target).__name__}, not a callable")
    return target


def _import_file(file: Path) -> Any:
    key = str(file.resolve())
    if key in sys.modules:
        return sys.modules[key]
    if not file.is_file():
        raise FileNotFoundError(f"no Python file at '{file}'")
    spec = importlib.util.spec_from_file_location(key, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def default_input_shape(name: str, **kwargs: Any) -> InputShape:
    """The input shape (no batch dimension) a model name is meant for, with its source.

    A reference architecture's own (adapted to ``in_channels``/``in_features``); for an
    import path, the ``input_shape`` attribute of the callable, else of the model it
    builds; for a timm or torchvision name, the model's declaration
    (``pathlift.graph.input_shape.declared_input_shape``: timm's pretrained_cfg,
    torchvision's documented input), read from the model built on the meta device.

    Raises:
        ShapeError: a model that declares no input shape.
    """
    spec = REFERENCE_MODELS.get(name)
    if spec is not None:
        return InputShape(spec.default_input_shape(**kwargs), f"{name}'s default")
    return model_input_shape(name, None, **kwargs)


def model_input_shape(name: str, model: nn.Module | None, **kwargs: Any) -> InputShape:
    """The input shape ``model`` (built from ``name`` with ``kwargs``, on the meta device
    when None) declares, else the ``input_shape`` attribute of the callable an import path
    names; a ShapeError saying how to give one when neither does."""
    if is_import_path(name):
        shape = getattr(import_callable(name), "input_shape", None)
        if shape is not None:
            return InputShape(tuple(int(s) for s in shape), f"{name}.input_shape")
    if model is None:
        with torch.device("meta"):
            model = get_model(name, **kwargs)
    declared = declared_input_shape(model)
    if declared is None:
        raise ShapeError(f"'{name}' does not say its input shape: give --input-shape (input_shape"
                         " in Python), or set an input_shape attribute on the model or the "
                         "callable, as in make.input_shape = (3, 32, 32)")
    return declared


@dataclass(frozen=True)
class ReferenceModel:
    """One row of ``pathlift models``: a reference architecture's name, default input shape
    and parameter count."""

    name: str
    input_shape: tuple[int, ...]
    parameters: int


def reference_models() -> list[ReferenceModel]:
    """The reference architectures with their default input shapes and parameter counts
    (a listing: nothing is built)."""
    return [ReferenceModel(name, spec.input_shape, spec.parameters)
            for name, spec in REFERENCE_MODELS.items()]


def _torchvision_models() -> Any | None:
    try:
        import torchvision.models as tv_models
    except Exception:  # absent, or present but broken against this torch build
        return None
    return tv_models
