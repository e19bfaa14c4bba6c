"""The Kronecker-sparse benchmark figures of the README in one command: ``pathlift kron-bench``
for the native and the AVX2 build of the fused kernel, float32 and bfloat16, 1 and 2
threads, each build in its own process (the AVX2 one with torch's own kernels held to AVX2
too), then one summary: the median t(bmm)/t(fused) per build, dtype and thread count,
and the patterns where the default algorithm (what ``KSLinear.tune`` picks) is more than
10% slower than bmm.

    python benchmarks/bench_kron_final.py                     # the figures (2-2.5 h, est.)
    python benchmarks/bench_kron_final.py --every 8 --repeats 3 --no-vit   # quick look

Run it on an otherwise idle machine: on a loaded one the 2-thread timings are not
reliable. Writes every CSV, plot and log under --out (default
runs/bench-kron-final-<timestamp>/<build>-<dtype>/) and summary.csv.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from pathlift import files

BUILDS = {
    "native": {},
    "avx2": {"PATHLIFT_KRON_CFLAGS": "-mno-avx512f", "ATEN_CPU_CAPABILITY": "avx2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
DTYPES = ("float32", "bfloat16")
# "default algorithm ... median t(bmm)/t(default) 1.65x, worst 1.24x; patterns where it is
# > 10% slower than bmm: none" and the table row "│ best │ 2.21x │ ..." of each thread count
_DEFAULT = re.compile(r"median\s+t\(bmm\)/t\(default\)\s+([\d.]+)x,\s+worst\s+([\d.]+)x;\s+"
                      r"patterns where it is\s+> 10% slower than\s+bmm:\s+(.*?)(?:\n\S|\Z)",
                      re.S)
_ROW = re.compile(r"│\s+(best|bsf|bsl)\s+│\s+([\d.]+)x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-vit", action="store_true")
    parser.add_argument("--out", default=f"runs/bench-kron-final-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for build, env in BUILDS.items():
        for dtype in DTYPES:
            folder = out / f"{build}-{dtype}"
            command = [sys.executable, "-m", "pathlift.cli", "kron-bench", "--threads", "1",
                       "--threads", "2", "--repeats", str(args.repeats), "--every",
                       str(args.every), "--dtype", dtype, "--out", str(folder),
                       *(["--no-vit"] if args.no_vit else [])]
            start = time.time()
            proc = subprocess.run(command, env=os.environ | env | {"COLUMNS": "200"},
                                  capture_output=True, text=True, check=False)
            log = proc.stdout + proc.stderr
            files.write_text(folder / "kron-bench.log", log)
            if proc.returncode:
                sys.exit(f"{build} {dtype} failed (exit {proc.returncode}); see "
                         f"{folder / 'kron-bench.log'}:\n{log[-2000:]}")
            defaults = _DEFAULT.findall(log)
            best = [r for r in _ROW.findall(log) if r[0] == "best"]
            for threads, (row, default) in enumerate(zip(best, defaults, strict=True), 1):
                rows.append({"build": build, "dtype": dtype, "threads": threads,
                             "fused_vs_bmm_best_layout": float(row[1]),
                             "default_vs_bmm_median": float(default[0]),
                             "default_vs_bmm_worst": float(default[1]),
                             "default_over_10pct_slower": " ".join(default[2].split()),
                             "minutes": round((time.time() - start) / 60, 1)})
            print(f"{build} {dtype}: {(time.time() - start) / 60:.1f} min", flush=True)
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    files.write_text(out / "summary.csv", buffer.getvalue())
    print(buffer.getvalue())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
