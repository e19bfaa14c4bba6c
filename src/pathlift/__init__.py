"""pathlift: the path-lifting of ReLU networks, made usable on real PyTorch models."""

from pathlift.errors import (
    ArchitectureMismatchError,
    InvalidParameterError,
    LeadingDimensionWarning,
    PathliftError,
    PrecisionError,
    ShapeError,
    UnsupportedModelError,
)
from pathlift.memory import set_memory_limit, set_time_limit

__version__ = "0.1.0"


__all__ = [
    "ArchitectureMismatchError",
    "InvalidParameterError",
    "LeadingDimensionWarning",
    "PathliftError",
    "PrecisionError",
    "ShapeError",
    "UnsupportedModelError",
    "__version__",
    "set_memory_limit",
    "set_time_limit",
]
