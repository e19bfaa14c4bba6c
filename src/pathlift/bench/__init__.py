"""Benchmarking applications the CLI calls, kept out of the library core: ``kron`` (the
Kronecker-sparse multiplication grid of thesis Sec. 5.4-5.5 and the design benchmark) and
``run_kron_benchmark`` (``pathlift kron-bench`` as one call returning a result object)."""

from pathlift.bench.kron_run import KronBenchResult, KronBenchRun, run_kron_benchmark

__all__ = ["KronBenchResult", "KronBenchRun", "run_kron_benchmark"]
