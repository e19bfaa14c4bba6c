"""The depth-scaled ResNet of the master's thesis, eq. (4.1), and its initialisations (eq. 4.2).

    h_0 = U_in x,   h_{k+1} = h_k + delta_L * sigma(W_k h_k)  (k = 0..L-1),   y = U_out h_L,

with delta_L = L^{-alpha}, U_in in R^{d x n_in} and U_out in R^{n_out x d} fixed (buffers,
uniform on [-sqrt(phi), sqrt(phi)], phi = 1 / #input features of the map) and the L matrices
W_k in R^{d x d} the only parameters, stored as one (L, d, d) tensor.

The depth loop runs in one custom autograd function (`residual_stack`), batched over samples,
with the backward pass written by hand (no autograd graph of 4 L nodes):

* d = 1 (`_ScalarStack`): the forward records a_k = sigma(w_k h_k) in one (L, N) buffer
  (and h_k every _BLOCK layers), three elementwise kernels per layer; the backward has no
  loop over layers: the adjoint of a scalar layer is a product,
  g_k = g_{k+1} (1 + delta w_k sigma'(w_k h_k)), so a block of layers is one cumulative
  product (its h_k one cumulative sum of the a_k) and dJ/dw_k one reduction over samples.
* d > 1 (`_MatrixStack`): a loop over k of matrix products, keeping the activations.

Activations are kept while they fit in MEMORY_BUDGET; beyond, h_k is kept every isqrt(L)
layers and each segment is recomputed once in the backward pass (O(sqrt(L) N d) memory for
one extra forward). benchmarks/bench_depth.py measures it against plain autograd over an
nn.ModuleList.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from pathlift.errors import InvalidParameterError

__all__ = ["ACTIVATIONS", "MEMORY_BUDGET", "DepthResNet", "initial_scale", "residual_stack"]

# sigma, and sigma'(z) written from a = sigma(z): tanh' = 1 - a^2, relu' = [a > 0].
Activation = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
ACTIVATIONS: dict[str, Activation] = {
    "tanh": (torch.tanh, lambda a: torch.addcmul(a.new_ones(()), a, a, value=-1.0)),
    "relu": (torch.relu, lambda a: (a > 0).to(a.dtype)),
}
_IN_PLACE = {"tanh": torch.tanh_, "relu": torch.relu_}

MEMORY_BUDGET = 3 << 30  # bytes of kept activations before the backward pass recomputes
_BLOCK = 32  # layers per vectorised block of the d = 1 backward (blocks stay in cache)


def initial_scale(depth: int, d: int, alpha: float, gamma: float) -> float:
    """L^{-1/gamma - beta} / d^2 with beta = 1 - alpha: the constant init of eq. (4.2)."""
    return depth ** (-1.0 / gamma - (1.0 - alpha)) / d**2


def _segment(depth: int, kept_bytes: int, budget: int) -> int:
    """Layers per recomputed segment: all of them when ``kept_bytes`` fit in ``budget``."""
    return depth if kept_bytes <= budget else max(1, math.isqrt(depth))


def _segments(depth: int, segment: int) -> list[tuple[int, int]]:
    return [(s, min(s + segment, depth)) for s in range(0, depth, segment)]


def _buffer(workspace: torch.Tensor | None, rows: int, like: torch.Tensor) -> torch.Tensor:
    """A (rows, N) buffer: a view of ``workspace`` (grown in place when too small) or new."""
    if workspace is None:
        return like.new_empty(rows, like.shape[0])
    if workspace.dtype != like.dtype or workspace.device != like.device:
        raise InvalidParameterError(
            f"workspace is {workspace.dtype} on {workspace.device}; the activations are "
            f"{like.dtype} on {like.device}: pass torch.empty(0, dtype=..., device=...)")
    size = rows * like.shape[0]
    if workspace.numel() < size:
        workspace.resize_(size)
    return workspace[:size].view(rows, like.shape[0])


def _fill_scalar(rows: torch.Tensor, h: torch.Tensor, weights: list[float], delta: float,
                 activation: str) -> torch.Tensor:
    """Run the n = len(weights) layers (d = 1) from h = h_0; return h_n; record in ``rows``.

    rows[:n] gets a_k = sigma(w_k h_k) last-first (row r is layer n - 1 - r: the backward
    pass, which runs from the last layer to the first, then reads its blocks in memory order
    and its products are forward cumulative ones); rows[n + b] gets h_{n - b _BLOCK}, the end
    of the b-th block of rows, from which the block's h_k are recovered in the backward.
    """
    sigma_ = _IN_PLACE[activation]
    n, out = len(weights), rows.unbind(0)
    h = h.clone()
    for k, w in enumerate(weights):
        if k and (n - k) % _BLOCK == 0:
            out[n + (n - k) // _BLOCK].copy_(h)
        a = out[n - 1 - k]
        torch.mul(h, w, out=a)
        sigma_(a)
        h.add_(a, alpha=delta)
    out[n].copy_(h)
    return h


def _adjoint_scalar(rows: torch.Tensor, w_last_first: torch.Tensor, g: torch.Tensor,
                    delta: float, activation: str, grad: torch.Tensor) -> torch.Tensor:
    """From g = dJ/dh_n to dJ/dh_0 through the n layers recorded in ``rows`` (_fill_scalar).

    With D_k = sigma'(w_k h_k): g_k = g_{k+1} (1 + delta w_k D_k) and
    dJ/dw_k = delta sum_samples g_{k+1} D_k h_k, written last-first into ``grad`` (n,) without
    the factor delta. A block of layers is one cumulative product of its factors, and its
    h_k = h_end - delta (a_k + ... + a_{end-1}) one cumulative sum.
    """
    _, derivative = ACTIVATIONS[activation]
    one = torch.ones((), dtype=rows.dtype, device=rows.device)
    n = w_last_first.shape[0]
    for b, r0 in enumerate(range(0, n, _BLOCK)):
        r1 = min(r0 + _BLOCK, n)
        a, w = rows[r0:r1], w_last_first[r0:r1, None]
        slope = derivative(a)  # first, streaming: the scans below then find a in cache
        h = torch.add(rows[n + b], torch.cumsum(a, 0), alpha=-delta)
        products = torch.cumprod(torch.addcmul(one, slope, w, value=delta), 0)
        g_next = torch.empty_like(a)  # g_{k+1}, last layer first
        g_next[0] = g
        torch.mul(products[:-1], g, out=g_next[1:])
        grad[r0:r1] = torch.linalg.vecdot(g_next.mul_(slope), h)
        g = products[-1] * g
    return g


class _ScalarStack(torch.autograd.Function):
    """h_L from h_0 (N, 1) and W (L, 1, 1): the d = 1 stack (_fill_scalar, _adjoint_scalar)."""

    @staticmethod
    def forward(ctx, h0: torch.Tensor, weight: torch.Tensor, delta: float, activation: str,
                budget: int, workspace: torch.Tensor | None) -> torch.Tensor:
        depth, n = weight.shape[0], h0.shape[0]
        kept = depth + -(-depth // _BLOCK)  # rows of a_k and of block ends
        segment = _segment(depth, kept * n * h0.element_size(), budget)
        rows = _buffer(workspace, segment + -(-segment // _BLOCK), h0.reshape(n))
        weights = weight.reshape(depth).tolist()
        starts, h = [], h0.reshape(n)
        for s, e in _segments(depth, segment):
            starts.append(h)
            h = _fill_scalar(rows, h, weights[s:e], delta, activation)
        if segment == depth:
            ctx.save_for_backward(weight, rows)
        else:
            ctx.save_for_backward(weight, torch.stack(starts))
            ctx.rows = rows  # scratch for the recomputation
        ctx.delta, ctx.activation, ctx.segment = delta, activation, segment
        return h.view_as(h0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        weight, kept = ctx.saved_tensors
        depth, delta, activation = weight.shape[0], ctx.delta, ctx.activation
        w = weight.reshape(depth)
        weights = w.tolist()
        grad = torch.empty_like(w)
        g = grad_out.reshape(-1)
        for i, (s, e) in reversed(list(enumerate(_segments(depth, ctx.segment)))):
            if ctx.segment == depth:
                rows = kept
            else:
                rows = ctx.rows
                _fill_scalar(rows, kept[i], weights[s:e], delta, activation)
            g = _adjoint_scalar(rows, w[s:e].flip(0), g, delta, activation, grad[s:e])
            grad[s:e] = grad[s:e].flip(0)
        return g.view_as(grad_out), grad.mul_(delta).view_as(weight), None, None, None, None


class _MatrixStack(torch.autograd.Function):
    """h_L from h_0 (N, d) and W (L, d, d); backward by the adjoint recursion.

    Adjoint (g_k = dJ/dh_k, z_k = W_k h_k): dJ/dW_k = delta (g_{k+1} * sigma'(z_k))^T h_k and
    g_k = g_{k+1} + delta (g_{k+1} * sigma'(z_k)) W_k (row convention). When the L pairs
    (h_k, sigma(z_k)) fit in ``budget`` bytes they are kept; otherwise h_k is kept every
    isqrt(L) layers and each segment is recomputed once in the backward pass.
    """

    @staticmethod
    def forward(ctx, h0: torch.Tensor, weight: torch.Tensor, delta: float, activation: str,
                budget: int) -> torch.Tensor:
        sigma, _ = ACTIVATIONS[activation]
        depth = weight.shape[0]
        segment = _segment(depth, 2 * depth * h0.numel() * h0.element_size(), budget)
        transposed = weight.transpose(1, 2).unbind(0)
        checkpoints, hs, acts = [], [], []
        h = h0.clone()
        for k in range(depth):
            if k % segment == 0:
                checkpoints.append(h.clone())
            a = sigma(h @ transposed[k])
            if segment == depth:
                hs.append(h.clone())
                acts.append(a)
            h.add_(a, alpha=delta)
        ctx.save_for_backward(weight, *checkpoints)
        ctx.delta, ctx.activation, ctx.segment = delta, activation, segment
        ctx.kept = (hs, acts) if segment == depth else None
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        weight, *checkpoints = ctx.saved_tensors
        sigma, derivative = ACTIVATIONS[ctx.activation]
        delta, segment, depth = ctx.delta, ctx.segment, weight.shape[0]
        layers, transposed = weight.unbind(0), weight.transpose(1, 2).unbind(0)
        grad_weight = torch.empty_like(weight)
        g = grad_out.clone()
        for start, stop in reversed(_segments(depth, segment)):
            if ctx.kept is not None:
                hs, acts = ctx.kept
            else:  # recompute the segment, keeping h_k and sigma(z_k)
                hs, acts = [checkpoints[start // segment]], []
                for k in range(start, stop):
                    acts.append(sigma(hs[-1] @ transposed[k]))
                    hs.append(torch.add(hs[-1], acts[-1], alpha=delta))
            for k in reversed(range(start, stop)):
                s = g * derivative(acts[k - start])  # dJ/dz_k / delta
                grad_weight[k] = s.T @ hs[k - start]
                g.addmm_(s, layers[k], alpha=delta)
        ctx.kept = None
        return g, grad_weight.mul_(delta), None, None, None


def residual_stack(h0: torch.Tensor, weight: torch.Tensor, delta: float,
                   activation: str = "tanh", memory_budget: int = MEMORY_BUDGET,
                   workspace: torch.Tensor | None = None) -> torch.Tensor:
    """h_L of the recursion h_{k+1} = h_k + delta * sigma(W_k h_k) (eq. 4.1), rows = samples.

    h0: (N, d); weight: (L, d, d). Differentiable w.r.t. both (hand-written backward). The
    backward keeps all activations when they fit in ``memory_budget`` bytes, else O(sqrt(L))
    of them and recomputes (one extra forward pass). ``workspace`` (d = 1 only): a 1-D tensor
    of the activations' dtype, grown in place and reused for the activation buffer, so that
    repeated training steps do not allocate it anew (a forward that overwrites it before
    the previous backward makes that backward raise, by autograd's version check).
    """
    if activation not in ACTIVATIONS:
        raise InvalidParameterError(
            f"activation {activation!r} is not one of {sorted(ACTIVATIONS)}")
    if weight.ndim != 3 or weight.shape[1] != weight.shape[2] or h0.shape[-1] != weight.shape[1]:
        raise InvalidParameterError(
            f"residual_stack needs h0 (N, d) and weight (L, d, d); got {tuple(h0.shape)} and "
            f"{tuple(weight.shape)}")
    if weight.shape[1] == 1:
        return _ScalarStack.apply(h0, weight, delta, activation, memory_budget, workspace)
    return _MatrixStack.apply(h0, weight, delta, activation, memory_budget)


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

    def forward(self, x: torch.Tensor, workspace: torch.Tensor | None = None) -> torch.Tensor:
        """U_out h_L for the rows of x; ``workspace``: see residual_stack."""
        h0 = x.reshape(x.shape[0], -1).to(self.u_in.dtype) @ self.u_in.T
        h = residual_stack(h0, self.weight, self.delta, self.activation, workspace=workspace)
        return h @ self.u_out.T

    def rescaled_weights(self) -> torch.Tensor:
        """L^beta W_k, k = 0..L-1: the path W^{(L)} the thesis measures (Sec. 4.2)."""
        return self.depth**self.beta * self.weight.detach()
