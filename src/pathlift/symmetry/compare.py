"""A model against a transformed copy (a rescaling, a normalisation, a permutation): what the
symmetry changes (the parameters' norm) and what it keeps (the path-norm, the function)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pathlift.errors import check_count
from pathlift.graph.boundary import flat_outputs, model_input
from pathlift.lift import path_norm
from pathlift.memory import check_samples

__all__ = ["Comparison", "compare_models"]


@dataclass(frozen=True)
class Comparison:
    """||theta||_2 and log10 ||Phi||_1 of a model and of its transformed copy, and the
    largest output gap max |R - R'| / max |R| on N(0, 1) samples. A rescaling (Def. 2.4.1)
    changes the first, keeps the second (Thm 2.4.2) and the function."""

    parameter_norm: tuple[float, float]
    path_norm_log10: tuple[float, float]
    output_gap: float
    samples: int


def compare_models(model: nn.Module, other: nn.Module, input_shape: Sequence[int],
                   samples: int = 16, seed: int = 0) -> Comparison:
    """Parameter norms, l1 path-norms (Thm 3.1.1) and the relative output gap of two models
    of the same input shape, on ``samples`` seeded N(0, 1) inputs. Neither is modified."""
    samples = check_count("samples", samples)
    check_samples(samples, input_shape, "comparing the outputs", 4)
    x = torch.randn((samples, *input_shape), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = flat_outputs(model(model_input(model, x)), samples).double()
        y2 = flat_outputs(other(model_input(other, x)), samples).double()
    norms = tuple(sum(float(p.detach().double().pow(2).sum()) for p in m.parameters()) ** 0.5
                  for m in (model, other))
    logs = tuple(path_norm(m, input_shape).log10 for m in (model, other))
    gap = float((y - y2).abs().max() / y.abs().max().clamp_min(1e-300))
    return Comparison(norms, logs, gap, samples)
