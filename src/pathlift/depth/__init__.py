"""The depth-limit lab: depth-scaled ResNets, p-variation and the experiments of Susanna's
master's thesis (Tables 4.1-4.5)."""

from pathlift.depth.experiments import (
    DepthExperiment,
    DepthRow,
    DepthRun,
    append_csv,
    depth_experiment,
    depth_table,
    fit_rate,
    grid,
    run,
)
from pathlift.depth.pvar import p_variation

__all__ = ["DepthExperiment", "DepthRow", "DepthRun", "append_csv", "depth_experiment",
           "depth_table", "fit_rate", "grid", "p_variation", "run"]
