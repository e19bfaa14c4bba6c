"""Certified quantisation error: the l1 path-metric d(theta, Q(theta)) and the bound
max(1, ||x||_inf) * d(theta, Q(theta)) on ||R_theta(x) - R_Q(theta)(x)||_1 (Cor. 3.4.1).

Cor. 3.4.1 bounds every output norm ||.||_r, r >= 1; its proof bounds each output
coordinate v by max(1, ||x||_inf) * ||Phi^{->v}(theta) - Phi^{->v}(theta')||_1 and sums
them, so the l1 norm of the output error (the largest of the r-norms) is certified, and
each output coordinate separately by its own share d_v.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.graph import LayerGraph, trace
from pathlift.lift import path_norm_of_graph
from pathlift.quant.model import QuantizedModel
from pathlift.quant.uniform import Rounding

_LN10 = math.log(10.0)


@dataclass(frozen=True)
class CertifiedError:
    """The l1 path-metric d(theta, Q(theta)) (exact for rounding towards zero, Lemma 3.4.1)
    and what it certifies (Cor. 3.4.1). ``log10`` is log10 d (never overflows);
    ``per_output_log10`` holds log10 d_v = log10 ||Phi^{->v}(theta) - Phi^{->v}(Q)||_1 and
    ``path_norm_log10`` log10 ||Phi(theta)||_1, so ``relative`` = d / ||Phi(theta)||_1."""

    log10: float
    per_output_log10: tuple[float, ...]
    path_norm_log10: float
    exact: bool

    @property
    def value(self) -> float:
        return math.inf if self.log10 > 308.25 else 10.0**self.log10

    @property
    def relative(self) -> float:
        """d(theta, Q(theta)) / ||Phi(theta)||_1, in [0, 1] for rounding towards zero."""
        return 10.0 ** (self.log10 - self.path_norm_log10)

    def bound(self, x: Tensor) -> Tensor:
        """max(1, ||x||_inf) * d for each sample of the batch ``x`` (Cor. 3.4.1): a bound on
        ||R_theta(x) - R_Q(theta)(x)||_1."""
        return _input_factor(x) * self.value

    def per_output_bound(self, x: Tensor) -> Tensor:
        """max(1, ||x||_inf) * d_v, shape (batch, outputs): a bound on each
        |R_theta(x)_v - R_Q(theta)(x)_v| (proof of Cor. 3.4.1)."""
        d_v = torch.tensor(self.per_output_log10, dtype=torch.float64).mul(_LN10).exp()
        return _input_factor(x)[:, None] * d_v


def _input_factor(x: Tensor) -> Tensor:
    return x.detach().double().flatten(1).abs().amax(dim=1).clamp(min=1.0)


def certified_error(model: nn.Module, quantized: QuantizedModel | nn.Module,
                    input_shape: Sequence[int]) -> CertifiedError:
    """d(theta, Q(theta)) = ||Phi(theta)||_1 - ||Phi(Q(theta))||_1 in two |theta| forward
    passes on the all-ones input (Lemma 3.4.1, Eq. 3.8), carried in log space.

    Exact when Q keeps signs and |Q(theta)| <= |theta| coordinatewise (rounding towards
    zero). Raises ArchitectureMismatchError when the two networks differ in structure and
    InvalidParameterError when the rounding is not towards zero.
    """
    if isinstance(quantized, QuantizedModel):
        if quantized.rounding is not Rounding.ZERO:
            raise InvalidParameterError(
                f"rounding '{quantized.rounding}' may increase |theta|; the two-pass "
                "path-metric of Lemma 3.4.1 is exact only for rounding='zero'")
        quantized = quantized.model
    graph, qgraph = trace(model, input_shape), trace(quantized, input_shape)
    _check_same_structure(graph, qgraph)
    logs, qlogs = _output_logs(graph), _output_logs(qgraph)
    gap = torch.clamp(qlogs - logs, max=0.0)
    per_output = logs + torch.log(-torch.expm1(gap))
    total = float(torch.logsumexp(per_output, dim=0))
    return CertifiedError(
        log10=total / _LN10,
        per_output_log10=tuple((per_output / _LN10).tolist()),
        path_norm_log10=float(torch.logsumexp(logs, dim=0)) / _LN10,
        exact=True,
    )


def _output_logs(graph: LayerGraph) -> Tensor:
    """ln ||Phi^{->v}||_1 for every output neuron v (Thm 3.1.1 with q = 1)."""
    per_output = path_norm_of_graph(graph, q=1.0).per_output_log10
    return torch.tensor(per_output, dtype=torch.float64) * _LN10


def _check_same_structure(a: LayerGraph, b: LayerGraph) -> None:
    ops_a = [(n.op, str(n.target)) for n in a.nodes()]
    ops_b = [(n.op, str(n.target)) for n in b.nodes()]
    if ops_a != ops_b:
        raise ArchitectureMismatchError(
            "the quantised network does not have the original's graph; pass the copy "
            "returned by quantize()")
