"""The depth-scaled ResNet of the master's thesis, eq. (4.1), and its initialisations (eq. 4.2).

    h_0 = U_in x,   h_{k+1} = h_k + delta_L * sigma(W_k h_k)  (k = 0..L-1),   y = U_out h_L,

with delta_L = L^{-alpha}, U_in in R^{d x n_in} and U_out in R^{n_out x d} fixed (buffers,
uniform on [-sqrt(phi), sqrt(phi)], phi = 1 / #input features of the map) and the L matrices
W_k in R^{d x d} the only parameters, stored as one (L, d, d) tensor.

The depth loop runs in one custom autograd function (`residual_stack`): a tight loop over k,
batched over samples, with the backward pass written by hand (no autograd graph of 4 L nodes,
elementwise kernels for d = 1). Activations are kept while they fit in MEMORY_BUDGET; beyond,
sqrt(L)-checkpointing keeps memory O(sqrt(L) N d) instead of O(L N d) for one extra forward.
benchmarks/bench_depth.py measures it against plain autograd over an nn.ModuleList.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from pathlift.errors import InvalidParameterError

__all__ = ["ACTIVATIONS", "MEMORY_BUDGET", "DepthResNet", "initial_scale", "residual_stack"]

# sigma, and sigma'(z) written from a = sigma(z): tanh' = 1 - a^2, relu' = [a > 0].
Activation = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
ACTIVATIONS: dict[str, Activation] = {
    "tanh": (torch.tanh, lambda a: 1.0 - a * a),
    "relu": (torch.relu, lambda a: a > 0),
}


MEMORY_BUDGET = 1 << 30  # bytes of kept activations before the backward pass recomputes


def initial_scale(depth: int, d: int, alpha: float, gamma: float) -> float:
    """L^{-1/gamma - beta} / d^2 with beta = 1 - alpha: the constant init of eq. (4.2)."""
    return depth ** (-1.0 / gamma - (1.0 - alpha)) / d**2


def _kernels(d: int) -> tuple[Callable, Callable, Callable]:
    """(h W^T, s^T h, g += c s W) on row batches; elementwise for d = 1 (no BLAS call)."""
    if d == 1:
        return (torch.mul, lambda s, h: (s * h).sum(0, keepdim=True),
                lambda g, s, w, c: g.addcmul_(s, w, value=c))
    return torch.mm, lambda s, h: s.T @ h, lambda g, s, w, c: g.addmm_(s, w, alpha=c)


class _ResidualStack(torch.autograd.Function):
    """h_L from h_0 and W (L, d, d); backward by the adjoint recursion.

    Adjoint (g_k = dJ/dh_k, z_k = W_k h_k): dJ/dW_k = delta (g_{k+1} * sigma'(z_k))^T h_k and
    g_k = g_{k+1} + delta (g_{k+1} * sigma'(z_k)) W_k (row convention). When the L pairs
    (h_k, sigma(z_k)) fit in ``budget`` bytes they are kept; otherwise h_k is kept every
    isqrt(L) layers and each segment is recomputed once in the backward pass.
    """

    @staticmethod
    def forward(ctx, h0: torch.Tensor, weight: torch.Tensor, delta: float, activation: str,
                budget: int) -> torch.Tensor:
        sigma, _ = ACTIVATIONS[activation]
        matmul, _, _ = _kernels(weight.shape[1])
        depth = weight.shape[0]
        keep_all = 2 * depth * h0.numel() * h0.element_size() <= budget
        segment = depth if keep_all else max(1, math.isqrt(depth))
        transposed = weight.transpose(1, 2).unbind(0)
        checkpoints, hs, acts = [], [], []
        h = h0.clone()
        for k in range(depth):
            if k % segment == 0:
                checkpoints.append(h.clone())
            a = sigma(matmul(h, transposed[k]))
            if keep_all:
                hs.append(h.clone())
                acts.append(a)
            h.add_(a, alpha=delta)
        ctx.save_for_backward(weight, *checkpoints)
        ctx.delta, ctx.activation, ctx.segment = delta, activation, segment
        ctx.kept = (hs, acts) if keep_all else None
        return h

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        weight, *checkpoints = ctx.saved_tensors
        sigma, derivative = ACTIVATIONS[ctx.activation]
        matmul, outer, update = _kernels(weight.shape[1])
        delta, segment, depth = ctx.delta, ctx.segment, weight.shape[0]
        layers, transposed = weight.unbind(0), weight.transpose(1, 2).unbind(0)
        grad_weight = torch.empty_like(weight)
        g = grad_out.clone()
        for start in reversed(range(0, depth, segment)):
            stop = min(start + segment, depth)
            if ctx.kept is not None:
                hs, acts = ctx.kept
            else:  # recompute the segment, keeping h_k and sigma(z_k)
                hs, acts = [checkpoints[start // segment]], []
                for k in range(start, stop):
                    acts.append(sigma(matmul(hs[-1], transposed[k])))
                    hs.append(torch.add(hs[-1], acts[-1], alpha=delta))
            for k in reversed(range(start, stop)):
                s = g * derivative(acts[k - start])  # dJ/dz_k / delta
                grad_weight[k] = outer(s, hs[k - start])
                update(g, s, layers[k], delta)
        ctx.kept = None
        return g, grad_weight.mul_(delta), None, None, None


def residual_stack(h0: torch.Tensor, weight: torch.Tensor, delta: float,
                   activation: str = "tanh", memory_budget: int = MEMORY_BUDGET) -> torch.Tensor:
    """h_L of the recursion h_{k+1} = h_k + delta * sigma(W_k h_k) (eq. 4.1), rows = samples.

    h0: (N, d); weight: (L, d, d). Differentiable w.r.t. both (hand-written backward). The
    backward keeps all activations when they fit in ``memory_budget`` bytes, else O(sqrt(L))
    of them and recomputes (one extra forward pass).
    """
    if activation not in ACTIVATIONS:
        raise InvalidParameterError(
            f"activation {activation!r} is not one of {sorted(ACTIVATIONS)}")
    if weight.ndim != 3 or weight.shape[1] != weight.shape[2] or h0.shape[-1] != weight.shape[1]:
        raise InvalidParameterError(
            f"residual_stack needs h0 (N, d) and weight (L, d, d); got {tuple(h0.shape)} and "
            f"{tuple(weight.shape)}")
    return _ResidualStack.apply(h0, weight, delta, activation, memory_budget)


class DepthResNet(nn.Module):
    """Eq. (4.1): fixed random embeddings around L trainable d x d residual layers.

    ``init`` is "constant" (eq. 4.2: every entry L^{-1/gamma-beta}/d^2) or "truncated"
    (normal of mean 0 and variance s = L^{-1/gamma-beta}/d^2 truncated to [-s, s], thesis
    Sec. 4, Assumption 3.1.1 (iii)). ``seed`` fixes the embeddings, drawn first, so that one
    seed gives the same U_in, U_out at every depth (as in the thesis) and the truncated
    initial weights after them; draws are made in float64 and cast, so that a seed gives the
    same network in every dtype.
    """

    def __init__(self, in_features: int, out_features: int, depth: int, d: int, alpha: float,
                 gamma: float, activation: str = "tanh", init: str = "constant", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        if depth < 1 or d < 1 or in_features < 1 or out_features < 1:
            raise InvalidParameterError(
                f"DepthResNet needs depth, d, in/out features >= 1; got depth={depth}, d={d}, "
                f"in_features={in_features}, out_features={out_features}")
        if activation not in ACTIVATIONS:
            raise InvalidParameterError(
                f"activation {activation!r} is not one of {sorted(ACTIVATIONS)}")
        if gamma <= 0:
            raise InvalidParameterError(f"gamma={gamma} must be > 0 (init scale L^(-1/gamma))")
        self.depth, self.d, self.alpha, self.gamma = depth, d, alpha, gamma
        self.activation, self.init = activation, init
        self.delta = depth ** (-alpha)
        gen = torch.Generator().manual_seed(seed)

        def uniform(rows: int, cols: int) -> torch.Tensor:  # float64 draws: same net per seed
            bound = cols**-0.5
            return ((torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 2 - 1)
                    * bound).to(dtype)

        self.register_buffer("u_in", uniform(d, in_features))
        self.register_buffer("u_out", uniform(out_features, d))
        scale = initial_scale(depth, d, alpha, gamma)
        if init == "constant":
            weight = torch.full((depth, d, d), scale, dtype=torch.float64)
        elif init == "truncated":
            weight = torch.empty(depth, d, d, dtype=torch.float64)
            nn.init.trunc_normal_(weight, 0.0, math.sqrt(scale), -scale, scale, generator=gen)
        else:
            raise InvalidParameterError(f"init {init!r} must be 'constant' or 'truncated'")
        self.weight = nn.Parameter(weight.to(dtype))

    @property
    def beta(self) -> float:
        """beta = 1 - alpha (thesis Assumption 3.1.1 (iii))."""
        return 1.0 - self.alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.reshape(x.shape[0], -1).to(self.u_in.dtype) @ self.u_in.T
        return residual_stack(h0, self.weight, self.delta, self.activation) @ self.u_out.T

    def rescaled_weights(self) -> torch.Tensor:
        """L^beta W_k, k = 0..L-1: the path W^{(L)} the thesis measures (Sec. 4.2)."""
        return self.depth**self.beta * self.weight.detach()
