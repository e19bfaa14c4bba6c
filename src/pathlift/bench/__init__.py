"""Benchmarking applications the CLI calls, kept out of the library core: ``kron`` (the
Kronecker-sparse multiplication grid of thesis Sec. 5.4-5.5 and the design benchmark)."""
