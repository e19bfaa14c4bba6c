"""Issue 40, the environment, variants the issue does not list: the C compiler's own
variables. ``CPATH`` / ``C_INCLUDE_PATH`` put someone else's header before the system's
(its code compiled into the kernel pathlift loads), ``COMPILER_PATH`` / ``GCC_EXEC_PREFIX``
make gcc run someone else's ``as``. pathlift runs the compiler with only
``cpu_kernel.COMPILER_ENVIRONMENT`` (docs/threat-model.md): the marker each would create
is never created, and the kernel still builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kron_fixtures import QUICK_BUILD
from pathlift.kron import cpu_kernel

SRC = str(Path(__file__).resolve().parents[1] / "src")
#: a stdlib.h that includes the real one, then runs ``touch marker`` when the kernel loads
EVIL_HEADER = ('#ifndef EVIL_H\n#define EVIL_H\n#include_next <stdlib.h>\n'
               '__attribute__((constructor)) static void owned(void) '
               '{{ system("touch {marker}"); }}\n#endif\n')
#: an assembler that creates the marker, then assembles as the real one
EVIL_AS = '#!/bin/sh\ntouch "{marker}"\nexec {real} "$@"\n'
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("as") is None,
                               reason="needs gcc and as")


@pytest.fixture
def attacker(tmp_path, monkeypatch):
    """evil/stdlib.h and evil/as, a fresh kernel cache (nothing built before counts),
    built with ``kron_fixtures.QUICK_BUILD``."""
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "marker"
    (evil / "stdlib.h").write_text(EVIL_HEADER.format(marker=marker))
    (evil / "as").write_text(EVIL_AS.format(marker=marker, real=shutil.which("as")))
    (evil / "as").chmod(0o755)
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path / "cache"))
    for name, value in QUICK_BUILD.items():
        monkeypatch.setenv(name, value)
    for cached in (cpu_kernel._load_for, cpu_kernel._load):  # built in this test, not before
        cached.cache_clear()
    yield evil
    for cached in (cpu_kernel._load_for, cpu_kernel._load):
        cached.cache_clear()


@needs_gcc
@pytest.mark.parametrize(("variable", "value"), [
    ("CPATH", "{evil}"), ("C_INCLUDE_PATH", "{evil}"), ("COMPILER_PATH", "{evil}"),
    ("GCC_EXEC_PREFIX", "{evil}/"),
])
def test_the_compilers_own_variables_never_choose_code(variable, value, attacker, monkeypatch):
    monkeypatch.setenv(variable, value.format(evil=attacker))
    kernel = cpu_kernel.load_kernel(torch.float32)
    assert kernel is not None  # built with the system's headers and assembler
    assert not (attacker.parent / "marker").exists()


@needs_gcc
def test_kron_bench_with_them_set_runs_nothing_of_theirs(attacker):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "CPATH": str(attacker),
           "COMPILER_PATH": str(attacker)}
    done = subprocess.run([sys.executable, "-m", "pathlift.cli", "kron-bench", "--every", "400",
                           "--repeats", "1", "--threads", "1", "--no-vit", "--algorithm",
                           "fused", "--out", "out"], cwd=attacker.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "could not be built" not in done.stderr
    assert not (attacker.parent / "marker").exists()
