"""Mixed path-norms ||Phi(theta)||_{q,r} in one forward pass (thesis Def. 3.1.1, Thm 3.1.1)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import AbsPowInterpreter, LayerGraph, Scaled, trace
from pathlift.logspace import format_log10, power10

_LN10 = math.log(10.0)


@dataclass(frozen=True)
class PathNorm:
    """A mixed path-norm ||(||Phi^{->v}||_q)_{v output}||_r, exact in log space.

    ``value`` is a float (inf when it exceeds float64); ``log10`` is always finite for a
    non-zero norm. ``per_output_log10`` holds log10 ||Phi^{->v}||_q for each output neuron.
    """

    q: float
    r: float
    log10: float
    per_output_log10: tuple[float, ...]

    @property
    def value(self) -> float:
        return power10(self.log10)

    def __str__(self) -> str:
        r = "inf" if math.isinf(self.r) else f"{self.r:g}"
        return f"||Phi||_(q={self.q:g}, r={r}) = {format_log10(self.log10)}"


def _check_exponents(q: float, r: float) -> None:
    if not (q > 0 and math.isfinite(q)):
        raise InvalidParameterError(f"q must be in (0, inf), got {q}")
    if not r > 0:
        raise InvalidParameterError(f"r must be in (0, inf], got {r}")


def _flatten_outputs(out: Scaled | Sequence[Scaled] | dict[str, Scaled]) -> torch.Tensor:
    """Natural logs of o_v for every output neuron, across every output tensor (in nested
    tuples, lists and dict values too, in order)."""
    return torch.cat([o.log().reshape(-1) for o in _output_leaves(out)])


def _output_leaves(out: object) -> list[Scaled]:
    if isinstance(out, Scaled):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _output_leaves(o)]
    raise UnsupportedModelError(f"the model returns a {type(out).__name__}; pathlift needs "
                                "tensors, or tuples, lists or dicts of tensors")


def mixed_norm_log(log_o: torch.Tensor, q: float, r: float) -> tuple[float, torch.Tensor]:
    """ln of the (q, r) norm, and per-output ln norms, from ln o_v = ln ||Phi^{->v}||_q^q."""
    per_output = log_o / q
    if math.isinf(r):
        total = float(per_output.max())
    else:
        total = float(torch.logsumexp(per_output * r, dim=0)) / r
    return total, per_output


def path_norm_of_graph(graph: LayerGraph, q: float = 1.0, r: float = 1.0,
                       dtype: torch.dtype = torch.float64) -> PathNorm:
    """Mixed path-norm of an already traced graph (Thm 3.1.1): one |theta|^q forward pass."""
    _check_exponents(q, r)
    with torch.no_grad():
        log_o = _flatten_outputs(AbsPowInterpreter(graph, q, dtype).run_all_ones())
    total, per_output = mixed_norm_log(log_o, q, r)
    return PathNorm(q=q, r=r, log10=total / _LN10,
                    per_output_log10=tuple((per_output / _LN10).tolist()))


def path_norm(model: nn.Module, input_shape: Sequence[int], q: float = 1.0,
              r: float = 1.0, dtype: torch.dtype = torch.float64) -> PathNorm:
    """Mixed (q, r) path-norm ||Phi(theta)||_{q,r} in one forward pass (thesis Thm 3.1.1).

    ``input_shape`` excludes the batch dimension. Max-pool neurons are replaced by window
    sums, average-pool weights become (1/K)^q, eval BatchNorm is an affine identity neuron,
    torch.nn.utils.prune masks are honoured. The model is not modified. Raises
    UnsupportedModelError naming every node outside the ReLU DAG model of Def. 2.2.2.
    """
    return path_norm_of_graph(trace(model, input_shape), q, r, dtype)


def path_norms(model: nn.Module, input_shape: Sequence[int],
               qs: Iterable[float] = (1.0, 2.0, 4.0), r: float | None = None,
               dtype: torch.dtype = torch.float64) -> dict[float, PathNorm]:
    """Several path-norms from one trace: one |theta|^q pass per exponent q (Thm 3.1.1).

    ``r=None`` takes r = q for each exponent, i.e. the plain l^q norm ||Phi(theta)||_q of
    the whole path-lifting, the quantity of thesis Table 7.2; a number fixes r for all.
    """
    graph = trace(model, input_shape)
    return {float(q): path_norm_of_graph(graph, float(q), float(q) if r is None else r, dtype)
            for q in qs}
