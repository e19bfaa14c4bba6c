"""Lightning: path-norms, the bound and the sparsity logged along training, path-magnitude
pruning at a chosen epoch (thesis Thm 3.1.1, Thm 4.4.1, Sec. 3.5.1), and path-norm
regularisation: a penalty's gradient added after each backward, a path-norm budget kept
after each step (Sec. 7.2.2, Alg. 3.2.1).

Needs Lightning: ``pip install 'pathlift[lightning]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from pathlift.distributed import World
from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph.boundary import attach_masks_, eval_mode, is_sharded, prune_masks, unwrap
from pathlift.prune.methods import PruningResult, Scope, prune_model
from pathlift.track import PathNormTracker
from pathlift.train.budget import PathNormBudget
from pathlift.train.penalties import AverageCasePenalty, make_penalty

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("pathlift.integrations.lightning needs Lightning: "
                      "pip install 'pathlift[lightning]'") from err

__all__ = ["PathNormCallback", "PathNormRegularizer"]


class PathNormCallback(Callback):
    """Log ``PathNormTracker``'s row (l1/l2/l4 path-norms, bound, sparsities) to the
    trainer's logger at the end of training epochs, and prune once if asked.

    At the end of epoch ``prune_epoch`` (counted from 1) it prunes ``amount`` of the
    network's unpruned weights with the path-magnitude method (thesis Sec. 3.5.1) through
    torch.nn.utils.prune, IN PLACE: ``pathlift.prune.prune_model(network, input_shape,
    amount, "path-magnitude", scope, last_layer_factor=...)``, the library's own call, so
    the masks are those it makes, with the network in eval mode for that call (BatchNorm
    as its affine map; its training flags are restored). Under DDP, rank 0 prunes, the
    other ranks attach its masks, and every rank checks by an all-reduced hash that it
    holds the same. The row is measured after pruning, on rank 0 only, and logged with
    ``rank_zero_only=True``. A sharded (FSDP2) network is measured by every rank together
    (rank 0 logs); pruning it in place is refused on every rank.

    Args:
        input_shape: the network's input shape, no batch dimension.
        n_train, sigma: for the bound (see ``PathNormTracker``).
        train_data: (x, y) of the training set, for the certified top-1 bound of Thm 4.1.2
            (``bound_top1_log10``, see ``PathNormTracker``).
        qs: exponents of the path-norms.
        every_n_epochs: log at the end of every n-th epoch.
        prune_epoch, amount, scope, last_layer_factor: the pruning, if any.
        network: the attribute holding the network in your LightningModule (``"model"``
            for ``self.model``); None takes the LightningModule itself.
        prefix: put before every logged name.

    Example::

        trainer = Trainer(max_epochs=10, callbacks=[PathNormCallback((1, 8, 8),
                          prune_epoch=5, amount=0.8)])
    """

    def __init__(self, input_shape: Sequence[int], n_train: int | None = None,
                 sigma: float | None = None, qs: Sequence[float] = (1.0, 2.0, 4.0),
                 every_n_epochs: int = 1, prune_epoch: int | None = None, amount: float = 0.0,
                 scope: Scope = "global", last_layer_factor: float = 1.0,
                 network: str | None = None, prefix: str = "pathlift/",
                 train_data: tuple[Tensor, Tensor] | None = None):
        super().__init__()
        if every_n_epochs < 1 or (prune_epoch is not None and prune_epoch < 1):
            raise InvalidParameterError("every_n_epochs and prune_epoch count from 1")
        self.tracker = PathNormTracker(input_shape, None, n_train, sigma, qs,
                                       train_data=train_data)
        self.every_n_epochs, self.prune_epoch = every_n_epochs, prune_epoch
        self.amount, self.scope, self.last_layer_factor = amount, scope, last_layer_factor
        self.network, self.prefix = network, prefix
        self.pruning: PruningResult | None = None

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        net = pl_module if self.network is None else pl_module.get_submodule(self.network)
        epoch = trainer.current_epoch + 1
        if epoch == self.prune_epoch:
            self.pruning = self._prune(net)
        if epoch % self.every_n_epochs == 0:
            row = self.tracker(net, epoch)
            if row is not None:
                pl_module.log_dict({self.prefix + k: v for k, v in row.items()},
                                   rank_zero_only=True)

    def _prune(self, net: nn.Module) -> PruningResult:
        """Prune on rank 0 with the model in eval mode (a training epoch ends in training
        mode; BatchNorm is scored as its affine map, Def. 2.2.2), flags restored after."""
        world = World.current()
        if is_sharded(unwrap(net)):  # refused on every rank: none waits for rank 0's masks
            raise UnsupportedModelError(
                "PathNormCallback cannot prune a sharded (FSDP2) network in place "
                "(torch.nn.utils.prune cannot reparametrise DTensors); prune it before "
                "fully_shard, or pick masks with pathlift.prune.global_masks")
        result = None
        if world.main:
            with eval_mode(net):
                result = prune_model(net, self.tracker.input_shape, self.amount,
                                     "path-magnitude", self.scope,
                                     last_layer_factor=self.last_layer_factor)
        masks = world.broadcast({k: v.cpu() for k, v in prune_masks(net).items()}
                                if world.main else None)
        if not world.main:
            attach_masks_(net, {k: v.to(world.device) for k, v in masks.items()})
        world.check_identical("pruning masks", prune_masks(net))
        return world.broadcast(result)


class PathNormRegularizer(Callback):
    """Path-norm regularisation of a LightningModule's training without touching its
    ``training_step``: after each backward, the gradient of ``strength * penalty`` is added
    to the parameters' ``.grad`` (so the optimiser steps on loss + strength * penalty);
    after each optimiser step, an optional ``budget`` ||Phi||_1 <= B is restored
    (``pathlift.train.PathNormBudget``: normalisation, Alg. 3.2.1, then projection).

    Args:
        input_shape: the network's input shape, no batch dimension.
        penalty: None, or a name of ``pathlift.train.PENALTIES`` ("l1", "l2", "l4",
            "log-l1", "average-case"; the last reads the batch's inputs).
        strength: the penalty's weight.
        budget: None, or B.
        network: the attribute holding the network (None: the LightningModule itself).
        prefix: put before the logged penalty value.

    Under DDP the data-free penalties add the same gradient on every rank (the weights
    are the same), so the ranks stay in step; the average-case penalty reads each rank's
    own batch and is refused there (InvalidParameterError). The penalty value is logged
    as ``{prefix}penalty`` at each step. The network is penalised as in eval mode
    (``pathlift.graph.eval_mode``: BatchNorm as its affine map with running statistics,
    Def. 2.2.2), where the penalty alone refuses a module in training mode as
    ``path_norm`` does.

    Example::

        trainer = Trainer(max_epochs=10, callbacks=[
            PathNormRegularizer((1, 8, 8), "log-l1", strength=0.1),
            PathNormCallback((1, 8, 8), n_train=n, sigma=sigma)])
    """

    def __init__(self, input_shape: Sequence[int], penalty: str | None = "log-l1",
                 strength: float = 0.0, budget: float | None = None,
                 network: str | None = None, prefix: str = "pathlift/"):
        super().__init__()
        if not strength >= 0:
            raise InvalidParameterError(f"strength must be >= 0, got {strength}")
        self.penalty = None if penalty is None else make_penalty(penalty, input_shape)
        self.strength = strength
        self.budget = None if budget is None else PathNormBudget(tuple(input_shape), budget)
        self.network, self.prefix = network, prefix
        self._inputs: Tensor | None = None

    def _net(self, pl_module: LightningModule) -> nn.Module:
        return pl_module if self.network is None else pl_module.get_submodule(self.network)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._inputs = batch[0] if isinstance(batch, list | tuple) else batch

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.penalty is None or self.strength == 0:
            return
        if isinstance(self.penalty, AverageCasePenalty) and World.current().size > 1:
            raise InvalidParameterError("the average-case penalty reads each rank's batch; "
                                        "under DDP use a data-free penalty (l1, l2, l4, log-l1)")
        net = self._net(pl_module)
        with eval_mode(net):  # BatchNorm as its affine map, Dropout as the identity
            value = self.penalty.backward(net, self.strength, self._inputs)
        pl_module.log(self.prefix + "penalty", value, rank_zero_only=True)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self.budget is not None:
            self.budget.project_(self._net(pl_module))
