"""Training toward informative bounds (thesis Sec. 7.2.1-7.2.2): differentiable path-norm
penalties, training under a path-norm budget, Path-SGD on any ReLU DAG and the recipes
toward the compression certificate (box-robust training, prune-retrain, compact models,
a reference network for a data-dependent code);
the certified top-1 bound of a trained network is ``pathlift.bounds.certified_top1``. The
accuracy/bound frontier experiment is the job ``pathlift.jobs.frontier``."""

from pathlift.lift.differentiable import (
    differentiable_path_norm,
    magnitude_gradients,
    path_norm_backward,
)
from pathlift.train.budget import PathNormBudget
from pathlift.train.path_sgd import PathSGD
from pathlift.train.penalties import PENALTIES, AverageCasePenalty, PathNormPenalty, make_penalty
from pathlift.train.recipes import RECIPES, compact_model, train_recipe, train_with_reference
from pathlift.train.robust import box_robust_loss

__all__ = [
           "PENALTIES",
           "RECIPES",
           "AverageCasePenalty",
           "PathNormBudget",
           "PathNormPenalty",
           "PathSGD",
           "box_robust_loss",
           "compact_model",
           "differentiable_path_norm",
           "magnitude_gradients",
           "make_penalty",
           "path_norm_backward",
           "train_recipe",
           "train_with_reference",
]
