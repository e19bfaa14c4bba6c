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

__version__ = "0.1.0"


def set_memory_limit(limit: int | str | None) -> None:
    """Refuse any pass or checkpoint estimated to need more than ``limit`` bytes (an int or
    "8G"); None: ``PATHLIFT_MAX_MEMORY``, else the memory available (pathlift.graph.memory)."""
    # start-up: pathlift.graph imports torch; `import pathlift` and the CLI's --help do not
    from pathlift.graph.memory import set_memory_limit as set_limit

    set_limit(limit)


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
]
