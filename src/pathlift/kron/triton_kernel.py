"""The fused GPU kernel of Algorithm 5.1.1 in Triton (optional: imports without triton).

One program computes a BLOCK_B × BLOCK_K tile of Y[:, row] for one pair (i, j): it reads
X[:, col] and the packed weights directly through their strides (col and row are spaced
by d), accumulates tl.dot products over c in float32 and writes the tile in place, so X
and Y cross global memory once, as the CUDA kernel of thesis Sec. 5.3 does. Batch-size-last
reads X along the batch (contiguous), which is the layout the thesis found fastest.

Not measured in the session that wrote it (no GPU there): the tests marked ``gpu`` check
it against the dense product on a CUDA machine.
"""

from __future__ import annotations

import torch

from pathlift.kron.pattern import KSPattern

try:
    import triton
    import triton.language as tl
except ImportError:  # the module must import without triton
    triton = None
    tl = None

__all__ = ["available", "launch"]


def available() -> bool:
    """True when triton is importable and a CUDA device is present."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _ks_kernel(x_ptr, w_ptr, y_ptr, B, a, b, c, d,
                   sxn, sxf, syn, syf,
                   BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                   BLOCK_L: tl.constexpr, IEEE: tl.constexpr):
        # x[n, f] at x_ptr + n*sxn + f*sxf (f = i*c*d + l*d + j); y likewise with (k, b);
        # w packed (a, d, c, b): w[i, j, l, k] = K[i*b*d + k*d + j, i*c*d + l*d + j].
        t = tl.program_id(0)
        i = t // d
        j = t % d
        offs_n = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
        offs_k = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_B, BLOCK_K), dtype=tl.float32)
        for l0 in range(0, c, BLOCK_L):
            offs_l = l0 + tl.arange(0, BLOCK_L)
            feat = i * c * d + offs_l * d + j
            x = tl.load(x_ptr + offs_n[:, None] * sxn + feat[None, :] * sxf,
                        mask=(offs_n[:, None] < B) & (offs_l[None, :] < c), other=0.0)
            w = tl.load(w_ptr + ((t * c + offs_l[:, None]) * b + offs_k[None, :]),
                        mask=(offs_l[:, None] < c) & (offs_k[None, :] < b), other=0.0)
            if IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w)
        out = i * b * d + offs_k * d + j
        tl.store(y_ptr + offs_n[:, None] * syn + out[None, :] * syf,
                 acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_n[:, None] < B) & (offs_k[None, :] < b))


def launch(x: torch.Tensor, w: torch.Tensor, p: KSPattern, layout: str) -> torch.Tensor:
    """Y = X K^T on CUDA (no autograd: ``pathlift.kron.multiply`` wraps it, with its
    backward and the einsum fallback where triton or the dtype does not fit)."""
    a, b, c, d = p.as_tuple()
    wp = w.permute(0, 3, 2, 1).contiguous()  # (a, d, c, b)
    if layout == "bsf":
        batch = x.shape[0]
        y = torch.empty(batch, a * b * d, device=x.device, dtype=x.dtype)
        sx, sy = (x.stride(0), x.stride(1)), (y.stride(0), y.stride(1))
    else:
        batch = x.shape[1]
        y = torch.empty(a * b * d, batch, device=x.device, dtype=x.dtype)
        sx, sy = (x.stride(1), x.stride(0)), (y.stride(1), y.stride(0))
    block_b, block_k, block_l = 64, 64, 32
    grid = (a * d, triton.cdiv(batch, block_b), triton.cdiv(b, block_k))
    _ks_kernel[grid](x, wp, y, batch, a, b, c, d, *sx, *sy,
                     BLOCK_B=block_b, BLOCK_K=block_k, BLOCK_L=block_l,
                     IEEE=x.dtype == torch.float32)
    return y

