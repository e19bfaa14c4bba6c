"""Reference ReLU architectures; the torchvision ones share torchvision's parameter names."""

from pathlift.models.alexnet import alexnet
from pathlift.models.checkpoints import (
    Checkpoint,
    UnsafeCheckpointError,
    load_model,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from pathlift.models.factory import model_factory
from pathlift.models.mobilenet import mobilenet_relu
from pathlift.models.registry import REFERENCE_MODELS, ModelSpec, get_model
from pathlift.models.resnet import resnet18, resnet34, resnet50, resnet101, resnet152
from pathlift.models.small import mlp, small_cnn
from pathlift.models.unet import unet
from pathlift.models.vgg import vgg11, vgg11_bn, vgg16, vgg16_bn

__all__ = [
    "REFERENCE_MODELS",
    "Checkpoint",
    "ModelSpec",
    "UnsafeCheckpointError",
    "alexnet",
    "get_model",
    "load_model",
    "load_weights",
    "mlp",
    "mobilenet_relu",
    "model_factory",
    "read_checkpoint",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "save_checkpoint",
    "small_cnn",
    "unet",
    "vgg11",
    "vgg11_bn",
    "vgg16",
    "vgg16_bn",
]
