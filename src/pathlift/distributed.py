"""torch.distributed for pathlift: the world of processes that ``torchrun`` started, DDP
wrapping, data sharding, and the check that every rank holds the same tensors.

pathlift launches and schedules nothing itself: ``torchrun --nproc_per_node N`` starts the
processes, ``torch.distributed`` connects them (gloo on CPU, NCCL on CUDA),
``DistributedDataParallel`` averages the gradients and ``DistributedSampler`` splits the
data. This module only wraps those for the prune-rewind-retrain protocol
(``pathlift.jobs.prune.protocol``) and the path-norm trackers (``pathlift.track``):

- ``launched()``: initialise the default process group from torchrun's environment and
  destroy it on exit, also when an error ends the run; one process without torchrun.
- ``World``: this process's rank, the world size and device, with the few collectives the
  protocol and the sharded certificate (``pathlift.bounds.sample``) need (broadcast,
  gather, reduce, buffer sync) and ``check_identical``, which
  all-reduces a hash of tensors that must agree on every rank and raises otherwise.
- ``ddp(model, world)`` and ``shard(loader, world, seed)``.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import struct
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from pathlift.errors import DistributedError, InvalidParameterError

__all__ = ["DEFAULT_TIMEOUT", "World", "collective_timeout", "ddp", "exit_process", "fingerprint",
           "launched", "set_collective_timeout", "shard"]

T = TypeVar("T")
_TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    """This process in a torch.distributed run: ``rank`` among ``size`` processes, and the
    device its tensors live on (``cuda:<local rank>`` under NCCL, else the CPU).

    ``World()`` is one process alone: every collective below is then a no-op, so code
    written for N ranks runs unchanged in a plain ``python`` process.

    Example::

        with launched() as world:          # under torchrun: the process group
            if world.main:
                print(f"{world.size} processes")
    """

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def current(cls) -> World:
        """The world of the default process group, or one process when there is none."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend() == "nccl" else torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), device)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes files and prints."""
        return self.rank == 0

    def broadcast(self, obj: T, src: int = 0) -> T:
        """``obj`` of rank ``src`` on every rank (pickled: keep tensors in it on the CPU)."""
        if self.size == 1:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, device=self.device)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def reduce(self, t: Tensor, op: str = "sum") -> Tensor:
        """``t`` combined elementwise over the ranks by ``op`` ("sum", "max" or "min"), the
        same on every rank: a new CPU tensor (an int64 sum is exact, in any order)."""
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if op not in ops:
            raise InvalidParameterError(f"op must be one of {sorted(ops)}, got {op!r}")
        out = t.detach().to(self.device, copy=True)
        if self.size > 1:
            dist.all_reduce(out, op=ops[op])
        return out.cpu()

    def sync_buffers(self, model: nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm running statistics, pruning masks),
        in place, as DistributedDataParallel does before each forward: after the last
        step each rank keeps the statistics of its own last batch."""
        if self.size == 1:
            return
        for buf in model.buffers():
            dist.broadcast(buf.data, src=0)

    def check_identical(self, what: str, value: Mapping[str, Tensor] | Tensor | float) -> str:
        """The ``fingerprint`` of ``value``, after checking that every rank has the same.

        The hash is all-reduced (max of h and of -h, one collective), so a mismatch is seen
        by every rank at once and each raises, with no rank left waiting.

        Raises:
            DistributedError: some rank's ``value`` differs from the others'.
        """
        digest = fingerprint(value)
        if self.size > 1:
            h = int(digest[:15], 16)  # 60 bits: fits an int64 and its negation
            both = torch.tensor([h, -h], dtype=torch.int64, device=self.device)
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
            if int(both[0]) != -int(both[1]):
                raise DistributedError(
                    f"{what} differ across the {self.size} ranks (rank {self.rank} holds "
                    f"{digest[:12]}). Every rank must train the DDP-wrapped model it is given "
                    "on its DistributedSampler shard and evaluate the same data, with the "
                    "same code and seeds on every rank")
        return digest


def fingerprint(value: Mapping[str, Tensor] | Tensor | float) -> str:
    """sha256 (hex) of tensors: names, dtypes, shapes and bytes (a float: its 8 bytes)."""
    h = hashlib.sha256()
    if isinstance(value, Mapping):
        items = sorted(value.items())
    elif isinstance(value, Tensor):
        items = [("", value)]
    else:
        h.update(struct.pack("<d", float(value)))
        return h.hexdigest()
    for name, t in items:
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


TIMEOUT_ENV = "PATHLIFT_TIMEOUT"
DEFAULT_TIMEOUT = timedelta(minutes=30)


_timeout: timedelta | None = None


def set_collective_timeout(timeout: float | timedelta | None) -> None:
    """Make ``timeout`` (seconds or a timedelta) this process's default for ``launched``
    (the ``pathlift --timeout`` option); None returns to ``PATHLIFT_TIMEOUT``, else 30
    minutes. Raises InvalidParameterError for a timeout that is not a positive number."""
    global _timeout
    _timeout = None if timeout is None else collective_timeout(timeout)


def collective_timeout(timeout: float | timedelta | None = None) -> timedelta:
    """How long a collective waits for the other ranks: ``timeout`` (seconds or a
    timedelta), else ``set_collective_timeout``'s, else the ``PATHLIFT_TIMEOUT``
    environment variable (seconds), else ``DEFAULT_TIMEOUT``, 30 minutes. It must exceed
    the longest time one rank can work alone: rank 0 choosing a mask while the others
    wait, or, with ``spread="runs"``, a rank without a run of the last round waiting for
    the others' runs.

    Raises InvalidParameterError for a timeout that is not a positive number."""
    source = "timeout"
    if timeout is None and _timeout is not None:
        return _timeout
    if timeout is None:
        timeout, source = os.environ.get(TIMEOUT_ENV), TIMEOUT_ENV
        if not timeout:
            return DEFAULT_TIMEOUT
    try:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidParameterError(
            f"{source} must be a positive number of seconds, got {timeout!r}")
    return timedelta(seconds=seconds)


@contextmanager
def launched(backend: str | None = None,
             timeout: float | timedelta | None = None) -> Iterator[World]:
    """The world of this process: under ``torchrun``, the default process group.

    Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
    initialises the group (``backend`` default: NCCL when CUDA is available, with
    ``cuda:<LOCAL_RANK>`` as this process's device, else gloo) and destroys it when the
    block ends, also on an error, so no rank is left waiting on a dead group (torchrun
    then stops the others). Without torchrun's variables: one process, no group. A group
    the caller (or Lightning) initialised is used and left alone.

    Args:
        backend: "gloo" or "nccl"; None picks as above.
        timeout: how long a collective waits for the other ranks before failing, so that
            a frozen rank ends the run (seconds or a timedelta); None takes
            ``collective_timeout()`` (``set_collective_timeout``, ``PATHLIFT_TIMEOUT``,
            else 30 minutes).

    Raises:
        DistributedError: the rendezvous or a collective inside the block timed out (one
            line naming the rank and the limit; the torch error is its ``__cause__``).

    Example::

        # torchrun --standalone --nproc_per_node 2 train.py
        with launched() as world:
            model = ddp(model, world)
    """
    wait = collective_timeout(timeout)
    if (dist.is_available() and dist.is_initialized()) or \
            not all(k in os.environ for k in _TORCHRUN):
        yield World.current()
        return
    _check_environment()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        dist.init_process_group(backend, timeout=wait)
    except RuntimeError as err:
        _raise_lost(err, wait)
        raise
    global _launched_here
    _launched_here = True
    previous = _stop_on_sigterm()
    try:
        yield World.current()
    except RuntimeError as err:
        _raise_lost(err, wait)
        raise
    finally:
        dist.destroy_process_group()  # under the handler: a SIGTERM meanwhile is let pass
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_launched_here = False


def exit_process(code: int | str | None = 0) -> NoReturn:
    """End this process with exit status ``code`` (``sys.exit``'s meaning), safely after a
    group that ``launched`` started here: then stdout and stderr are flushed and the
    process leaves with ``os._exit``, without the interpreter's finalisation.

    Why: once DistributedDataParallel has used a gloo group, torch keeps the group's
    worker threads alive after ``destroy_process_group``. A worker that frees its last
    collective (DDP's all-reduce, whose captured thread-local state holds a Python object)
    while the interpreter finalises cannot take the GIL, and the process aborts
    (SIGABRT, "terminate called without an active exception") after its work is done:
    about one exit in twenty of a two-process run on a loaded 2-core machine (core dump:
    ``ProcessGroupGloo::runLoop`` -> ``~AsyncWork`` -> ``~ThreadLocalState`` ->
    ``take_gil`` during ``Py_FinalizeEx``). Every file pathlift writes is complete before
    (atomic writes), so nothing is lost by skipping finalisation. Without a group
    launched here: ``sys.exit(code)``.

    Example::

        with launched() as world:
            train(ddp(model, world))
        exit_process(0)   # the last line of a script run under torchrun
    """
    if not _launched_here:
        sys.exit(code)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(code, str):
        print(code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _check_environment() -> None:
    """torchrun's variables, checked before the rendezvous: a RANK outside 0..WORLD_SIZE-1
    once waited for ranks that never come (and read as a timeout), a WORLD_SIZE that is
    not a number ended in a traceback."""
    values = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        text = os.environ.get(key)
        try:
            values[key] = None if text is None else int(text)
        except ValueError:
            raise DistributedError(f"{key}={text!r} is not an integer; {_UNSET}") from None
    rank, size, port = values["RANK"], values["WORLD_SIZE"], values["MASTER_PORT"]
    if size < 1 or not 0 <= rank < size:
        raise DistributedError(f"RANK={rank} with WORLD_SIZE={size}: the ranks of a run are "
                               f"0..WORLD_SIZE-1; {_UNSET}")
    if not 0 < port < 65536:
        raise DistributedError(f"MASTER_PORT={port} is not a TCP port; {_UNSET}")


_UNSET = ("start the processes with torchrun, or unset RANK, WORLD_SIZE, MASTER_ADDR and "
          "MASTER_PORT to run one process")
#: what gloo, NCCL and the TCP store say when another rank's process is gone
_LOST = ("connection reset", "connection closed", "broken pipe", "connection refused",
         "socket closed", "end of file")


def _stop_on_sigterm() -> Any:
    """Make SIGTERM raise a one-line ``DistributedError`` in this rank (the main thread
    only), and return the handler it replaces (None: not the main thread, nothing set).

    torchrun sends SIGTERM to every surviving rank as soon as one rank's process ends
    with an error or a signal; by default the survivors then die without a word, and
    only the launcher's ChildFailedError summary is left.

    A SIGTERM that comes while this rank is already ending by an error of the group (the
    connection to a killed rank lost, a collective timed out: an exception being handled,
    see ``_ending``) is let pass: torchrun sends it about 0.1 s after the other rank's
    death, while the survivor unwinds, and it would replace the error that says what
    happened with its own, or, once the handler was restored, end the rank without a
    word."""
    if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
        return None
    rank = os.environ.get("RANK", "?")

    def stopped(signum: int, frame: object) -> None:
        if _ending(sys.exc_info()[1]):
            return
        raise DistributedError(
            f"rank {rank}: stopped by SIGTERM, which torchrun sends to every rank once one "
            "rank has failed or was killed (its 'Root Cause' below names that rank), or "
            "someone ended the run")

    return signal.signal(signal.SIGTERM, stopped)


def _group_failure(err: BaseException | None) -> str | None:
    """"lost" when ``err`` is a RuntimeError saying another rank's process is gone, "timed
    out" when it says a collective or the rendezvous timed out, else None (gloo raises a
    plain RuntimeError, NCCL and the store torch.distributed.DistError subclasses)."""
    if not isinstance(err, RuntimeError):
        return None
    text = str(err).lower()
    if any(marker in text for marker in _LOST):
        return "lost"
    return "timed out" if "timed out" in text else None


def _ending(err: BaseException | None) -> bool:
    """Whether ``err`` ends this rank because of the group: a ``DistributedError``, or a
    RuntimeError that ``_raise_lost`` turns into one."""
    return isinstance(err, DistributedError) or _group_failure(err) is not None


def _lost_peer(rank: str) -> str:
    """The rank whose connection ``rank`` lost: named when there are two ranks."""
    if os.environ.get("WORLD_SIZE") == "2" and rank in ("0", "1"):
        return f"rank {1 - int(rank)}"
    return "another rank"


def _raise_lost(err: RuntimeError, wait: timedelta) -> None:
    """Raise a one-line ``DistributedError`` if ``err`` is a collective or rendezvous that
    timed out, or lost its connection to another rank (``_group_failure``)."""
    failure = _group_failure(err)
    rank = os.environ.get("RANK", "?")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if failure == "lost":
        raise DistributedError(
            f"rank {rank}: lost the connection to {_lost_peer(rank)} ({first[:160]}); that "
            "rank ended or was killed, and its own output (or torchrun's 'Root Cause' "
            "below) says why") from err
    if failure is None:
        return
    raise DistributedError(
        f"rank {rank}: the other ranks did not answer within {wait.total_seconds():g} s "
        f"({first}); one of them failed or is frozen, or works "
        "alone longer than that: raise the limit with 'pathlift --timeout SECONDS' or "
        f"{TIMEOUT_ENV}") from err


def ddp(model: nn.Module, world: World) -> nn.Module:
    """``model`` (moved to ``world.device``) wrapped in DistributedDataParallel, or the
    model itself when the world is one process. Construction broadcasts rank 0's
    parameters and buffers, so every rank starts from the same weights; pathlift's
    functions read through the wrapper (``pathlift.graph.unwrap``).

    Example::

        with launched() as world:
            wrapped = ddp(model, world)        # train `wrapped`, measure either
    """
    if world.size == 1:
        return model
    model.to(world.device)
    ids = [world.device.index] if world.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def shard(loader: DataLoader, world: World, seed: int = 0) -> DataLoader:
    """The same loader over this rank's ``DistributedSampler`` shard of its dataset.

    Batch size, workers, collate function and the rest are kept, so the global batch is
    ``world.size * loader.batch_size`` (DDP convention). A shuffling loader shuffles with
    ``seed`` (the same on every rank, so the shards stay disjoint); call
    ``loader.sampler.set_epoch(epoch)`` before each epoch (``Phase.epochs`` does). One
    process, or a loader already over a DistributedSampler: returned as is.

    Raises:
        InvalidParameterError: the loader has its own sampler or batch sampler, or an
            iterable dataset: shard those yourself.

    Example::

        loader = shard(DataLoader(dataset, 64, shuffle=True), world, seed=0)
        for epoch in range(epochs):
            if isinstance(loader.sampler, DistributedSampler):
                loader.sampler.set_epoch(epoch)
    """
    if world.size == 1 or isinstance(loader.sampler, DistributedSampler):
        return loader
    if not isinstance(loader.sampler, RandomSampler | SequentialSampler) or \
            loader.batch_size is None:
        raise InvalidParameterError(
            f"cannot shard a DataLoader with a {type(loader.sampler).__name__} or its own "
            "batch sampler over the ranks; build it with shuffle=True/False and batch_size, "
            "or over a torch.utils.data.DistributedSampler yourself")
    sampler = DistributedSampler(loader.dataset, world.size, world.rank,
                                 shuffle=isinstance(loader.sampler, RandomSampler), seed=seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                      num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                      pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context,
                      prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers)
