"""Symmetry-aware quantisation: pick a canonical point of the rescaling class, then quantise
(thesis Sec. 7.5, which proposes reducing to a canonical form before quantising).

Phi and the function are invariant under rescaling (Def. 2.4.1) but uniform quantisation is
not: a random rescaling with factors up to 4096 puts most weights of a tensor below its
step, so plain quantisation erases almost every path. Normalising first (Alg. 3.2.1) maps
every rescaled copy to the same parameters, so the certified error of the symmetry-aware
quantiser is a function of the rescaling class only. Among the normalisations for
q in ``qs``, the one with the smallest certified error d(theta, Q(N_q(theta))) is kept
(still a function of the class only). Because d = ||Phi(theta)||_1 - ||Phi(Q)||_1 for
rounding towards zero (Lemma 3.4.1), every certified error lies in [0, ||Phi(theta)||_1].

The certificate is d(N(theta), Q(N(theta))), exact in two passes: theta is only
rescaling-equivalent to a parameter dominating Q(N(theta)), and Phi(N(theta)) = Phi(theta)
(Lemma B.1; the remark after Lemma 3.4.1), up to the floating-point rounding of the
normalised weights (relative 1e-7 in float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.bounds.quantization import CertifiedError, certified_error
from pathlift.errors import InvalidParameterError
from pathlift.graph import LayerGraph, copy_model, graph_of
from pathlift.graph.boundary import dtype_device, flat_outputs, model_input
from pathlift.quant.model import QuantizedModel, quantize
from pathlift.quant.uniform import Rounding
from pathlift.symmetry import normalize

DEFAULT_QS = (1.0, 2.0, math.inf)


@dataclass(frozen=True)
class SymmetryAwareQuantized:
    """The quantised normalised copy, the normalisation exponent ``q`` that was kept and its
    certified error d(N_q(theta), Q(N_q(theta))) = d(theta, Q(N_q(theta)))."""

    quantized: QuantizedModel
    q: float
    certified: CertifiedError


def symmetry_aware_quantize(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                            bits: int, *, per_channel: bool = False,
                            qs: Sequence[float] = DEFAULT_QS) -> SymmetryAwareQuantized:
    """Normalise (Alg. 3.2.1) with each q in ``qs``, quantise towards zero with ``bits``,
    keep the copy with the smallest certified error (Lemma 3.4.1). The model is unchanged
    and traced once: every normalised and quantised copy shares its graph."""
    if not qs:
        raise InvalidParameterError("qs must list at least one normalisation exponent")
    graph = graph_of(model, input_shape)
    best = None
    for q in qs:
        normalised = normalize(graph, None, q=q)
        quantized = quantize(normalised, bits=bits, per_channel=per_channel)
        certified = certified_error(normalised, quantized)
        if best is None or certified.log10 < best.certified.log10:
            best = SymmetryAwareQuantized(quantized, float(q), certified)
    return best


@dataclass(frozen=True)
class QuantReport:
    """One quantised copy (``method`` "plain" or "aware q=..." with the normalisation
    exponent kept) judged at equal bits: certified error d and d / ||Phi||_1, the
    measured worst ||R_theta(x) - R_Q(x)||_1 over the inputs and its certified bound, and
    top-1 accuracy when labels were given."""

    method: str
    bits: int
    certified: float
    relative: float
    measured: float
    bound: float
    accuracy: float | None


def compare(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None, bits: int,
            inputs: Tensor,
            labels: Tensor | None = None, *, per_channel: bool = False,
            symmetry_aware: bool = True, qs: Sequence[float] = DEFAULT_QS
            ) -> tuple[QuantReport, ...]:
    """Plain (and, with ``symmetry_aware``, symmetry-aware) quantisation towards zero at
    equal ``bits``, judged on ``inputs`` (a batch; ``labels`` for accuracy)."""
    graph = graph_of(model, input_shape)
    plain = quantize(graph, bits=bits, rounding=Rounding.ZERO, per_channel=per_channel)
    candidates = [("plain", plain.model, certified_error(graph, plain))]
    if symmetry_aware:
        aware = symmetry_aware_quantize(graph, None, bits, per_channel=per_channel, qs=qs)
        candidates.append((f"aware q={aware.q:g}", aware.quantized.model,
                           aware.certified))
    reports = []
    for method, qmodel, cert in candidates:
        measured, accuracy = _measure(graph.model, qmodel, inputs, labels)
        reports.append(QuantReport(method, bits, cert.value, cert.relative, measured,
                                   float(cert.bound(inputs).max()), accuracy))
    return tuple(reports)


def _measure(model: nn.Module, qmodel: nn.Module, inputs: Tensor, labels: Tensor | None
             ) -> tuple[float, float | None]:
    """The largest ||R_theta(x) - R_Q(x)||_1 over ``inputs`` and Q's accuracy. Half
    precision models run on float32 copies: their own rounding would add an error the
    certificate (about the exact functions) does not cover."""
    if dtype_device(model)[0] in (torch.float16, torch.bfloat16):
        model, qmodel = copy_model(model).float(), copy_model(qmodel).float()
    x = model_input(model, inputs)
    with torch.no_grad():
        reference = flat_outputs(model(x), len(inputs)).double().cpu()
        out = flat_outputs(qmodel.eval()(x), len(inputs)).double().cpu()
    measured = float((reference - out).abs().sum(1).max())
    if labels is None:
        return measured, None
    return measured, float((out.argmax(1) == labels).double().mean())
