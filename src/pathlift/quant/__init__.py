"""Uniform quantisation of ReLU networks with certified errors (thesis Ch. 6, Sec. 7.5)."""

from pathlift.quant.certify import CertifiedError, certified_error
from pathlift.quant.model import QuantizedModel, quantize
from pathlift.quant.uniform import QuantizedTensor, Rounding, max_code, quantize_tensor

__all__ = [
    "CertifiedError",
    "QuantizedModel",
    "QuantizedTensor",
    "Rounding",
    "certified_error",
    "max_code",
    "quantize",
    "quantize_tensor",
]
