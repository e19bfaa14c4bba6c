"""The training step's passes recorded once and replayed: per model, input shape and
setting, a ``Tape`` of the pass (``pathlift.lift.tape``) and a ``Watch`` of the model.

A call replays the tape while the watch sees the model as it was recorded: the same
modules (class, train/eval flag, hooks, instance-level forward, children, plain
attributes such as stride or eps) and the same tensors (each parameter the same object
with the same dtype, device and shape; each buffer the same dtype, device and shape).
That is what ``pathlift.graph.boundary.structure_key`` keys traced graphs on, compared in
place rather than rebuilt: a replaced, pruned (torch.nn.utils.prune) or parametrized
parameter, a ``.to(...)``, FSDP2 sharding, a swapped module or a train/eval flip each
record the pass again. Sharded (FSDP2) and FSDP1 models are walked at every call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from pathlift.graph import LayerGraph, unwrap
from pathlift.graph.boundary import is_fsdp1
from pathlift.graph.sharded import is_sharded_graph
from pathlift.lift.chain import Chain
from pathlift.lift.tape import Tape
from pathlift.lift.transpose import Transposed

__all__ = ["Watch", "recorded_chain", "replayed", "replayed_gradients"]

T = TypeVar("T")

_SCALARS = (bool, int, float, str, type(None))


def _plain(value: object) -> bool:
    """A configuration value compared by ``==`` without reading tensors."""
    if type(value) is tuple:
        return all(_plain(v) for v in value)
    return isinstance(value, _SCALARS)


class Watch:
    """The parts of a model a traced graph depends on, as they were (see the module); the
    modules held weakly (the cache of tapes is weak in the model).

    What is compared is one tuple, made by a function generated for the model (as
    ``pathlift.lift.program`` writes a tape): per module its class, train/eval flag,
    instance-level forward, hook ids, children and parameters (by id: the recorded ones
    are held, so no other object takes their id), buffer names and plain attributes;
    per parameter and buffer its dtype, device and shape."""

    def __init__(self, model: nn.Module):
        modules = list(model.modules())
        self._now = _snapshot(modules)
        self._held = [t for m in modules for t in (*m._modules.values(),
                                                   *m._parameters.values())]
        self._recorded = self._now()

    def unchanged(self) -> bool:
        """Whether every module and tensor is as it was recorded."""
        try:
            return self._now() == self._recorded  # a tuple: a NaN compares as itself
        except (AttributeError, KeyError):  # a module freed, a tensor or attribute removed
            return False


def _snapshot(modules: list[nn.Module]) -> Callable[[], tuple]:
    """The generated function giving the tuple ``Watch`` compares (see there)."""
    env: dict[str, Any] = {}
    lines, items = [], []
    for i, m in enumerate(modules):
        env[f"R{i}"] = weakref.ref(m)
        lines.append(f"m{i} = R{i}(); s{i} = m{i}.__dict__")
        items += [f"type(m{i})", f"m{i}.training", f"id(s{i}.get('forward'))",
                  *(f"tuple(s{i}[{name!r}])"
                    for name in ("_forward_hooks", "_forward_pre_hooks", "_buffers")),
                  *(f"tuple(map(id, s{i}[{name!r}].values()))"
                    for name in ("_modules", "_parameters")),
                  *(f"s{i}[{k!r}]" for k, v in vars(m).items()
                    if k[0] != "_" and k != "training" and _plain(v))]
    tensors = [(table, key) for m in modules for table in (m._parameters, m._buffers)
               for key, t in table.items() if t is not None]
    for j, (table, key) in enumerate(tensors):
        env[f"T{j}"], env[f"K{j}"] = table, key
        lines.append(f"t{j} = T{j}[K{j}]")
        items += [f"t{j}.dtype", f"t{j}.device", f"t{j}.shape"]
    source = ("def now():\n" + "".join(f"    {line}\n" for line in lines)
              + "    return (" + ", ".join(items) + ",)\n")
    exec(compile(source, f"<pathlift watch of {len(modules)} modules>", "exec"), env)
    return env["now"]


# Per model: (what, input shape) -> (the model's watch, its tape or None: walk each time,
# the compiled chain (``pathlift.lift.chain``: replays and gradients) or the tape's transpose
# for ``replayed_gradients`` or None: the tape, and autograd's gradients)
_PLANS: weakref.WeakKeyDictionary[
    nn.Module, dict[tuple, tuple[Watch, Tape | None, Chain | Transposed | None]]] = \
    weakref.WeakKeyDictionary()
_NONE: dict = {}  # the plans of a model not seen yet (never written)


def replayed(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None, what: tuple,
             run: Callable[[LayerGraph], T],
             graph_of: Callable[[Any, Sequence[int] | None], LayerGraph],
             gradient: bool = False) -> T:
    """``run(graph_of(model, input_shape))``: a pass of the graph, recorded at the first
    call for ``model``, ``input_shape`` and ``what`` and replayed while the model's
    ``Watch`` holds and the tape's scales fit (recorded again else); a tape that is a chain
    of dense layers runs as one compiled call (``pathlift.lift.chain``). Recorded in autograd
    whatever the caller's mode (a pass under ``no_grad`` writes into shared buffers),
    replayed in the caller's. A ``LayerGraph``, an unknown shape, FSDP1 and sharded
    models are walked at each call. ``gradient``: ``run`` gives a tuple ending with a
    0-dim tensor and the list of leaves it was computed from, whose gradient
    ``replayed_gradients`` takes by the tape's transpose where it covers the tape."""
    if isinstance(model, LayerGraph) or input_shape is None:
        graph = graph_of(model, input_shape)
        with torch.enable_grad():
            return run(graph)
    net = unwrap(model)
    where = (*what, tuple(input_shape))
    known = _PLANS.get(net, _NONE).get(where)
    if known is not None and known[1] is not None and known[0].unchanged():
        out = (known[1] if gradient or known[2] is None else known[2]).replay()
        if out is not None:
            return out
    plans = _PLANS.setdefault(net, {})
    graph = graph_of(model, input_shape)
    watch = Watch(net)
    with torch.enable_grad():
        if is_fsdp1(model) or is_sharded_graph(graph):
            plans[where] = (watch, None, None)
            return run(graph)
        out, tape = Tape.record(lambda: run(graph), net)
    chain = Chain.of(tape, out) if tape is not None else None
    plans[where] = (watch, tape, chain or (_transposed(tape, out) if gradient and tape else None))
    return out


def recorded_chain(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                   what: tuple) -> Chain | None:
    """The compiled chain (``pathlift.lift.chain``) of the pass ``replayed`` recorded for
    ``model``, ``input_shape`` and ``what`` while the model's ``Watch`` holds, else None
    (not recorded yet, no chain, or the model changed: ``replayed`` records again)."""
    plan = _recorded_plan(model, input_shape, what)
    return plan if type(plan) is Chain else None


def _recorded_plan(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                   what: tuple) -> Chain | Transposed | None:
    """The chain or transpose recorded beside the tape of ``what`` while the model's
    ``Watch`` holds, else None."""
    if isinstance(model, LayerGraph) or input_shape is None:
        return None
    known = _PLANS.get(unwrap(model), _NONE).get((*what, tuple(input_shape)))
    return known[2] if known is not None and known[2] is not None \
        and known[0].unchanged() else None


def _transposed(tape: Tape, out: tuple) -> Transposed | None:
    """The transpose of a tape whose result ``out`` is a tuple of single leaves ending
    with (total, [leaves])."""
    slots = tape.result_slots()
    sources = [s for s in slots[len(out) - 1:] if s is not None]
    target = slots[len(out) - 2]
    if len(slots) != len(out) - 1 + len(out[-1]) or target is None \
            or len(sources) != len(out[-1]):
        return None
    return Transposed.plan(tape, sources, target)


def replayed_gradients(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None,
                       what: tuple, run: Callable[[LayerGraph], tuple],
                       graph_of: Callable[[Any, Sequence[int] | None], LayerGraph]
                       ) -> tuple[tuple, list[Tensor | None]]:
    """``(result, grads)``: ``result`` as ``replayed(..., gradient=True)`` gives it (a
    tuple ending with a 0-dim ``total`` and a list of ``leaves``) and d total / d leaf
    for each leaf (None where none flows): by the compiled chain (``pathlift.lift.chain``)
    or the tape's transpose without autograd (``pathlift.lift.transpose``) where one covers
    the recorded pass, else by autograd."""
    plan = _recorded_plan(model, input_shape, what)
    got = None if plan is None else plan.gradients()
    if got is not None:
        return got
    with torch.enable_grad():
        result = replayed(model, input_shape, what, run, graph_of, gradient=True)
        total, leaves = result[-2], result[-1]
        return result, list(torch.autograd.grad(total, leaves, allow_unused=True))
