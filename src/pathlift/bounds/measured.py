"""The generalisation bounds of a trained classifier on its own data, against the gap
measured on held-out data (thesis Thm 4.4.1, Thm 4.3.1 and Thm 4.1.2, Sec. 7.2.1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import DataLoader

from pathlift.bounds.constants import ArchitectureConstants, architecture_constants
from pathlift.bounds.rademacher import (
    RademacherBound,
    Sigma,
    rademacher_covering,
    rademacher_peeling,
    sigma_from_loader,
)
from pathlift.bounds.risk import (
    MarginBound,
    cross_entropy_gap_log10,
    default_quantile,
    margin_bound,
    margins,
)
from pathlift.bounds.union import (
    UnionGapBound,
    UnionMarginBound,
    union_gap_bound,
    union_margin_bound,
)
from pathlift.graph import eval_mode, graph_of, unwrap
from pathlift.graph.boundary import model_input
from pathlift.graph.input_shape import InputShape, resolve_input_shape
from pathlift.graph.outputs import OutputKey, classifier_output, select_output
from pathlift.lift import path_norm

__all__ = ["GeneralizationBounds", "Measured", "generalization_bounds", "loss_accuracy"]


@dataclass(frozen=True)
class Measured:
    """Eval-mode cross-entropy and top-1 accuracy on the training and the test data."""

    train_loss: float
    test_loss: float
    train_accuracy: float
    test_accuracy: float

    @property
    def cross_entropy_gap(self) -> float:
        """Test minus training cross-entropy."""
        return self.test_loss - self.train_loss

    @property
    def test_error(self) -> float:
        return 1.0 - self.test_accuracy


@dataclass(frozen=True, repr=False)
class GeneralizationBounds:
    """Bounds on the expected generalisation gap of a trained classifier and the measured one.

    ``rademacher``: Thm 4.4.1 (and Remark 4.4.1 when it applies), Thm C.2.2 and Thm 4.3.1
    bounds on the Rademacher complexity of {theta: ||Phi||_1 <= r}, r = ``path_norm_log10``;
    ``cross_entropy_log10``: each turned into a bound on the expected cross-entropy gap by
    Thm 4.1.1 (L = sqrt(2)); ``top1``: the top-1 error bound of Thm 4.1.2 (delta = 0.05,
    gamma a training-margin quantile); ``measured``: the gap measured on the test data;
    ``train_margins``/``test_margins``: R(x)_y - max_{c != y} R(x)_c per sample.

    Those use r = the network's own ||Phi||_1 (and gamma read off its margins): the
    thesis' fixed-class form (Sec. 7.2.1), which the theorems do not allow (Sec. 7.3.1).
    The certificates valid as stated are ``top1_union`` (Thm 4.1.2 + 4.4.1, union over
    radii and margins fixed in advance) and ``cross_entropy_union`` (the expected
    cross-entropy clipped at 10 nats, union over radii), ``pathlift.bounds.union``.
    ``input_shape``: the shape the network was measured at, ``input_shape.source`` where
    that came from (given, or the model's own declaration: never a guess).
    """

    n_train: int
    sigma: Sigma
    constants: ArchitectureConstants
    path_norm_log10: float
    rademacher: tuple[RademacherBound, ...]
    cross_entropy_log10: tuple[float, ...]
    top1: MarginBound
    measured: Measured
    train_margins: tuple[float, ...]
    test_margins: tuple[float, ...]
    top1_union: UnionMarginBound
    cross_entropy_union: UnionGapBound
    input_shape: InputShape | None = field(default=None, compare=False)

    @property
    def orders_above_measured(self) -> tuple[float, ...]:
        """log10(bound / measured cross-entropy gap) per bound (nan when the gap is <= 0)."""
        gap = self.measured.cross_entropy_gap
        gap_log10 = math.log10(gap) if gap > 0 else math.nan
        return tuple(b - gap_log10 for b in self.cross_entropy_log10)

    @property
    def top1_orders_above_measured(self) -> float:
        """log10(top-1 bound / measured test error), an error of 0 counted as 1/n_test."""
        floor = 1.0 / len(self.test_margins)
        return self.top1.log10 - math.log10(max(self.measured.test_error, floor))

    def __repr__(self) -> str:
        return (f"GeneralizationBounds(n_train={self.n_train}, log10 ||Phi||_1="
                f"{self.path_norm_log10:.3f}, log10 cross-entropy gap bound (Thm 4.4.1)="
                f"{self.cross_entropy_log10[0]:.3f}, measured gap="
                f"{self.measured.cross_entropy_gap:.4g}, log10 top-1 bound (Thm 4.1.2)="
                f"{self.top1.log10:.3f} (fixed class), valid (union) {self.top1_union.log10:.3f}"
                f", test error={self.measured.test_error:.4f})")


def loss_accuracy(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy of ``model`` over ``loader`` (as it is: put it
    in eval mode first if it should be)."""
    total, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(model_input(model, x)).reshape(len(x), -1)
            out = out.to(torch.promote_types(out.dtype, torch.float32))  # float16: loss in 32
            total += float(nn.functional.cross_entropy(out, y.to(out.device),
                                                       reduction="sum"))
            correct += int((out.argmax(1).cpu() == y).sum())
            seen += len(y)
    return total / seen, correct / seen


def _classes(*loaders: DataLoader) -> int:
    """1 + the largest label of the loaders' data."""
    return 1 + max(int(y.max()) for loader in loaders for _, y in loader)


def generalization_bounds(model: nn.Module, input_shape: Sequence[int] | None,
                          train: DataLoader, test: DataLoader, outputs: OutputKey | None = None
                          ) -> GeneralizationBounds:
    """The bounds of thesis Thm 4.4.1, 4.3.1 (and Thm C.2.2) on the expected cross-entropy
    gap (Thm 4.1.1) and of Thm 4.1.2 on the top-1 error, for ``model`` trained on
    ``train``, with the gap measured on ``test``.

    sigma and n come from ``train`` (the sample S the bounds are about); r = ||Phi||_1 from
    the trained parameters. The model is measured in eval mode (BatchNorm as its affine
    map, Dropout as the identity: Def. 2.2.2) and its flags are restored; it is not
    modified. ``input_shape`` None takes the one the model declares
    (``pathlift.graph.input_shape``), else raises ShapeError. A model returning several
    tensors (a tuple, list or dict) is bounded on the one ``outputs`` names (a position or
    a key: the sub-network of the paths ending there,
    ``pathlift.graph.outputs.select_output``), which must hold one logit per class.

    Raises:
        InvalidParameterError: an empty loader, or no positive training-margin quantile
            (Thm 4.1.2 needs gamma > 0).
        ShapeError: several outputs and no ``outputs``, or an output that does not hold
            one value per class of the data (a U-Net's mask).
        UnsupportedModelError: the model is outside the ReLU DAG model.

    Example:
        >>> result = generalization_bounds(net, (1, 8, 8), train_loader, test_loader)
        >>> result.cross_entropy_log10[0], result.measured.cross_entropy_gap
    """
    shape = resolve_input_shape(unwrap(model), input_shape)
    net = select_output(unwrap(model), outputs, shape)
    with eval_mode(net):
        graph = graph_of(net, shape)
        classifier_output(graph, _classes(train, test))
        constants = architecture_constants(graph)
        l1 = path_norm(graph).log10
        sigma = sigma_from_loader(train)
        train_loss, train_acc = loss_accuracy(net, train)
        test_loss, test_acc = loss_accuracy(net, test)
        train_m, test_m = margins(net, train), margins(net, test)
    bounds = [rademacher_peeling(constants, sigma.peeling, l1)]
    if constants.sharpened_applies:
        bounds.append(rademacher_peeling(constants, sigma.peeling, l1, sharpened=True))
    bounds += [rademacher_covering(constants, sigma.covering, l1, weight_sharing=True),
               rademacher_covering(constants, sigma.covering, l1, weight_sharing=False)]
    top1 = margin_bound(bounds[0], train_m, default_quantile(1 - train_acc))
    return GeneralizationBounds(
        sigma.n, sigma, constants, l1, tuple(bounds),
        tuple(cross_entropy_gap_log10(b, sigma.n) for b in bounds), top1,
        Measured(train_loss, test_loss, train_acc, test_acc),
        tuple(train_m.tolist()), tuple(test_m.tolist()), union_margin_bound(bounds[0], train_m),
        union_gap_bound(bounds[0], sigma.n), shape)
