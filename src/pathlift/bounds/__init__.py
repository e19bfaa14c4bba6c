"""Every theorem that turns path-lifting quantities into a bound: generalisation bounds of
ReLU DAG networks and their architecture constants (thesis Ch. 4), valid as stated
(``union``), the certified top-1 error of a trained classifier (``top1``), the Lipschitz
bounds in the input and in the parameters (``lipschitz``, thesis Sec. 3.3-3.4), the
certified error of a quantised network (``quantization``, Lemma 3.4.1) and the quantiser that
keeps the normalisation of smallest certified error (``symmetry_aware``, Sec. 7.5), the
certificate of a pruning (``PruningCertificate``, eq. 3.19: defined in
``pathlift.lift.pruning_bound``, below the pruning package that computes it while it
prunes), and the compression certificate of a trained network (``compression``), its
training sample streamed in batches and sharded over torchrun's ranks (``sample``), its
code relative to a reference network trained on part of the sample (``reference``)."""

from pathlift.bounds.compression import (
    CompressionBound,
    CompressionSearch,
    EventGrid,
    compression_bound,
)
from pathlift.bounds.constants import (
    ArchitectureConstants,
    architecture_constants,
)
from pathlift.bounds.covering import CoveringNumber, covering_deep, covering_shallow
from pathlift.bounds.disagreement import DisagreementBound, RouteCertificate, certify
from pathlift.bounds.lipschitz import (
    InputLipschitz,
    LipschitzBounds,
    ParameterLipschitz,
    lipschitz_bounds,
    lipschitz_input,
    lipschitz_params,
)
from pathlift.bounds.measured import (
    GeneralizationBounds,
    Measured,
    generalization_bounds,
    loss_accuracy,
)
from pathlift.bounds.quantization import CertifiedError, certified_error
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
from pathlift.bounds.reference import Reference, reference_of, split_sample
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
from pathlift.bounds.sample import Batches
from pathlift.bounds.symmetry_aware import SymmetryAwareQuantized, symmetry_aware_quantize
from pathlift.bounds.top1 import FORMS, CertifiedBound, certified_top1
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
from pathlift.bounds.verdict import Verdict, judge, verdict
from pathlift.lift.pruning_bound import PruningCertificate, pruning_certificate

__all__ = [
    "CROSS_ENTROPY_LIPSCHITZ",
    "DEFAULT_GRID",
    "FORMS",
    "ArchitectureConstants",
    "Batches",
    "CertifiedBound",
    "CertifiedError",
    "CompressionBound",
    "CompressionSearch",
    "CoveringNumber",
    "DisagreementBound",
    "EventGrid",
    "GeneralizationBounds",
    "InputLipschitz",
    "LipschitzBounds",
    "MarginBound",
    "Measured",
    "ParameterLipschitz",
    "PriorGrid",
    "PruningCertificate",
    "RademacherBound",
    "Reference",
    "RouteCertificate",
    "Sigma",
    "SymmetryAwareQuantized",
    "UnionGapBound",
    "UnionMarginBound",
    "Verdict",
    "architecture_constants",
    "certified_error",
    "certified_top1",
    "certify",
    "compression_bound",
    "covering_deep",
    "covering_shallow",
    "cross_entropy_gap_log10",
    "default_quantile",
    "fixed_class_margin_bound",
    "gap_bound_log10",
    "generalization_bounds",
    "judge",
    "lipschitz_bounds",
    "lipschitz_input",
    "lipschitz_params",
    "loss_accuracy",
    "margin_bound",
    "margin_loss",
    "margin_losses",
    "margins",
    "peeling_constant",
    "pruning_certificate",
    "rademacher_covering",
    "rademacher_peeling",
    "reference_of",
    "sharpened_constant",
    "sigma_from_loader",
    "sigma_of",
    "split_sample",
    "symmetry_aware_quantize",
    "union_gap_bound",
    "union_margin_bound",
    "verdict",
]
