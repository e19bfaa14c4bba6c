"""Training toward informative bounds (thesis Sec. 7.2.1-7.2.2): differentiable path-norm
penalties, training under a path-norm budget, Path-SGD on any ReLU DAG, the certified
top-1 bound of a trained network, the recipes toward the compression certificate
(box-robust training, prune-retrain, compact models), and the accuracy/bound frontier
experiment."""

from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.train.budget import PathNormBudget
from pathlift.train.frontier import (
    FrontierConfig,
    FrontierRun,
    frontier_experiment,
    run_frontier,
    with_sweep,
    write_frontier,
)
from pathlift.train.path_sgd import PathSGD
from pathlift.train.penalties import PENALTIES, AverageCasePenalty, PathNormPenalty, make_penalty
from pathlift.train.recipes import RECIPES, compact_model, train_recipe
from pathlift.train.robust import box_robust_loss

__all__ = [
           "PENALTIES",
           "RECIPES",
           "AverageCasePenalty",
           "FrontierConfig",
           "FrontierRun",
           "PathNormBudget",
           "PathNormPenalty",
           "PathSGD",
           "box_robust_loss",
           "compact_model",
           "differentiable_path_norm",
           "frontier_experiment",
           "magnitude_gradients",
           "make_penalty",
           "run_frontier",
           "train_recipe",
           "with_sweep",
           "write_frontier",
]
