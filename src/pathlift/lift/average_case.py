"""The average-case path-norm E_x ||A(theta, x)^T Phi(theta)||_1 (thesis Sec. 7.2.2).

On an input x where the path-activations are locally constant, R_theta is affine near x
(Thm 2.4.2: R_theta(x) = <Phi(theta), A(theta, x)(x; 1)>), and the vector
A(theta, x)^T Phi^{->v}(theta) in R^{d_in + 1} holds the slopes of output v (its input
gradient) and its offset R_v(x) - <grad R_v(x), x>. Automatic differentiation therefore
gives it exactly: one backward pass per output over the whole batch (samples do not
interact in eval mode), faster on CPU than torch.func.vmap(jacrev), see
benchmarks/bench_average_case.py. Since every a_p(theta, x) is 0 or
1, ||A^T Phi^{->v}||_1 <= ||Phi^{->v}||_1: the l1 path-norm is the worst case over x.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError, ShapeError, UnsupportedModelError
from pathlift.exponents import check_q
from pathlift.graph import LayerGraph, copy_model, graph_of
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.sharded import is_sharded_graph
from pathlift.lift.path_norm import path_norm


@dataclass(frozen=True)
class LocalAffine:
    """The local affine map of a network at each input: R(x) = slopes . x + offsets.

    ``slopes`` has shape (n, d_out, *input_shape), ``offsets`` (n, d_out); the d_out output
    neurons of every output tensor are flattened and concatenated in order.
    """

    slopes: Tensor
    offsets: Tensor

    def coefficients(self) -> Tensor:
        """A(theta, x)^T Phi^{->v}(theta) for each sample and output: shape (n, d_out, d_in+1)."""
        return torch.cat([self.slopes.flatten(2), self.offsets.unsqueeze(-1)], dim=2)


@dataclass(frozen=True)
class AverageCasePathNorm:
    """Monte Carlo estimate of E_x sum_v ||A(theta, x)^T Phi^{->v}(theta)||_q (Sec. 7.2.2).

    ``mean`` is the estimate, ``std_error`` its standard error over ``n_samples`` inputs,
    ``per_output_mean`` the estimate per output neuron v; ``worst_case_log10`` is log10 of
    the mixed path-norm ||Phi||_{q,1} = sum_v ||Phi^{->v}||_q, which ``mean`` never exceeds
    when q = 1.
    """

    q: float
    mean: float
    std_error: float
    per_output_mean: tuple[float, ...]
    n_samples: int
    worst_case_log10: float

    @property
    def log10(self) -> float:
        return math.log10(self.mean) if self.mean > 0 else -math.inf

    @property
    def gap_log10(self) -> float:
        """Orders of magnitude between the worst case and the average case."""
        return self.worst_case_log10 - self.log10


def local_affine(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None, x: Tensor,
                 dtype: torch.dtype = torch.float64, chunk: int = 256) -> LocalAffine:
    """Slopes and offsets of the network's local affine map at each row of x (Thm 2.4.2).

    Differentiates the traced graph with respect to x only (a copy in ``dtype`` when the
    model has another); the model, its ``.grad`` and its autograd state are untouched.
    Raises UnsupportedModelError outside the ReLU DAG model of Def. 2.2.2, ShapeError when
    x does not have shape (n, *input_shape).
    """
    return _local_affine(_in_dtype(graph_of(model, input_shape), dtype), x, dtype, chunk)


def _in_dtype(graph: LayerGraph, dtype: torch.dtype) -> LayerGraph:
    """``graph`` itself, or the same graph over a copy of its model cast to ``dtype``.
    A sharded model is refused: the local maps need the whole of every layer."""
    if is_sharded_graph(graph):
        raise UnsupportedModelError(
            "local affine maps and the average-case path-norm of a sharded (FSDP2) model "
            "are not implemented (they run the whole model on inputs); path_norm, the "
            "Lipschitz bounds, scores and penalties are")
    graph.check_values()
    if graph.dtype == dtype:
        return graph
    return graph.bind(copy_model(graph.model).to(dtype))


def _local_affine(graph: LayerGraph, x: Tensor, dtype: torch.dtype, chunk: int) -> LocalAffine:
    input_shape = graph.input_shape
    if tuple(x.shape[1:]) != tuple(input_shape):
        raise ShapeError(f"inputs have shape {tuple(x.shape)}; expected (n, *{tuple(input_shape)})")
    device = graph.device
    # functionalize: in-place ops (ReLU(inplace=True), +=) would break the backward passes
    forward = torch.func.functionalize(graph.differentiable_forward())
    slopes, offsets = [], []
    for xb in x.to(device=device, dtype=dtype).split(chunk):
        leaf = xb.detach().requires_grad_()
        out = flat_outputs(forward(leaf), len(xb))
        d_out = out.shape[1]
        s = torch.stack([torch.autograd.grad(out[:, v].sum(), leaf, retain_graph=v < d_out - 1)[0]
                         for v in range(d_out)], dim=1)
        out = out.detach()
        slopes.append(s)
        offsets.append(out - (s.flatten(2) * xb.flatten(1).unsqueeze(1)).sum(-1))
    return LocalAffine(torch.cat(slopes), torch.cat(offsets))


def average_case_path_norm(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                           inputs: Tensor | Iterable, q: float = 1.0,
                           max_samples: int | None = 512,
                           dtype: torch.dtype = torch.float64) -> AverageCasePathNorm:
    """E_x sum_v ||A(theta, x)^T Phi^{->v}(theta)||_q by Monte Carlo over ``inputs`` (thesis
    Sec. 7.2.2; the l^q analogue for q != 1), with the worst case ||Phi||_{q,1}.

    ``inputs`` is a tensor (n, *input_shape) or an iterable of (x, y) batches (a
    DataLoader); at most ``max_samples`` inputs are used, in order. The model is not
    modified.
    """
    check_q(q, minimum=1.0)
    x = _collect(inputs, max_samples)
    graph = _in_dtype(graph_of(model, input_shape), dtype)
    coeffs = _local_affine(graph, x, dtype, 256).coefficients()
    per_sample_output = coeffs.abs().pow(q).sum(-1).pow(1 / q)  # (n, d_out)
    per_sample = per_sample_output.sum(-1)
    n = len(per_sample)
    std_error = float(per_sample.std() / math.sqrt(n)) if n > 1 else math.nan
    worst = path_norm(graph, q=q, r=1.0, dtype=dtype)
    return AverageCasePathNorm(q=q, mean=float(per_sample.mean()), std_error=std_error,
                               per_output_mean=tuple(per_sample_output.mean(0).tolist()),
                               n_samples=n, worst_case_log10=worst.log10)


def _collect(inputs: Tensor | Iterable, max_samples: int | None) -> Tensor:
    if isinstance(inputs, Tensor):
        x = inputs
    else:
        parts, seen = [], 0
        for batch in inputs:
            xb = batch[0] if isinstance(batch, list | tuple) else batch
            parts.append(xb)
            seen += len(xb)
            if max_samples is not None and seen >= max_samples:
                break
        if not parts:
            raise InvalidParameterError("average_case_path_norm() got no inputs")
        x = torch.cat(parts)
    if max_samples is not None:
        x = x[:max_samples]
    if len(x) == 0:
        raise InvalidParameterError("average_case_path_norm() got no inputs")
    return x
