"""Plain SGD training and top-1 evaluation of classifiers, with per-epoch callbacks."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from pathlift.errors import InvalidParameterError

__all__ = ["Callback", "evaluate", "reproducible", "train_classifier"]


class Callback(Protocol):
    """Anything with ``on_epoch_end``; it may add entries to ``logs`` (they are kept)."""

    def on_epoch_end(self, model: nn.Module, epoch: int, logs: dict[str, Any]) -> None: ...


def train_classifier(model: nn.Module, train_loader: DataLoader, epochs: int, lr: float,
                     momentum: float = 0.9, weight_decay: float = 0.0,
                     callbacks: Iterable[Callback] = (), progress: bool = True,
                     seed: int | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place with SGD on the cross-entropy; one log dict per epoch.

    Each log holds ``epoch`` (1-based), ``loss`` (mean train loss) and ``accuracy`` (train
    top-1 accuracy during the epoch), then whatever the callbacks add. With ``seed`` the
    run is reproducible: the global torch RNG is seeded inside a forked RNG state (the
    caller's RNG state is left untouched) and the loader's own generator, if it has one,
    is reseeded. Raises InvalidParameterError when the loss stops being finite.
    """
    if epochs < 0 or not lr > 0:
        raise InvalidParameterError(f"need epochs >= 0 and lr > 0 (got {epochs}, {lr})")
    callbacks = tuple(callbacks)
    to_model = _placement(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    history: list[dict[str, Any]] = []
    with _seeded(seed, train_loader), _bar(progress, epochs * len(train_loader)) as advance:
        for epoch in range(1, epochs + 1):
            model.train()
            total_loss, correct, seen = 0.0, 0, 0
            for x, y in train_loader:
                x = to_model(x)
                y = y.to(x.device)
                opt.zero_grad(set_to_none=True)
                out = model(x)
                loss = nn.functional.cross_entropy(out, y)
                if not torch.isfinite(loss):
                    raise InvalidParameterError(
                        f"training loss became {loss.item()} at epoch {epoch}; lower lr "
                        f"(now {lr}) or check the inputs")
                loss.backward()
                opt.step()
                total_loss += loss.item() * len(y)
                correct += int((out.argmax(1) == y).sum())
                seen += len(y)
                advance()
            logs: dict[str, Any] = {"epoch": epoch, "loss": total_loss / max(seen, 1),
                                    "accuracy": correct / max(seen, 1)}
            for cb in callbacks:
                cb.on_epoch_end(model, epoch, logs)
            history.append(logs)
    return history


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    """Top-1 accuracy of ``model`` on ``loader`` in eval mode; the training flag is restored."""
    to_model = _placement(model)
    was_training = model.training
    model.eval()
    correct, seen = 0, 0
    try:
        with torch.no_grad():
            for x, y in loader:
                pred = model(to_model(x)).argmax(1)
                correct += int((pred == y.to(pred.device)).sum())
                seen += len(y)
    finally:
        model.train(was_training)
    if seen == 0:
        raise InvalidParameterError("evaluate() got an empty loader")
    return correct / seen


def _placement(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """Move a batch to the model's device and floating dtype (float64 models take float32
    data)."""
    p = next(model.parameters(), None)
    if p is None:
        return lambda x: x
    return lambda x: x.to(p.device, p.dtype) if x.is_floating_point() else x.to(p.device)


@contextmanager
def reproducible(threads: int = 1) -> Iterator[None]:
    """Bit-reproducible CPU training inside the block, whatever the machine's core count.

    Float sums are ordered by the number of intra-op threads, so two runs with the same
    seeds agree only at a fixed thread count: the block runs ``threads`` threads (one is
    also the fastest for small networks on a shared CPU) with
    ``torch.use_deterministic_algorithms`` (warn-only: CPU kernels are deterministic at a
    fixed thread count, this guards the few scatter-style ops that are not). Both settings
    are restored afterwards. Another CPU type (vector width) may still move the last
    digits. TorchInductor's own switch is set with them only when inductor is loaded:
    ``torch.use_deterministic_algorithms`` imports it, and torch._dynamo with it (about 1 s
    of every training command's start), for code that nothing here compiles.

    Example:
        >>> with reproducible():
        ...     train_classifier(model, loader, epochs=5, lr=0.05, seed=0)
    """
    previous = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_num_threads(threads)
    _deterministic(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        _deterministic(previous[1], warn_only=previous[2])


def _deterministic(mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=warn_only)`` when TorchInductor is
    loaded, else the same switch of torch's dispatcher alone (what that function sets but
    inductor's config, whose import loads torch._dynamo)."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


@contextmanager
def _seeded(seed: int | None, loader: DataLoader) -> Iterator[None]:
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = getattr(loader, "generator", None)
        if generator is not None:
            generator.manual_seed(seed)
        yield


@contextmanager
def _bar(show: bool, total: int) -> Iterator[Any]:
    """A progress bar when ``show`` and rich (``pathlift[cli]``) is installed."""
    try:
        from rich.progress import Progress
    except ImportError:
        show = False
    if not show or total == 0:
        yield lambda: None
        return
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=total)
        yield lambda: bar.advance(task)

