"""Checkpoints: safetensors (architecture in JSON metadata) and weights-only torch files.

Nothing here unpickles arbitrary objects: ``.pt``/``.pth`` files are read with
``torch.load(weights_only=True)``, which refuses any pickle that would run code.
"""

from __future__ import annotations

import json
import operator
import pickle
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
from pathlift.graph.boundary import cpu_state, unwrap
from pathlift.models.registry import REFERENCE_MODELS, get_model

__all__ = ["Checkpoint", "UnsafeCheckpointError", "load_model", "load_weights",
           "read_checkpoint", "save_checkpoint"]

_ARCH, _KWARGS, _SHAPE = "pathlift.arch", "pathlift.kwargs", "pathlift.input_shape"
_SAFETENSORS, _TORCH = (".safetensors",), (".pt", ".pth")
_IMAGENET = (3, 224, 224)


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


def save_checkpoint(model: nn.Module, path: str | Path, arch: str, *,
                    input_shape: Sequence[int] | None = None, **kwargs: Any) -> Path:
    """Write ``model``'s state_dict with its architecture name and constructor ``kwargs``.

    ``.safetensors`` stores them as JSON metadata; ``.pt``/``.pth`` as a weights-only
    dict {arch, kwargs, input_shape, state_dict}. ``input_shape`` (no batch dimension) is
    the shape the model is analysed at; ``load_model(path)`` returns it, and falls back to
    the architecture's default when it was not given. The file mode follows the umask, as
    for ``torch.save``.

    Example:
        >>> save_checkpoint(small_cnn(), "net.safetensors", "small_cnn", input_shape=(1, 8, 8))
    """
    path = Path(path)
    if arch not in REFERENCE_MODELS:
        get_model(arch, **kwargs)  # raises InvalidParameterError for an unknown name
    shape = None if input_shape is None else _shape(input_shape)
    try:
        meta = {_ARCH: arch, _KWARGS: json.dumps(kwargs)}
    except TypeError as err:
        raise InvalidParameterError(f"constructor kwargs {kwargs} must be JSON values") from err
    if shape is not None:
        meta[_SHAPE] = json.dumps(shape)
    state = cpu_state(unwrap(model).state_dict())
    if path.suffix in _SAFETENSORS:
        # safetensors' save_file creates the file with mode 0600; bytes written through
        # open() get the usual 0666 & ~umask
        path.write_bytes(safetensors_bytes(state, metadata=meta))
    elif path.suffix in _TORCH:
        torch.save({"arch": arch, "kwargs": kwargs, "input_shape": shape, "state_dict": state},
                   path)
    else:
        raise InvalidParameterError(f"checkpoint '{path}' must end in .safetensors, .pt or .pth")
    return path


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint without executing anything it contains."""
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"no checkpoint file at '{path}'")
    if path.suffix in _SAFETENSORS:
        return _read_safetensors(path)
    if path.suffix in _TORCH:
        return _read_torch(path)
    raise InvalidParameterError(f"checkpoint '{path}' must end in .safetensors, .pt or .pth")


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
    return Checkpoint(state, meta.get(_ARCH), kwargs, _stored_shape(shape, path))


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
        return Checkpoint(_tensors(obj["state_dict"], path), obj.get("arch"),
                          dict(obj.get("kwargs") or {}),
                          _stored_shape(obj.get("input_shape"), path))
    if isinstance(obj, Mapping):
        return Checkpoint(_tensors(obj, path))
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


def _tensors(state: Mapping, path: Path) -> dict[str, Tensor]:
    bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if bad:
        raise InvalidParameterError(f"'{path}': state_dict entries {bad[:3]} are not tensors")
    return dict(state)


def load_weights(model: nn.Module, state_dict: Mapping[str, Tensor]) -> nn.Module:
    """Load ``state_dict`` into ``model`` strictly, after checking every key and shape.

    Pruned checkpoints (``<name>_orig`` and ``<name>_mask``) re-attach their
    torch.nn.utils.prune masks. Kronecker-sparse layers saved with their chain
    (``<name>.chain``) are rebuilt in ``model`` first (``pathlift.kron.rebuild_layers``),
    so a dense architecture loads its designed version. A floating dtype differing from
    the model's converts the model to it (never rounding the checkpoint). Raises
    ArchitectureMismatchError naming the first missing, unexpected and mis-shaped keys.
    """
    if any(k == "chain" or k.endswith(".chain") for k in state_dict):
        from pathlift.kron import rebuild_layers  # imported only for Kronecker-sparse models

        model = rebuild_layers(model, state_dict)
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
    """An eval-mode model and its input shape from a reference name or a checkpoint file.

    ``spec`` is an architecture name (random weights, or those of ``weights``: a plain or
    pathlift state_dict file) or a checkpoint written by ``save_checkpoint`` (a file whose
    metadata names the architecture). The input shape is ``input_shape`` if given, else
    the one stored in the checkpoint, else the architecture's default. ``seed`` seeds the
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
    with nullcontext() if seed is None else torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = get_model(name, **ckpt.kwargs)
    if ckpt.state_dict:
        load_weights(model, ckpt.state_dict)
    model.eval()
    if input_shape:
        return model, tuple(int(s) for s in input_shape)
    if ckpt.input_shape is not None:
        return model, ckpt.input_shape
    spec_entry = REFERENCE_MODELS.get(name)
    shape = spec_entry.default_input_shape(**ckpt.kwargs) if spec_entry else _IMAGENET
    return model, shape


def _is_path(spec: str | Path) -> bool:
    return isinstance(spec, PurePath) or Path(spec).suffix in _SAFETENSORS + _TORCH \
        or Path(spec).is_file()
