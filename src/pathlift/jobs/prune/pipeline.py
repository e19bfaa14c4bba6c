"""The digits defaults of the prune-rewind-retrain protocol (``pathlift.jobs.prune.protocol``),

``SGDTraining`` is the training of the README's digits experiment, over any DataLoaders:
SGD (lr 0.05, momentum 0.9, weight decay 5e-4) on the cross-entropy through
``pathlift.data.training.train_classifier``, top-1 accuracy on the test loader. Under DDP
it trains on its rank's shard of the training data and evaluates the whole test set on
every rank. Its figure is ``pathlift.jobs.plots.pruning_experiment``.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from pathlift.data.training import evaluate, reproducible, train_classifier
from pathlift.distributed import fingerprint
from pathlift.jobs.prune.protocol import Phase
from pathlift.prune.scores import magnitude_scores, path_magnitude_scores

__all__ = ["SGDTraining", "scatter"]


@dataclass(frozen=True)
class SGDTraining:
    """The protocol's default ``train`` and ``evaluate`` (thesis App. E.1 style: SGD with
    momentum and weight decay, the same hyper-parameters for every method).

    Args:
        train_loader: training batches (x, y); sharded over the ranks under DDP.
        test_loader: evaluation batches; ``evaluate`` returns the top-1 accuracy.
        lr, momentum, weight_decay: SGD's.

    Example::

        train_loader, test_loader = loaders(load_digits(), batch_size=64, seed=0)
        training = SGDTraining(train_loader, test_loader)
        prune_rewind_retrain(small_cnn, (1, 8, 8), training.train, training.evaluate)
    """

    train_loader: DataLoader
    test_loader: DataLoader
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4

    def train(self, model: nn.Module, epochs: int, phase: Phase) -> None:
        """``epochs`` epochs of SGD on ``model`` IN PLACE, seeded by ``phase.rank_seed``,
        bit-reproducible whatever the caller's thread count (``reproducible``)."""
        with reproducible():
            train_classifier(model, phase.loader(self.train_loader), epochs, self.lr,
                             self.momentum, self.weight_decay, callbacks=(phase,),
                             progress=False, seed=phase.rank_seed)

    def evaluate(self, model: nn.Module) -> float:
        """Top-1 accuracy on the whole test loader."""
        return evaluate(model, self.test_loader)

    def settings(self) -> dict[str, Any]:
        """What defines the results besides the model and the grid: the data (a digest of
        each loader's dataset), the batch size and SGD's hyper-parameters. A run folder
        records them in its manifest and checks them on resume (``protocol.manifest``)."""
        return {"data": [data_digest(self.train_loader), data_digest(self.test_loader)],
                "batch_size": self.train_loader.batch_size, "lr": self.lr,
                "momentum": self.momentum, "weight_decay": self.weight_decay}


def data_digest(loader: DataLoader) -> str:
    """The sha256 start of a TensorDataset's tensors, else the dataset's type and size."""
    data = loader.dataset
    if isinstance(data, TensorDataset):
        return fingerprint({str(i): t for i, t in enumerate(data.tensors)})[:16]
    size = len(data) if isinstance(data, Sized) else "?"
    return f"{type(data).__name__}[{size}]"


def scatter(model: nn.Module, input_shape: Sequence[int]) -> tuple[Tensor, Tensor]:
    """(|theta_i|, log10 Path-Mag(theta, i)) of every prunable weight (thesis Figure 3.8)."""
    path = path_magnitude_scores(model, input_shape)
    return (magnitude_scores(model, input_shape).flat().double(),  # bfloat16: no numpy
            path.flat().double().log10() + path.log10_scale)
