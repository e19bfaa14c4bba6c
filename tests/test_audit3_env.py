"""Issue 40, the environment: what it may choose, and what it may not make pathlift run.

docs/threat-model.md: ``PATHLIFT_KRON_CFLAGS`` chooses how the Kronecker kernel is built
(optimisation and instruction-set flags only), never what is compiled or which program
runs; ``CC`` is trusted exactly like ``PATH`` (an absolute path or a name on PATH), and a
relative ``CC`` (it depends on the current folder) is refused. Each refused variant would
create a marker file if the compiler ran it; the marker is never created.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kron_fixtures import QUICK_BUILD
from pathlift.errors import InvalidParameterError
from pathlift.kron import cpu_kernel

SRC = str(Path(__file__).resolve().parents[1] / "src")
#: C that creates ``marker`` in the current folder when it is compiled in and loaded
EVIL_C = '#include <stdlib.h>\n__attribute__((constructor)) static void owned(void) ' \
         '{ system("touch marker"); }\n'
#: a "compiler" that creates ``marker`` and then compiles as gcc would
EVIL_CC = '#!/bin/sh\ntouch "$(dirname "$0")/marker"\nexec {gcc} "$@"\n'
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture
def attacker(tmp_path, monkeypatch):
    """A folder holding evil.c, evilcc.sh, a flags file and bin/cc, as the current folder,
    with a fresh kernel cache (nothing built before counts),
    built with ``kron_fixtures.QUICK_BUILD``."""
    (tmp_path / "evil.c").write_text(EVIL_C)
    (tmp_path / "flags.txt").write_text("-include evil.c\n")
    for script in (tmp_path / "evilcc.sh", tmp_path / "bin" / "cc"):
        script.parent.mkdir(exist_ok=True)
        script.write_text(EVIL_CC.format(gcc=shutil.which("gcc") or "false"))
        script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path / "cache"))
    for name, value in QUICK_BUILD.items():
        monkeypatch.setenv(name, value)
    cpu_kernel._load_for.cache_clear()
    yield tmp_path
    cpu_kernel._load_for.cache_clear()


@needs_gcc
@pytest.mark.parametrize("cflags", [
    "-include evil.c", "-imacros evil.c", "--include=evil.c", "@flags.txt", "-B .",
    "-O2 -Dks_isa()=0", "-fplugin=./evil.so", "-Wl,-init,owned evil.c", "-x c evil.c",
    "-specs=evil.specs", "-wrapper ./evilcc.sh", "-O3 'unbalanced",
])
def test_compiler_flags_that_run_or_read_code_are_refused(cflags, attacker, monkeypatch):
    monkeypatch.setenv("PATHLIFT_KRON_CFLAGS", cflags)
    with pytest.raises(InvalidParameterError, match="PATHLIFT_KRON_CFLAGS"):
        cpu_kernel.load_kernel(torch.float32)
    with pytest.raises(InvalidParameterError, match="PATHLIFT_KRON_CFLAGS"):
        cpu_kernel.build_flags()  # the cache's fingerprint reads them too
    assert not (attacker / "marker").exists()


@pytest.mark.parametrize("cflags", ["-O2", "-mno-avx512f -mtune=generic", "-march=x86-64-v3",
                                    "-funroll-loops -fno-tree-vectorize -g", "-Ofast -msse4.2"])
def test_optimisation_and_instruction_set_flags_are_passed_as_given(cflags, monkeypatch):
    monkeypatch.setenv("PATHLIFT_KRON_CFLAGS", cflags)
    assert cpu_kernel.build_flags() == cpu_kernel._BASE_FLAGS + tuple(cflags.split())


@needs_gcc
@pytest.mark.slow
def test_optimisation_flags_still_build_the_kernel(attacker, monkeypatch):
    monkeypatch.setenv("PATHLIFT_KRON_CFLAGS", "-O2 -mtune=generic -funroll-loops")
    kernel = cpu_kernel.load_kernel(torch.float32)
    assert kernel is not None and kernel.flags[-3:] == ("-O2", "-mtune=generic",
                                                        "-funroll-loops")


@needs_gcc
@pytest.mark.parametrize("cc", ["./evilcc.sh", "bin/cc", "../" + "x/evilcc.sh"])
def test_a_relative_cc_is_refused_before_it_runs(cc, attacker, monkeypatch):
    monkeypatch.setenv("CC", cc)
    with pytest.raises(InvalidParameterError, match="relative path"):
        cpu_kernel.load_kernel(torch.float32)
    with pytest.raises(InvalidParameterError, match="relative path"):
        cpu_kernel._compiler()
    assert not (attacker / "marker").exists()


@needs_gcc
def test_an_absolute_cc_is_trusted_like_path(attacker, monkeypatch):
    """The documented boundary: whoever sets CC to a program already chooses what runs as
    you (as with PATH); pathlift runs it and the kernel it builds works."""
    monkeypatch.setenv("CC", str(attacker / "evilcc.sh"))
    kernel = cpu_kernel.load_kernel(torch.float32)
    assert kernel is not None and (attacker / "marker").exists()


@needs_gcc
@pytest.mark.parametrize(("variable", "value", "command"), [
    ("PATHLIFT_KRON_CFLAGS", "-include evil.c",
     ["kron-design", "64", "64", "--top-k", "1", "--repeats", "1", "--out", "out"]),
    ("CC", "./evilcc.sh", ["kron-bench", "--every", "400", "--repeats", "1", "--no-vit",
                           "--out", "out"]),
])
def test_the_command_line_refuses_them_in_one_line(variable, value, command, attacker):
    env = {**os.environ, "PYTHONPATH": SRC, variable: value, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pathlift.cli", *command], cwd=attacker,
                          env=env, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and variable in lines[0], done.stderr
    assert not (attacker / "marker").exists()
