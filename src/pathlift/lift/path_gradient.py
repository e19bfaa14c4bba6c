"""theta_i * d||Phi(theta)||_1 / d theta_i for chosen parameters, from one |theta| pass and
its backward (paper 002 eq. 14, thesis Sec. 3.5.1): the path-magnitude of each coordinate."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from pathlift.graph import AbsPowInterpreter, LayerGraph, Scaled


@contextmanager
def _requiring_grad(tensors: Sequence[Tensor]) -> Iterator[None]:
    """Let autograd reach frozen parameters; restores their requires_grad flags."""
    flags = [t.requires_grad for t in tensors]
    try:
        for t in tensors:
            t.requires_grad_(True)
        yield
    finally:
        for t, flag in zip(tensors, flags, strict=True):
            t.requires_grad_(flag)


def _l1_mantissa(out: Scaled | Sequence[Scaled]) -> tuple[Tensor, float]:
    """||Phi||_1 = sum of all outputs, as (mantissa, natural-log scale) over one scale."""
    outs = [out] if isinstance(out, Scaled) else list(out)
    top = max(o.log_scale for o in outs)
    total = sum(o.mantissa.sum() * math.exp(o.log_scale - top) for o in outs)
    return total, top


def path_magnitudes(graph: LayerGraph, leaves: Sequence[Tensor],
                    dtype: torch.dtype = torch.float64) -> tuple[list[Tensor], float]:
    """(theta * grad ||Phi||_1 / e^s for each tensor of ``leaves``, s) with s the natural-log
    scale of the pass, so that nothing overflows. ``leaves`` are the tensors autograd
    differentiates (``weight_orig`` of a pruned parameter); a tensor outside the pass (an
    all-zero bias) gets zeros. ``.grad`` and requires_grad flags are left as they were.
    """
    with torch.enable_grad(), _requiring_grad(leaves):
        mantissa, log_scale = _l1_mantissa(AbsPowInterpreter(graph, 1.0, dtype).run_all_ones())
        grads = torch.autograd.grad(mantissa, list(leaves), allow_unused=True)
    costs = [leaf.detach().to(dtype) * grad.to(dtype) if grad is not None
             else torch.zeros_like(leaf, dtype=dtype) for leaf, grad in zip(leaves, grads,
                                                                            strict=True)]
    return costs, log_scale
