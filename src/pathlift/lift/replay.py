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

import operator
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

__all__ = ["Watch", "replayed", "replayed_gradients"]

T = TypeVar("T")

_SCALARS = (bool, int, float, str, type(None))


def _plain(value: object) -> bool:
    """A configuration value compared by ``==`` without reading tensors."""
    if type(value) is tuple:
        return all(_plain(v) for v in value)
    return isinstance(value, _SCALARS)


class Watch:
    """The parts of a model a traced graph depends on, as they were (see the module); the
    modules held weakly (the cache of tapes is weak in the model)."""

    def __init__(self, model: nn.Module):
        self.modules = []
        for m in model.modules():
            state = vars(m)
            attrs = tuple(k for k, v in state.items()
                          if k[0] != "_" and k != "training" and _plain(v))
            read = _reader(attrs)
            self.modules.append((
                weakref.ref(m), type(m), m.training, tuple(m._forward_hooks),
                tuple(m._forward_pre_hooks), id(state.get("forward")), tuple(m._modules.values()),
                tuple(m._parameters.values()), tuple(m._buffers), read, read(state)))
        # parameters are the same objects (checked above), buffers are read where they are
        self.tensors = [(table, key, t.dtype, t.device, t.shape) for m in model.modules()
                        for table in (m._parameters, m._buffers)
                        for key, t in table.items() if t is not None]

    def unchanged(self) -> bool:
        """Whether every module and tensor is as it was recorded."""
        is_ = operator.is_
        for (ref, cls, training, hooks, pre_hooks, forward, children, params, buffers, read,
             values) in self.modules:
            m = ref()
            if m is None:
                return False
            state = vars(m)
            now_children, now_params = m._modules.values(), m._parameters.values()
            try:
                now_values = read(state)
            except KeyError:  # a plain attribute deleted
                return False
            if type(m) is not cls or m.training is not training \
                    or id(state.get("forward")) != forward \
                    or tuple(m._forward_hooks) != hooks \
                    or tuple(m._forward_pre_hooks) != pre_hooks \
                    or len(now_children) != len(children) \
                    or not all(map(is_, now_children, children)) \
                    or len(now_params) != len(params) or not all(map(is_, now_params, params)) \
                    or tuple(m._buffers) != buffers \
                    or now_values != values:  # a tuple: a NaN compares as itself
                return False
        for table, key, dtype, device, shape in self.tensors:
            t = table[key]
            if t is None or t.dtype != dtype or t.device != device or t.shape != shape:
                return False
        return True


def _reader(attrs: tuple[str, ...]) -> Callable[[dict], tuple]:
    """The function giving the values of ``attrs`` in a module's ``vars`` as a tuple
    (KeyError for a missing one)."""
    if len(attrs) > 1:
        return operator.itemgetter(*attrs)
    if attrs:
        get = operator.itemgetter(attrs[0])
        return lambda state: (get(state),)
    return lambda state: ()

# Per model: (what, input shape) -> (the model's watch, its tape or None: walk each time,
# the compiled chain (``pathlift.lift.chain``: replays and gradients) or the tape's transpose
# for ``replayed_gradients`` or None: the tape, and autograd's gradients)
_PLANS: weakref.WeakKeyDictionary[
    nn.Module, dict[tuple, tuple[Watch, Tape | None, Chain | Transposed | None]]] = \
    weakref.WeakKeyDictionary()


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
    plans = _PLANS.setdefault(net, {})
    where = (*what, tuple(input_shape))
    known = plans.get(where)
    if known is not None and known[0].unchanged() and known[1] is not None:
        out = (known[1] if gradient or known[2] is None else known[2]).replay()
        if out is not None:
            return out
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
    if not isinstance(model, LayerGraph) and input_shape is not None:
        known = _PLANS.get(unwrap(model), {}).get((*what, tuple(input_shape)))
        if known is not None and known[2] is not None and known[0].unchanged():
            got = known[2].gradients()
            if got is not None:
                return got
    with torch.enable_grad():
        result = replayed(model, input_shape, what, run, graph_of, gradient=True)
        total, leaves = result[-2], result[-1]
        return result, list(torch.autograd.grad(total, leaves, allow_unused=True))
