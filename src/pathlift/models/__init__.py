"""Reference ReLU architectures; the torchvision ones share torchvision's parameter names."""

from pathlift.models.small import mlp, small_cnn

__all__ = ["mlp", "small_cnn"]
