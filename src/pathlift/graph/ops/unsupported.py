"""Operations known to lie outside the ReLU DAG model of thesis Def. 2.2.2, each refused
with the reason it shares with others of its kind and what is supported instead."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from pathlift.graph.ops.base import UnsupportedHandler, register

_CURVED = ("is not piecewise linear, so no ReLU network computes it (Def. 2.2.2); use a "
           "piecewise-linear activation")  # followed by the supported ones (the registry's)
_NORMALISES = ("normalises by a data-dependent statistic, which is not an affine neuron; use "
               "BatchNorm in eval mode (folded into an affine map)")
_PRODUCT = ("multiplies activations together (gating, attention, squeeze-excitation), "
            "which no ReLU network computes; supported: sums, concatenations, constant scales")
_SOFTMAX = ("normalises across outputs; path-norms and bounds apply to the logits: remove it "
            "from forward")
_LOOKUP = "is a lookup, not a neuron; feed the embedded input instead"

_MODULES = {
    _CURVED: (nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.ELU, nn.SELU, nn.CELU, nn.Softplus,
              nn.Mish, nn.Hardswish, nn.Tanhshrink, nn.Softsign, nn.LogSigmoid),
    _NORMALISES: (nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d,
                  nn.InstanceNorm3d, nn.LocalResponseNorm, nn.RMSNorm),
    _PRODUCT: (nn.MultiheadAttention, nn.Bilinear, nn.LSTM, nn.GRU, nn.RNN),
    _SOFTMAX: (nn.Softmax, nn.LogSoftmax, nn.Softmin),
    _LOOKUP: (nn.Embedding, nn.EmbeddingBag),
}
_FUNCTIONS = {
    _CURVED: (F.gelu, F.silu, torch.sigmoid, F.sigmoid, torch.tanh, F.tanh, F.elu, F.selu,
              F.softplus, F.mish, F.hardswish, torch.exp, torch.log, torch.sqrt,
              F.logsigmoid),
    _NORMALISES: (F.layer_norm, F.group_norm, F.instance_norm, F.normalize, F.rms_norm),
    _PRODUCT: (F.scaled_dot_product_attention, torch.matmul, operator.matmul, torch.bmm,
               torch.einsum, F.bilinear),
    _SOFTMAX: (F.softmax, F.log_softmax, torch.softmax, torch.log_softmax),
    _LOOKUP: (F.embedding,),
}
_METHODS = {
    _CURVED: ("sigmoid", "tanh", "exp", "log", "sqrt"),
    _PRODUCT: ("matmul", "bmm", "__matmul__"),
    _SOFTMAX: ("softmax", "log_softmax"),
}

_INSTEAD = {_CURVED: "activations"}  # the family whose supported ops the message lists

for _cause, _classes in _MODULES.items():
    for _cls in _classes:
        register(UnsupportedHandler(_cls.__name__, _cause, _INSTEAD.get(_cause, "")),
                 modules=[_cls])
for _cause, _fns in _FUNCTIONS.items():
    for _fn in _fns:
        register(UnsupportedHandler(getattr(_fn, "__name__", str(_fn)), _cause,
                                    _INSTEAD.get(_cause, "")), functions=[_fn])
for _cause, _names in _METHODS.items():
    for _name in _names:
        register(UnsupportedHandler(_name, _cause, _INSTEAD.get(_cause, "")), methods=[_name])
