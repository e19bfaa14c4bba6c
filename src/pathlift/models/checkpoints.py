"""Checkpoints: safetensors (architecture in JSON metadata) and weights-only torch files.

Nothing here unpickles arbitrary objects or calls what a file names: ``.pt``/``.pth``
files are read with ``torch.load(weights_only=True)``, which refuses any pickle that would
run code, and the architecture a file names is only returned (``pathlift.models.loading``
decides whether it may be built). A file is read only when it is a regular file that fits
the memory limit, a ``.pt``'s zip entries included (``pathlift.files``); weights load into
the widest floating dtype they hold, never rounded.
"""

from __future__ import annotations

import functools
import inspect
import json
import operator
import os
import pickle
import re
import typing
import warnings
import zipfile
from collections import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn
from torch.nn.utils import prune

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.files import (
    atomic_write,
    check_archive,
    open_regular,
    parse_safetensors,
    write_bytes,
)
from pathlift.graph.boundary import cpu_state, unwrap
from pathlift.models.registry import REFERENCE_MODELS, check_model_size, get_model
from pathlift.rebuilders import rebuild

__all__ = ["CHECKPOINT_SUFFIXES", "Checkpoint", "UnsafeCheckpointError", "load_weights",
           "read_checkpoint", "save_checkpoint"]

_ARCH, _KWARGS, _SHAPE = "pathlift.arch", "pathlift.kwargs", "pathlift.input_shape"
_SAFETENSORS, _TORCH = (".safetensors",), (".pt", ".pth")
CHECKPOINT_SUFFIXES = _SAFETENSORS + _TORCH


class UnsafeCheckpointError(InvalidParameterError):
    """A torch checkpoint holds pickled objects other than tensors and plain containers."""


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint file holds; ``arch`` and ``input_shape`` are None for a plain
    state_dict (and ``input_shape`` for checkpoints written before it was stored)."""

    state_dict: dict[str, Tensor]
    arch: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None


def save_checkpoint(model: nn.Module, path: str | Path, arch: str | None = None, *,
                    input_shape: Sequence[int] | None = None, **kwargs: Any) -> Path:
    """Write ``model``'s state_dict with its architecture name and constructor ``kwargs``.

    ``arch`` is any name ``get_model`` takes: a reference architecture, or your own class or
    factory by import path (``mymodels:Net``, ``path/to/nets.py:make``); by default the
    import path of ``model``'s class. The weights are loaded into ``get_model(arch,
    **kwargs)`` before anything is written, so a file that would not load is never written
    (ArchitectureMismatchError).

    ``.safetensors`` stores them as JSON metadata; ``.pt``/``.pth`` as a weights-only
    dict {arch, kwargs, input_shape, state_dict}. ``input_shape`` (no batch dimension) is
    the shape the model is analysed at; ``load_model(path)`` returns it, and falls back to
    the architecture's default when it was not given. The file is written whole or not at
    all (``pathlift.files.atomic_write``: a kill or a full disk leaves the previous file);
    its mode follows the umask, as for ``torch.save``. OS errors raise ``FileSystemError``.

    Example:
        >>> save_checkpoint(small_cnn(), "net.safetensors", "small_cnn", input_shape=(1, 8, 8))
    """
    path = Path(path)
    arch = _class_path(model) if arch is None else arch
    state = cpu_state(unwrap(model).state_dict())
    check_model_size(arch, kwargs)
    with torch.random.fork_rng(devices=[]):  # the check's initialisation leaves no trace
        load_weights(unwrap(get_model(arch, **kwargs)), state)  # a compiled factory too
    shape = None if input_shape is None else _shape(input_shape)
    try:
        meta = {_ARCH: arch, _KWARGS: json.dumps(kwargs)}
    except TypeError as err:
        raise InvalidParameterError(f"constructor kwargs {kwargs} must be JSON values") from err
    if shape is not None:
        meta[_SHAPE] = json.dumps(shape)
    if path.suffix in _SAFETENSORS:
        return write_bytes(path, safetensors_bytes(state, metadata=meta))
    if path.suffix in _TORCH:
        obj = {"arch": arch, "kwargs": kwargs, "input_shape": shape, "state_dict": state}
        return atomic_write(path, lambda fh: torch.save(obj, fh))
    raise InvalidParameterError(f"checkpoint '{path}' must end in .safetensors, .pt or .pth")


def _class_path(model: nn.Module) -> str:
    """``module:QualName`` of the model's class, refused when it cannot be imported again."""
    cls = type(unwrap(model))
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise InvalidParameterError(
            f"{cls.__qualname__} is defined in a script or a function, so a checkpoint cannot "
            "name it: move it into a module and pass arch='module:callable' (or "
            "'path/to/file.py:callable')")
    return f"{cls.__module__}:{cls.__qualname__}"


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint without executing anything it contains.

    Raises:
        FileSystemError: not a regular file (a FIFO, a device, a folder), or unreadable.
        MemoryLimitError: the file, or what a .pt's zip entries unpack to, does not fit
            the memory limit (checked before reading or unpacking).
        InvalidParameterError: not a checkpoint (named suffix, format, schema).
    """
    path = Path(path)
    if path.suffix not in CHECKPOINT_SUFFIXES:
        raise InvalidParameterError(
            f"checkpoint '{path}' must end in .safetensors, .pt or .pth")
    if not os.path.lexists(path):
        raise InvalidParameterError(f"no checkpoint file at '{path}'")
    safetensors = path.suffix in _SAFETENSORS
    # safetensors: the bytes and the tensors parsed from them; torch reads what it needs
    with open_regular(path, memory_per_byte=2 if safetensors else 1) as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise InvalidParameterError(f"checkpoint '{path}' is empty (0 bytes): was its "
                                        "writing interrupted? Save it again")
        if safetensors:
            return _read_safetensors(fh.read(), path)
        check_archive(fh, path)
        return _read_torch(fh, path)


def _read_safetensors(data: bytes, path: Path) -> Checkpoint:
    try:
        state, meta = parse_safetensors(data)
        kwargs = json.loads(meta.get(_KWARGS, "{}"))
        shape = json.loads(meta[_SHAPE]) if _SHAPE in meta else None
    except Exception as err:  # safetensors raises its own SafetensorError on bad files
        raise InvalidParameterError(f"'{path}' is not a readable safetensors file: {err}") \
            from err
    return _checked(state, meta.get(_ARCH), kwargs, shape, path)


#: what a checkpoint holding any other object must become to be read
_RESAVE = ("save the model's weights instead: torch.save(model.state_dict(), FILE) or "
           "pathlift's save_checkpoint")


def _read_torch(fh: BinaryIO, path: Path) -> Checkpoint:
    """The checkpoint in a torch file, read weights-only; a refusal says what the file
    holds and how to re-save it, never torch's advice to load it unsafely."""
    if _is_torchscript(fh):
        raise UnsafeCheckpointError(
            f"refused to load '{path}': it is a TorchScript archive (compiled model code, "
            f"run when loaded), not weights; {_RESAVE}")
    try:
        with warnings.catch_warnings():  # torch's remarks on the file's pickle protocol
            warnings.simplefilter("ignore")
            obj = torch.load(fh, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(err))
        if found is None:
            raise UnsafeCheckpointError(f"refused to load '{path}': weights-only loading "
                                        f"cannot read it; {_RESAVE}") from err
        raise UnsafeCheckpointError(
            f"refused to load '{path}': it holds a pickled {found[1]}, which only an unsafe "
            f"load rebuilds (unpickling can run code); {_RESAVE}") from err
    except Exception as err:
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InvalidParameterError(  # torch's words, unless they advise an unsafe load
            f"'{path}' is not a readable torch checkpoint"
            + ("" if "weights_only" in said else f" ({said[:200]})") + f"; {_RESAVE}") \
            from err
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        return _checked(obj["state_dict"], obj.get("arch"), obj.get("kwargs") or {},
                        obj.get("input_shape"), path)
    if isinstance(obj, Mapping):
        return _checked(obj, None, {}, None, path)
    raise InvalidParameterError(
        f"'{path}' holds a {type(obj).__name__}; expected a state_dict or a dict with keys "
        "arch, kwargs, state_dict")


def _is_torchscript(fh: BinaryIO) -> bool:
    """Whether ``fh`` is a zip archive written by ``torch.jit.save`` (its ``constants.pkl``
    and ``code/`` entries); ``fh`` is left at its start."""
    try:
        if not zipfile.is_zipfile(fh):
            return False
        fh.seek(0)
        with zipfile.ZipFile(fh) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, EOFError):
        return False
    finally:
        fh.seek(0)
    return any(name.endswith("/constants.pkl") for name in names)


def _shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints; floats are refused, never truncated."""
    try:
        shape = tuple(operator.index(s) for s in input_shape)
    except TypeError as err:
        raise InvalidParameterError(
            f"input_shape {input_shape!r} must be a sequence of positive ints (no batch "
            "dimension), such as (3, 224, 224)") from err
    if not shape or min(shape) < 1:
        raise InvalidParameterError(
            f"input_shape {input_shape!r} must be a non-empty sequence of positive ints")
    return shape


def _stored_shape(shape: Any, path: Path) -> tuple[int, ...] | None:
    """The input shape read from a checkpoint, checked like the one it was saved from."""
    if shape is None:
        return None
    try:
        return _shape(shape)
    except InvalidParameterError as err:
        raise InvalidParameterError(f"'{path}' stores an invalid input shape: {err}") from err


def _checked(state: Mapping, arch: Any, kwargs: Any, shape: Any, path: Path) -> Checkpoint:
    """The checkpoint read from ``path``, after checking it against the schema: tensors,
    an architecture name, keyword arguments its constructor takes (lists only where it
    takes a sequence, of at most one entry per tensor held: a list of 200,000 widths once
    built a 200,000-layer skeleton for minutes before its weights were compared) and an
    input shape."""
    bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if bad:
        raise InvalidParameterError(f"'{path}': state_dict entries {bad[:3]} are not tensors")
    if arch is not None and not isinstance(arch, str):
        raise InvalidParameterError(f"'{path}' names its architecture with a "
                                    f"{type(arch).__name__}, not a string; save it again")
    if not isinstance(kwargs, Mapping):
        raise InvalidParameterError(f"'{path}' stores constructor arguments as a "
                                    f"{type(kwargs).__name__}, not a dict; save it again")
    kwargs = dict(kwargs)
    for name, value in kwargs.items():
        problem = _kwarg_problem(arch, name, value)
        if isinstance(value, list) and len(value) > len(state):  # before building anything
            problem = (f"{len(value):,} entries, each a layer with weights, but the file holds "
                       f"{len(state):,} tensors")
            value = f"[{len(value):,} entries]"
        if problem:
            raise InvalidParameterError(f"'{path}' stores constructor argument {name}="
                                        f"{value!r} for '{arch}': {problem}; save it again")
    return Checkpoint(dict(state), arch, kwargs, _stored_shape(shape, path))


def _kwarg_problem(arch: str | None, name: str, value: Any) -> str | None:
    """Why ``value`` cannot be argument ``name`` of ``arch``'s constructor, else None.
    Reference architectures are checked against their signature's annotations; any other
    name (torchvision) takes JSON scalars only."""
    spec = REFERENCE_MODELS.get(arch) if arch is not None else None
    if spec is None:
        ok = value is None or isinstance(value, bool | int | float | str)
        return None if ok else "only numbers, strings and booleans are allowed"
    params = inspect.signature(spec.constructor).parameters
    if name not in params:
        return f"it takes only {', '.join(params)}"
    hint = typing.get_type_hints(spec.constructor).get(name)
    return None if hint is None or _fits(value, hint) else \
        f"expected {getattr(hint, '__name__', hint)}"


def _fits(value: Any, hint: Any) -> bool:
    """``value`` (a JSON value) matches the annotation ``hint``: int (not bool), float (or
    int), bool, str, or a sequence of such."""
    if typing.get_origin(hint) in (Sequence, list, tuple, abc.Sequence):
        items = typing.get_args(hint)[:1] or (Any,)
        return isinstance(value, list | tuple) and all(_fits(v, items[0]) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel / FSDP, torch.compile


def _unwrapped_keys(model: nn.Module, state_dict: Mapping[str, Tensor]
                    ) -> Mapping[str, Tensor]:
    """``state_dict`` without the key prefixes a wrapper adds (``ddp.state_dict()``,
    ``torch.compile(model).state_dict()``), when every key has them and the model's
    keys do not."""
    expected = model.state_dict().keys()
    while state_dict and not expected & state_dict.keys():
        prefix = next((p for p in _WRAPPER_PREFIXES if all(k.startswith(p) for k in state_dict)),
                      None)
        if prefix is None:
            break
        state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def load_weights(model: nn.Module, state_dict: Mapping[str, Tensor]) -> nn.Module:
    """Load ``state_dict`` into ``model`` strictly, after checking every key and shape.

    Pruned checkpoints (``<name>_orig`` and ``<name>_mask``) re-attach their
    torch.nn.utils.prune masks. Layers whose structure is saved in their state are
    rebuilt in ``model`` first by the rebuilder their package registers
    (``pathlift.rebuilders``): Kronecker-sparse layers saved with their chain
    (``<name>.chain``, ``pathlift.kron.rebuild_layers``), so a dense architecture loads
    its designed version. The model is converted to the widest floating dtype the
    checkpoint holds (the smallest that holds every one of its floating dtypes exactly,
    ``torch.promote_types``: float64 when any tensor is float64), so no weight is ever
    rounded; integer, boolean or complex tensors where the model holds floating-point
    ones are refused, not cast. The key prefixes of a wrapped model's
    state_dict (DDP's ``module.``, torch.compile's ``_orig_mod.``) are dropped. Raises
    ArchitectureMismatchError naming the first missing, unexpected and mis-shaped keys.
    """
    state_dict = _unwrapped_keys(model, state_dict)
    model = rebuild(model, state_dict)
    expected_dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    cast = [f"{k} ({v.dtype})" for k, v in state_dict.items()
            if k in expected_dtypes and expected_dtypes[k].is_floating_point
            and not v.is_floating_point()]
    if cast:
        raise InvalidParameterError(
            f"{', '.join(cast[:3])}: integer, boolean or complex weights where "
            f"{type(model).__name__} holds floating-point ones; pathlift does not cast them "
            "silently: convert them yourself (state_dict values .float()) and save again")
    float_dtypes = {v.dtype for v in state_dict.values() if v.is_floating_point()}
    if float_dtypes:
        model.to(functools.reduce(torch.promote_types, float_dtypes))
    _reattach_pruning(model, state_dict)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    shapes = [f"{k} {tuple(state_dict[k].shape)} != model {tuple(v.shape)}"
              for k, v in expected.items()
              if k in state_dict and state_dict[k].shape != v.shape]
    if missing or unexpected or shapes:
        parts = [f"{label} ({len(keys)}): {', '.join(keys[:3])}"
                 for label, keys in (("missing", missing), ("unexpected", unexpected),
                                     ("shape mismatch", shapes)) if keys]
        raise ArchitectureMismatchError(
            f"checkpoint does not fit {type(model).__name__}: " + "; ".join(parts)
            + ". Check the architecture name and its constructor arguments.")
    model.load_state_dict(state_dict, strict=True)
    return model


def _reattach_pruning(model: nn.Module, state_dict: Mapping[str, Tensor]) -> None:
    """Re-create each torch.nn.utils.prune reparametrisation ``name = name_orig * name_mask``."""
    for key, mask in state_dict.items():
        orig = state_dict.get(key[:-5] + "_orig") if key.endswith("_mask") else None
        if orig is None:
            continue
        owner, _, name = key[:-5].rpartition(".")
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue  # reported as unexpected keys by the caller
        param = getattr(module, name, None)
        if isinstance(param, nn.Parameter) and param.shape == orig.shape == mask.shape:
            with torch.no_grad():
                param.copy_(orig)
            prune.custom_from_mask(module, name, mask.to(param.device))
