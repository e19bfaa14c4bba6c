"""Kronecker-sparse multiplication benchmark (thesis Sec. 5.4-5.5): fused vs bmm, einsum,
bsr, dense and sparse, measured in the same run, plus the ViT-S/16 MLP of Table 5.5.

    python benchmarks/bench_kron.py                # the documented CPU configuration:
                                                   # batch 256, the 160 grid patterns with
                                                   # M*N <= 2^22, median of 5 round-robin runs
    python benchmarks/bench_kron.py --every 8      # a quick look (20 patterns)
    python benchmarks/bench_kron.py --device cuda --full   # the thesis protocol on a GPU

Same options as ``pathlift kron-bench`` (``--threads 1 --threads 2`` for one run per thread
count; PATHLIFT_KRON_CFLAGS=-mno-avx512f for the AVX2 kernel); writes
runs/kron-bench-<timestamp>/kron_<device>_<dtype>_t<threads>.csv, the Figure 5.8 plot
(.png) and the ViT ratios (_vit.csv), and prints the CPU and instruction set, the median
speed-up t(bmm)/t(fused), the fused-vs-dense check on the patterns of density <= 1/8 and
the check that KSLinear's algorithm is never more than 10% slower than bmm.
"""

import sys

from pathlift.cli import app

if __name__ == "__main__":
    app(["kron-bench", *sys.argv[1:]])
