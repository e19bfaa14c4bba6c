"""Uniform quantisation of ReLU networks (thesis Ch. 6) and the bits it needs; their certified
errors and the symmetry-aware quantiser (Sec. 7.5) are in ``pathlift.bounds``."""

from pathlift.quant.bits import BitsBudget, LFCNConstants, lfcn_constants, sufficient_bits
from pathlift.quant.model import QuantizedModel, quantize
from pathlift.quant.uniform import QuantizedTensor, Rounding, max_code, quantize_tensor

__all__ = [
    "BitsBudget",
    "LFCNConstants",
    "QuantizedModel",
    "QuantizedTensor",
    "Rounding",
    "lfcn_constants",
    "max_code",
    "quantize",
    "quantize_tensor",
    "sufficient_bits",
]
