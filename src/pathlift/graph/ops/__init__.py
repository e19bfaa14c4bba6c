"""The op table: one handler per supported operation, one module per op family.

Every node of a traced model is matched to exactly one handler (``handler_for``). A
handler's kind says which neurons of thesis Def. 2.2.2 it makes and so which hook of a
pass (``pathlift.graph.walk.OpWalker``) runs it; its traits are data; the protocol of its
family says how it acts on the |theta|^q network of Thm 3.1.1 and the other passes.
Adding a supported operation is adding one module here (every module of this package is
imported, and registers its handlers with ``register``) and its tests.
"""

import importlib
import pkgutil

from pathlift.graph.ops.activation import Activation, Pieces
from pathlift.graph.ops.affine import (
    AffineHandler,
    BatchNormHandler,
    LinearHandler,
    Workspace,
    abs_power,
    batchnorm_affine,
    channel_view,
    unit_of,
)
from pathlift.graph.ops.base import (
    FUNCTIONS,
    METHODS,
    MODULES,
    Call,
    Handler,
    Kind,
    UnsupportedHandler,
    handler_for,
    register,
    supported_summary,
)
from pathlift.graph.ops.pooling import FixedLinear, window_max, window_sum

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "FUNCTIONS",
    "METHODS",
    "MODULES",
    "Activation",
    "AffineHandler",
    "BatchNormHandler",
    "Call",
    "FixedLinear",
    "Handler",
    "Kind",
    "LinearHandler",
    "Pieces",
    "UnsupportedHandler",
    "Workspace",
    "abs_power",
    "batchnorm_affine",
    "channel_view",
    "handler_for",
    "register",
    "supported_summary",
    "unit_of",
    "window_max",
    "window_sum",
]
