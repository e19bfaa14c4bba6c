"""The model boundary: the one place where pathlift unwraps, reads, writes or copies a
user's ``nn.Module``.

- ``unwrap``: the module under DistributedDataParallel / DataParallel / FSDP (``.module``)
  and ``torch.compile`` (``._orig_mod``).
- ``param`` / ``stored`` / ``assign_``: parameters under torch.nn.utils.prune's convention
  (``name_orig`` * ``name_mask``, with ``name`` a plain attribute refreshed by a forward
  pre-hook) and under torch.nn.utils.parametrize (read through, never written).
- ``copy_model``: a deep copy that also works on pruned models; ``meta_clone``: the same
  structure with every tensor on the meta device (shapes only, no memory); ``cpu_state``:
  a state_dict as detached, contiguous CPU tensors (to save or to keep).
- ``dtype_device``, ``output_leaves``, ``eval_mode``, ``structure_key``.

Nothing here modifies the caller's model, its parameters' version counters or its
autograd state, so every function may run between a forward and ``loss.backward()``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize, prune
from torch.utils._pytree import tree_leaves

from pathlift.errors import InvalidParameterError, UnsupportedModelError


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under data-parallel wrappers and ``torch.compile``.

    DistributedDataParallel, DataParallel and FullyShardedDataParallel keep it as
    ``.module``; a compiled module (``OptimizedModule``) as ``._orig_mod``. pathlift reads
    the parameters the wrapper trains, so results equal those of the plain module.
    """
    if not isinstance(model, nn.Module):
        raise InvalidParameterError(f"expected an nn.Module, got a {type(model).__name__}")
    while True:
        inner = getattr(model, "_orig_mod", None) if type(model).__name__ == "OptimizedModule" \
            else getattr(model, "module", None) if _is_data_parallel(model) else None
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _is_data_parallel(model: nn.Module) -> bool:
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    return isinstance(model, wrappers) or type(model).__name__ == "FullyShardedDataParallel"


def param(module: nn.Module, name: str, detach: bool = True) -> Tensor | None:
    """The effective parameter ``name``, honouring torch.nn.utils.prune masks.

    A pruned module stores ``name_orig`` and ``name_mask``; its plain ``name`` attribute is
    only refreshed by a forward pre-hook and may be stale, so the product is recomputed.
    Detached by default (reading a parameter never records autograd history); with
    ``detach=False`` it keeps it, for a pass that differentiates through the parameters.
    """
    orig, mask = _own(module, name + "_orig"), _own(module, name + "_mask")
    if orig is not None and mask is not None:
        return (orig.detach() if detach else orig) * mask
    value = getattr(module, name, None)
    if not isinstance(value, Tensor):
        return value
    return value.detach() if detach else value


def _own(module: nn.Module, key: str) -> Any:
    """``module.key`` when it is a parameter, buffer or instance attribute (where
    torch.nn.utils.prune puts ``name_orig`` and ``name_mask``), else None, without the
    AttributeError that nn.Module raises and formats for a missing name (every layer of
    every pass asks)."""
    for table in (module._parameters, module._buffers, vars(module)):
        if key in table:
            return table[key]
    return None


def stored(module: nn.Module, name: str) -> Tensor | None:
    """The tensor to write to change parameter ``name`` (``name_orig`` under a pruning
    mask, whose zeros stay zero). Parametrized tensors cannot be written through."""
    if parametrize.is_parametrized(module, name):
        raise UnsupportedModelError(
            f"{type(module).__name__}.{name} is computed by a torch.nn.utils.parametrize "
            "parametrization; pathlift cannot write through it. Call "
            "parametrize.remove_parametrizations(module, name) on a copy first")
    orig = getattr(module, name + "_orig", None)
    return orig if orig is not None else getattr(module, name, None)


def mask(module: nn.Module, name: str) -> Tensor | None:
    """The torch.nn.utils.prune mask of parameter ``name``, or None."""
    return getattr(module, name + "_mask", None)


def prune_masks(model: nn.Module) -> dict[str, Tensor]:
    """``{"layer.weight": mask}`` (a copy) of every parameter pruned with
    torch.nn.utils.prune in ``unwrap(model)``."""
    return {name[: -len("_mask")]: buf.detach().clone()
            for name, buf in unwrap(model).named_buffers() if name.endswith("_mask")}


def cpu_state(state: dict[str, Tensor], snapshot: bool = False) -> dict[str, Tensor]:
    """``state`` (a state_dict) as detached, contiguous CPU tensors, what safetensors and
    ``torch.save`` write; with ``snapshot`` copies that share no memory with the model."""
    return {k: v.detach().to("cpu", memory_format=torch.contiguous_format, copy=snapshot)
            for k, v in state.items()}


def attach_masks_(model: nn.Module, masks: dict[str, Tensor]) -> nn.Module:
    """Re-create the torch.nn.utils.prune reparametrisation of each ``"layer.name": mask``
    on ``model`` (in place, like torch.nn.utils.prune.custom_from_mask)."""
    for name, m in masks.items():
        owner, _, pname = name.rpartition(".")
        prune.custom_from_mask(model.get_submodule(owner), pname, m)
    return model


def assign_(module: nn.Module, name: str, value: Tensor) -> None:
    """Write the effective value of parameter ``name`` in place (its stored tensor; under a
    pruning mask the masked entries stay zero, and the cached product is refreshed)."""
    target = stored(module, name)
    with torch.no_grad():
        target.copy_(value.to(target.dtype))
        m = mask(module, name)
        if m is not None:
            setattr(module, name, target * m)


def copy_model(model: nn.Module) -> nn.Module:
    """A deep copy of ``unwrap(model)``, also of pruned modules: the ``weight = weight_orig *
    mask`` that torch.nn.utils.prune caches on a module is not a graph leaf and deepcopy
    refuses it, so such tensors are copied detached."""
    model = unwrap(model)
    memo = {id(v): v.detach().clone() for m in model.modules() for v in vars(m).values()
            if isinstance(v, Tensor) and not v.is_leaf}
    return copy.deepcopy(model, memo)


def meta_clone(model: nn.Module) -> nn.Module:
    """The structure of ``model`` with every parameter, buffer and cached tensor on the meta
    device: it runs forward for shapes only, without memory or arithmetic. Modules are
    copied shallowly (their plain attributes are shared, tensors and submodules are not),
    which is several times cheaper than a deep copy."""
    tensors: dict[int, Tensor] = {}
    modules: dict[int, nn.Module] = {}

    def meta(t: Tensor) -> Tensor:
        if id(t) not in tensors:
            empty = torch.empty_like(t, device="meta")
            tensors[id(t)] = nn.Parameter(empty, t.requires_grad) \
                if isinstance(t, nn.Parameter) else empty
        return tensors[id(t)]

    def clone(m: nn.Module) -> nn.Module:
        if id(m) not in modules:
            new = modules[id(m)] = object.__new__(type(m))
            new.__dict__.update(vars(m))
            for key, value in vars(m).items():
                if isinstance(value, Tensor):
                    new.__dict__[key] = meta(value)
            new._parameters = {k: None if v is None else meta(v)
                               for k, v in m._parameters.items()}
            new._buffers = {k: None if v is None else meta(v) for k, v in m._buffers.items()}
            new._modules = {k: None if c is None else clone(c) for k, c in m._modules.items()}
        return modules[id(m)]

    return clone(model)


def dtype_device(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    """The floating dtype and device of the model's first floating parameter or buffer
    (float32 on the CPU for a model without any). Refuses a model on the meta device."""
    for t in (*model.parameters(), *model.buffers()):  # BatchNorm(affine=False): buffers only
        if t.is_floating_point():
            if t.device.type == "meta":
                raise InvalidParameterError(
                    f"{type(model).__name__} has its parameters on the meta device (shapes "
                    "without values); materialise them first, e.g. "
                    "model.to_empty(device='cpu') then load_state_dict(...)")
            return t.dtype, t.device
    return torch.float32, torch.device("cpu")


def output_leaves(out: Any, kind: type = Tensor) -> list[Any]:
    """The leaves of a model output in order: a tensor, or nested tuples, lists and dicts of
    them (dicts in insertion order). Anything else raises UnsupportedModelError."""
    leaves = tree_leaves(out)
    bad = sorted({type(v).__name__ for v in leaves if not isinstance(v, kind)})
    if bad:
        raise UnsupportedModelError(
            f"the model returns {', '.join(bad)} values; pathlift needs tensors, or tuples, "
            "lists or dicts of tensors")
    return leaves


def flat_outputs(out: Any, batch: int) -> Tensor:
    """Every output neuron of every returned tensor, in order: shape (batch, d_out)."""
    return torch.cat([t.reshape(batch, -1) for t in output_leaves(out)], dim=1)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put every submodule in eval mode, restoring each flag exactly after.

    Use it to measure a network in the middle of training: BatchNorm then counts as its
    affine map with running statistics and Dropout as the identity (thesis Def. 2.2.2).
    Flipping the flags does not touch autograd: a pending ``loss.backward()`` still works.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in flags:
            m.training = training


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _plain(value: object) -> bool:
    """A configuration value compared by ``==`` without reading tensors (stride, eps...)."""
    kind = type(value)
    if kind is tuple:
        return all(_plain(v) for v in value)
    return kind in _PLAIN or isinstance(value, (bool, int, float, str))


def structure_key(model: nn.Module, as_eval: bool = False) -> tuple:
    """What a traced graph of ``model`` depends on, cheaply (no tensor data is read).

    Every submodule's identity, class, train/eval flag, hooks, instance-level forward,
    plain attributes (stride, padding, eps, inplace, ...), and the names, identities,
    shapes, dtypes and devices of its parameters and buffers. An in-place weight update
    keeps the key; a replaced submodule or parameter, a train/eval flip, a new
    torch.nn.utils.prune reparametrisation, a hook or a ``.to(...)`` changes it.
    ``as_eval``: the key the model would have with every module in eval mode (its flags
    are not touched), for looking up a graph traced under ``eval_mode``.

    Called on every cached lookup, so it walks ``_modules`` itself (in the order of
    ``named_modules(remove_duplicate=False)``) rather than through generators.
    """
    parts: list[tuple] = []
    _structure(model, "", as_eval, parts)
    return tuple(parts)


def _structure(m: nn.Module, name: str, as_eval: bool, parts: list[tuple]) -> None:
    state = vars(m)
    parts.append((
        name, id(m), type(m), False if as_eval else m.training,
        tuple(m._forward_hooks), tuple(m._forward_pre_hooks),
        id(state.get("forward")),
        tuple((k, v) for k, v in state.items()
              if k[0] != "_" and k != "training" and _plain(v)),
        tuple((k, id(p), p.shape, p.dtype, p.device)
              for k, p in m._parameters.items() if p is not None),
        tuple((k, b.shape, b.dtype, b.device)
              for k, b in m._buffers.items() if b is not None),
    ))
    for key, child in m._modules.items():
        if child is not None:
            _structure(child, f"{name}.{key}" if name else key, as_eval, parts)


def writable_copy(model: nn.Module) -> nn.Module:
    """``copy_model(model)`` whose tensors computed by torch.nn.utils.parametrize
    (``weight_norm``, ``spectral_norm``, orthogonal, your own) are plain parameters holding
    their eval-mode values, so that a pass can write them (rescaling, normalisation,
    quantisation, pruning a copy). The copy computes what ``model`` computes in eval mode,
    and its state_dict keys are those of the plain layers (``layer.weight``)."""
    out = copy_model(model)
    with eval_mode(out), torch.no_grad():
        for module in [m for m in out.modules() if parametrize.is_parametrized(m)]:
            _unparametrize_(module)
    return out


def _unparametrize_(module: nn.Module) -> None:
    """Replace every parametrization of ``module`` by a parameter holding its value. Not
    ``parametrize.remove_parametrizations``: it deletes the property from the module's
    class, which a deep copy shares with the original module."""
    lists = module.parametrizations
    values = {name: nn.Parameter(getattr(module, name).detach().clone(), any(
        p.requires_grad for p in plist.parameters(recurse=False))) for name, plist in lists.items()}
    module.__class__ = parametrize.type_before_parametrizations(module)
    del module._modules["parametrizations"]
    for name, value in values.items():
        module.register_parameter(name, value)


def model_input(model: nn.Module, x: Tensor) -> Tensor:
    """A batch ``x`` as ``model`` computes with it: floating inputs in its floating dtype
    and on its device (data loaders give float32 CPU tensors; a float16, bfloat16 or
    float64 checkpoint, or a model on a GPU, needs its own), other inputs on its device."""
    dtype, device = dtype_device(unwrap(model))
    return x.to(device, dtype) if x.is_floating_point() else x.to(device)
