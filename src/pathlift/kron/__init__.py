"""Kronecker-sparse matrices (thesis Ch. 5): patterns, factors, the six multiplication
algorithms (dense, sparse, bsr, einsum, bmm, fused) and the ``KSLinear`` layer."""

from pathlift.kron.factor import (
    ButterflyFactorization,
    chain_to_dense,
    dft_butterfly,
    from_dense,
    hadamard_butterfly,
    project,
    random_factor,
    to_dense,
)
from pathlift.kron.layer import KSLinear, fastest_algorithm
from pathlift.kron.multiply import ALGORITHMS, LAYOUTS, apply, ks_multiply, prepare
from pathlift.kron.pattern import (
    KSPattern,
    benchmark_patterns,
    block_butterfly,
    check_chain,
    deformable_butterfly,
    dense,
    kaleidoscope,
    low_rank,
    monarch,
    square_dyadic_butterfly,
)

__all__ = [
    "ALGORITHMS",
    "LAYOUTS",
    "ButterflyFactorization",
    "KSLinear",
    "KSPattern",
    "apply",
    "benchmark_patterns",
    "block_butterfly",
    "chain_to_dense",
    "check_chain",
    "deformable_butterfly",
    "dense",
    "dft_butterfly",
    "fastest_algorithm",
    "from_dense",
    "hadamard_butterfly",
    "kaleidoscope",
    "ks_multiply",
    "low_rank",
    "monarch",
    "prepare",
    "project",
    "random_factor",
    "square_dyadic_butterfly",
    "to_dense",
]
