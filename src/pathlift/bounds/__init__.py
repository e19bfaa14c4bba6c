"""Generalisation bounds of ReLU DAG networks and their architecture constants (thesis Ch. 4)."""

from pathlift.bounds.constants import (
    ArchitectureConstants,
    architecture_constants,
)
from pathlift.bounds.covering import CoveringNumber, covering_deep, covering_shallow
from pathlift.bounds.measured import (
    GeneralizationBounds,
    Measured,
    generalization_bounds,
    loss_accuracy,
)
from pathlift.bounds.rademacher import (
    RademacherBound,
    Sigma,
    peeling_constant,
    rademacher_covering,
    rademacher_peeling,
    sharpened_constant,
    sigma_from_loader,
    sigma_of,
)
from pathlift.bounds.risk import (
    CROSS_ENTROPY_LIPSCHITZ,
    MarginBound,
    cross_entropy_gap_log10,
    default_quantile,
    gap_bound_log10,
    margin_bound,
    margin_loss,
    margins,
)

__all__ = [
    "CROSS_ENTROPY_LIPSCHITZ",
    "ArchitectureConstants",
    "CoveringNumber",
    "GeneralizationBounds",
    "MarginBound",
    "Measured",
    "RademacherBound",
    "Sigma",
    "architecture_constants",
    "covering_deep",
    "covering_shallow",
    "cross_entropy_gap_log10",
    "default_quantile",
    "gap_bound_log10",
    "generalization_bounds",
    "loss_accuracy",
    "margin_bound",
    "margin_loss",
    "margins",
    "peeling_constant",
    "rademacher_covering",
    "rademacher_peeling",
    "sharpened_constant",
    "sigma_from_loader",
    "sigma_of",
]
