"""The prune-rewind-retrain protocol (thesis Sec. 3.5.2) with your own training, on one
process or under torchrun, its resumable run folders and the ``pathlift prune`` job."""

from pathlift.jobs.prune.experiment import PruneExperiment, prune_experiment
from pathlift.jobs.prune.pipeline import SGDTraining
from pathlift.jobs.prune.protocol import (
    METHODS,
    Method,
    Phase,
    ProtocolResult,
    PruneConfig,
    prune_rewind_retrain,
)
from pathlift.jobs.prune.results import ResultsFileError, RunFolder, RunFolderBusyError, RunRecord

__all__ = [
    "METHODS",
    "Method",
    "Phase",
    "ProtocolResult",
    "PruneConfig",
    "PruneExperiment",
    "ResultsFileError",
    "RunFolder",
    "RunFolderBusyError",
    "RunRecord",
    "SGDTraining",
    "prune_experiment",
    "prune_rewind_retrain",
]
