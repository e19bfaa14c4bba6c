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
from pathlift.bounds.union import (
    DEFAULT_GRID,
    PriorGrid,
    UnionGapBound,
    UnionMarginBound,
    fixed_class_margin_bound,
    margin_losses,
    union_gap_bound,
    union_margin_bound,
)

__all__ = [
    "CROSS_ENTROPY_LIPSCHITZ",
    "DEFAULT_GRID",
    "ArchitectureConstants",
    "CoveringNumber",
    "GeneralizationBounds",
    "MarginBound",
    "Measured",
    "PriorGrid",
    "RademacherBound",
    "Sigma",
    "UnionGapBound",
    "UnionMarginBound",
    "architecture_constants",
    "covering_deep",
    "covering_shallow",
    "cross_entropy_gap_log10",
    "default_quantile",
    "fixed_class_margin_bound",
    "gap_bound_log10",
    "generalization_bounds",
    "loss_accuracy",
    "margin_bound",
    "margin_loss",
    "margin_losses",
    "margins",
    "peeling_constant",
    "rademacher_covering",
    "rademacher_peeling",
    "sharpened_constant",
    "sigma_from_loader",
    "sigma_of",
    "union_gap_bound",
    "union_margin_bound",
]
