"""The one place that understands torch: tracing, validation, the model boundary, and the
graph passes (the registry of supported operations is ``pathlift.graph.ops``)."""

from pathlift.graph.abs_pow import AbsPowInterpreter, Scaled
from pathlift.graph.boundary import copy_model, eval_mode, param, unwrap, writable_copy
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import Call, Handler, Kind, batchnorm_affine, handler_for
from pathlift.graph.trace import CheckReport, check, graph_of, trace
from pathlift.graph.walk import OpWalker

__all__ = [
    "AbsPowInterpreter",
    "Call",
    "CheckReport",
    "Handler",
    "Kind",
    "LayerGraph",
    "OpWalker",
    "Scaled",
    "batchnorm_affine",
    "check",
    "copy_model",
    "eval_mode",
    "graph_of",
    "handler_for",
    "param",
    "trace",
    "unwrap",
    "writable_copy",
]
