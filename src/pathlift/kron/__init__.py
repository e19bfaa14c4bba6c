"""Kronecker-sparse matrices (thesis Ch. 5): patterns, factors, the six multiplication
algorithms (dense, sparse, bsr, einsum, bmm, fused), the ``KSLinear`` layer, chains
designed for this machine (``design``, ``replace_linears``; thesis Sec. 7.4.1), and models
saved with their chains (``load_state``)."""

from pathlift.kron.cache import machine_description
from pathlift.kron.cpu_kernel import vector_width
from pathlift.kron.design import Candidate, CostModel, Design, design, hand_families
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
from pathlift.kron.layer import KSLinear, fastest_algorithm, known_algorithm
from pathlift.kron.multiply import ALGORITHMS, LAYOUTS, apply, ks_multiply, prepare
from pathlift.kron.pattern import (
    KSPattern,
    benchmark_patterns,
    block_butterfly,
    check_chain,
    deformable_butterfly,
    dense,
    dense_support,
    kaleidoscope,
    low_rank,
    monarch,
    square_dyadic_butterfly,
)
from pathlift.kron.replace import (
    LayerChoice,
    Replacement,
    load_state,
    rebuild_layers,
    replace_linears,
)
from pathlift.kron.timing import steady_allocator

__all__ = [
    "ALGORITHMS",
    "LAYOUTS",
    "ButterflyFactorization",
    "Candidate",
    "CostModel",
    "Design",
    "KSLinear",
    "KSPattern",
    "LayerChoice",
    "Replacement",
    "apply",
    "benchmark_patterns",
    "block_butterfly",
    "chain_to_dense",
    "check_chain",
    "deformable_butterfly",
    "dense",
    "dense_support",
    "design",
    "dft_butterfly",
    "fastest_algorithm",
    "from_dense",
    "hadamard_butterfly",
    "hand_families",
    "kaleidoscope",
    "known_algorithm",
    "ks_multiply",
    "load_state",
    "low_rank",
    "machine_description",
    "monarch",
    "prepare",
    "project",
    "random_factor",
    "rebuild_layers",
    "replace_linears",
    "square_dyadic_butterfly",
    "steady_allocator",
    "to_dense",
    "vector_width",
]
