"""The ``pathlift rescale`` / ``pathlift normalize`` commands as one call each: the
transformed copy, compared with the model (``pathlift.symmetry.compare_models``), and
written as a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from torch.nn.utils import parametrize

from pathlift.errors import UnsupportedModelError
from pathlift.graph import unwrap
from pathlift.graph.normalize import Normalized, normalize_report
from pathlift.models import save_checkpoint, save_like
from pathlift.symmetry.compare import Comparison, compare_models
from pathlift.symmetry.rescale import random_rescale

__all__ = ["Transformed", "compare_normalized", "compare_random_rescale"]


@dataclass(frozen=True, repr=False)
class Transformed:
    """What ``compare_random_rescale`` or ``compare_normalized`` did: the transformed copy,
    its comparison with the model, the checkpoint written (None without ``out``) and, for a
    normalisation, ``normalize_report``'s counts (None for a rescaling)."""

    model: nn.Module
    comparison: Comparison
    path: Path | None
    normalized: Normalized | None = None

    def __repr__(self) -> str:
        c = self.comparison
        kind = "rescaled" if self.normalized is None else f"normalized q={self.normalized.q:g}"
        return (f"Transformed({kind}, ||theta||_2 {c.parameter_norm[0]:.6g} -> "
                f"{c.parameter_norm[1]:.6g}, log10 ||Phi||_1 {c.path_norm_log10[0]:.6f} -> "
                f"{c.path_norm_log10[1]:.6f}, output gap {c.output_gap:.3g}"
                + ("" if self.path is None else f", wrote {self.path}") + ")")


def _finish(model: nn.Module, copy: nn.Module, input_shape: Sequence[int], samples: int,
            out: str | Path | None, spec: str | None,
            normalized: Normalized | None = None) -> Transformed:
    """Compare ``copy`` with ``model`` and write it to ``out`` (as ``spec``'s architecture)."""
    comparison = compare_models(model, copy, input_shape, samples)
    path = None
    if out and any(parametrize.is_parametrized(m) for m in unwrap(model).modules()):
        raise UnsupportedModelError(
            "the model computes weights through torch.nn.utils.parametrize (weight_norm, "
            "spectral_norm, ...), which cannot hold the transformed values exactly: the "
            "copy is plain, so it cannot be saved as the model's architecture; save it "
            "with pathlift.models.save_checkpoint under a plain architecture (the same "
            "layers without the parametrizations)")
    if out:
        path = save_checkpoint(copy, out, input_shape=input_shape) if spec is None else \
            save_like(copy, spec, out, input_shape)
    return Transformed(copy, comparison, path, normalized)


def compare_random_rescale(model: nn.Module, input_shape: Sequence[int],
                           factors: Sequence[float] = (1.0, 128.0, 4096.0), seed: int = 0, *,
                           samples: int = 16, out: str | Path | None = None,
                           spec: str | None = None) -> Transformed:
    """``random_rescale`` (thesis Def. 2.4.1, App. E.1.2), compared with the model on
    ``samples`` N(0, 1) inputs (``compare_models``), and with ``out`` written there as a
    checkpoint: of ``spec``'s architecture (a model name or a checkpoint file, as
    ``pathlift.models.save_like``), else of the model's class. The model is not modified."""
    return _finish(model, random_rescale(model, factors, seed, input_shape), input_shape,
                   samples, out, spec)


def compare_normalized(model: nn.Module, input_shape: Sequence[int], q: float = 1.0, *,
                       samples: int = 16, out: str | Path | None = None,
                       spec: str | None = None) -> Transformed:
    """``normalize_report`` (thesis Alg. 3.2.1), compared with the model and written as
    ``compare_random_rescale`` does; ``normalized`` holds the dead and tied group counts."""
    result = normalize_report(model, input_shape, q)
    return _finish(model, result.model, input_shape, samples, out, spec, result)
