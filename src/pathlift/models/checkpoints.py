"""Checkpoints: safetensors (architecture in JSON metadata) and weights-only torch files.

Nothing here unpickles arbitrary objects: ``.pt``/``.pth`` files are read with
``torch.load(weights_only=True)``, which refuses any pickle that would run code.
"""

from __future__ import annotations

import inspect
import json
import operator
import pickle
import typing
from collections import abc
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn
from torch.nn.utils import prune

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.files import atomic_write, os_errors, write_bytes
from pathlift.graph.boundary import cpu_state, unwrap
from pathlift.graph.memory import check_bytes
from pathlift.models.registry import REFERENCE_MODELS, default_input_shape, get_model

__all__ = ["Checkpoint", "UnsafeCheckpointError", "load_model", "load_weights",
           "read_checkpoint", "save_checkpoint"]

_ARCH, _KWARGS, _SHAPE = "pathlift.arch", "pathlift.kwargs", "pathlift.input_shape"
_SAFETENSORS, _TORCH = (".safetensors",), (".pt", ".pth")


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
    _check_size(arch, kwargs)
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
    """Read a checkpoint without executing anything it contains."""
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"no checkpoint file at '{path}'")
    if path.suffix not in _SAFETENSORS + _TORCH:
        raise InvalidParameterError(
            f"checkpoint '{path}' must end in .safetensors, .pt or .pth")
    with os_errors(path, "read"):
        empty = path.stat().st_size == 0
        with path.open("rb"):  # unreadable files fail here, with the path
            pass
    if empty:
        raise InvalidParameterError(f"checkpoint '{path}' is empty (0 bytes): was its writing "
                                    "interrupted? Save it again")
    return _read_safetensors(path) if path.suffix in _SAFETENSORS else _read_torch(path)


def _read_safetensors(path: Path) -> Checkpoint:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        kwargs = json.loads(meta.get(_KWARGS, "{}"))
        shape = json.loads(meta[_SHAPE]) if _SHAPE in meta else None
    except Exception as err:  # safetensors raises its own SafetensorError on bad files
        raise InvalidParameterError(f"'{path}' is not a readable safetensors file: {err}") \
            from err
    return _checked(state, meta.get(_ARCH), kwargs, shape, path)


def _read_torch(path: Path) -> Checkpoint:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"refused to load '{path}': it contains pickled objects that are not weights "
            f"(torch.load(weights_only=True) says: {str(err).splitlines()[0]}). Re-save it "
            "as a plain state_dict or with pathlift's save_checkpoint.") from err
    except Exception as err:
        raise InvalidParameterError(f"'{path}' is not a readable torch checkpoint: {err}") \
            from err
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        return _checked(obj["state_dict"], obj.get("arch"), obj.get("kwargs") or {},
                        obj.get("input_shape"), path)
    if isinstance(obj, Mapping):
        return _checked(obj, None, {}, None, path)
    raise InvalidParameterError(
        f"'{path}' holds a {type(obj).__name__}; expected a state_dict or a dict with keys "
        "arch, kwargs, state_dict")


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
    takes a sequence) and an input shape."""
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
    torch.nn.utils.prune masks. Kronecker-sparse layers saved with their chain
    (``<name>.chain``) are rebuilt in ``model`` first (``pathlift.kron.rebuild_layers``),
    so a dense architecture loads its designed version. A floating dtype differing from
    the model's converts the model to it (never rounding the checkpoint). The key prefixes
    of a wrapped model's state_dict (DDP's ``module.``, torch.compile's ``_orig_mod.``)
    are dropped. Raises
    ArchitectureMismatchError naming the first missing, unexpected and mis-shaped keys.
    """
    state_dict = _unwrapped_keys(model, state_dict)
    if any(k == "chain" or k.endswith(".chain") for k in state_dict):
        from pathlift.kron import rebuild_layers  # imported only for Kronecker-sparse models

        model = rebuild_layers(model, state_dict)
    expected_dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    cast = [f"{k} ({v.dtype})" for k, v in state_dict.items()
            if k in expected_dtypes and expected_dtypes[k].is_floating_point
            and not v.is_floating_point()]
    if cast:
        raise InvalidParameterError(
            f"{', '.join(cast[:3])}: integer or boolean weights where {type(model).__name__} "
            "holds floating-point ones; pathlift does not cast them silently: convert them "
            "yourself (state_dict values .float()) and save again")
    float_dtypes = {v.dtype for v in state_dict.values() if v.is_floating_point()}
    if len(float_dtypes) == 1:
        model.to(float_dtypes.pop())
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


def load_model(spec: str | Path, input_shape: Sequence[int] | None = None,
               weights: str | Path | None = None, *,
               seed: int | None = None) -> tuple[nn.Module, tuple[int, ...]]:
    """An eval-mode model and its input shape from a model name or a checkpoint file.

    ``spec`` is a model name as ``get_model`` takes it (reference architecture,
    ``module:callable``, ``path/to/file.py:callable``, torchvision name), with random
    weights or those of ``weights`` (a plain or pathlift state_dict file), or a checkpoint
    written by ``save_checkpoint`` (a file whose metadata names the architecture). The
    input shape is ``input_shape`` if given, else the one stored in the checkpoint, else
    the architecture's default (``default_input_shape``: a factory's ``input_shape``
    attribute). ``seed`` seeds the
    random initialisation (in a forked RNG: the caller's RNG state is left as it was), so
    one architecture name and one seed always give the same weights.

    Example:
        >>> model, shape = load_model("resnet18", seed=0)       # random init, (3, 224, 224)
        >>> model, shape = load_model("net.safetensors")        # arch and shape from the file
    """
    if _is_path(spec):
        if weights is not None:
            raise InvalidParameterError("give either a checkpoint file or weights=, not both")
        ckpt = read_checkpoint(spec)
        if ckpt.arch is None:
            raise InvalidParameterError(
                f"'{spec}' is a plain state_dict without an architecture name; load it as "
                f"load_model('<architecture>', weights='{spec}')")
    else:
        ckpt = Checkpoint({}, str(spec))
        if weights is not None:
            ckpt = read_checkpoint(weights)
            if ckpt.arch not in (None, str(spec)):
                raise ArchitectureMismatchError(
                    f"'{weights}' was saved from '{ckpt.arch}', not '{spec}'")
    name = str(ckpt.arch if ckpt.arch is not None else spec)
    _check_size(name, ckpt.kwargs)
    with nullcontext() if seed is None else torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = get_model(name, **ckpt.kwargs)
    if ckpt.state_dict:
        load_weights(unwrap(model), ckpt.state_dict)
    model.eval()
    if input_shape:
        return model, tuple(int(s) for s in input_shape)
    if ckpt.input_shape is not None:
        return model, ckpt.input_shape
    return model, default_input_shape(name, **ckpt.kwargs)


def _check_size(name: str, kwargs: dict[str, Any]) -> None:
    """Build ``name`` on the meta device (no memory) and refuse it, before it is built for
    real, when its parameters and buffers exceed the memory limit (graph/memory.py)."""
    with torch.device("meta"):
        skeleton = get_model(name, **kwargs)
    size = sum(t.numel() * t.element_size() for t in skeleton.state_dict().values())
    check_bytes(size, f"model '{name}'" + (f" {kwargs}" if kwargs else ""))


def _is_path(spec: str | Path) -> bool:
    return isinstance(spec, PurePath) or Path(spec).suffix in _SAFETENSORS + _TORCH \
        or Path(spec).is_file()
