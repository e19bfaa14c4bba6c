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
- ``dtype_device``, ``output_leaves``, ``eval_mode``, ``structure_key``; ``survey``: what
  a call needs of the model (``readable``, its key, dtype, device and named modules) in
  one walk.

Nothing here modifies the caller's model, its parameters' version counters or its
autograd state, so every function may run between a forward and ``loss.backward()``.
"""

from __future__ import annotations

import copy
import sys
import types
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize, prune
from torch.utils._pytree import tree_leaves

from pathlift.errors import InvalidParameterError, UnsupportedModelError


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under data-parallel wrappers and ``torch.compile``.

    DistributedDataParallel, DataParallel and FullyShardedDataParallel (FSDP1) keep it as
    ``.module``; a compiled module (``OptimizedModule``) as ``._orig_mod``. DDP, DataParallel
    and compiled modules hold the plain module's parameters, so results are the plain
    module's. FSDP1 holds flat shards: ``readable`` says when they can be read. FSDP2
    (``fully_shard``) wraps nothing: its model is the module itself, see
    ``sharded_parameters``.
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
    A tensor the module's class computes (a property: torch.nn.utils.parametrize, the
    view of a layer whose weight its module standardises in forward) is read as computed.
    """
    if isinstance(getattr(type(module), name, None), property):
        value = getattr(module, name)
        return value.detach() if detach and isinstance(value, Tensor) else value
    return own_param(module, name, detach)


def own_param(module: nn.Module, name: str, detach: bool = True) -> Tensor | None:
    """``param`` of a tensor held in the module's own tables (never through a property of
    its class): ``name_orig * name_mask`` under torch.nn.utils.prune, else the tensor."""
    orig, mask = _own(module, name + "_orig"), _own(module, name + "_mask")
    if orig is not None and mask is not None:
        return (orig.detach() if detach else orig) * mask
    value = _own(module, name)
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


#: Exact types of most values in a module's ``__dict__`` (its tables, flags, sizes): no
#: tensor, bound method or tuple to look into, so the walks over every module skip them
#: after one set lookup.
_ATTRIBUTES = frozenset({bool, int, float, str, type(None), dict, OrderedDict, set})


def meta_clone(model: nn.Module, copies: dict[int, nn.Module] | None = None) -> nn.Module:
    """The structure of ``model`` with every parameter, buffer and cached tensor on the meta
    device: it runs forward for shapes only, without memory or arithmetic. Modules are
    copied shallowly (their plain attributes are shared, tensors and submodules are not),
    which is several times cheaper than a deep copy.

    A module is copied as ``object.__new__`` of its class and its instance dict: no
    ``__new__``, ``__init__`` or ``__reduce_ex__`` runs, so a module of FSDP2
    (``fully_shard``, whose ``__new__`` re-runs the layer's ``__init__`` and draws from the
    global RNG) or of torch.nn.utils.parametrize (which refuses pickling) copies like any
    other. An FSDP2 module becomes a module of its original class, without FSDP's hooks,
    and its DTensor parameters meta tensors of their global shape: the copy is the plain
    model's skeleton and running it never reaches FSDP's state or collectives.
    ``copies``, when given, is filled with each module's copy by the module's id.
    """
    tensors: dict[int, Tensor] = {}
    modules: dict[int, nn.Module] = {} if copies is None else copies

    def meta(t: Tensor) -> Tensor:
        if id(t) not in tensors:
            empty = torch.empty(t.shape, dtype=t.dtype, device="meta") if is_dtensor(t) \
                else torch.empty_like(t, device="meta")
            tensors[id(t)] = nn.Parameter(empty, t.requires_grad) \
                if type(t) is nn.Parameter or isinstance(t, nn.Parameter) else empty
        return tensors[id(t)]

    def clone(m: nn.Module) -> nn.Module:
        if id(m) not in modules:
            new = modules[id(m)] = module_view(m, {
                k: meta(v) for k, v in (*m._parameters.items(), *m._buffers.items())
                if v is not None})
            for key, value in vars(m).items():
                if type(value) in _ATTRIBUTES:  # most of a module's state: no test needed
                    continue
                if isinstance(value, Tensor):
                    new.__dict__[key] = meta(value)
                elif isinstance(value, types.MethodType) and value.__self__ is m:
                    # a method chosen in __init__ (timm's FasterNet: self.forward =
                    # self.forward_split_cat) runs on the copy, as a deep copy would
                    new.__dict__[key] = types.MethodType(value.__func__, new)
            new.__dict__["_modules"] = {k: None if c is None else clone(c)
                                        for k, c in m._modules.items()}
        return modules[id(m)]

    return clone(model)


def _loaded(module: str, name: str) -> type | None:
    """A class of a torch module if that module is imported, else None: a model can hold
    an FSDP2 module or a DTensor only once torch.distributed.fsdp / .tensor is imported,
    so pathlift never pays their import (half a second) itself."""
    return getattr(sys.modules.get(module), name, None)


def is_dtensor(t: Tensor) -> bool:
    """Whether ``t`` is a DTensor (torch.distributed.tensor), without importing it."""
    dtensor = _loaded("torch.distributed.tensor", "DTensor")
    return dtensor is not None and isinstance(t, dtensor)


def _plain_class(cls: type) -> type:
    """The user's class of a module: ``fully_shard`` swaps ``Linear`` for a generated
    ``FSDPLinear(FSDPModule, Linear)``, whose MRO holds the original at
    ``_orig_cls_mro_index``."""
    fsdp = _loaded("torch.distributed.fsdp", "FSDPModule")
    if fsdp is None or not issubclass(cls, fsdp):
        return cls
    return cls.__mro__[cls._orig_cls_mro_index]


_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                "_backward_pre_hooks", "_backward_hooks")


def _drop_fsdp_hooks(m: nn.Module) -> None:
    """Give the copy ``m`` of an FSDP2 module its own hook tables without FSDP's hooks
    (they all-gather, reshard and keep FSDP's per-iteration state: bound to the model's
    FSDP state, they would run it from the copy)."""
    fsdp = {key for key, hook in m._forward_pre_hooks.items() | m._forward_hooks.items()
            if getattr(hook, "__module__", "").startswith("torch.distributed.fsdp")}
    for table in _HOOK_TABLES:
        hooks = getattr(m, table, None)
        if hooks is not None:
            m.__dict__[table] = type(hooks)((k, v) for k, v in hooks.items() if k not in fsdp)


def module_view(module: nn.Module, tensors: dict[str, Tensor]) -> nn.Module:
    """A shallow copy of one module whose parameters or buffers named in ``tensors`` are
    those tensors (anything else is shared with ``module``), of the module's own class
    without FSDP's hooks: what a pass reads in place of a layer (its local shard). The
    tensors may be views or carry autograd history; the module is not touched."""
    view = object.__new__(_plain_class(type(module)))
    state = view.__dict__  # set directly: nn.Module.__setattr__ costs more than the copy
    state.update(vars(module))
    state["_parameters"] = {k: tensors.get(k, v) for k, v in module._parameters.items()}
    state["_buffers"] = {k: tensors.get(k, v) for k, v in module._buffers.items()}
    if view.__class__ is not type(module):
        _drop_fsdp_hooks(view)
    return view


# --------------------------------------------------------------------------- sharded models


def sharded_parameters(model: nn.Module) -> dict[tuple[int, str], Tensor]:
    """Every parameter of ``model`` held as a DTensor, by (id of its module, name).

    FSDP2 (``fully_shard``) keeps each parameter's shard in its state as a DTensor, also
    while a forward has left the gathered parameter on the module (the root, between its
    forward and backward): the shard is given then. A DTensor parameter set without FSDP is
    given as it is. Empty for a model without DTensors (and free when torch.distributed's
    tensor package is not even imported).
    """
    dtensor = _loaded("torch.distributed.tensor", "DTensor")
    if dtensor is None:
        return {}
    found: dict[tuple[int, str], Tensor] = {}
    fsdp = _loaded("torch.distributed.fsdp", "FSDPModule")
    fsdp_modules = []
    for m in model.modules():  # one walk: DTensor parameters, FSDP2 modules
        for k, p in m._parameters.items():
            if isinstance(p, dtensor):
                found[id(m), k] = p
        if fsdp is not None and isinstance(m, fsdp):
            fsdp_modules.append(m)
    for m in fsdp_modules:
        try:
            groups = m._get_fsdp_state()._fsdp_param_groups
            for param in (p for g in groups for p in g.fsdp_params):
                info = param._module_info
                for owner, name in ((info.module, info.param_name),
                                    *zip(info.shared_modules, info.shared_param_names,
                                         strict=True)):
                    found[id(owner), name] = param.sharded_param
        except AttributeError as err:  # pragma: no cover - another torch's FSDP2
            raise UnsupportedModelError(
                f"cannot find the shards of FSDP2 module {type(m).__name__} ({err}); "
                f"pathlift reads FSDP2 as torch 2.13 keeps it, this is torch "
                f"{torch.__version__}") from None
    return found


def local(t: Tensor) -> Tensor:
    """This rank's part of ``t``: a DTensor's local tensor, else ``t``."""
    return t.to_local() if is_dtensor(t) else t


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds parameters sharded across ranks (FSDP2, DTensor): every
    rank must then take part in every pass."""
    return bool(sharded_parameters(model))


def readable(model: nn.Module) -> nn.Module:
    """The module whose tensors pathlift reads for ``model``: ``unwrap(model)``, after
    checking that every parameter, buffer and cached tensor can be read as numbers
    (``survey(model).module``, which says how FSDP1 and DTensors are read).

    Raises:
        UnsupportedModelError, InvalidParameterError: as ``survey``.
    """
    return survey(model).module


@dataclass(frozen=True)
class Survey:
    """What one walk over a model's modules finds (``survey``): the module pathlift reads,
    its ``structure_key``, its ``dtype_device`` and its ``named_modules(remove_duplicate=
    False)`` table."""

    module: nn.Module
    key: tuple
    dtype: torch.dtype
    device: torch.device
    modules: dict[str, nn.Module]


def survey(model: nn.Module, as_eval: bool = False) -> Survey:
    """``readable(model)``, its ``structure_key(..., as_eval)``, ``dtype_device`` and table
    of named modules, in ONE walk over the modules (a first call used to walk a large
    model five times, a tenth of a forward pass on timm's HRNet).

    FSDP1 (``FullyShardedDataParallel``, as root or per layer) is read only inside
    ``FSDP.summon_full_params(model)`` on a rank that holds the gathered parameters (every
    rank, or rank 0 with ``rank0_only=True``), through a view of the model without its
    FSDP1 wrappers (traced on every call: FSDP1 makes new parameters each time). Outside
    it, its parameters are flat shards or tensors whose memory is freed, so it is refused
    before anything runs: no forward, no collective, the model untouched.

    Raises:
        UnsupportedModelError: FSDP1 outside ``summon_full_params`` (or on a rank that does
            not hold the gathered parameters), a DTensor split in another way than FSDP2's
            dim-0 shards. InvalidParameterError: a tensor on the meta device or without
            memory behind it. One line naming the tensor and saying what to do.
    """
    if is_fsdp1(model):
        model = _fsdp1_view(model, _loaded("torch.distributed.fsdp", "FullyShardedDataParallel"))
    model = unwrap(model)
    walk = _Walk(as_eval, check=True)
    walk.visit(model, "")
    if walk.sharded:  # FSDP2 or DTensors: each parameter counts as its shard
        shards = sharded_parameters(model)
        walk = _Walk(as_eval, check=False, shards=shards)
        walk.visit(model, "")
        dtype, device = dtype_device(model)
    else:
        first = walk.floating[0] if walk.floating[0] is not None else walk.floating[1]
        dtype, device = (first.dtype, first.device) if first is not None else \
            (torch.float32, torch.device("cpu"))
    return Survey(model, tuple(walk.parts), dtype, device, walk.modules)


class _Walk:
    """One recursive walk over ``_modules`` in the order of ``named_modules(
    remove_duplicate=False)``: each module's ``structure_key`` part, the table of named
    modules, the first floating parameter and buffer, whether any tensor is sharded
    (a DTensor or an FSDP2 module), and with ``check`` each tensor's readability."""

    def __init__(self, as_eval: bool, check: bool,
                 shards: dict[tuple[int, str], Tensor] | None = None) -> None:
        self.as_eval, self.check, self.shards = as_eval, check, shards or {}
        self.parts: list[tuple] = []
        self.modules: dict[str, nn.Module] = {}
        self.floating: list[Tensor | None] = [None, None]  # first parameter, first buffer
        self.dtensor = _loaded("torch.distributed.tensor", "DTensor")
        fsdp = _loaded("torch.distributed.fsdp", "FSDPModule")
        self.fsdp2 = () if fsdp is None else fsdp
        self.sharded = False

    def visit(self, m: nn.Module, name: str) -> None:
        self.modules[name] = m
        state, params, buffers = vars(m), m._parameters, m._buffers
        plain, cached = [], []  # configuration values; tensors kept as plain attributes
        for k, v in state.items():
            kind = type(v)
            if kind in _ATTRIBUTES:
                if kind in _PLAIN and k[0] != "_" and k != "training":
                    plain.append((k, v))
            elif isinstance(v, Tensor):
                cached.append((k, v))
            elif k[0] != "_" and k != "training" and _plain(v):
                plain.append((k, v))
        if self.check:
            for table in (params.items(), buffers.items(), cached):
                for k, t in table:
                    if t is not None:
                        self._check(m, name, k, t)
        self.sharded = self.sharded or isinstance(m, self.fsdp2)
        shards = self.shards
        self.parts.append((
            name, id(m), type(m), False if self.as_eval else m.training,
            tuple(m._forward_hooks), tuple(m._forward_pre_hooks),
            id(state.get("forward")), tuple(plain),
            tuple((k, id(p), p.shape, p.dtype, p.device)
                  for k, p in ((k, shards.get((id(m), k), p)) for k, p in params.items())
                  if p is not None),
            tuple((k, b.shape, b.dtype, b.device) for k, b in buffers.items() if b is not None),
        ))
        for slot, table in enumerate((params, buffers)):
            if self.floating[slot] is None:
                self.floating[slot] = next((t for t in table.values()
                                            if t is not None and t.is_floating_point()), None)
        for key, child in m._modules.items():
            if child is not None:
                self.visit(child, f"{name}.{key}" if name else key)

    def _check(self, m: nn.Module, name: str, key: str, t: Tensor) -> None:
        """``readable``'s test of one tensor ``m`` holds (a few attribute reads)."""
        dtensor = self.dtensor
        distributed = dtensor is not None and isinstance(t, dtensor)
        self.sharded = self.sharded or distributed
        reason = _unreadable(t, dtensor if distributed else None)
        if reason is not None:
            where = f"{name}.{key}" if name else key
            error = UnsupportedModelError if distributed else InvalidParameterError
            raise error(f"'{where}' ({type(m).__name__}) {reason}")


def _unreadable(t: Tensor, dtensor: type | None) -> str | None:
    """Why a tensor of a model cannot be read as numbers, or None (``dtensor``: the
    DTensor class when it is loaded)."""
    if dtensor is not None and isinstance(t, dtensor):
        mesh, placements = t.device_mesh, t.placements
        if mesh.ndim == 1 and all(p.is_shard(0) or p.is_replicate() for p in placements):
            return None
        return (f"is a DTensor placed as {placements} on a {mesh.ndim}-D mesh; pathlift "
                "reads DTensors split on dim 0 over one mesh dimension (FSDP2's fully_shard "
                "on a 1-D mesh) or replicated; gather it (full_tensor()) on a copy first")
    if t.is_meta:
        return ("is on the meta device (shapes without values); materialise the model "
                "first, e.g. model.to_empty(device='cpu') then load_state_dict(...)")
    if t.layout == torch.strided and t.numel() and \
            t.untyped_storage().nbytes() < t.numel() * t.element_size() and \
            t.untyped_storage().nbytes() < (t.storage_offset() + sum(
                (n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1
            ) * t.element_size():  # the fast test first: smaller than a dense copy
        return ("has no memory behind it (freed storage, as FSDP1 leaves its parameters "
                "outside forward, or a ZeRO-style partition); measure the model where its "
                "parameters are gathered, or a copy loaded from a state_dict")
    return None


def is_fsdp1(model: nn.Module) -> bool:
    """Whether ``model`` holds FullyShardedDataParallel (FSDP1) wrappers."""
    fsdp1 = _loaded("torch.distributed.fsdp", "FullyShardedDataParallel")
    return fsdp1 is not None and any(isinstance(m, fsdp1) for m in model.modules())


def _fsdp1_view(model: nn.Module, fsdp1: type) -> nn.Module:
    """``model`` with every FSDP1 wrapper replaced by the module it wraps (shallow copies
    along the way, made once per model; the layers are the model's own), when this rank
    holds the gathered parameters inside ``summon_full_params``; else
    UnsupportedModelError, one line."""
    how = ("measure inside `with FullyShardedDataParallel.summon_full_params(model, "
           "rank0_only=True, writeback=False):` on rank 0, or shard the model with "
           "torch.distributed.fsdp.fully_shard (FSDP2), which pathlift measures on every "
           "rank without gathering it")
    for m in model.modules():
        if not isinstance(m, fsdp1):
            continue
        if m.training_state.name != "SUMMON_FULL_PARAMS":
            raise UnsupportedModelError(
                f"{type(unwrap(model)).__name__} is wrapped in FullyShardedDataParallel "
                f"(FSDP1), whose parameters are flat shards outside summon_full_params; {how}")
        handle = m._handle
        if handle is not None and handle.is_sharded(handle.flat_param):
            raise UnsupportedModelError(
                "inside summon_full_params(rank0_only=True) this rank does not hold the "
                "gathered FSDP1 parameters (only rank 0 does); call pathlift on rank 0 "
                "inside the block")

    def view(m: nn.Module) -> nn.Module:
        if isinstance(m, fsdp1):
            return view(m._fsdp_wrapped_module)
        if not any(isinstance(c, fsdp1) for c in m.modules()):
            return m
        new = object.__new__(type(m))
        new.__dict__.update(vars(m))
        new._modules = {k: None if c is None else view(c) for k, c in m._modules.items()}
        return new

    found = _FSDP1_VIEWS.get(model)
    if found is None:  # one view per model: its graph stays cached while it lives
        found = _FSDP1_VIEWS[model] = view(model)
    return found


_FSDP1_VIEWS: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def dtype_device(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    """The floating dtype and device of the model's first floating parameter or buffer
    (float32 on the CPU for a model without any; an FSDP2 model's shards first, not the
    gathered parameters of a mixed-precision forward). Refuses a model on the meta
    device."""
    for t in (*sharded_parameters(model).values(), *model.parameters(),
              *model.buffers()):  # BatchNorm(affine=False): buffers only
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
    ``named_modules(remove_duplicate=False)``) rather than through generators. An FSDP2
    parameter counts as its shard: FSDP2 swaps the module's parameter for the gathered
    one in forward and back after, which changes nothing of the model's structure.
    """
    walk = _Walk(as_eval, check=False, shards=sharded_parameters(model))
    walk.visit(model, "")
    return tuple(walk.parts)


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
