"""Reference ReLU architectures (the torchvision ones share torchvision's parameter names),
models by name (reference, torchvision, ``timm:NAME``, import paths) and checkpoints."""

from pathlift.models.alexnet import alexnet
from pathlift.models.checkpoints import (
    Checkpoint,
    UnsafeCheckpointError,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from pathlift.models.loading import (
    UntrustedArchitectureError,
    load_model,
    load_model_pair,
    model_factory,
    save_like,
    set_trust_arch,
)
from pathlift.models.mobilenet import mobilenet_relu
from pathlift.models.registry import (
    REFERENCE_MODELS,
    ModelSpec,
    ReferenceModel,
    default_input_shape,
    get_model,
    import_callable,
    model_input_shape,
    reference_models,
)
from pathlift.models.resnet import resnet18, resnet34, resnet50, resnet101, resnet152
from pathlift.models.small import mlp, small_cnn
from pathlift.models.unet import unet
from pathlift.models.vgg import vgg11, vgg11_bn, vgg16, vgg16_bn

__all__ = [
    "REFERENCE_MODELS",
    "Checkpoint",
    "ModelSpec",
    "ReferenceModel",
    "UnsafeCheckpointError",
    "UntrustedArchitectureError",
    "alexnet",
    "default_input_shape",
    "get_model",
    "import_callable",
    "load_model",
    "load_model_pair",
    "load_weights",
    "mlp",
    "mobilenet_relu",
    "model_factory",
    "model_input_shape",
    "read_checkpoint",
    "reference_models",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "save_checkpoint",
    "save_like",
    "set_trust_arch",
    "small_cnn",
    "unet",
    "vgg11",
    "vgg11_bn",
    "vgg16",
    "vgg16_bn",
]
