"""Certified quantisation error: the l1 path-metric d(theta, Q(theta)) and the bound
max(1, ||x||_inf) * d(theta, Q(theta)) on ||R_theta(x) - R_Q(theta)(x)||_1 (Cor. 3.4.1).

Cor. 3.4.1 bounds every output norm ||.||_r, r >= 1, under theta_i Q(theta)_i >= 0; its
proof bounds each output coordinate v by max(1, ||x||_inf) ||Phi^{->v}(theta) -
Phi^{->v}(theta')||_1 and sums over v, so the l1 norm of the output error (the largest of
the r-norms) is what is certified. All three roundings keep signs. Rounding towards zero
also keeps |Q(theta)| <= |theta|, so d is exact in two forward passes (Lemma 3.4.1);
otherwise ``pathlift.lift.path_metric`` gives a certified interval and the bound uses its
upper end (paper 002 Lemma F.3, infinite where its premise fails).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from pathlift.bounds.compression import input_scale
from pathlift.errors import InvalidParameterError
from pathlift.graph import LayerGraph
from pathlift.lift import PathMetric, path_metric
from pathlift.logspace import power10
from pathlift.quant.model import QuantizedModel


@dataclass(frozen=True)
class CertifiedError:
    """d(theta, Q(theta)) as a ``PathMetric`` (``exact`` for rounding towards zero, else an
    interval) and what it certifies. ``value``/``log10`` are d, or the upper end of its
    interval; ``relative`` is that over ||Phi(theta)||_1 (in [0, 1] when exact)."""

    metric: PathMetric

    @property
    def exact(self) -> bool:
        return self.metric.exact

    @property
    def log10(self) -> float:
        return self.metric.upper_log10

    @property
    def value(self) -> float:
        return self.metric.upper

    @property
    def path_norm_log10(self) -> float:
        """log10 ||Phi(theta)||_1 of the original network."""
        return self.metric.norm_a_log10

    @property
    def relative(self) -> float:
        return power10(self.log10 - self.path_norm_log10)

    def bound(self, x: Tensor) -> Tensor:
        """max(1, ||x||_inf) * d for each sample of the batch ``x`` (Cor. 3.4.1): a bound on
        ||R_theta(x) - R_Q(theta)(x)||_1."""
        return input_scale(x) * self.value


def certified_error(model: nn.Module | LayerGraph, quantized: QuantizedModel | nn.Module,
                    input_shape: Sequence[int] | None = None) -> CertifiedError:
    """d(theta, Q(theta)) by ``path_metric`` (two |theta| passes, Lemma 3.4.1, when exact).

    Raises InvalidParameterError when a sign differs (Cor. 3.4.1 then certifies nothing)
    and ArchitectureMismatchError when the networks differ in structure.
    """
    if isinstance(quantized, QuantizedModel):
        quantized = quantized.model
    metric = path_metric(model, quantized, input_shape)
    if not metric.same_signs:
        raise InvalidParameterError(
            "some parameter changes sign between the two networks: Cor. 3.4.1 needs "
            "theta_i theta'_i >= 0; quantise with pathlift.quant.quantize")
    return CertifiedError(metric)
