"""Y = X·K^T for a Kronecker-sparse K: the six algorithms of thesis Sec. 5.1.2 and 5.3.

Algorithm 5.1.1 (loop over the ad dense blocks K[row, col]) and its permuted form 5.1.2
(Y = ((X Q^T) K~^T) P^T with K~ block-diagonal) are implemented as

- ``dense``:  K stored dense, ``torch.nn.functional.linear`` (generic);
- ``sparse``: K stored in CSR (generic sparse, ignores the structure);
- ``bsr``:    Alg. 5.1.2 with K~ in block-sparse-row format;
- ``einsum``: Alg. 5.1.1 as one tensor contraction on w (a, b, c, d);
- ``bmm``:    Alg. 5.1.2 with ``torch.bmm`` on K~ stored (ad, b, c) (Dao et al. 2022);
- ``fused``:  Alg. 5.1.1 without the permutation passes: the C kernel of
  ``pathlift.kron.cpu_kernel`` on CPU, the Triton kernel of ``pathlift.kron.triton_kernel``
  on CUDA.

Layouts (Sec. 5.1.2): ``"bsf"`` (batch-size-first) takes X of shape (B, acd) and returns
(B, abd); ``"bsl"`` (batch-size-last) takes (acd, B) and returns (abd, B).
Every algorithm is differentiable in X and in the factor w (autograd). On CPU, half
precision inputs of ``sparse``, ``bsr`` and ``fused`` are computed in float32 (PyTorch's MKL
sparse routines and the C kernel have no half-precision path) and cast back.

``prepare(w, pattern, algorithm)`` converts w to the storage of the algorithm once;
``apply`` runs it, so a layer or a benchmark pays for conversion only when w changes.
``ks_multiply`` does the same by itself: it keeps the prepared factor while w's storage,
view and version are unchanged (where autograd does not record w).
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron import cpu_kernel
from pathlift.kron.factor import check_factor, to_dense
from pathlift.kron.pattern import KSPattern

__all__ = ["ALGORITHMS", "LAYOUTS", "apply", "ks_multiply", "prepare"]

LAYOUTS = ("bsf", "bsl")
HALF = (torch.float16, torch.bfloat16)


def _check(algorithm: str, layout: str) -> None:
    if algorithm not in ALGORITHMS:
        raise InvalidParameterError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if layout not in LAYOUTS:
        raise InvalidParameterError(f"unknown layout {layout!r}; choose 'bsf' (batch-size-first,"
                                    " x of shape (B, N)) or 'bsl' (batch-size-last, (N, B))")


def _upcast_on_cpu(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Run ``fn`` in float32 when x is a CPU half tensor, and cast the result back."""

    def run(x: torch.Tensor, op: Any, pattern: KSPattern, layout: str) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype in HALF:
            op = {k: v.float() if torch.is_tensor(v) else v for k, v in op.items()}
            return fn(x.float(), op, pattern, layout).to(x.dtype)
        return fn(x, op, pattern, layout)

    return run


@contextlib.contextmanager
def _quiet_sparse() -> Iterator[None]:
    """PyTorch warns that sparse compressed tensors are beta on construction; the indices
    built here are valid by construction (the tests compare against the dense product)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        yield


# --- dense -------------------------------------------------------------------------------
def _prep_dense(w: torch.Tensor, p: KSPattern) -> dict:
    return {"k": to_dense(w, p)}


def _dense(x: torch.Tensor, op: dict, p: KSPattern, layout: str) -> torch.Tensor:
    return F.linear(x, op["k"]) if layout == "bsf" else op["k"] @ x


# --- sparse (CSR) ------------------------------------------------------------------------
def _prep_sparse(w: torch.Tensor, p: KSPattern) -> dict:
    a, b, c, d = p.as_tuple()
    dev = w.device
    i, _, j, ell = torch.meshgrid(torch.arange(a, device=dev), torch.arange(b, device=dev),
                                  torch.arange(d, device=dev), torch.arange(c, device=dev),
                                  indexing="ij")
    cols = (i * c * d + ell * d + j).reshape(-1)
    crow = torch.arange(0, p.out_features + 1, device=dev) * c
    values = w.permute(0, 1, 3, 2).reshape(-1)  # row (i, k, j), then l
    with _quiet_sparse():
        k = torch.sparse_csr_tensor(crow, cols, values, (p.out_features, p.in_features),
                                    check_invariants=False)
    return {"k": k}


@_upcast_on_cpu
def _sparse(x: torch.Tensor, op: dict, p: KSPattern, layout: str) -> torch.Tensor:
    return F.linear(x, op["k"]) if layout == "bsf" else op["k"] @ x


# --- bsr (Alg. 5.1.2) --------------------------------------------------------------------
def _prep_bsr(w: torch.Tensor, p: KSPattern) -> dict:
    a, b, c, d = p.as_tuple()
    # MKL's CPU BSR product needs square blocks: cut each b × c block into g × g ones.
    g = math.gcd(b, c) if w.device.type == "cpu" else None
    gb, gc = (b // g, c // g) if g else (1, 1)
    bh, bw = (g, g) if g else (b, c)
    values = (w.permute(0, 3, 1, 2).reshape(a * d, gb, bh, gc, bw)
              .permute(0, 1, 3, 2, 4).reshape(-1, bh, bw))
    block_rows = a * d * gb
    crow = torch.arange(0, block_rows + 1, device=w.device) * gc
    cols = ((torch.arange(block_rows, device=w.device) // gb)[:, None] * gc
            + torch.arange(gc, device=w.device)[None, :]).reshape(-1)
    with _quiet_sparse():
        k = torch.sparse_bsr_tensor(crow, cols, values, (p.out_features, p.in_features),
                                    check_invariants=False)
    return {"k": k, "w": w}


def _permute_in(x: torch.Tensor, p: KSPattern, layout: str) -> torch.Tensor:
    """X Q^T (Alg. 5.1.2, line 1)."""
    a, _, c, d = p.as_tuple()
    if layout == "bsf":
        return x.reshape(-1, a, c, d).transpose(-1, -2).reshape(-1, a * c * d)
    return x.reshape(a, c, d, -1).transpose(1, 2).reshape(a * c * d, -1)


def _permute_out(y: torch.Tensor, p: KSPattern, layout: str) -> torch.Tensor:
    """Y~ P^T (Alg. 5.1.2, line 3)."""
    a, b, _, d = p.as_tuple()
    if layout == "bsf":
        return y.reshape(-1, a, d, b).transpose(-1, -2).reshape(-1, a * b * d)
    return y.reshape(a, d, b, -1).transpose(1, 2).reshape(a * b * d, -1)


@_upcast_on_cpu
def _bsr(x: torch.Tensor, op: dict, p: KSPattern, layout: str) -> torch.Tensor:
    def run(v: torch.Tensor) -> torch.Tensor:
        vp = _permute_in(v, p, layout)
        yp = F.linear(vp, op["k"]) if layout == "bsf" else op["k"] @ vp
        return _permute_out(yp, p, layout)

    # PyTorch has no CPU backward for BSR products: supply it.
    return _KernelProduct.apply(x, op["w"], run, p, layout, "bsr")


# --- einsum (Alg. 5.1.1) -----------------------------------------------------------------
def _prep_einsum(w: torch.Tensor, p: KSPattern) -> dict:
    return {"w": w}


def _einsum(x: torch.Tensor, op: dict, p: KSPattern, layout: str) -> torch.Tensor:
    a, b, c, d = p.as_tuple()
    if layout == "bsf":
        y = torch.einsum("nilj,iklj->nikj", x.reshape(-1, a, c, d), op["w"])
        return y.reshape(-1, a * b * d)
    y = torch.einsum("iljn,iklj->ikjn", x.reshape(a, c, d, -1), op["w"])
    return y.reshape(a * b * d, -1)


# --- bmm (Alg. 5.1.2, Dao et al. 2022) ---------------------------------------------------
def _prep_bmm(w: torch.Tensor, p: KSPattern) -> dict:
    a, b, c, d = p.as_tuple()
    return {"k": w.permute(0, 3, 1, 2).reshape(a * d, b, c).contiguous()}


def _bmm(x: torch.Tensor, op: dict, p: KSPattern, layout: str) -> torch.Tensor:
    a, b, c, d = p.as_tuple()
    if layout == "bsf":
        xp = x.reshape(-1, a, c, d).transpose(-1, -2).reshape(-1, a * d, c).transpose(0, 1)
        yp = torch.bmm(xp, op["k"].transpose(-1, -2))  # (ad, B, b)
        return yp.transpose(0, 1).reshape(-1, a, d, b).transpose(-1, -2).reshape(-1, a * b * d)
    xp = x.reshape(a, c, d, -1).transpose(1, 2).reshape(a * d, c, -1)
    yp = torch.bmm(op["k"], xp)  # (ad, b, B)
    return yp.reshape(a, d, b, -1).transpose(1, 2).reshape(a * b * d, -1)


# --- fused (Alg. 5.1.1 in one pass) ------------------------------------------------------
def _prep_fused(w: torch.Tensor, p: KSPattern) -> dict:
    """w and the C kernel for its dtype (float32 for half precision) where it can be built;
    the kernel's packing of w for a layout (``packed``) is made on the first product in
    that layout (``_packed``), so the layout can be chosen per call and a training step
    packs only the one it uses. For bfloat16 also the packing of the bf16 kernel
    (batch-size-first, bf16 dot products) where the instruction set has one."""
    kernel = cpu_kernel.current_kernel(torch.float32 if w.dtype in HALF else w.dtype)
    if w.device.type != "cpu" or kernel is None:
        return {"w": w}
    op = {"w": w, "kernel": kernel, "packed": {}}
    if w.dtype == torch.bfloat16 and (bf16 := cpu_kernel.current_kernel(torch.bfloat16)):
        op["bf16"] = (bf16, cpu_kernel.pack(w, bf16, "bsf"))
    return op


def _packed(op: dict, layout: str) -> torch.Tensor:
    if layout not in op["packed"]:
        op["packed"][layout] = cpu_kernel.pack(op["w"], op["kernel"], layout)
    return op["packed"][layout]


def _run_fused(x: torch.Tensor, op: dict, p: KSPattern, layout: str, once: bool = False,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """The C kernel's product (no autograd), plus ``bias`` where given (added as the kernel
    stores Y): the bf16 kernel for bfloat16 batch-size-first where there is one, else the
    kernel of op["kernel"] on x in its dtype. ``once``: the factor is used for this product
    only (autograd records it: a training step changes it before the next), so it is not
    kept packed in op."""
    if x.dtype == torch.bfloat16 and layout == "bsf" and "bf16" in op:
        kernel, packed = op["bf16"]
        y = cpu_kernel.multiply(kernel, x.contiguous(), packed, p.as_tuple(), layout)
        return y if bias is None else y + bias.detach()
    kernel = op["kernel"]
    xk = x if x.dtype == kernel.dtype and x.is_contiguous() else \
        x.to(kernel.dtype).contiguous()
    bk = None if bias is None else bias.detach().to(kernel.dtype).contiguous()
    if once and layout not in op["packed"]:
        y = cpu_kernel.multiply_once(kernel, xk, op["w"], p.as_tuple(), layout, bk)
    else:
        y = cpu_kernel.multiply(kernel, xk, _packed(op, layout), p.as_tuple(), layout, bk)
    return y if y.dtype == x.dtype else y.to(x.dtype)


class _FusedProduct(torch.autograd.Function):
    """The C kernel's product (plus a bias, added as Y is stored) with its backward in the
    same kernel: dX = dY·K is the product by K^T (pattern (a, c, b, d);
    ``cpu_kernel.multiply_transposed``: w read in place on the flat and phased paths,
    packed through its transposed strides on the others), dw[i, k, l, j] = sum_n dY[n, i,
    k, j] X[n, i, l, j] the kernel's product with the batch as inner dimension
    (``cpu_kernel.grad_factor``), and the bias's the sum of dY over the batch; no
    permutation of X, dY or the gradients goes through torch. Half precision runs in
    float32 and is cast back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                op: dict, p: KSPattern, layout: str) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.kernel, ctx.p, ctx.layout = op["kernel"], p, layout
        return _run_fused(x, op, p, layout, once=True, bias=bias)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        kernel, p, layout = ctx.kernel, ctx.p, ctx.layout
        g = gy.to(kernel.dtype).contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            wk = w.detach().to(kernel.dtype)
            gx = cpu_kernel.multiply_transposed(kernel, g, wk, p.as_tuple(), layout).to(x.dtype)
        if ctx.needs_input_grad[1]:
            gw = cpu_kernel.grad_factor(kernel, x.to(kernel.dtype).contiguous(), g,
                                        p.as_tuple(), layout).to(w.dtype)
        gb = gy.sum(0 if layout == "bsf" else 1) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None


class _KernelProduct(torch.autograd.Function):
    """Products whose kernel has no autograd formula (CPU BSR, the Triton kernel). Backward:
    dX = dY·K is the same algorithm on K^T (pattern (a, c, b, d), factor w transposed in
    (b, c)), and dw[i, k, l, j] = sum_n dY[n, i, k, j] X[n, i, l, j]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, run: Callable, p: KSPattern,
                layout: str, algorithm: str) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.p, ctx.layout, ctx.algorithm = p, layout, algorithm
        return run(x)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        p, layout = ctx.p, ctx.layout
        gx = gw = None
        if ctx.needs_input_grad[0]:
            wt = w.transpose(1, 2)
            gx = apply(gy, prepare(wt, p.transpose(), ctx.algorithm), p.transpose(),
                       ctx.algorithm, layout)
        if ctx.needs_input_grad[1]:
            a, b, c, d = p.as_tuple()
            if layout == "bsf":
                gw = torch.einsum("nikj,nilj->iklj", gy.reshape(-1, a, b, d),
                                  x.reshape(-1, a, c, d))
            else:
                gw = torch.einsum("ikjn,iljn->iklj", gy.reshape(a, b, d, -1),
                                  x.reshape(a, c, d, -1))
        return gx, gw, None, None, None, None


def _fused_cuda(x: torch.Tensor, w: torch.Tensor, p: KSPattern, layout: str) -> torch.Tensor:
    """The Triton kernel, differentiable (backward as on CPU: the kernel on K^T for dX, a
    batch contraction for dw); einsum where it does not apply (no triton, float64)."""
    from pathlift.kron import triton_kernel  # start-up: it imports triton, only on CUDA

    if not triton_kernel.available() or x.dtype == torch.float64:
        return _einsum(x, {"w": w}, p, layout)
    return _KernelProduct.apply(x, w, lambda v: triton_kernel.launch(v, w.detach(), p, layout),
                                p, layout, "fused")


def _fused(x: torch.Tensor, op: dict, p: KSPattern, layout: str,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X K^T + bias, the bias added by the C kernel as it stores Y (on CPU)."""
    kernel = op.get("kernel")
    if x.device.type == "cuda" or kernel is None:
        y = _fused_cuda(x, op["w"], p, layout) if x.device.type == "cuda" else \
            _einsum(x, op, p, layout)
        return _add_bias(y, bias, layout)
    if (torch.float32 if x.dtype in HALF else x.dtype) != kernel.dtype:
        raise InvalidParameterError(f"fused: input dtype {x.dtype} != factor dtype "
                                    f"{op['w'].dtype}; cast one of them")
    tracked = (x, op["w"]) if bias is None else (x, op["w"], bias)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tracked)):
        return _run_fused(x, op, p, layout, bias=bias)  # no autograd node to build
    return _FusedProduct.apply(x, op["w"], bias, op, p, layout)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None, layout: str) -> torch.Tensor:
    if bias is None:
        return y
    return y + bias if layout == "bsf" else y + bias[:, None]


_REGISTRY: dict[str, tuple[Callable, Callable]] = {
    "dense": (_prep_dense, _dense),
    "sparse": (_prep_sparse, _sparse),
    "bsr": (_prep_bsr, _bsr),
    "einsum": (_prep_einsum, _einsum),
    "bmm": (_prep_bmm, _bmm),
    "fused": (_prep_fused, _fused),
}
ALGORITHMS = tuple(_REGISTRY)  # the one list: ("dense", "sparse", "bsr", "einsum", "bmm", "fused")


def prepare(w: torch.Tensor, pattern: KSPattern, algorithm: str) -> dict:
    """Convert the factor w (a, b, c, d) to the storage of ``algorithm`` (differentiable)."""
    _check(algorithm, "bsf")
    check_factor(w, pattern)
    return _REGISTRY[algorithm][0](w, pattern)


# algorithms whose product adds a bias itself (no pass of its own over Y); the others' Y
# gets it added afterwards
_WITH_BIAS: dict[str, Callable] = {"fused": _fused}


def apply(x: torch.Tensor, prepared: dict, pattern: KSPattern, algorithm: str,
          layout: str = "bsf", bias: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X K^T (+ ``bias``, a vector of the M = abd output features) with K given by
    ``prepare(w, pattern, algorithm)``; differentiable in x, w and the bias."""
    _check(algorithm, layout)
    n = pattern.in_features
    if x.dim() != 2 or x.shape[1 if layout == "bsf" else 0] != n:
        want = "(B, N)" if layout == "bsf" else "(N, B)"
        raise ShapeError(f"{algorithm}/{layout}: x must have shape {want} with N = acd = {n} "
                         f"for pattern {pattern}, got {tuple(x.shape)}")
    if bias is None:
        return _REGISTRY[algorithm][1](x, prepared, pattern, layout)
    if tuple(bias.shape) != (pattern.out_features,):
        raise ShapeError(f"{algorithm}: the bias must have shape ({pattern.out_features},) "
                         f"(M = abd for pattern {pattern}), got {tuple(bias.shape)}")
    if algorithm in _WITH_BIAS:
        return _WITH_BIAS[algorithm](x, prepared, pattern, layout, bias)
    return _add_bias(_REGISTRY[algorithm][1](x, prepared, pattern, layout), bias, layout)


def ks_multiply(x: torch.Tensor, w: torch.Tensor, pattern: KSPattern,
                algorithm: str = "bmm", layout: str = "bsf") -> torch.Tensor:
    """Y = X·K^T for the pattern-``pattern`` factor w (thesis Alg. 5.1.1 / 5.1.2).

    x: (B, acd) for layout "bsf", (acd, B) for "bsl"; returns (B, abd) or (abd, B).
    Differentiable in x and w for every algorithm.

    The factor in the algorithm's storage (``prepare``) is kept between calls where
    autograd does not record w (it does not require grad, or under ``torch.no_grad``), as
    ``KSLinear`` keeps its factors': while w's storage lives and its version counter is
    unchanged, the next call with the same w (or the same view of it) reuses it; an
    in-place change (an optimizer step, ``copy_``) or a new tensor (``.to(dtype)``, a
    recomputed pruning product) prepares it again. Writes that bypass the version counter
    (through ``w.data`` or a NumPy view) are not seen: call ``apply(x, prepare(w, ...),
    ...)`` after those. Where autograd records w, every call prepares it (the fused
    kernel packs it in one pass in C).
    """
    return apply(x, _cached_prepare(w, pattern, algorithm), pattern, algorithm, layout)


_PREPARED: dict[tuple, tuple[weakref.ref, int, dict]] = {}
_PREPARED_MAX = 64  # entries kept (oldest dropped first); each also dies with its storage


def _cached_prepare(w: torch.Tensor, pattern: KSPattern, algorithm: str) -> dict:
    """``prepare(w, pattern, algorithm)``, from ``_PREPARED`` when autograd does not record
    w and w's storage (the same Python object, so not a new tensor at a reused address),
    view and version match (and the kernel's forced vector width, ``vector_width``)."""
    if w.device.type == "meta" or (torch.is_grad_enabled() and w.requires_grad):
        return prepare(w, pattern, algorithm)
    storage = w.untyped_storage()
    key = (algorithm, pattern, storage.data_ptr(), w.storage_offset(), tuple(w.shape),
           w.stride(), w.dtype, w.device, cpu_kernel.width_flags())
    hit = _PREPARED.get(key)
    if hit is None or hit[0]() is not storage or hit[1] != w._version:
        _PREPARED.pop(key, None)
        # the oldest first; keys listed at once (an entry's storage may die meanwhile)
        for old in list(_PREPARED)[:max(0, len(_PREPARED) - _PREPARED_MAX + 1)]:
            _PREPARED.pop(old, None)
        hit = (weakref.ref(storage, lambda _, key=key: _forget(key)), w._version,
               prepare(w, pattern, algorithm))
        _PREPARED[key] = hit
    return hit[2]


def _forget(key: tuple) -> None:
    """Drop the entry of a storage that died (unless a newer one took its key)."""
    hit = _PREPARED.get(key)
    if hit is not None and hit[0]() is None:
        _PREPARED.pop(key, None)
