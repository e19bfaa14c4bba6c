"""Benchmarking applications the CLI calls, kept out of the library core: ``kron`` (the
Kronecker-sparse multiplication grid of thesis Sec. 5.4-5.5 and the design benchmark) and
``run_kron_benchmark`` and ``run_kron_design`` (``pathlift kron-bench`` and ``pathlift
kron-design`` as one call each, returning a result object)."""

from pathlift.jobs.bench.kron_run import (
    KronBenchResult,
    KronBenchRun,
    KronDesignRun,
    run_kron_benchmark,
    run_kron_design,
)

__all__ = ["KronBenchResult", "KronBenchRun", "KronDesignRun", "run_kron_benchmark",
           "run_kron_design"]
