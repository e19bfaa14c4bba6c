"""Fixtures of the Kronecker-sparse tests: one kernel and measurement cache per run in a
temporary folder, never the user's ~/.cache/pathlift; a fresh process loading the kernel;
quick builds for the tests of the cache itself."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import pytest
import torch

import warm_process

# A fresh process: the float32 kernel from $PATHLIFT_CACHE_DIR, its product against the
# dense matrix in float64, and the warnings it gave.
KERNEL_CHILD = """
import json, warnings, torch
from pathlift.kron import KSPattern, cpu_kernel, ks_multiply, random_factor, to_dense
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    kernel = cpu_kernel.load_kernel(torch.float32)
    p = KSPattern(2, 24, 20, 3)
    g = torch.Generator().manual_seed(0)
    w, x = random_factor(p, generator=g), torch.randn(33, p.in_features, generator=g)
    y = ks_multiply(x, w, p, "fused").double()
ref = x.double() @ to_dense(w.double(), p).T
print(json.dumps({"kernel": kernel is not None, "error": float((y - ref).abs().max()
                  / ref.abs().max()), "warnings": [str(m.message) for m in caught]}))
"""


def kernel_child(cache_dir: Path, **env: str) -> dict:
    """What ``KERNEL_CHILD`` reports, run with ``PATHLIFT_CACHE_DIR=cache_dir`` and ``env``
    in a fork of the warm process (tests/warm_process.py), which imported pathlift but
    never loaded a kernel."""
    env = os.environ | {"PATHLIFT_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.run([warm_process.python(), "-c", KERNEL_CHILD], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


#: the tests of where a kernel is built, recorded and loaded build it anew in folders of their
#: own: at -O0 (the last -O counts) a build takes 0.3 s of CPU instead of 2.6 s at -O3. The
#: cache's logic is the same for every flag, their products are still checked against the
#: dense matrix, and every other Kronecker test runs the -O3 kernel, built once per session.
QUICK_BUILD = {"PATHLIFT_KRON_CFLAGS": "-O0"}


@pytest.fixture
def quick_build(monkeypatch):
    """Kernels built (in this process and its children) with ``QUICK_BUILD``."""
    for name, value in QUICK_BUILD.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(autouse=True)
def isolated_kron_cache(kron_cache_dir, monkeypatch):
    """PATHLIFT_CACHE_DIR points at the session's temporary cache (``kron_cache_dir`` of
    tests/conftest.py; import this fixture)."""
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(kron_cache_dir))
    return kron_cache_dir


def _native_bits() -> int:
    from pathlift.kron import cpu_kernel

    kernel = cpu_kernel.load_kernel(torch.float32)
    return 0 if kernel is None else kernel.vector_bytes * 8


X86 = platform.machine() in ("x86_64", "AMD64")
# every vector width this machine runs the fused kernel at: its own and, on x86, each
# narrower build (``pathlift.kron.vector_width``)
WIDTHS = [b for b in (512, 256, 128) if b <= _native_bits() and (X86 or b == _native_bits())]

