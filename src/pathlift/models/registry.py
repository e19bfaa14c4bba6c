"""The reference architectures by name, with their default input shapes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from pathlift.errors import InvalidParameterError
from pathlift.models.alexnet import alexnet
from pathlift.models.mobilenet import mobilenet_relu
from pathlift.models.resnet import resnet18, resnet34, resnet50, resnet101, resnet152
from pathlift.models.small import mlp, small_cnn
from pathlift.models.unet import unet
from pathlift.models.vgg import vgg11, vgg11_bn, vgg16, vgg16_bn

__all__ = ["REFERENCE_MODELS", "ModelSpec", "get_model"]

_IMAGENET = (3, 224, 224)


@dataclass(frozen=True)
class ModelSpec:
    """A constructor and the input shape (no batch dimension) its model is meant for."""

    constructor: Callable[..., nn.Module]
    input_shape: tuple[int, ...]

    def default_input_shape(self, **kwargs: Any) -> tuple[int, ...]:
        """``input_shape`` adapted to an ``in_channels`` or ``in_features`` keyword."""
        shape = self.input_shape
        if "in_channels" in kwargs:
            shape = (int(kwargs["in_channels"]), *shape[1:])
        if "in_features" in kwargs and int(kwargs["in_features"]) != math.prod(shape):
            shape = (int(kwargs["in_features"]),)
        return shape


REFERENCE_MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(mlp, (1, 8, 8)),
    "small_cnn": ModelSpec(small_cnn, (1, 8, 8)),
    "unet": ModelSpec(unet, (1, 64, 64)),
    "resnet18": ModelSpec(resnet18, _IMAGENET),
    "resnet34": ModelSpec(resnet34, _IMAGENET),
    "resnet50": ModelSpec(resnet50, _IMAGENET),
    "resnet101": ModelSpec(resnet101, _IMAGENET),
    "resnet152": ModelSpec(resnet152, _IMAGENET),
    "vgg11": ModelSpec(vgg11, _IMAGENET),
    "vgg11_bn": ModelSpec(vgg11_bn, _IMAGENET),
    "vgg16": ModelSpec(vgg16, _IMAGENET),
    "vgg16_bn": ModelSpec(vgg16_bn, _IMAGENET),
    "alexnet": ModelSpec(alexnet, _IMAGENET),
    "mobilenet_relu": ModelSpec(mobilenet_relu, _IMAGENET),
}


def get_model(name: str, **kwargs: Any) -> nn.Module:
    """A fresh, randomly initialised model: a reference architecture or, when torchvision
    is installed, any torchvision classification model name (pathlift's own names win)."""
    spec = REFERENCE_MODELS.get(name)
    if spec is not None:
        try:
            return spec.constructor(**kwargs)
        except TypeError as err:
            raise InvalidParameterError(f"bad arguments {kwargs} for model '{name}': {err}") \
                from err
    torchvision_models = _torchvision_models()
    if torchvision_models is not None and name in torchvision_models.list_models():
        return torchvision_models.get_model(name, weights=None, **kwargs)
    known = ", ".join(sorted(REFERENCE_MODELS))
    extra = "" if torchvision_models is None else " or a torchvision model name"
    raise InvalidParameterError(f"unknown model '{name}'; choose one of: {known}{extra}")


def _torchvision_models() -> Any | None:
    try:
        import torchvision.models as tv_models
    except Exception:  # absent, or present but broken against this torch build
        return None
    return tv_models
