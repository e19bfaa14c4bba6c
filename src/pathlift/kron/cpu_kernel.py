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
X[rows, col] of batch-size-first is packed into MR-row slivers per block of 256 columns,
a copy that stays in the L2 cache.

The vector width and the tile come from the instruction set the compiler targets
(``-march=native`` unless ``PATHLIFT_KRON_CFLAGS`` adds flags such as ``-mno-avx512f``):

    AVX-512   64-byte vectors, 32 registers: MR = 12, NR = 2 vectors (24 accumulators)
    AVX2/AVX  32-byte vectors, 16 registers: MR = 6,  NR = 2 vectors (12 accumulators)
    NEON      16-byte vectors, 32 registers: MR = 12, NR = 2 vectors (24 accumulators)
    SSE2 and anything else: 16-byte vectors, MR = 6, NR = 2 vectors

so the accumulators, the loaded vectors and a broadcast fit in the register file (the
earlier kernel hard-coded 64-byte vectors and a 6 × 2 tile: 24 registers' worth of
accumulators, which spill on AVX2's 16 and made it 20-50x slower than bmm there).

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
import shlex
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pathlift import files
from pathlift.errors import PathliftError
from pathlift.kron.machine import (
    cpu_features,
    trusted_cache_dir,
    unsafe_to_load,
    warn_unusable_cache,
)

__all__ = ["CpuKernel", "build_flags", "fused_bsf", "fused_bsl", "load_kernel", "pack"]

# the C source, shipped as package data beside this module (pyproject package-data)
SOURCE = (Path(__file__).with_name("ks_fused.c")).read_text()

_BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
# per dtype: the name of its build and its defines; bfloat16 is float32 arithmetic on
# bf16 operands (ks_bsf_bf16), built where the instruction set has bf16 dot products
_TYPES = {torch.float32: ("float", ("-Dreal=float",)),
          torch.float64: ("double", ("-Dreal=double",)),
          torch.bfloat16: ("bf16", ("-Dreal=float", "-DKS_BF16"))}
_BSL_BATCH_TILE = 256  # batch columns per task (bsl): X block 256 x 256 in L2
_BF16_INNER_BLOCK = 256  # KC of ks_fused.c: ks_bsf_bf16 writes bf16 when c fits one block


def build_flags() -> tuple[str, ...]:
    """Compiler flags: ``-O3 -march=native -fopenmp ...`` then ``$PATHLIFT_KRON_CFLAGS``
    (e.g. ``-mno-avx512f`` to build the AVX2 kernel on an AVX-512 machine)."""
    return _BASE_FLAGS + tuple(shlex.split(os.environ.get("PATHLIFT_KRON_CFLAGS", "")))


def _compiler() -> str | None:
    return os.environ.get("CC") or _compiler_on_path(os.environ.get("PATH", os.defpath))


@functools.cache
def _compiler_on_path(path: str) -> str | None:
    # searched once per PATH: KSLinear asks for the machine fingerprint on every forward
    return shutil.which("gcc", path=path) or shutil.which("cc", path=path)


@dataclass(frozen=True)
class CpuKernel:
    """A compiled kernel: its library, the instruction set it was built for and its tiles
    (MR x NR scalars for the GEMM, DR x DK vectors along d for ``ks_bsf_d``)."""

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


def _key(ctype: str, compiler: str, flags: tuple[str, ...]) -> str:
    return hashlib.sha256("\0".join(
        (SOURCE, ctype, compiler, *flags, platform.machine(), platform.processor(),
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


def _build(defines: tuple[str, ...], compiler: str, flags: tuple[str, ...]) -> bytes:
    """The shared object's bytes, compiled in a private temporary folder."""
    with tempfile.TemporaryDirectory(prefix="pathlift-kron-") as tmp:
        src, out = Path(tmp) / "ks_fused.c", Path(tmp) / "ks_fused.so"
        src.write_text(SOURCE)
        try:
            proc = subprocess.run([compiler, *flags, *defines, str(src), "-o", str(out)],
                                  capture_output=True, text=True, check=False)
        except OSError as err:
            raise RuntimeError(f"cannot run the C compiler {compiler!r}: {err}") from err
        if proc.returncode:
            raise RuntimeError(f"{compiler} failed:\n{proc.stderr[-2000:]}")
        return out.read_bytes()


def _compile(dtype: torch.dtype, compiler: str, flags: tuple[str, ...],
             rebuild: bool = False) -> tuple[Path, bool]:
    """The verified shared object of this build in the trusted cache (``trusted_cache_dir``),
    built (and recorded with its size and digest) if missing, damaged or ``rebuild``, and
    False; where the cache cannot be trusted or written, a private copy in a temporary
    folder (one warning) and True: the caller loads it and removes the folder, and the next
    process builds it again."""
    ctype, defines = _TYPES[dtype]
    key = _key(ctype, compiler, (*flags, *defines))
    folder = trusted_cache_dir()
    record = None if folder is None else folder / f"ks_fused_{ctype}_{key}.json"
    if record is not None and not rebuild and (library := _verified(record)) is not None:
        return library, False
    data = _build(defines, compiler, flags)
    digest = _digest(data)
    # named by its digest: concurrent builders never replace a library another one loads
    name = f"ks_fused_{ctype}_{key}_{digest[:12]}.so"
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
          rebuild: bool) -> ctypes.CDLL:
    library, private = _compile(dtype, compiler, flags, rebuild)
    try:
        return ctypes.CDLL(str(library))
    finally:
        if private:  # mapped now: the file is no longer needed
            shutil.rmtree(library.parent, ignore_errors=True)


@functools.cache
def _load(dtype: torch.dtype, compiler: str | None, flags: tuple[str, ...]) -> CpuKernel | None:
    """The kernel, from the cache or built; a library that does not load or lacks a symbol
    is built again once, and if that fails too the caller falls back to einsum (one
    warning): never an exception."""
    try:
        if compiler is None:
            raise RuntimeError("no C compiler found (set CC or install gcc)")
        try:
            return _bind(_open(dtype, compiler, flags, rebuild=False), dtype, compiler, flags)
        except (OSError, AttributeError):  # a cached library that does not load: build anew
            return _bind(_open(dtype, compiler, flags, rebuild=True), dtype, compiler, flags)
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
    long, ptr = ctypes.c_long, ctypes.c_void_p
    entries = (lib.ks_bsf_bf16,) if dtype == torch.bfloat16 else (lib.ks_bsf, lib.ks_bsf_d,
                                                                    lib.ks_bsl)
    for fn in entries:
        fn.argtypes = [ptr, ptr, ptr, *[long] * 6, ctypes.c_int]
        fn.restype = ctypes.c_int
    lib.ks_isa.restype = ctypes.c_char_p
    tile = (ctypes.c_long * 5)()
    lib.ks_tile(tile)
    return CpuKernel(lib, dtype, lib.ks_isa().decode(), *tile, compiler, flags)


def load_kernel(dtype: torch.dtype) -> CpuKernel | None:
    """The kernel for float32 or float64 built with the current ``build_flags()``, or None
    (with a warning) if it cannot be built. For bfloat16 the batch-size-first kernel with
    bf16 dot products and float32 accumulation, or None (no warning) where the instruction
    set has none (AVX512-BF16); other dtypes give None without a warning."""
    if dtype not in _TYPES:
        return None
    return _load(dtype, _compiler(), build_flags())


def _slivers(w: torch.Tensor, width: int) -> torch.Tensor:
    """(a, d, ceil(b/width), c, width) with [i, j, s, l, t] = w[i, s*width + t, l, j]."""
    a, b, c, d = w.shape
    padded = F.pad(w.permute(0, 3, 2, 1), (0, -(-b // width) * width - b))  # (a, d, c, bpad)
    return padded.reshape(a, d, c, -1, width).permute(0, 1, 3, 2, 4).contiguous()


def pack(w: torch.Tensor, kernel: CpuKernel) -> dict[str, torch.Tensor]:
    """The factor w (a, b, c, d) in the kernel's storage for each layout: output features in
    slivers of NR (batch-size-first) or MR (batch-size-last), zero-padded; and when d is a
    multiple of the vector lanes, (a, d/LANES, ceil(b/DK), c, DK, LANES) for ``ks_bsf_d``.
    For the bfloat16 kernel (batch-size-first only) the slivers of NR hold pairs of the
    inner dimension: (a, d, ceil(b/NR), ceil(c/2), NR, 2)."""
    if kernel.dtype == torch.bfloat16:
        a, b, c, d = w.shape
        nr = kernel.nr
        padded = F.pad(w.to(torch.bfloat16).permute(0, 3, 1, 2),
                       (0, c % 2, 0, -(-b // nr) * nr - b))  # (a, d, bpad, cpad)
        pairs = padded.reshape(a, d, -1, nr, (c + 1) // 2, 2).permute(0, 1, 2, 4, 3, 5)
        return {"bsf_bf16": pairs.contiguous()}
    out = {"bsf": _slivers(w, kernel.nr), "bsl": _slivers(w, kernel.mr)}
    a, b, c, d = w.shape
    lanes, dk = kernel.lanes, kernel.dk
    if d % lanes == 0:
        wv = F.pad(w.permute(0, 3, 2, 1), (0, -(-b // dk) * dk - b))  # (a, d, c, bpad)
        wv = wv.reshape(a, d // lanes, lanes, c, -1, dk).permute(0, 1, 4, 3, 5, 2)
        out["bsf_d"] = wv.contiguous()
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


def fused_bsf(kernel: CpuKernel, x: torch.Tensor, packed: dict[str, torch.Tensor],
              shape: tuple[int, ...]) -> torch.Tensor:
    """Y (B, abd) from x (B, acd) contiguous and packed = pack(w): along d when d is a
    multiple of the vector lanes (``ks_bsf_d``), else the GEMM on packed rows."""
    a, b, c, d = shape
    batch = x.shape[0]
    threads = _threads(batch, shape)
    if "bsf_bf16" in packed:  # float32 accumulation, rounded to bfloat16 once
        # one block of the inner dimension: the kernel rounds as it stores
        single = c <= _BF16_INNER_BLOCK
        y = torch.empty(batch, a * b * d, dtype=torch.bfloat16 if single else torch.float32)
        rows = _tile(batch, max(kernel.mr, min(20 * kernel.mr, (512 * 1024) // max(
            1, c * d * 2))), kernel.mr, a, threads)
        _check(kernel.lib.ks_bsf_bf16(x.data_ptr(), packed["bsf_bf16"].data_ptr(),
                                      y.data_ptr(), batch, a, b, c, d, rows, threads))
        return y if single else y.to(torch.bfloat16)
    y = torch.empty(batch, a * b * d, dtype=x.dtype)
    if "bsf_d" in packed:
        tile, tasks, fn, w = kernel.dr, a * d // kernel.lanes, kernel.lib.ks_bsf_d, "bsf_d"
        row_bytes = c * kernel.vector_bytes  # X[row, i, :, one vector of j]
    else:
        tile, tasks, fn, w = kernel.mr, a, kernel.lib.ks_bsf, "bsf"
        row_bytes = c * d * x.element_size()  # X[row, i, :, :]
    # rows of one task: the task's block of X should stay in the L2 cache
    l2_rows = (512 * 1024) // max(1, row_bytes)
    rows = _tile(batch, max(tile, min(20 * tile, l2_rows)), tile, tasks, threads)
    _check(fn(x.data_ptr(), packed[w].data_ptr(), y.data_ptr(), batch, a, b, c, d, rows,
              threads))
    return y


def fused_bsl(kernel: CpuKernel, x: torch.Tensor, packed: dict[str, torch.Tensor],
              shape: tuple[int, ...]) -> torch.Tensor:
    """Y (abd, B) from x (acd, B) contiguous and packed = pack(w)."""
    a, b, c, d = shape
    batch = x.shape[1]
    y = torch.empty(a * b * d, batch, dtype=x.dtype)
    threads = _threads(batch, shape)
    cols = _tile(batch, _BSL_BATCH_TILE, kernel.nr, a * d, threads)
    _check(kernel.lib.ks_bsl(x.data_ptr(), packed["bsl"].data_ptr(), y.data_ptr(), batch, a, b,
                             c, d, cols, threads))
    return y
