"""The loading boundary: every model pathlift builds from a spec or a file comes through here.

The trust rule. What the user types (a command line, a Python call) is theirs to run: a
model spec ``module:callable`` or ``path/to/file.py:callable`` is imported and called. A
*file* is not trusted: a checkpoint may name only a reference architecture (pathlift's
registry), a torchvision classification model or a timm architecture (``timm:NAME``,
built with random weights and never with arguments that load files or download:
``pathlift.models.timm_models``). An import path read from inside a file
(``pathlift.arch`` in a .safetensors' metadata, the ``arch`` field of a .pt dict) is
refused with ``UntrustedArchitectureError`` before anything is imported or called, unless
the user names the architecture themselves (``load_model(FILE, arch="mymodule:Net")``,
``pathlift COMMAND mymodule:Net --weights FILE``) or opts in for the files they trust
(``trust_arch=True``, ``pathlift --trust-arch COMMAND``). See docs/threat-model.md.

The input shape, in this order: the one given, else the one stored in the checkpoint,
else the data's (``data_shape``), else the one the architecture declares (a callable's
``input_shape`` attribute, else the model's: ``pathlift.graph.input_shape``); never a
guess. It comes as an ``InputShape`` whose ``source`` says which.

The size: every model is first built on the meta device and refused when its parameters
and buffers exceed the memory limit (``pathlift.memory``), before it is built for
real (``pathlift.models.registry.check_model_size``).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path, PurePath
from typing import Any

import torch
from torch import nn

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError, ShapeError
from pathlift.graph import copy_model
from pathlift.graph.boundary import unwrap
from pathlift.graph.input_shape import InputShape, as_input_shape
from pathlift.models.checkpoints import (
    CHECKPOINT_SUFFIXES,
    Checkpoint,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from pathlift.models.registry import (
    REFERENCE_MODELS,
    check_model_size,
    get_model,
    is_import_path,
    model_input_shape,
)

__all__ = ["UntrustedArchitectureError", "load_model", "load_model_pair", "model_factory",
           "save_like", "set_trust_arch"]

_trust_arch = False


class UntrustedArchitectureError(InvalidParameterError):
    """A file names its architecture by an import path: building it would run code that the
    file, not the user, chose."""


def set_trust_arch(trust: bool) -> None:
    """Whether architectures named by an import path inside a checkpoint are built in this
    process when a call does not say (``trust_arch=None``); ``pathlift --trust-arch``
    sets it. Off by default: only do this for files you trust as you trust your own code."""
    global _trust_arch
    _trust_arch = bool(trust)


def _is_path(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` names a checkpoint file rather than a model."""
    if isinstance(spec, PurePath):
        return True
    try:
        return Path(spec).suffix in CHECKPOINT_SUFFIXES or Path(spec).is_file()
    except OSError:  # a name too long for a path: not a file
        return False


def _file_arch(ckpt: Checkpoint, path: str | os.PathLike[str], trust_arch: bool | None) -> str:
    """The architecture ``ckpt`` (read from ``path``) names, refused when it is an import
    path and the user has not said to trust the file's (see the module docstring)."""
    arch = ckpt.arch
    if arch is None:
        raise InvalidParameterError(
            f"'{path}' is a plain state_dict without an architecture name; load it as "
            f"load_model('<architecture>', weights='{path}') (--weights on the command line)")
    trusted = _trust_arch if trust_arch is None else trust_arch
    if arch in REFERENCE_MODELS or not is_import_path(arch) or trusted:
        return arch
    shown = repr(arch[:120])  # the file's text, quoted: no control characters printed
    raise UntrustedArchitectureError(
        f"'{path}' names its architecture by the import path {shown}, and pathlift does "
        f"not run code that a file names: if it is yours, name it yourself (MODEL {shown} "
        f"--weights '{path}' on the command line, load_model('{path}', arch={shown}) in "
        "Python), or trust the file as your own code (pathlift --trust-arch COMMAND ..., "
        "trust_arch=True)")


def _checkpoint(spec: str | os.PathLike[str], weights: str | os.PathLike[str] | None,
                arch: str | None, trust_arch: bool | None) -> tuple[Checkpoint, str]:
    """The checkpoint to load (empty for a name alone) and the architecture to build."""
    if arch is not None:  # load_model(FILE, arch=...): the user names the architecture
        if weights is not None:
            raise InvalidParameterError("give weights= or arch= with a checkpoint, not both")
        spec, weights = arch, spec
    if _is_path(spec):
        if weights is not None:
            raise InvalidParameterError("give either a checkpoint file or weights=, not both")
        ckpt = read_checkpoint(spec)
        return ckpt, _file_arch(ckpt, spec, trust_arch)
    if weights is None:
        return Checkpoint({}, str(spec)), str(spec)
    ckpt = read_checkpoint(weights)
    named = (ckpt.arch, str(spec))  # import paths are spelt many ways: the keys decide
    if ckpt.arch not in (None, str(spec)) and not any(map(is_import_path, named)):
        raise ArchitectureMismatchError(
            f"'{weights}' was saved from {ckpt.arch[:120]!r}, not '{spec}'")
    return ckpt, str(spec)


def load_model(spec: str | os.PathLike[str], input_shape: Sequence[int] | None = None,
               weights: str | os.PathLike[str] | None = None, *, seed: int | None = None,
               arch: str | None = None, trust_arch: bool | None = None,
               data_shape: Sequence[int] | None = None,
               model_kwargs: Mapping[str, Any] | None = None) -> tuple[nn.Module, InputShape]:
    """An eval-mode model and its input shape from a model name or a checkpoint file.

    ``spec`` is a model name as ``get_model`` takes it (reference architecture,
    ``module:callable``, ``path/to/file.py:callable``, ``timm:NAME``, torchvision name), with
    random weights or those of ``weights`` (a plain or pathlift state_dict file), or a
    checkpoint written by ``save_checkpoint`` (a file whose metadata names the architecture).

    A file may name only a reference, timm or torchvision architecture (the trust rule of
    this module): for your own class give ``arch`` (``load_model("net.safetensors",
    arch="mymodels:Net")``, the same as ``load_model("mymodels:Net",
    weights="net.safetensors")``), or ``trust_arch=True`` to build the import path the file
    names (default: ``set_trust_arch``'s setting, off).

    The input shape is ``input_shape`` if given, else the one stored in the checkpoint, else
    ``data_shape`` (the data's), else the one the architecture declares
    (``model_input_shape``), else a ShapeError; its ``source`` says which.
    ``seed`` seeds the random initialisation (in a forked RNG: the caller's RNG state is
    left as it was), so one architecture name and one seed always give the same weights.
    ``model_kwargs`` are constructor arguments of a model given by name
    (``{"num_classes": 10, "drop_rate": 0.0}`` for ``timm:NAME``); a checkpoint file holds
    its own.

    Raises:
        UntrustedArchitectureError: a file names its architecture by an import path.
        MemoryLimitError: the model would not fit the memory limit (checked before it is
            built, on the meta device).
        InvalidParameterError, ArchitectureMismatchError: an unknown name, a file that is
            not a checkpoint, weights that do not fit.

    Example:
        >>> model, shape = load_model("resnet18", seed=0)       # random init, (3, 224, 224)
        >>> model, shape = load_model("net.safetensors")        # arch and shape from the file
    """
    ckpt, name = _checkpoint(spec, weights, arch, trust_arch)
    if model_kwargs:
        if _is_path(spec):
            raise InvalidParameterError(
                f"'{spec}' is a checkpoint, which holds its own constructor arguments; "
                "give model arguments with a model name")
        ckpt = replace(ckpt, kwargs={**ckpt.kwargs, **model_kwargs})
    check_model_size(name, ckpt.kwargs)
    with nullcontext() if seed is None else torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = get_model(name, **ckpt.kwargs)
    if ckpt.state_dict:
        load_weights(unwrap(model), ckpt.state_dict)  # a compiled factory too
    model.eval()
    for shape, source in ((input_shape, "given"), (ckpt.input_shape, "the checkpoint"),
                          (data_shape, "the data")):
        if shape:
            return model, as_input_shape(shape, source)
    return model, model_input_shape(name, unwrap(model))


def load_model_pair(spec_a: str, spec_b: str, input_shape: Sequence[int] | None = None,
                    weights_a: str | None = None, weights_b: str | None = None, *,
                    seed: int | None = None, model_kwargs: Mapping[str, Any] | None = None
                    ) -> tuple[nn.Module, nn.Module, tuple[int, ...]]:
    """Two models (``load_model`` each) and their common input shape. ``model_kwargs`` are
    the constructor arguments of each of the two given by name (a checkpoint file holds
    its own).

    Raises:
        ShapeError: they come with different input shapes and ``input_shape`` does not
            choose one.
        InvalidParameterError: ``model_kwargs`` and two checkpoint files.
    """
    if model_kwargs and _is_path(spec_a) and _is_path(spec_b):
        raise InvalidParameterError(
            f"'{spec_a}' and '{spec_b}' are checkpoints, which hold their own constructor "
            "arguments; give model arguments with a model name")
    net_a, shape = load_model(spec_a, input_shape, weights_a, seed=seed,
                              model_kwargs=None if _is_path(spec_a) else model_kwargs)
    net_b, shape_b = load_model(spec_b, input_shape, weights_b, seed=seed,
                                model_kwargs=None if _is_path(spec_b) else model_kwargs)
    if shape != shape_b:
        raise ShapeError(f"{spec_a} has input shape {shape} and {spec_b} has {shape_b} (stored "
                         "in a checkpoint, or an architecture's default): give --input-shape")
    return net_a, net_b, shape


def model_factory(spec: str, num_classes: int | None = None, weights: str | None = None,
                  model_kwargs: Mapping[str, Any] | None = None) -> Callable[[], nn.Module]:
    """A callable building a fresh model from ``spec``.

    - a model name (``pathlift models``, ``module:callable``, ``path/to/file.py:callable``;
      ``timm:NAME``, a torchvision name when installed): a new randomly initialised model
      each call, with ``num_classes`` when a reference constructor takes that argument;
    - a checkpoint file, or a name with ``weights``: each call returns a copy of those
      weights (``load_model``, its trust rule included), so every run starts from them.

    ``model_kwargs``: constructor arguments of a model given by name (over ``num_classes``;
    a checkpoint file holds its own).

    Raises:
        InvalidParameterError: unknown name, module or attribute, or a factory that does
            not return an ``nn.Module`` (checked here, before any training).
        MemoryLimitError: the model would not fit the memory limit (``num_classes`` from
            data with huge labels, say): checked on the meta device, nothing built.

    Example::

        make = model_factory("small_cnn", num_classes=10)
        make = model_factory("examples.nets:tiny_cnn")
    """
    if weights is not None or _is_path(spec):
        template, _ = load_model(spec, None, weights, model_kwargs=model_kwargs)
        return lambda: copy_model(template)
    constructor = REFERENCE_MODELS[spec].constructor if spec in REFERENCE_MODELS else None
    takes = "num_classes" in inspect.signature(constructor).parameters if constructor \
        else not is_import_path(spec)  # torchvision's and timm's constructors take num_classes
    kwargs = {"num_classes": num_classes} if num_classes is not None and takes else {}
    kwargs.update(model_kwargs or {})
    check_model_size(spec, kwargs)  # an unknown name or a huge model fails here
    return functools.partial(get_model, spec, **kwargs)


def save_like(model: nn.Module, spec: str, path: str | Path,
              input_shape: Sequence[int], *, trust_arch: bool | None = None) -> Path:
    """Write ``model`` as a checkpoint of the architecture (and constructor kwargs) that
    ``spec`` names: a model name, or a checkpoint file whose architecture is reused (under
    the trust rule of ``load_model``)."""
    arch, kwargs = spec, {}
    if _is_path(spec):
        ckpt = read_checkpoint(spec)
        arch, kwargs = _file_arch(ckpt, spec, trust_arch), ckpt.kwargs
    return save_checkpoint(model, path, arch, input_shape=input_shape, **kwargs)
