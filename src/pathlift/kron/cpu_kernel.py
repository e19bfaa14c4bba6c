"""The fused CPU kernel of Algorithm 5.1.1: a small C GEMM compiled once with the system C
compiler for the machine it runs on, and called through ctypes.

For every pair (i, j) of Algorithm 5.1.1 it multiplies X[:, col] by K^T[col, row] reading X
and writing Y in place through their strides (col and row are spaced by d), so neither of
the two permutation passes of bmm (Algorithm 5.1.2, lines 1 and 3) goes through memory.
The product is the classic register-blocked GEMM (Goto & van de Geijn 2008; the tile sizes
are those of the BLIS micro-kernels for each instruction set): an MR × NR tile of Y lives
in MR·NR/LANES vector registers; per step of the inner dimension the micro-kernel loads
NR/LANES vectors of one operand and broadcasts MR scalars of the other. Both operands of
the micro-kernel are contiguous: the weights are packed once (``pack``) into slivers of
NR columns (batch-size-first) or MR rows (batch-size-last), and the strided block
X[rows, col] of batch-size-first is packed into MR-row slivers per block of 512 columns,
a copy that stays in the L2 cache. Batch-size-first has three more paths (``path_of``)
that gather and scatter nothing: along d when d is a multiple of the vector lanes; *flat*
when d divides them (vectors along the output features f = k*d + j, contiguous in Y, X's
d values of a step broadcast from its rows); *phased* for d = 3*2^m up to two vectors
(the same in slivers of lcm(lanes, d) = 3 vectors, X's values shuffled into the three
phases once per row and block). The factors are packed in one pass in C (``pack``, read
through their strides). The gradients run in the same kernel: dX = dY K is the product by
K^T (``multiply_transposed``; K's rows as they are on the flat and phased paths), dw a
product with the batch as its inner dimension (``grad_factor``). A layer's bias is added as
the kernel stores Y (``multiply(..., bias)``), so Y + b costs no pass of its own.

The vector width and the tiles come from the instruction set the compiler targets
(``-march=native``, narrowed by ``vector_width`` or by flags in ``PATHLIFT_KRON_CFLAGS``
such as ``-mno-avx512f``); GEMM MR x NR, flat rows x vectors, phased rows x vectors:

    AVX-512   64-byte vectors, 32 registers: 12 x 2, 6 x 4, 4 x 3
    AVX2/AVX  32-byte vectors, 16 registers:  6 x 2, 6 x 2, 4 x 3
    NEON      16-byte vectors, 32 registers: 12 x 2, 6 x 4, 4 x 3
    SSE2 and anything else: 16-byte vectors,  6 x 2, 6 x 2 (no phased path)

so the accumulators, the loaded vectors and a broadcast fit in the register file (24 or
12 accumulators), and the phased path's shuffled X of a block stays in half of a 32 kB L1.
The flat tile was 6 x 4 vectors on every instruction set and the phased one 8 x 3 until
issue 41: 24 accumulators spill on AVX2's 16 registers, which made d = 1 patterns run at
0.55-0.6x bmm there.

The shared objects are built on first use (``gcc -O3 -march=native -fopenmp``, about a
second each) from ``ks_fused.c`` (package data beside this module) into
``$PATHLIFT_CACHE_DIR/kron`` (default ``~/.cache/pathlift``), keyed by a hash of the
source, the compiler, the flags and the CPU, so a fresh machine builds its own and nothing
prebuilt ships. The cache is used only where nobody but the user can write
(``pathlift.kron.machine.trusted_cache_dir``). Each library is written atomically under a
name carrying its digest, with a record of its size and SHA-256; both are checked before
loading, with the library itself (the user's regular file, not a link, writable by nobody
else), and a library that fails the check (truncated, empty, replaced, foreign) is
rebuilt, as is one that does not load or lacks a symbol. Where the cache cannot be trusted
or written the library is built in a private temporary folder, loaded and removed (one
warning). ``load_kernel`` returns None (and warns once) when no compiler works or no build
loads; the caller then runs einsum.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F

from pathlift import files
from pathlift.errors import InvalidParameterError, PathliftError
from pathlift.kron.machine import (
    cpu_features,
    trusted_cache_dir,
    unsafe_to_load,
    warn_unusable_cache,
)

__all__ = ["CpuKernel", "bsf_path", "build_flags", "compiled_library", "current_kernel",
           "grad_factor", "load_kernel", "multiply", "multiply_once", "multiply_transposed",
           "pack", "path_of", "vector_width", "width_flags"]

T = TypeVar("T")

# the C source, shipped as package data beside this module (pyproject package-data)
SOURCE = (Path(__file__).with_name("ks_fused.c")).read_text()

_BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
# per dtype: the name of its build and its defines; bfloat16 is float32 arithmetic on
# bf16 operands (ks_bsf_bf16), built where the instruction set has bf16 dot products
_TYPES = {torch.float32: ("float", ("-Dreal=float",)),
          torch.float64: ("double", ("-Dreal=double", "-Direal=long")),
          torch.bfloat16: ("bf16", ("-Dreal=float", "-DKS_BF16"))}
_BSL_BATCH_TILE = 256  # batch columns per task (bsl): X block 256 x 256 in L2
_BF16_INNER_BLOCK = 256  # KC of ks_fused.c: ks_bsf_bf16 writes bf16 when c fits one block
# rows per task of ks_bsf: its packed rows of X (24 x 512 steps of l, 48 kB) stay near L1
# while the slivers of the weights stream from L2; blocks of X sized for L2 (up to 120 rows)
# ran d = 3-12 patterns 0-15% slower (Zen 4, float32, AVX2 and AVX-512 builds)
_GEMM_ROWS = 24


def build_flags() -> tuple[str, ...]:
    """Compiler flags: ``-O3 -march=native -fopenmp ...`` then ``$PATHLIFT_KRON_CFLAGS``
    (e.g. ``-mno-avx512f`` to build the AVX2 kernel on an AVX-512 machine)."""
    return _flags(os.environ.get("PATHLIFT_KRON_CFLAGS", ""))


#: the flags PATHLIFT_KRON_CFLAGS may add: optimisation and instruction-set choices, none
#: of which reads a file, loads a plugin, defines a macro or picks another program
#: (-include, -D, -B, -wrapper, -specs=, -fplugin=, -Wl, @file are refused)
_SAFE_FLAG = re.compile(
    r"-O[0-3sgz]?|-Ofast|-g[0-3]?|-pipe|-m(arch|tune)=[\w.+-]+|-mprefer-vector-width=\w+"
    r"|-m(no-)?[a-z0-9][a-z0-9.-]*"
    r"|-f(no-)?(?!dump|profile|plugin|auto-profile|record|stack-usage|opt-info|sanitize"
    r"|instrument|callgraph|diagnostics|save|debug|.*-map)[a-z0-9][a-z0-9-]*")


@functools.cache
def _flags(extra: str) -> tuple[str, ...]:
    """``_BASE_FLAGS`` and the flags of ``extra`` (PATHLIFT_KRON_CFLAGS), each of which
    must be an optimisation or instruction-set flag (``_SAFE_FLAG``): the environment
    chooses how the kernel is built, never what code is compiled or run."""
    # parsed once per value: every fused prepare asks for the kernel of the current flags
    try:
        added = tuple(shlex.split(extra))
    except ValueError as err:
        raise InvalidParameterError(f"PATHLIFT_KRON_CFLAGS={extra!r} cannot be read ({err})"
                                    ) from err
    refused = [flag for flag in added if not _SAFE_FLAG.fullmatch(flag)]
    if refused:
        raise InvalidParameterError(
            f"PATHLIFT_KRON_CFLAGS holds {' '.join(map(repr, refused))}: only optimisation "
            "and instruction-set flags are passed to the compiler (-O*, -march=, -mtune=, "
            "-m[no-]FEATURE, -f[no-]OPTION without '=', -g); remove the others")
    return _BASE_FLAGS + added


def _compiler() -> str | None:
    return _trusted_cc(os.environ.get("CC")) or \
        _compiler_on_path(os.environ.get("PATH", os.defpath))


def _trusted_cc(cc: str | None) -> str | None:
    """``$CC`` when it names a program as ``PATH`` does: an absolute path or a bare name
    looked up on ``PATH`` (trusted like ``PATH``, docs/threat-model.md); a relative path
    (``./cc.sh``, ``bin/cc``) depends on the current folder, which may be anyone's, and is
    refused."""
    if cc and os.sep in cc and not os.path.isabs(cc):
        raise InvalidParameterError(
            f"CC={cc!r} is a relative path, so the compiler would depend on the current "
            "folder; give an absolute path or a name on PATH")
    return cc or None


@functools.cache
def _compiler_on_path(path: str) -> str | None:
    # searched once per PATH: KSLinear asks for the machine fingerprint on every forward
    return shutil.which("gcc", path=path) or shutil.which("cc", path=path)


@dataclass(frozen=True)
class CpuKernel:
    """A compiled kernel: its library, the instruction set it was built for and its tiles
    (MR x NR scalars for the GEMM, DR x DK vectors along d for ``ks_bsf_d``), the largest
    d that ``ks_bsf_f`` broadcasts (``bcast``), its slivers' width (``nf``) and those of
    ``ks_bsf_p`` (``wp``, 0 where it is not built: no shuffle instructions)."""

    @property
    def lanes(self) -> int:
        return self.vector_bytes // self.dtype.itemsize


    lib: ctypes.CDLL
    dtype: torch.dtype
    isa: str
    vector_bytes: int
    mr: int
    nr: int
    dr: int
    dk: int
    bcast: int
    nf: int
    wp: int
    compiler: str
    flags: tuple[str, ...]

    def __deepcopy__(self, memo: dict) -> CpuKernel:
        return self  # one loaded library per process, shared by every copy of a layer

    def __reduce__(self) -> tuple:
        # pickled as its build: another process loads (or builds) its own library
        return _load, (self.dtype, self.compiler, self.flags)

    def describe(self) -> str:
        """E.g. 'avx2, 32-byte vectors, 6 x 16 torch.float32 tile (gcc -O3 ...)'."""
        return (f"{self.isa}, {self.vector_bytes}-byte vectors, {self.mr} x {self.nr} "
                f"{str(self.dtype).removeprefix('torch.')} tile "
                f"({Path(self.compiler).name} {' '.join(self.flags)})")


def _key(ctype: str, compiler: str, flags: tuple[str, ...], source: str = SOURCE) -> str:
    return hashlib.sha256("\0".join(
        (source, ctype, compiler, *flags, platform.machine(), platform.processor(),
         cpu_features())).encode()).hexdigest()[:16]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _verified(record: Path) -> Path | None:
    """The shared object ``record`` (JSON: file, size, sha256 written at build) names, if it
    is there with that size and digest and is safe to load (``unsafe_to_load``: the user's
    regular file, not a link, writable by nobody else); None for anything else (no record,
    a malformed one, a truncated, empty, replaced or foreign library): the caller rebuilds."""
    try:
        entry = json.loads(files.read_regular(record, follow_links=False))
        name = entry["file"]
        if not isinstance(name, str) or "/" in name or name in (".", ".."):
            return None
        library = record.with_name(name)
        if unsafe_to_load(library) is not None or library.stat().st_size != entry["size"]:
            return None
        data = files.read_regular(library, follow_links=False)
        return library if _digest(data) == entry["sha256"] else None
    except (OSError, ValueError, KeyError, TypeError, PathliftError):
        return None


#: the only variables the compiler sees (docs/threat-model.md): where programs are
#: (``PATH``, trusted), where its temporary files go, the language of its messages. The
#: compilers' own variables choose code, so they are never passed on: ``CPATH`` and
#: ``C_INCLUDE_PATH`` (a header of someone else's compiled in), ``COMPILER_PATH`` and
#: ``GCC_EXEC_PREFIX`` (their ``as`` or ``cc1`` run), ``LIBRARY_PATH``,
#: ``CCC_OVERRIDE_OPTIONS``, ``DEPENDENCIES_OUTPUT`` and the like
COMPILER_ENVIRONMENT = ("PATH", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES")


def _build(defines: tuple[str, ...], compiler: str, flags: tuple[str, ...],
           source: str = SOURCE) -> bytes:
    """The shared object's bytes, compiled from ``source`` in a private temporary folder by
    ``compiler`` run with only the variables ``COMPILER_ENVIRONMENT`` names."""
    with tempfile.TemporaryDirectory(prefix="pathlift-kron-") as tmp:
        src, out = Path(tmp) / "ks_fused.c", Path(tmp) / "ks_fused.so"
        src.write_text(source)
        try:
            env = {k: os.environ[k] for k in COMPILER_ENVIRONMENT if k in os.environ}
            proc = subprocess.run([compiler, *flags, *defines, str(src), "-o", str(out)],
                                  capture_output=True, text=True, check=False, env=env)
        except OSError as err:
            raise RuntimeError(f"cannot run the C compiler {compiler!r}: {err}") from err
        if proc.returncode:
            raise RuntimeError(f"{compiler} failed:\n{proc.stderr[-2000:]}")
        return out.read_bytes()


def _compile(dtype: torch.dtype, compiler: str, flags: tuple[str, ...],
             rebuild: bool = False, source: str = SOURCE, stem: str = "ks_fused"
             ) -> tuple[Path, bool]:
    """The verified shared object of this build in the trusted cache (``trusted_cache_dir``),
    built (and recorded with its size and digest) if missing, damaged or ``rebuild``, and
    False; where the cache cannot be trusted or written, a private copy in a temporary
    folder (one warning) and True: the caller loads it and removes the folder, and the next
    process builds it again."""
    ctype, defines = _TYPES[dtype]
    key = _key(ctype, compiler, (*flags, *defines), source)
    folder = trusted_cache_dir()
    record = None if folder is None else folder / f"{stem}_{ctype}_{key}.json"
    if record is not None and not rebuild and (library := _verified(record)) is not None:
        return library, False
    data = _build(defines, compiler, flags, source)
    digest = _digest(data)
    # named by its digest: concurrent builders never replace a library another one loads
    name = f"{stem}_{ctype}_{key}_{digest[:12]}.so"
    if record is not None:
        try:
            target = files.write_bytes(record.with_name(name), data)
            files.write_json(record, {"file": name, "size": len(data), "sha256": digest})
            return target, False
        except files.FileSystemError as err:
            warn_unusable_cache(err)
    private = Path(tempfile.mkdtemp(prefix="pathlift-kron-")) / name
    private.write_bytes(data)
    return private, True


def _open(dtype: torch.dtype, compiler: str, flags: tuple[str, ...],
          rebuild: bool, source: str = SOURCE, stem: str = "ks_fused") -> ctypes.CDLL:
    library, private = _compile(dtype, compiler, flags, rebuild, source, stem)
    try:
        return ctypes.CDLL(str(library))
    finally:
        if private:  # mapped now: the file is no longer needed
            shutil.rmtree(library.parent, ignore_errors=True)


def _opened(dtype: torch.dtype, compiler: str | None, flags: tuple[str, ...],
            bind: Callable[[ctypes.CDLL], T], source: str = SOURCE, stem: str = "ks_fused"
            ) -> T:
    """``bind`` of the library of this build, from the cache or built; one that does not
    load or bind (OSError, AttributeError: a damaged or stale cached file) is built again
    once. RuntimeError without a compiler."""
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    try:
        return bind(_open(dtype, compiler, flags, False, source, stem))
    except (OSError, AttributeError):  # a cached library that does not load: build anew
        return bind(_open(dtype, compiler, flags, True, source, stem))


@functools.cache
def _load(dtype: torch.dtype, compiler: str | None, flags: tuple[str, ...]) -> CpuKernel | None:
    """The kernel, from the cache or built; a library that does not load or lacks a symbol
    is built again once, and if that fails too the caller falls back to einsum (one
    warning): never an exception."""
    try:
        return _opened(dtype, compiler, flags,
                       lambda lib: _bind(lib, dtype, compiler, flags))
    except (RuntimeError, OSError, AttributeError) as err:
        warnings.warn(f"pathlift.kron: the fused CPU kernel could not be built or loaded "
                      f"({err}); falling back to the einsum algorithm", RuntimeWarning,
                      stacklevel=4)
        return None


def _bind(lib: ctypes.CDLL, dtype: torch.dtype, compiler: str,
          flags: tuple[str, ...]) -> CpuKernel | None:
    """The kernel's entry points typed (AttributeError for a missing one); None for
    bfloat16 where the instruction set has no bf16 dot products."""
    if dtype == torch.bfloat16 and not lib.ks_has_bf16():
        return None  # no bf16 dot products: the caller runs the float32 kernel
    long, ptr, longs = ctypes.c_long, ctypes.c_void_p, ctypes.POINTER(ctypes.c_long)
    if dtype == torch.bfloat16:
        lib.ks_bsf_bf16.argtypes = [ptr, ptr, ptr, *[long] * 6, ctypes.c_int]
        lib.ks_bsf_bf16.restype = ctypes.c_int
    else:
        lib.ks_bsl.argtypes = [ptr, ptr, ptr, *[long] * 6, ctypes.c_int]
        lib.ks_bsf.argtypes = [ptr, ptr, ptr, *[long] * 5, longs, longs, ptr, long,
                               ctypes.c_int]
        lib.ks_bsf_d.argtypes = [ptr, ptr, ptr, *[long] * 5, longs, longs, longs, ptr, long,
                                 ctypes.c_int]
        lib.ks_grad.argtypes = [ptr, ptr, ptr, *[long] * 5, longs, longs, longs, long,
                                ctypes.c_int]
        for fn in (lib.ks_bsl, lib.ks_bsf, lib.ks_bsf_d, lib.ks_grad):
            fn.restype = ctypes.c_int
        lib.ks_bsf_f.argtypes = [ptr, ptr, ptr, *[long] * 7, longs, ctypes.c_int, ptr, long,
                                 ctypes.c_int]
        lib.ks_grad_f.argtypes = [ptr, ptr, ptr, *[long] * 7, ctypes.c_int]
        lib.ks_bsf_p.argtypes = [ptr, ptr, ptr, *[long] * 7, ptr, longs, ctypes.c_int, ptr,
                                 long, ctypes.c_int]
        lib.ks_bsf_fw.argtypes = [ptr, ptr, longs, ptr, *[long] * 5, ctypes.c_int, ptr, ptr,
                                  long, ctypes.c_int]
        lib.ks_grad_p.argtypes = [ptr, ptr, ptr, *[long] * 7, ptr, long, ctypes.c_int]
        lib.ks_bsf_p.restype = lib.ks_bsf_fw.restype = lib.ks_grad_p.restype = ctypes.c_int
        lib.ks_bsf_f.restype = lib.ks_grad_f.restype = ctypes.c_int
        lib.ks_pack.argtypes = [ptr, longs, *[long] * 5, ptr]
        lib.ks_pack_d.argtypes = [ptr, longs, *[long] * 4, ptr]
        lib.ks_pack_f.argtypes = [ptr, longs, *[long] * 5, ptr]
        lib.ks_pack.restype = lib.ks_pack_d.restype = lib.ks_pack_f.restype = None
    lib.ks_isa.restype = ctypes.c_char_p
    tile = (ctypes.c_long * 8)()
    lib.ks_tile(tile)
    return CpuKernel(lib, dtype, lib.ks_isa().decode(), *tile, compiler, flags)


def load_kernel(dtype: torch.dtype) -> CpuKernel | None:
    """The kernel for float32 or float64 built with the current ``build_flags()``, or None
    (with a warning) if it cannot be built. For bfloat16 the batch-size-first kernel with
    bf16 dot products and float32 accumulation, or None (no warning) where the instruction
    set has none (AVX512-BF16); other dtypes give None without a warning."""
    if dtype not in _TYPES:
        return None
    env = os.environ
    return _load_for(dtype, _trusted_cc(env.get("CC")), env.get("PATH", os.defpath),
                     env.get("PATHLIFT_KRON_CFLAGS", ""))


@functools.cache
def _load_for(dtype: torch.dtype, cc: str | None, path: str, cflags: str) -> CpuKernel | None:
    # per value of the variables the build depends on: every fused prepare asks
    return _load(dtype, cc or _compiler_on_path(path), _flags(cflags))


def compiled_library(source: str, stem: str, dtype: torch.dtype) -> ctypes.CDLL | None:
    """Another C source of pathlift's, compiled with ``-Dreal=`` the C type of ``dtype``
    (float32 or float64) as the fused kernel is: the same compiler and flags
    (``build_flags``), the restricted environment (``COMPILER_ENVIRONMENT``), the verified
    cache (files named ``stem``); None, with one warning, where it cannot be built or
    loaded, or for another dtype (no warning)."""
    if dtype not in (torch.float32, torch.float64):
        return None
    env = os.environ
    return _library_for(source, stem, dtype, _trusted_cc(env.get("CC")),
                        env.get("PATH", os.defpath), env.get("PATHLIFT_KRON_CFLAGS", ""))


@functools.cache
def _library_for(source: str, stem: str, dtype: torch.dtype, cc: str | None, path: str,
                 cflags: str) -> ctypes.CDLL | None:
    # per value of the variables the build depends on, as ``_load_for``
    try:
        return _opened(dtype, cc or _compiler_on_path(path), _flags(cflags), lambda lib: lib,
                       source, stem)
    except (RuntimeError, OSError, AttributeError) as err:
        warnings.warn(f"pathlift: {stem}.c could not be built or loaded ({err}); the "
                      "replayed pass runs instead", RuntimeWarning, stacklevel=5)
        return None


# x86 flags that narrow the kernel's vectors below the CPU's (each a build the CPU runs)
_NARROWER = {256: ("-mno-avx512f",), 128: ("-mno-avx",)}
_forced_bits: int | None = None


class vector_width:  # noqa: N801 (a context manager, as torch.no_grad)
    """Inside ``with vector_width(bits):`` the fused CPU kernel is built and run with
    vectors of at most ``bits`` (256: the AVX2 kernel on an AVX-512 CPU, 128: SSE2; 512 or
    None: the CPU's own), so one machine tests and times the build of a narrower one;
    factors prepared inside keep that kernel. Process-wide, like ``torch.set_num_threads``;
    narrower builds on x86 only."""

    def __init__(self, bits: int | None) -> None:
        if bits not in (None, 128, 256, 512):
            raise InvalidParameterError(f"vector_width({bits!r}): choose 128, 256, 512 or None")
        if bits is not None and bits < 512 and platform.machine() not in ("x86_64", "AMD64"):
            raise InvalidParameterError(f"vector_width({bits}): only x86 builds narrower "
                                        f"kernels; this machine is {platform.machine()}")
        self.bits = None if bits == 512 else bits
        self._previous: list[int | None] = []

    def __enter__(self) -> vector_width:
        global _forced_bits
        self._previous.append(_forced_bits)
        _forced_bits = self.bits
        return self

    def __exit__(self, *exc: object) -> None:
        global _forced_bits
        _forced_bits = self._previous.pop()


def width_flags() -> tuple[str, ...]:
    """The compiler flags of the width ``vector_width`` forces, () where none is forced."""
    return () if _forced_bits is None else _NARROWER[_forced_bits]


def current_kernel(dtype: torch.dtype) -> CpuKernel | None:
    """``load_kernel(dtype)``, or the same build with the narrower vectors ``vector_width``
    forces where the CPU's are wider: the kernel the fused algorithm runs."""
    native = load_kernel(dtype)
    if native is None or _forced_bits is None or native.vector_bytes * 8 <= _forced_bits:
        return native
    return _load(dtype, native.compiler, native.flags + width_flags())


@functools.lru_cache(maxsize=1024)
def _longs(values: tuple[int, ...]) -> ctypes.Array:
    """A C array of longs (strides), made once per value: the kernels only read it."""
    return (ctypes.c_long * len(values))(*values)


def path_of(lanes: int, bcast: int, wp: int, d: int, c: int) -> str:
    """Which batch-size-first product of a kernel with ``lanes`` vector lanes, flat
    broadcasts up to d = ``bcast`` and phased slivers of ``wp`` features (0: none) runs a
    pattern with this d and c: ``"along_d"`` (``ks_bsf_d``) for d a multiple of the lanes,
    ``"flat"`` (``ks_bsf_f``) for d dividing them up to ``bcast``, ``"phased"``
    (``ks_bsf_p``) for d with lcm(d, lanes) = 3 lanes and d <= 2 lanes (3, 6, 12, 24 in
    float32 with AVX-512; 3, 6, 12 with AVX2) while the inner dimension c is under 8 lanes
    (128 floats with AVX-512, 64 with AVX2), else ``"gemm"`` (``ks_bsf``). The phased tile
    loads a vector of X per multiply-add, the GEMM's one per two after packing X, which
    pays over a long inner dimension: on a Zen 4 (float32, 4 x 3 phased tile) the phased
    path ran c = 24-48 1.2-1.5x (AVX2) and 1.2-2.0x (AVX-512) faster than the GEMM, c = 64
    and 192 within 6% of it, c = 96-512 (AVX2) and 128-512 (AVX-512) 0.82-0.93x of it."""
    if lanes and d % lanes == 0:
        return "along_d"
    if lanes and lanes % d == 0 and d <= bcast:
        return "flat"
    if wp and d <= 2 * lanes and d // math.gcd(d, lanes) == 3 and c < 8 * lanes:
        return "phased"
    return "gemm"


def bsf_path(kernel: CpuKernel, d: int, c: int) -> str:
    """``path_of`` for this kernel."""
    return path_of(kernel.lanes, kernel.bcast, kernel.wp, d, c)


def pack(w: torch.Tensor, kernel: CpuKernel, layout: str) -> torch.Tensor:
    """The factor w (a, b, c, d) in the kernel's storage for ``layout``, read through its
    strides in one pass in C (``ks_pack``), so the transposed view ``w.transpose(1, 2)``
    packs K^T without a copy.

    Batch-size-first (``bsf_path``): along d, (a, d/LANES, ceil(b/DK), c, DK, LANES); flat
    or phased, the output features f = k*d + j in slivers of NF or WP, (a, ceil(b*d/NF), c,
    NF); else slivers of NR output features per j, (a, d, ceil(b/NR), c, NR). Batch-size-last:
    slivers of MR, (a, d, ceil(b/MR), c, MR). Zero-padded. For the bfloat16 kernel
    (batch-size-first only) the slivers of NR hold pairs of the inner dimension: (a, d,
    ceil(b/NR), ceil(c/2), NR, 2)."""
    a, b, c, d = w.shape
    w = w.detach()
    if kernel.dtype == torch.bfloat16:
        nr = kernel.nr
        padded = F.pad(w.to(torch.bfloat16).permute(0, 3, 1, 2),
                       (0, c % 2, 0, -(-b // nr) * nr - b))  # (a, d, bpad, cpad)
        pairs = padded.reshape(a, d, -1, nr, (c + 1) // 2, 2).permute(0, 1, 2, 4, 3, 5)
        return pairs.contiguous()
    w = w.to(kernel.dtype)
    strides, dt = _longs(tuple(w.stride())), kernel.dtype
    path = bsf_path(kernel, d, c) if layout == "bsf" else "gemm"
    if path == "along_d":
        out = torch.empty(a, d // kernel.lanes, -(-b // kernel.dk), c, kernel.dk, kernel.lanes,
                          dtype=dt)
        kernel.lib.ks_pack_d(w.data_ptr(), strides, a, b, c, d, out.data_ptr())
    elif path in ("flat", "phased"):
        width = kernel.nf if path == "flat" else kernel.wp
        out = torch.empty(a, -(-b * d // width), c, width, dtype=dt)
        kernel.lib.ks_pack_f(w.data_ptr(), strides, a, b, c, d, width, out.data_ptr())
    else:
        width = kernel.nr if layout == "bsf" else kernel.mr
        out = torch.empty(a, d, -(-b // width), c, width, dtype=dt)
        kernel.lib.ks_pack(w.data_ptr(), strides, a, b, c, d, width, out.data_ptr())
    return out


def _tile(batch: int, limit: int, multiple: int, tasks_per_tile: int, threads: int) -> int:
    """Batch rows (or columns) per task: at most ``limit``, a multiple of the micro-tile,
    and small enough that every thread gets about two tasks."""
    wanted = -(-2 * threads // tasks_per_tile) if threads > 1 else 1  # tiles for the team
    size = -(-batch // max(1, wanted))
    return max(multiple, min(limit, -(-size // multiple) * multiple))


def _threads(batch: int, shape: tuple[int, ...]) -> int:
    """One thread for small products: waking an OpenMP team costs more than it saves."""
    return torch.get_num_threads() if batch * math.prod(shape) >= 1 << 18 else 1


def _check(status: int) -> None:
    if status:
        raise MemoryError("pathlift.kron: the fused kernel could not allocate its packing "
                          "buffer; free memory or use algorithm='bmm'")


def _rows_per_task(kernel: CpuKernel, rows: int, shape: tuple[int, ...], along_d: bool,
                   row_bytes: int) -> tuple[int, int]:
    """(rows per task, threads): the task's block of X should stay in the L2 cache."""
    a, _, _, d = shape
    threads = _threads(rows, shape)
    tile, tasks = (kernel.dr, a * d // kernel.lanes) if along_d else (kernel.mr, a)
    l2_rows = (512 * 1024) // max(1, row_bytes)
    return _tile(rows, max(tile, min(20 * tile, l2_rows)), tile, tasks, threads), threads


def _gemm(kernel: CpuKernel, x: torch.Tensor, xs: tuple[int, ...], packed: torch.Tensor,
          y: torch.Tensor, ys: tuple[int, ...], rows: int, shape: tuple[int, ...],
          bias: int | None = None) -> None:
    """Y(n, i, k, j) = sum_l X(n, i, l, j) W(i, k, l, j) (+ bias(i, k, j), ``bias`` the
    address of a contiguous (a, b, d) vector, with Y's strides (i, k, j) those of its rows)
    for n < rows, X and Y by strides (n, i, feature, j), W packed in NR-column slivers
    (``ks_bsf``)."""
    a, b, c, d = shape
    threads = _threads(rows, shape)
    mc = _tile(rows, max(kernel.mr, _GEMM_ROWS // kernel.mr * kernel.mr), kernel.mr, a, threads)
    _check(kernel.lib.ks_bsf(x.data_ptr(), packed.data_ptr(), y.data_ptr(), rows, a, b, c, d,
                             _longs(xs), _longs(ys), bias, mc, threads))


def _along_d(kernel: CpuKernel, x: torch.Tensor, xs: tuple[int, ...], w: torch.Tensor,
             ws: tuple[int, ...], y: torch.Tensor, ys: tuple[int, ...], rows: int,
             shape: tuple[int, ...], bias: int | None = None) -> None:
    """The same product with the vectors along j (``ks_bsf_d``; d a multiple of the lanes,
    j contiguous in X and Y), W(i, s*DK + q, l, v*LANES + t) at w[i*ws[0] + v*ws[1] +
    s*ws[2] + q*ws[3] + l*ws[4] + t]; ``bias`` as in ``_gemm``."""
    a, b, c, d = shape
    mc, threads = _rows_per_task(kernel, rows, shape, True, c * kernel.vector_bytes)
    _check(kernel.lib.ks_bsf_d(x.data_ptr(), w.data_ptr(), y.data_ptr(), rows, a, b, c, d,
                               _longs(xs), _longs(ws), _longs(ys), bias, mc, threads))


def _packed_d_strides(kernel: CpuKernel, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (i, v, s, q, l) of ``ks_pack_d``'s storage for ``ks_bsf_d``."""
    _, b, c, d = shape
    lanes, dk = kernel.lanes, kernel.dk
    step = c * dk * lanes
    return d // lanes * -(-b // dk) * step, -(-b // dk) * step, step, lanes, dk * lanes


def multiply(kernel: CpuKernel, x: torch.Tensor, packed: torch.Tensor,
             shape: tuple[int, ...], layout: str,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X K^T (+ bias) from x contiguous, (B, acd) batch-size-first or (acd, B)
    batch-size-last, and packed = pack(w, kernel, layout): Y (B, abd) or (abd, B). The bias
    (a contiguous vector of the abd output features, in the kernel's dtype) is added as the
    float kernels store Y batch-size-first, with no pass over Y of its own; afterwards
    otherwise."""
    a, b, c, d = shape
    bias_at = None if bias is None else bias.data_ptr()
    if layout == "bsl":
        batch = x.shape[1]
        y = torch.empty(a * b * d, batch, dtype=x.dtype)
        cols = _tile(batch, _BSL_BATCH_TILE, kernel.nr, a * d, _threads(batch, shape))
        _check(kernel.lib.ks_bsl(x.data_ptr(), packed.data_ptr(), y.data_ptr(), batch, a, b,
                                 c, d, cols, _threads(batch, shape)))
        return y if bias is None else y.add_(bias[:, None])
    batch = x.shape[0]
    if kernel.dtype == torch.bfloat16:  # float32 accumulation, rounded to bfloat16 once
        y = _bsf_bf16(kernel, x, packed, shape)
        return y if bias is None else y + bias
    y = torch.empty(batch, a * b * d, dtype=x.dtype)
    xs, ys = (a * c * d, c * d, d, 1), (a * b * d, b * d, d, 1)
    path = bsf_path(kernel, d, c)
    if path == "along_d":
        _along_d(kernel, x, xs, packed, _packed_d_strides(kernel, shape), y, ys, batch, shape,
                 bias_at)
    elif path == "gemm":
        _gemm(kernel, x, xs, packed, y, ys, batch, shape, bias_at)
    else:
        _along_features(kernel, path, x, packed, packed.stride()[:3], True, y, shape, bias_at)
    return y


def _along_features(kernel: CpuKernel, path: str, x: torch.Tensor, w: torch.Tensor,
                    ws: tuple[int, ...], padded: bool, y: torch.Tensor,
                    shape: tuple[int, ...], bias: int | None = None) -> None:
    """Y = X K^T (+ bias, as in ``_gemm``), contiguous and batch-size-first, on the flat
    or phased path, the weights of sliver s of block i at step l at w + i*ws[0] + s*ws[1] +
    l*ws[2] (``padded``: the slivers are zero-padded, as ``pack`` makes them)."""
    a, b, c, d = shape
    batch = x.shape[0]
    mc, threads = _rows_per_task(kernel, batch, shape, False, c * d * x.element_size())
    args = (x.data_ptr(), w.data_ptr(), y.data_ptr(), batch, a, b, c, d, a * c * d, a * b * d)
    if path == "flat":
        status = kernel.lib.ks_bsf_f(*args, _longs(ws), padded, bias, mc, threads)
    else:  # X's storage ends at end: its last values are read through a copy
        end = x.data_ptr() + x.numel() * x.element_size()
        status = kernel.lib.ks_bsf_p(*args, end, _longs(ws), padded, bias, mc, threads)
    _check(status)


def multiply_once(kernel: CpuKernel, x: torch.Tensor, w: torch.Tensor,
                  shape: tuple[int, ...], layout: str,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``multiply(kernel, x, pack(w, kernel, layout), shape, layout, bias)`` for a factor
    used once (a training step's forward): on the flat and phased paths packed and
    multiplied in one call (``ks_bsf_fw``), the packing freed on return."""
    a, b, c, d = shape
    path = bsf_path(kernel, d, c) if layout == "bsf" else "gemm"
    if path not in ("flat", "phased") or kernel.dtype == torch.bfloat16:
        return multiply(kernel, x, pack(w, kernel, layout), shape, layout, bias)
    if w.dtype != kernel.dtype:
        w = w.detach().to(kernel.dtype)
    batch = x.shape[0]
    y = torch.empty(batch, a * b * d, dtype=x.dtype)
    mc, threads = _rows_per_task(kernel, batch, shape, False, c * d * x.element_size())
    end = x.data_ptr() + x.numel() * x.element_size()
    _check(kernel.lib.ks_bsf_fw(x.data_ptr(), w.data_ptr(), _longs(w.stride()), y.data_ptr(),
                                batch, a, b, c, d, path == "phased", end,
                                None if bias is None else bias.data_ptr(), mc, threads))
    return y


def multiply_transposed(kernel: CpuKernel, x: torch.Tensor, w: torch.Tensor,
                        shape: tuple[int, ...], layout: str) -> torch.Tensor:
    """X K for the factor w of pattern ``shape`` (a, b, c, d), x contiguous, (B, abd)
    batch-size-first or (abd, B) batch-size-last: the product by K^T (pattern (a, c, b, d)),
    the gradient of the input of Y = X K^T. On the flat and phased paths K's rows are the
    weights of that product as they are (w[i, k, l*d + j] at sliver (l*d + j) // width),
    read in place; elsewhere w.transpose(1, 2) is packed."""
    a, b, c, d = shape
    transposed = (a, c, b, d)
    path = bsf_path(kernel, d, b) if layout == "bsf" else "gemm"
    width = kernel.nf if path == "flat" else kernel.wp
    # rows 4 KiB apart share an L1 set: slivers of one cache line then read one line per
    # step from the same set (AVX2, (1, 256, 1024, 1): 1.4x slower than packing K^T)
    aliased = (c * d * w.element_size()) % 4096 == 0 and width * w.element_size() <= 64
    if path in ("flat", "phased") and w.is_contiguous() and w.dtype == kernel.dtype and \
            not aliased:
        y = torch.empty(x.shape[0], a * c * d, dtype=x.dtype)
        _along_features(kernel, path, x, w, (b * c * d, width, c * d), False, y, transposed)
        return y
    return multiply(kernel, x, pack(w.transpose(1, 2), kernel, layout), transposed, layout)


def _bsf_bf16(kernel: CpuKernel, x: torch.Tensor, packed: torch.Tensor,
              shape: tuple[int, ...]) -> torch.Tensor:
    a, b, c, d = shape
    batch = x.shape[0]
    threads = _threads(batch, shape)
    # one block of the inner dimension: the kernel rounds as it stores
    single = c <= _BF16_INNER_BLOCK
    y = torch.empty(batch, a * b * d, dtype=torch.bfloat16 if single else torch.float32)
    rows = _tile(batch, max(kernel.mr, min(20 * kernel.mr, (512 * 1024) // max(
        1, c * d * 2))), kernel.mr, a, threads)
    _check(kernel.lib.ks_bsf_bf16(x.data_ptr(), packed.data_ptr(), y.data_ptr(), batch, a, b,
                                  c, d, rows, threads))
    return y if single else y.to(torch.bfloat16)


def _use(rows: int, cols: int, tile: tuple[int, int]) -> float:
    """The fraction of the micro-tiles' work that is not zero padding."""
    return rows / (-(-rows // tile[0]) * tile[0]) * cols / (-(-cols // tile[1]) * tile[1])


def grad_factor(kernel: CpuKernel, x: torch.Tensor, gy: torch.Tensor,
                shape: tuple[int, ...], layout: str) -> torch.Tensor:
    """dw[i, k, l, j] = sum_n gy[n, (i, k, j)] x[n, (i, l, j)], the gradient of the factor
    of Y = X K^T, from x and gy contiguous in ``layout``: per pair (i, j) a GEMM with the
    batch as inner dimension (``ks_grad``, both operands packed block by block in the
    cache); batch-size-first with d a multiple of the vector lanes, ``ks_bsf_d`` with x's
    rows l and gy read in place as its weights; with d dividing them (``bsf_path`` flat),
    ``ks_grad_f``: vectors along dw's (l, j), gy broadcast, nothing packed; phased,
    ``ks_grad_p``: the same with gy's values shuffled into the phases. Columns l (rows k),
    unless rows l and columns k pad the micro-tile far less."""
    a, b, c, d = shape
    dw = torch.empty(a, b, c, d, dtype=x.dtype)
    batch = x.shape[0] if layout == "bsf" else x.shape[1]
    if batch == 0:
        return dw.zero_()

    def strides(size: int) -> tuple[int, int, int, int]:
        """(n, i, feature, j) strides of an operand with ``size`` features per (i, j)."""
        if layout == "bsf":
            return a * size * d, size * d, d, 1
        return 1, size * d * batch, d * batch, batch

    path = bsf_path(kernel, d, c) if layout == "bsf" else "gemm"
    # one-line flat slivers (AVX2) read a new line of x per step of the batch: from 2^16
    # weights per block the packed GEMM is faster (AVX2, (1, 768, 192, 1) 1104 -> 856 us,
    # (1, 256, 1024, 1) 1902 -> 1527 us; (1, 192, 192, 1) 193 vs 229 us)
    if path == "flat" and kernel.nf * x.element_size() <= 64 and b * c >= 1 << 16:
        path = "gemm"
    if path == "flat":
        _check(kernel.lib.ks_grad_f(x.data_ptr(), gy.data_ptr(), dw.data_ptr(), batch, a, b, c,
                                    d, a * c * d, a * b * d, _threads(batch, shape)))
        return dw
    # phased from d = 6 (at d = 3, c < 128, ks_grad's gathers share cache lines: it ran
    # (1, 512, 32, 3) 1.6x faster; d = 6-24 ran 1.1-2.6x faster phased); rows k in tiles of
    # 48 for the team's tasks
    if path == "phased" and d >= 6:
        threads = _threads(batch, shape)
        end = gy.data_ptr() + gy.numel() * gy.element_size()
        _check(kernel.lib.ks_grad_p(x.data_ptr(), gy.data_ptr(), dw.data_ptr(), batch, a, b, c,
                                    d, a * c * d, a * b * d, end,
                                    _tile(b, 48, 8, a, threads), threads))
        return dw
    along_d = path == "along_d"
    tile = (kernel.dr, kernel.dk) if along_d else (kernel.mr, kernel.nr)
    # (rows operand, its features, columns operand, its features, dw's strides (i, col, row, j))
    by_l = (x, c, gy, b, (b * c * d, c * d, d, 1))
    by_k = (gy, b, x, c, (b * c * d, d, c * d, 1))
    # columns l unless rows l pad far less: their stores run along dw's inner index
    # (contiguous for d = 1), those of columns k are c*d apart (the same L1 set when 4 kB)
    rows_t, m, cols_t, n, ws = by_l if _use(c, b, tile) > 1.25 * _use(b, c, tile) else by_k
    rs, cs = strides(m), strides(n)
    if along_d:  # X rows (row, i, n, j); the columns operand read in place as the weights
        lanes, dk = kernel.lanes, kernel.dk
        _along_d(kernel, rows_t, (rs[2], rs[1], rs[0], 1), cols_t,
                 (cs[1], lanes, dk * cs[2], cs[2], cs[0]), dw, (ws[2], ws[0], ws[1], 1), m,
                 (a, n, batch, d))
        return dw
    nb = _tile(n, 256, kernel.nr, a * d, _threads(batch, shape))
    _check(kernel.lib.ks_grad(rows_t.data_ptr(), cols_t.data_ptr(), dw.data_ptr(), batch, a, n,
                              m, d, _longs(rs), _longs(cs), _longs(ws), nb,
                              _threads(batch, shape)))
    return dw
