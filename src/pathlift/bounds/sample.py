"""A certificate's sample as a stream of batches: every pass over it is a fold with exact
integer counts, in memory bounded by a batch, on one process or data-parallel under
torchrun.

``Batches`` takes what users hold: (x, y) tensors, a map-style ``Dataset`` of (x, y)
pairs, a ``DataLoader`` (not shuffling) or any re-iterable of (x, y) batches; inputs alone
(``labels=False``) for unlabeled data. Its batches come in a fixed order and hold the rows
[start, start + len) of the sample, start counted from 0 across the whole sample.

**Sharding (strided by batch).** With a ``World`` of W ranks (``pathlift.distributed``),
every rank is given the whole sample and batch i goes to rank i mod W. Tensors and
datasets are cut into batches of ``batch_size`` rows and a rank reads only its own (a
dataset's ``__getitems__``, torch's batched fetch, when it has one); a
DataLoader or other iterable is read in full on every rank (its batch sizes fix the
starts) and a rank computes on its own batches only. ``count`` sums int64 counts over a
rank's batches and all-reduces them: integers, so the sum is exact and the same in every
order, on one process or N. A pass that meets another number of rows than the first one
raises: the source must give the same batches on every pass (no shuffling, no random
augmentation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    TensorDataset,
    default_collate,
)

from pathlift.distributed import World
from pathlift.errors import InvalidParameterError

__all__ = ["BATCH_SIZE", "Batches", "as_batches"]

BATCH_SIZE = 4096


class Batches:
    """The sample of the module docstring, this rank's batches of it, and its folds.

    Args:
        x: inputs (a tensor, samples first), or the whole source: a ``Dataset`` of (x, y)
            pairs, a ``DataLoader`` or a re-iterable of (x, y) batches (inputs alone when
            ``labels`` is False).
        y: the labels when ``x`` is a tensor of inputs, else None.
        batch_size: rows a batch when pathlift cuts the batches (tensors, datasets).
        world: the ranks to shard over (default: one process, no sharding).
        labels: whether the sample is labelled.

    Raises InvalidParameterError for a one-shot iterator, a shuffling or distributed
    DataLoader, or tensors without labels (one line saying what to pass).
    """

    def __init__(self, x: Any, y: Tensor | None = None, *, batch_size: int = BATCH_SIZE,
                 world: World | None = None, labels: bool = True):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidParameterError(f"batch_size must be a positive integer, got "
                                        f"{batch_size!r}")
        self.batch_size, self.world, self.labels = batch_size, world or World(), labels
        self._rows: int | None = None
        if isinstance(x, Tensor):
            if labels and not isinstance(y, Tensor):
                raise InvalidParameterError("x and y must be tensors (inputs, integer labels), "
                                            "or x a Dataset/DataLoader of (x, y) batches")
            if labels and len(x) != len(y):
                raise InvalidParameterError(f"x and y must hold one label per input, got x "
                                            f"{tuple(x.shape)} and y {tuple(y.shape)}")
            self._tensors: tuple[Tensor, ...] | None = (x, y) if labels else (x,)
            self._source: Any = None
            return
        if y is not None:
            raise InvalidParameterError("y is given with the inputs as a tensor only; a "
                                        "Dataset or DataLoader holds its own labels")
        self._tensors = tuple(x.tensors) if type(x) is TensorDataset else None
        if self._tensors is not None and len(self._tensors) != 1 + labels:
            raise InvalidParameterError(
                f"a TensorDataset of {len(self._tensors)} tensors; a sample is "
                + ("(inputs, labels)" if labels else "inputs alone"))
        if isinstance(x, DataLoader):
            if isinstance(x.sampler, RandomSampler | DistributedSampler):
                raise InvalidParameterError(
                    f"a DataLoader with a {type(x.sampler).__name__} gives other batches on "
                    "every pass: build it with shuffle=False over the whole sample (pathlift "
                    "shards it over the ranks itself)")
        elif isinstance(x, IterableDataset):
            x = DataLoader(x, batch_size=batch_size)
        elif not isinstance(x, Dataset | Iterable) or isinstance(x, Iterator):
            raise InvalidParameterError(
                f"cannot take the sample from a {type(x).__name__}: pass tensors, a Dataset, "
                "a DataLoader or a list of (x, y) batches (a one-shot iterator cannot be "
                "read once a pass)")
        self._source = x

    def __iter__(self) -> Iterator[tuple[int, Tensor, Tensor | None]]:
        """(start, x, y) of this rank's batches, in order (y None when unlabelled)."""
        rank, size = self.world.rank, self.world.size
        if self._tensors is not None or _mapped(self._source):
            total = len(self._tensors[0]) if self._tensors is not None else len(self._source)
            for i, start in enumerate(range(0, total, self.batch_size)):
                if i % size == rank:
                    yield (start, *self._cut(start, min(start + self.batch_size, total)))
            return
        start = 0
        for i, batch in enumerate(self._source):
            x, y = _split(batch, self.labels, start)
            if i % size == rank:
                yield start, x, y
            start += len(x)

    def _cut(self, start: int, stop: int) -> tuple[Tensor, Tensor | None]:
        if self._tensors is not None:
            parts = [t[start:stop] for t in self._tensors]
            return parts[0], (parts[1] if self.labels else None)
        rows = list(range(start, stop))
        get = getattr(self._source, "__getitems__", None)  # torch's batched fetch, if any
        items = get(rows) if get is not None else [self._source[i] for i in rows]
        return _split(default_collate(items), self.labels, start)

    def count(self, fn: Callable[..., Tensor], size: int, *, starts: bool = False
              ) -> list[int]:
        """The sums over the whole sample (every rank's batches) of ``fn(x, y)`` (of
        ``fn(start, x, y)``, start the batch's first sample position, with ``starts``),
        ``size`` integer counts a batch, exact (int64, all-reduced), the same on every
        rank."""
        total = torch.zeros(size + 1, dtype=torch.int64)
        for start, x, y in self:
            counts = fn(start, x, y) if starts else fn(x, y)
            total[:size] += counts.reshape(size).to(torch.int64)
            total[size] += len(x)
        *counts, rows = self.world.reduce(total).tolist()
        self.check_rows(rows)
        return counts

    def check_rows(self, rows: int) -> None:
        """Record that a pass met ``rows`` rows of the whole sample; InvalidParameterError
        when an earlier pass met another number."""
        if self._rows is None:
            self._rows = rows
        elif rows != self._rows:
            raise InvalidParameterError(
                f"the sample gave {rows} rows on one pass and {self._rows} on another: its "
                "source must give the same batches on every pass (no shuffling, no random "
                "augmentation, no dropped last batch)")

    @property
    def n(self) -> int:
        """The number of rows of the whole sample (one pass when not yet known)."""
        if self._rows is None:
            self.count(lambda x, y: torch.zeros(0, dtype=torch.int64), 0)
        return self._rows

    def rows(self, index: Tensor) -> tuple[Tensor, Tensor | None]:
        """The rows at the sample positions ``index`` (distinct, in [0, n)), in that order,
        on every rank: one pass, memory of those rows alone."""
        order = torch.argsort(index)
        wanted = index[order]
        mine = []
        for start, x, y in self:
            lo, hi = (int(torch.searchsorted(wanted, v)) for v in (start, start + len(x)))
            at = wanted[lo:hi] - start
            if hi > lo:
                mine.append((order[lo:hi], x[at], None if y is None else y[at]))
        parts = [p for rank in self.world.gather(mine) for p in rank]
        if not parts:
            raise InvalidParameterError("the sample is empty")
        first = parts[0][1]
        xs = first.new_empty((len(index), *first.shape[1:]))
        ys = None if parts[0][2] is None else parts[0][2].new_empty(len(index))
        for where, x, y in parts:
            xs[where] = x
            if ys is not None:
                ys[where] = y
        return xs, ys


def as_batches(x: Any, y: Tensor | None = None, *, labels: bool = True) -> Batches:
    """``x`` itself when it is ``Batches``, else ``Batches(x, y)`` on one process."""
    if isinstance(x, Batches):
        if y is not None:
            raise InvalidParameterError("y is given with the inputs as a tensor only; "
                                        "Batches hold their own labels")
        return x
    return Batches(x, y, labels=labels)


def _mapped(source: Any) -> bool:
    """A map-style dataset (rows read by index), not a loader or a list of batches."""
    return isinstance(source, Dataset) and not isinstance(source, IterableDataset) and \
        hasattr(source, "__len__")


def _split(batch: Any, labels: bool, start: int) -> tuple[Tensor, Tensor | None]:
    """(x, y) of one batch, or InvalidParameterError naming its first row."""
    if not labels:
        x = batch[0] if isinstance(batch, list | tuple) and len(batch) == 1 else batch
        if not isinstance(x, Tensor):
            raise InvalidParameterError(f"the batch at row {start} is a {type(x).__name__}; "
                                        "unlabeled batches must be input tensors")
        return x, None
    if not isinstance(batch, list | tuple) or len(batch) != 2 or \
            not all(isinstance(t, Tensor) for t in batch):
        raise InvalidParameterError(f"the batch at row {start} is not an (x, y) pair of "
                                    "tensors; a labelled sample gives (inputs, labels) batches")
    return batch[0], batch[1]
