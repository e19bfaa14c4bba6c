"""The one place that understands torch: tracing, validation, and graph passes."""

from pathlift.graph.abs_pow import AbsPowInterpreter, Scaled
from pathlift.graph.ops import Call, Handler, Kind, batchnorm_affine, handler_for, param
from pathlift.graph.trace import CheckReport, LayerGraph, check, trace

__all__ = [
    "AbsPowInterpreter",
    "Call",
    "CheckReport",
    "Handler",
    "Kind",
    "LayerGraph",
    "Scaled",
    "batchnorm_affine",
    "check",
    "handler_for",
    "param",
    "trace",
]
