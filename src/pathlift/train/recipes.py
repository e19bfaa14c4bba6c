"""Training recipes that favour the compression certificate (``pathlift.bounds.compression``)
and the small architectures it is informative on.

- ``"prune-retrain"`` (strength = fraction pruned): Adam on the cross-entropy, then global
  path-magnitude pruning (thesis Sec. 3.5) of that fraction of the weights, then Adam
  again for half the epochs with the pruned weights held at exactly 0 (a pruned weight
  costs the code one cheap symbol and its box has width 0).
- ``"box-robust"`` (strength = relative radius rho): the same, with the loss
  (CE + ``box_robust_loss`` at radius rho ramped up over the first half of training) / 2,
  so that the margins survive a quantisation step of about rho times each tensor's
  largest weight; ``BOX_ROBUST_PRUNE`` of the weights are pruned before retraining.
- ``"quantized"`` (strength = the grid offset o, an integer >= 1): the same as
  ``prune-retrain`` at ``BOX_ROBUST_PRUNE``, the retraining quantisation-aware
  (``pathlift.train.quantized``: each tensor on the grid of step 2^(floor(log2 max|w|) - o),
  straight-through, the rate annealed to 0 by a cosine), and the weights set on that grid
  at the end: the network is its own
  coded network (exact path-metric d = 0) with o + 1 mantissa bits a weight.

Both use Adam (lr ``lr``, then ``lr`` / 3 for the retraining), batches drawn with
``seed``, and leave the model dense (pruning masks folded in, pruned weights exactly 0).
``sparsity`` > 0 adds to the retraining's loss that weight times the mean of |w| / max|w|
of its tensor over all parameters (the mean code magnitude on each tensor's grid, up to
2^o): weights pushed to 0 and +-1 step lower the empirical entropy of each tensor's codes,
which is what the certificate's code pays (``pathlift.bounds.code``, the enumerative
scheme's n H and the bit-length scheme's symbols).

``train_with_reference`` trains for the certificate with a data-dependent code
(``pathlift.bounds.reference``): the ``quantized`` recipe on a part S1 of the sample
(``split_sample``) gives the reference A, then the network, started from A, is fine-tuned
on the whole sample on A's grids (``tune_from_reference_``) with a pull towards A's cells,
so that few of its codes differ from A's and its code relative to A is short.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from pathlift.bounds.reference import Reference, reference_of, split_sample
from pathlift.errors import InvalidParameterError
from pathlift.prune.methods import prune_model
from pathlift.train.quantized import grid_step, quantized_forward, snap_
from pathlift.train.robust import box_robust_loss

__all__ = ["BOX_ROBUST_PRUNE", "RECIPES", "compact_model", "fit", "train_recipe",
           "train_with_reference", "tune_from_reference_"]

RECIPES = ("prune-retrain", "box-robust", "quantized")
BOX_ROBUST_PRUNE = 0.6


def compact_model(kind: str, shape: Sequence[int], num_classes: int = 10) -> nn.Module:
    """The small architectures of the certificate experiments: ``"mlp-small"`` (one hidden
    layer of 10 ReLU units), ``"cnn-small"`` (conv5-ReLU-maxpool2 with 8 then 16
    channels, then a Linear classifier; 1-d or 2-d by the input shape, 3x3 kernels in
    2-d) and ``"cnn-wide"`` (the same with 16 then 32 channels: more weights, which a
    code relative to a reference, ``pathlift.bounds.reference``, pays only where they
    move)."""
    shape = tuple(shape)
    if kind == "mlp-small":
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), 10), nn.ReLU(),
                             nn.Linear(10, num_classes))
    widths = {"cnn-small": (8, 16), "cnn-wide": (16, 32)}.get(kind)
    if widths is not None and len(shape) in (2, 3):
        conv, pool = (nn.Conv1d, nn.MaxPool1d) if len(shape) == 2 else (nn.Conv2d, nn.MaxPool2d)
        k = 5 if len(shape) == 2 else 3
        spatial = math.prod(s // 4 for s in shape[1:])
        a, b = widths
        return nn.Sequential(conv(shape[0], a, k, padding=k // 2), nn.ReLU(), pool(2),
                             conv(a, b, k, padding=k // 2), nn.ReLU(), pool(2),
                             nn.Flatten(), nn.Linear(b * spatial, num_classes))
    raise InvalidParameterError(f"unknown compact model {kind!r} for input shape {shape}")


def train_recipe(model: nn.Module, x: Tensor, y: Tensor, method: str, strength: float,
                 epochs: int, batch_size: int, lr: float, seed: int,
                 on_epoch: Callable[[int], None] | None = None, sparsity: float = 0.0
                 ) -> None:
    """Train ``model`` IN PLACE on (x, y) with one of ``RECIPES`` (module docstring)."""
    if method not in RECIPES:
        raise InvalidParameterError(f"unknown recipe {method!r}; choose from {RECIPES}")
    shape = tuple(x.shape[1:])
    robust = strength if method == "box-robust" else 0.0
    fraction = strength if method == "prune-retrain" else BOX_ROBUST_PRUNE
    offset = int(strength) if method == "quantized" else None
    if not 0 <= fraction < 1 or robust < 0 or (offset is not None and (
            offset != strength or offset < 1)):
        raise InvalidParameterError(f"{method}: strength {strength} out of range")
    if not (math.isfinite(sparsity) and sparsity >= 0):
        raise InvalidParameterError(f"sparsity must be a finite number >= 0, got {sparsity}")
    gen = torch.Generator().manual_seed(seed)
    _adam(model, x, y, shape, epochs, batch_size, lr, robust, gen, on_epoch, 0)
    if fraction > 0:
        with torch.no_grad():
            prune_model(model, shape, fraction)
        _adam(model, x, y, shape, max(epochs // 2, 1), batch_size, lr / 3, robust, gen,
              on_epoch, epochs, offset, sparsity)
    for module in model.modules():
        for name in ("weight", "bias"):
            if torch_prune.is_pruned(module) and hasattr(module, name + "_orig"):
                torch_prune.remove(module, name)
    if offset is not None:
        snap_(model, offset)


def train_with_reference(model: nn.Module, x: Tensor, y: Tensor, offset: int, epochs: int,
                         batch_size: int, lr: float, seed: int, *,
                         prior_fraction: float = 0.5, split_seed: int = 0,
                         pull: float = 0.0, tune_epochs: int | None = None
                         ) -> Reference:
    """Train ``model`` IN PLACE for a certificate relative to a reference (module
    docstring): the ``quantized`` recipe at ``offset`` on S1 = the first part of
    ``split_sample(len(x), prior_fraction, split_seed)`` alone gives A, whose
    ``Reference`` is returned; then ``tune_from_reference_`` on all of (x, y) for
    ``tune_epochs`` (default epochs // 2) at lr / 3. Pass the returned reference and the
    same (x, y) to ``compression_bound(..., reference=)``: it counts on S2 only."""
    prior, _ = split_sample(len(x), prior_fraction, split_seed)
    train_recipe(model, x[prior], y[prior], "quantized", offset, epochs, batch_size, lr, seed)
    reference = reference_of(model, tuple(x.shape[1:]), x, y, prior)
    tune_from_reference_(model, x, y, offset, max(epochs // 2, 1) if tune_epochs is None
                         else tune_epochs, batch_size, lr / 3, seed + 1, pull)
    return reference


def tune_from_reference_(model: nn.Module, x: Tensor, y: Tensor, offset: int, epochs: int,
                         batch_size: int, lr: float, seed: int, pull: float = 0.0) -> None:
    """Fine-tune ``model`` (the reference A, on its ``offset`` grids) IN PLACE on (x, y),
    quantisation-aware on A's grids (each parameter's step fixed at A's,
    ``pathlift.train.quantized``), A's zeros held at 0, the weights started at the centre
    of A's cells (A + sign(A) step / 2: truncation gives A back, a small step does not
    change a code) and ``pull`` times the mean of |w - centre| / step (the mean distance
    to A's cell, in steps) added to the loss; Adam, cosine-annealed; then set on A's
    grids. With ``pull`` large or ``epochs`` 0 the network stays A."""
    if not (math.isfinite(pull) and pull >= 0):
        raise InvalidParameterError(f"pull must be a finite number >= 0, got {pull}")
    params = dict(model.named_parameters())
    steps = {name: grid_step(p, offset) for name, p in params.items()}
    with torch.no_grad():
        kept = {name: p != 0 for name, p in params.items()}
        for name, p in params.items():
            p.add_(torch.sign(p) * steps[name] / 2)
        centres = {name: p.detach().clone() for name, p in params.items()}

    def loss(xb: Tensor, yb: Tensor) -> Tensor:
        out = F.cross_entropy(quantized_forward(model, xb, offset, steps), yb)
        if not pull:
            return out
        total = sum(p.numel() for p in params.values())
        return out + pull * sum(((p - centres[n]).abs() / max(steps[n], 1e-300)).sum()
                                for n, p in params.items()) / total

    def held() -> None:
        anneal()
        with torch.no_grad():
            for name, p in params.items():
                p.mul_(kept[name])

    opt = torch.optim.Adam(params.values(), lr=lr)
    anneal = torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, max(epochs * math.ceil(len(x) / batch_size), 1)).step
    fit(model, x, y, opt, loss, epochs, batch_size, torch.Generator().manual_seed(seed),
        after_step=held, what="tune from reference: ")
    snap_(model, offset, steps)


def _adam(model: nn.Module, x: Tensor, y: Tensor, shape: tuple[int, ...], epochs: int,
          batch_size: int, lr: float, robust: float, gen: torch.Generator,
          on_epoch: Callable[[int], None] | None, done: int, offset: int | None = None,
          sparsity: float = 0.0) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    radius = {"rho": 0.0}

    def loss(xb: Tensor, yb: Tensor) -> Tensor:
        out = model(xb) if offset is None else quantized_forward(model, xb, offset)
        plain = F.cross_entropy(out, yb)
        if sparsity:
            plain = plain + sparsity * _relative_l1(model)
        if radius["rho"] == 0:
            return plain
        return (plain + box_robust_loss(model, shape, xb, yb, radius["rho"])) / 2

    def ramp(epoch: int) -> None:
        radius["rho"] = robust * min(1.0, (epoch - done) / max(epochs / 2, 1))

    # the quantisation-aware retraining anneals its rate to 0 (cosine, Loshchilov & Hutter
    # 2017): the weights settle on their grid points instead of hopping between them
    anneal = None if offset is None else torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, epochs * math.ceil(len(x) / batch_size)).step
    fit(model, x, y, opt, loss, epochs, batch_size, gen, after_step=anneal,
        before_epoch=ramp, on_epoch=on_epoch, first_epoch=done, what="")


def _relative_l1(model: nn.Module) -> Tensor:
    """sum_i |w_i| / max |w| of its tensor, over all parameters, divided by their number:
    the mean magnitude of the codes on each tensor's grid, up to 2^offset."""
    params = [p for p in model.parameters() if p.numel()]
    total = sum(p.numel() for p in params)
    return sum((p.abs() / p.detach().abs().max().clamp(min=1e-30)).sum()
               for p in params) / total


def fit(model: nn.Module, x: Tensor, y: Tensor, opt: torch.optim.Optimizer,
        loss: Callable[[Tensor, Tensor], Tensor], epochs: int, batch_size: int,
        gen: torch.Generator, *, after_step: Callable[[], None] | None = None,
        before_epoch: Callable[[int], None] | None = None,
        on_epoch: Callable[[int], None] | None = None, first_epoch: int = 0,
        what: str = "") -> None:
    """Epochs of minibatch steps on (x, y), batches drawn with ``gen``: ``loss(xb, yb)``,
    backward, ``opt.step()``, then ``after_step()``; ``before_epoch(e)`` and
    ``on_epoch(e + 1)`` around epoch e (counted from ``first_epoch``). Raises
    InvalidParameterError (prefixed by ``what``) when the loss stops being finite."""
    for epoch in range(first_epoch, first_epoch + epochs):
        model.train()
        if before_epoch is not None:
            before_epoch(epoch)
        for batch in torch.randperm(len(x), generator=gen).split(batch_size):
            opt.zero_grad(set_to_none=True)
            value = loss(x[batch], y[batch])
            if not torch.isfinite(value):
                raise InvalidParameterError(f"{what}the loss became {float(value)} at epoch "
                                            f"{epoch + 1}")
            value.backward()
            opt.step()
            if after_step is not None:
                after_step()
        if on_epoch is not None:
            on_epoch(epoch + 1)
