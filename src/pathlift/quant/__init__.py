"""Uniform quantisation of ReLU networks with certified errors (thesis Ch. 6, Sec. 7.5)."""

from pathlift.quant.bits import BitsBudget, LFCNConstants, lfcn_constants, sufficient_bits
from pathlift.quant.certify import CertifiedError, certified_error
from pathlift.quant.model import QuantizedModel, quantize
from pathlift.quant.symmetry_aware import (
    QuantReport,
    SymmetryAwareQuantized,
    append_csv,
    compare,
    symmetry_aware_quantize,
)
from pathlift.quant.uniform import QuantizedTensor, Rounding, max_code, quantize_tensor

__all__ = [
    "BitsBudget",
    "CertifiedError",
    "LFCNConstants",
    "QuantReport",
    "QuantizedModel",
    "QuantizedTensor",
    "Rounding",
    "SymmetryAwareQuantized",
    "append_csv",
    "certified_error",
    "compare",
    "lfcn_constants",
    "max_code",
    "quantize",
    "quantize_tensor",
    "sufficient_bits",
    "symmetry_aware_quantize",
]
