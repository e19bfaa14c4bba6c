"""The collectives of the sharded passes (``pathlift.graph.sharded``), as autograd functions
whose backward is right for what those passes compute: a result every rank computes the
same (a replicated path-norm), so the gradient reaching any replicated tensor is the same
on every rank. Megatron-LM's tensor-parallel operators (Shoeybi et al. 2019, Sec. 3), on
a dim-0 split of the rows of a weight:

- ``gather_rows``: every rank's slab along a dim, concatenated in rank order
  (all-gather); backward: this rank's slab of the gradient, without communication.
- ``sum_ranks``: the sum over ranks (all-reduce); backward: the gradient itself.
- ``replicated``: the tensor itself; backward: the sum over ranks of the gradient (every
  rank's slab of a layer reads the whole of its replicated input).

A collective that times out, or finds the ranks running different passes, raises a
one-line ``DistributedError``: every rank must call pathlift on a sharded model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pathlift.errors import DistributedError


@dataclass(frozen=True)
class Rows:
    """The rows ``[start, start + count)`` of a dim-0 split of ``total`` rows that this rank
    holds, and every rank's count in rank order: torch.chunk's split (ceil(total / ranks)
    rows each, the last ranks fewer or none), which FSDP2 and DTensor's ``Shard(0)`` use."""

    start: int
    count: int
    total: int
    sizes: tuple[int, ...]
    group: Any

    @classmethod
    def chunk(cls, total: int, rank: int, ranks: int, group: Any) -> Rows:
        size = math.ceil(total / ranks) if total else 0
        sizes = tuple(max(0, min(size, total - r * size)) for r in range(ranks))
        return cls(min(rank * size, total), sizes[rank], total, sizes, group)


def _slab(t: Tensor, dim: int, rows: int) -> Tensor:
    """``t`` with ``rows`` entries along ``dim``: cut, or padded with zeros."""
    have = t.shape[dim]
    if have >= rows:
        return t.narrow(dim, 0, rows)
    pad = list(t.shape)
    pad[dim] = rows - have
    return torch.cat([t, t.new_zeros(pad)], dim)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, dim: int, rows: Rows) -> Tensor:
        ctx.dim, ctx.rows, ctx.local = dim, rows, t.shape[dim]
        top = max(rows.sizes)
        mine = _slab(t, dim, top).contiguous()
        parts = [torch.empty_like(mine) for _ in rows.sizes]
        with _one_line("all-gather"):
            dist.all_gather(parts, mine, group=rows.group)
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, rows.sizes, strict=True)],
                         dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        mine = grad.narrow(ctx.dim, ctx.rows.start, ctx.rows.count)
        return _slab(mine, ctx.dim, ctx.local), None, None


class _SumRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, group: Any) -> Tensor:
        total = t.clone()
        with _one_line("all-reduce"):
            dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _Replicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        total = grad.clone()
        with _one_line("all-reduce"):
            dist.all_reduce(total, group=ctx.group)
        return total, None


def gather_rows(t: Tensor, dim: int, rows: Rows) -> Tensor:
    """Every rank's ``t`` (its ``rows.count`` leading entries along ``dim``; a rank without
    rows may pass one entry, dropped) concatenated along ``dim`` in rank order."""
    return _GatherRows.apply(t, dim, rows)


def sum_ranks(t: Tensor, group: Any) -> Tensor:
    """The sum of ``t`` over the ranks of ``group``."""
    return _SumRanks.apply(t, group)


def replicated(t: Tensor, group: Any) -> Tensor:
    """``t``, whose gradient is summed over the ranks of ``group`` (when it needs one)."""
    return _Replicated.apply(t, group) if t.requires_grad else t


def all_max(values: tuple[float, ...], group: Any) -> tuple[float, ...]:
    """Each value's largest over the ranks of ``group`` (one all-reduce for all)."""
    t = torch.tensor(values, dtype=torch.float64, device=_device(group))
    with _one_line("all-reduce"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return tuple(t.tolist())


def all_true(flags: tuple[bool, ...], group: Any) -> tuple[bool, ...]:
    """Each flag's conjunction over the ranks of ``group``."""
    t = torch.tensor(flags, dtype=torch.int64, device=_device(group))
    with _one_line("all-reduce"):
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return tuple(bool(f) for f in t.tolist())


def all_objects(value: Any, group: Any = None) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order."""
    out: list[Any] = [None] * dist.get_world_size(group)
    with _one_line("all-gather"):
        dist.all_gather_object(out, value, group=group)
    return out


def same_pass(what: str, group: Any) -> None:
    """Check that every rank of ``group`` runs the pass ``what`` (a name and the graph's
    shape: one small all-reduce), before the pass's first collective. A rank that does not
    join ends this one with DistributedError after the group's timeout."""
    h = int(hashlib.sha256(what.encode()).hexdigest()[:15], 16)
    both = torch.tensor([h, -h], dtype=torch.int64, device=_device(group))
    with _one_line("all-reduce"):
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    if int(both[0]) != -int(both[1]):
        raise DistributedError(
            f"rank {dist.get_rank()} runs {what} on a sharded model while another rank runs "
            "something else; every rank must make the same pathlift calls on a sharded model, "
            "in the same order")


def _device(group: Any) -> torch.device:
    """Where a collective's tensors live: the current CUDA device under NCCL."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextmanager
def _one_line(op: str) -> Iterator[None]:
    """A collective that fails (gloo: RuntimeError "Timed out ..." or "Connection closed by
    peer", NCCL: DistError) as one line naming this rank."""
    try:
        yield
    except RuntimeError as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        why = "did not join" if "timed out" in str(err).lower() or "timeout" in str(
            err).lower() else "failed in"
        raise DistributedError(
            f"rank {dist.get_rank()}: the other ranks {why} the {op} of a pathlift pass on a "
            f"sharded model ({text[:160]}); every rank must call pathlift on a sharded "
            "model, not only rank 0, within the process group's timeout") from err
