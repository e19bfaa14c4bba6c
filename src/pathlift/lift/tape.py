"""A pass over the graph, recorded once as the list of torch calls it made and replayed
as plain tensor code: the training step's |theta|^q pass (Thm 3.1.1) without the walk.

``Tape.record(fn, model)`` runs ``fn`` (a pass of the engine) under a
``TorchFunctionMode`` that notes every torch call: its function, its arguments (the
model's parameters and buffers as inputs, fetched anew at each replay; tensors made by an
earlier call as slots; anything else as a constant) and its outputs. ``replay()`` calls
the same functions on the current parameters, above autograd, so the result and its
gradient are those of the walk, number for number; the calls are written out once as a
straight-line Python function (``pathlift.lift.program``), so a replay pays for them alone.

The walk also reads numbers (``float(t.amax())``) to choose the powers of two that keep
its mantissas in range (log scales, layer units; ``pathlift.graph.abs_pow``); the tape
keeps the choices made at recording as constants. Every such choice scales exactly (the
value is mantissa * e^scale with both from the same choice), so a replay computes the
same number while the mantissas stay in range: ``replay`` reads the largest |t| of every
tensor the walk read, in one batched call, and gives ``None`` (record again) when one of
them moved by more than ``DRIFT`` binary orders, reached zero or left the finite numbers.
Calls that only fed such reads are not replayed; calls that depend on no input are not
either (their results are constants), nor calls that fill a tensor of an argument's shape
(``new_ones``).

What the pass wrote into a buffer (``out=``, ``copy_``) a replay writes into a new tensor,
so replays share no memory with other passes. A pass the tape cannot replay faithfully
is declined (``record`` gives ``None`` for the tape): another in-place call on a constant,
a read of something other than a peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from pathlift.lift.program import LIST, straight_line

__all__ = ["DRIFT", "Tape", "foreach_square"]

T = TypeVar("T")

#: A replay stands while the peak of every tensor the walk read lies within 2^(+-DRIFT)
#: of its peak at recording (the walk keeps mantissa peaks within 2^(+-16) of 1).
DRIFT = 8.0

# Calls that give a number read from a tensor's values (a choice of the walk).
_READS = frozenset({"__float__", "__int__", "__bool__", "__index__", "item", "tolist",
                    "equal", "is_nonzero"})
# Calls between a tensor and such a read: a peak of it (max |t|, its zero-ness).
_PEAK_CHAIN = frozenset({"detach", "amax", "max", "amin", "min", "aminmax", "abs", "eq",
                         "ne", "all", "any", "to", "float", "double"})


# Calls that give their argument back when it already has the asked dtype, layout...
_SAME = frozenset({"to", "contiguous", "type_as"})


def _fresh_copy(target: Tensor, source: Tensor, non_blocking: bool = False) -> Tensor:
    """``target.copy_(source)`` into a new tensor like ``target``."""
    return torch.empty_like(target).copy_(source, non_blocking)


# Calls whose values depend on their arguments' shapes alone: constants of the tape.
_FILLS = frozenset({"new_ones", "new_zeros", "new_full", "new_empty", "ones_like",
                    "zeros_like", "full_like", "empty_like"})
_LIST = LIST  # ``_Op.nested`` of a call whose one argument is a list of tensors


class _Op(NamedTuple):
    """One replayed call: ``func(*args, **kwargs)`` with the slots of ``refs`` put in
    (position in args, or keyword) and its tensor outputs stored in ``outs``."""

    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    refs: tuple[tuple[int | str, int], ...]
    nested: Any  # the args' pytree spec when tensors sit inside lists, _LIST, or None
    outs: Any  # one slot, or the output's pytree spec and its slots


class _Slot(NamedTuple):
    index: int


class _Recorder(TorchFunctionMode):
    """Notes each torch call as (function, flat arguments, spec, flat outputs, spec,
    whether it wrote into ``out=``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[Any], Any, list[Any], Any, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # a replay allocates what the pass wrote into ``out=`` (a workspace buffer)
        flat, spec = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))
        outs, out_spec = tree_flatten(out)
        self.calls.append((func, flat, spec, outs, out_spec, "out" in kwargs))
        return out


class Tape(Generic[T]):
    """A recorded pass (see the module's docstring): ``replay()`` is ``fn()`` again on the
    model's current parameters, or None when the walk's choices of scale no longer fit."""

    def __init__(self, inputs: list[tuple[dict[str, Any], str]], ops: list[_Op],
                 constants: dict[int, Tensor], slots: int, result: tuple[list[Any], Any],
                 peaks: list[int], reference: list[float], signless: bool):
        self.inputs, self.ops, self.constants, self.slots = inputs, ops, constants, slots
        self.result, self.peaks, self.reference = result, peaks, reference
        self.signless = signless  # the read tensors held no negative number (the pass's)
        kept = set(peaks) | {v.index for v in result[0] if isinstance(v, _Slot)}
        last = {slot: i for i, op in enumerate(ops) for _, slot in op.refs}
        frees: list[list[int]] = [[] for _ in ops]
        for slot, index in last.items():
            if slot not in kept:
                frees[index].append(slot)
        self.frees = [tuple(f) for f in frees]
        self._program: Callable[[], list[Any]] | None = None

    @classmethod
    def record(cls, fn: Callable[[], T], model: nn.Module) -> tuple[T, Tape[T] | None]:
        """``fn()`` and its tape, or None for a pass the tape declines (see the module)."""
        recorder = _Recorder()
        with recorder:
            result = fn()
        return result, _build(recorder.calls, model, result)

    def replay(self) -> T | None:
        """The recorded pass on the current parameters, or None to record it again."""
        env = self.run()
        return self.result_of(env) if self.in_range(env) else None

    def run(self) -> list[Any]:
        """The recorded calls on the current parameters: every slot's value (those no
        later call reads freed), by the tape written out as straight-line code
        (``pathlift.lift.program``) at first use."""
        if self._program is None:
            self._program = straight_line(self)
        return self._program()

    def result_of(self, env: list[Any]) -> T:
        """The pass's result from the slots of a run."""
        leaves, spec = self.result
        if spec.is_leaf():
            return env[leaves[0].index] if isinstance(leaves[0], _Slot) else leaves[0]
        return tree_unflatten([env[v.index] if isinstance(v, _Slot) else v for v in leaves],
                              spec)

    def result_slots(self) -> list[int | None]:
        """The slot of each leaf of the result, flattened (None: a constant)."""
        return [v.index if isinstance(v, _Slot) else None for v in self.result[0]]

    def in_range(self, env: list[Any]) -> bool:
        """Whether every read peak is within 2^(+-DRIFT) of its recorded one (zero and
        non-finite peaks must stay so): one batched max |t| and one read."""
        if not self.peaks:
            return True
        with torch.no_grad():
            tensors = [env[i] for i in self.peaks]
            found = torch._foreach_max(tensors if self.signless else torch._foreach_abs(tensors))
            peaks = [float(p) for p in found] if len(found) < 2 or len(
                {p.dtype for p in found}) > 1 else torch.stack(found).tolist()
        return all(_near(now, then) for now, then in zip(peaks, self.reference, strict=True))


def _near(peak: float, reference: float) -> bool:
    """``peak`` within 2^(+-DRIFT) of ``reference`` (both 0, or both the same non-finite)."""
    if peak == reference:
        return True
    if not (0 < peak < math.inf and 0 < reference < math.inf):
        return False
    return abs(math.log2(peak / reference)) <= DRIFT


def _inputs(model: nn.Module) -> dict[int, tuple[dict[str, Any], str]]:
    """Every tensor the model holds (parameters, buffers, tensor attributes such as
    torch.nn.utils.prune's masks), by id, with the table and key it is read from."""
    found: dict[int, tuple[dict[str, Any], str]] = {}
    for m in model.modules():
        for table in (m._parameters, m._buffers, vars(m)):
            for key, t in table.items():
                if isinstance(t, Tensor):
                    found.setdefault(id(t), (table, key))
    return found


class _Call(NamedTuple):
    """A recorded call that depends on an input: its tensors as record numbers."""

    func: Callable[..., Any]
    flat: list[Any]
    spec: Any
    args: list[int]
    outs: list[int | None]
    out_spec: Any


def _build(calls: list, model: nn.Module, result: Any) -> Tape | None:
    """The tape of ``calls`` (see the module's docstring), or None when it declines."""
    known = _inputs(model)
    number: dict[int, int] = {}  # id of a recorded tensor -> its record number
    tensors: list[Tensor] = []  # by record number (keeps every id from being reused)
    live: set[int] = set()  # record numbers that depend on an input
    producer: dict[int, int] = {}  # record number -> the call (index in ``made``) making it
    made: list[_Call] = []
    reads: list[int] = []

    def record(t: Tensor) -> int:
        if id(t) not in number:
            number[id(t)] = len(tensors)
            tensors.append(t)
            if id(t) in known:
                live.add(number[id(t)])
        return number[id(t)]

    for func, flat, spec, outs, out_spec, has_out in calls:
        name = getattr(func, "__name__", "")
        args = [record(v) for v in flat if isinstance(v, Tensor)]
        if name in _READS:
            reads.extend(a for a in args if a in live)
            continue
        if not any(isinstance(o, Tensor) for o in outs):
            continue  # metadata (shape, dtype, data_ptr): fixed with the model's structure
        depends = name not in _FILLS and any(a in live for a in args)
        in_place = name.endswith("_") and not name.startswith("__")
        if (in_place or has_out) and not depends:
            return None  # an in-place call on a constant would compound at each replay
        if in_place and args and args[0] not in live:
            if name != "copy_":
                return None  # its result depends on what the constant held before
            func = _fresh_copy  # a copy into a constant (a buffer): into a new tensor
            number[id(outs[0])] = len(tensors)  # which is a tensor of its own from here
            tensors.append(outs[0])
        out_numbers = [record(o) if isinstance(o, Tensor) else None for o in outs]
        if depends:
            for o in out_numbers:
                if o is not None and o not in live:
                    live.add(o)
                    producer[o] = len(made)
            made.append(_Call(func, flat, spec, args, out_numbers, out_spec))
    peaks = []
    for r in reads:
        base = _peak_base(r, made, producer, known, tensors)
        if base is None or not tensors[base].is_floating_point():
            return None
        if base in producer and tensors[base].numel():
            peaks.append(base)  # a parameter's peak shows in the peak of the layer it enters
    return _assemble(made, tensors, live, known, sorted(set(peaks)), result, number)


def _peak_base(r: int, made: list[_Call], producer: dict[int, int],
               known: dict[int, Any], tensors: list[Tensor]) -> int | None:
    """The tensor whose peak a read of record ``r`` reads: back through the calls that
    take a peak (detach, amax, aminmax, abs, ==0, all...) to the tensor the pass uses;
    None when a read goes through another call."""
    while r in producer:
        call = made[producer[r]]
        name = getattr(call.func, "__name__", "")
        inner = [a for a in call.args if a in producer or id(tensors[a]) in known]
        if name not in _PEAK_CHAIN or len(inner) != 1:
            return r if name not in _PEAK_CHAIN else None
        r = inner[0]
    return r


def _assemble(made: list[_Call], tensors: list[Tensor], live: set[int],
              known: dict[int, tuple[dict[str, Any], str]], peaks: list[int], result: Any,
              number: dict[int, int]) -> Tape:
    """The calls the result and the peaks need, their tensors renumbered as slots: the
    inputs first, then constants and the calls' outputs."""
    leaves, spec = tree_flatten(result)
    needed = {number[id(v)] for v in leaves if isinstance(v, Tensor)} | set(peaks)
    kept = []
    for call in reversed(made):
        if any(o in needed for o in call.outs if o is not None):
            kept.append(call)
            needed.update(call.args)
    kept.reverse()
    kept = _batched(kept, tensors, known)
    inputs = sorted(r for r in needed if id(tensors[r]) in known)
    slot = {r: i for i, r in enumerate(inputs)}
    constants: dict[int, Tensor] = {}

    def slot_of(r: int) -> int:
        if r not in slot:
            slot[r] = len(slot)
            if r not in live:
                constants[slot[r]] = tensors[r]
        return slot[r]

    ops = []
    for call in kept:
        if getattr(call.func, "__name__", "") in _SAME and call.outs[0] in call.args:
            slot[call.outs[0]] = slot_of(call.outs[0])
            continue  # gave its argument back (a cast to its own dtype): so will a replay
        template, refs, numbers = list(call.flat), [], iter(call.args)
        for i, v in enumerate(call.flat):
            if isinstance(v, Tensor):
                template[i] = None
                refs.append((i, slot_of(next(numbers))))
        outs = [None if o is None else slot_of(o) for o in call.outs]
        ops.append(_op(call.func, template, call.spec, refs, outs, call.out_spec))
    result_leaves = [_Slot(slot_of(number[id(v)])) if isinstance(v, Tensor) else v
                     for v in leaves]
    with torch.no_grad():
        reference = [_peak(tensors[r]) for r in peaks]
        signless = all(bool((tensors[r] >= 0).all()) for r in peaks)
    return Tape([known[id(tensors[r])] for r in inputs], ops, constants, len(slot),
                (result_leaves, spec), [slot_of(r) for r in peaks], reference, signless)


def _batched(calls: list[_Call], tensors: list[Tensor], known: dict[int, Any]
             ) -> list[_Call]:
    """``calls`` with the |p| (q = 1) and p*p (q = 2) of parameters made in one foreach
    call each, where the first of them was: one autograd node instead of one a tensor
    (for networks of up to ``_FOREACH_NUMBERS`` parameters)."""
    groups: dict[str, list[_Call]] = {}
    for call in calls:
        name = getattr(call.func, "__name__", "")
        if name in _FOREACH and len(call.flat) == 1 and len(call.outs) == 1 \
                and id(tensors[call.args[0]]) in known:
            groups.setdefault(name, []).append(call)
    groups = {name: group for name, group in groups.items() if len(group) > 1 and sum(
        tensors[c.args[0]].numel() for c in group) <= _FOREACH_NUMBERS}
    merged = {id(group[0]): _foreach_call(name, group) for name, group in groups.items()}
    dropped = {id(c) for group in groups.values() for c in group[1:]}
    return [merged.get(id(c), c) for c in calls if id(c) not in dropped]


def _foreach_call(name: str, group: list[_Call]) -> _Call:
    """One ``torch._foreach_*`` call doing what the calls of ``group`` did."""
    flat = [c.flat[0] for c in group]
    spec = tree_flatten(((flat,), {}))[1]
    outs = [c.outs[0] for c in group]
    return _Call(_FOREACH[name], flat, spec, [c.args[0] for c in group], outs,
                 tree_flatten(list(range(len(group))))[1])


# Batched while the parameters fit a core's cache (~4 MB of float32): |W| made long before
# its layer runs would be read back from memory (ResNet-18's 11M weights)
_FOREACH_NUMBERS = 2 ** 20


def foreach_square(tensors: list[Tensor]) -> list[Tensor]:
    """t * t of every tensor in one foreach call (the q = 2 magnitudes)."""
    return torch._foreach_mul(tensors, tensors)


_FOREACH = {"abs": torch._foreach_abs, "square": foreach_square}


def _peak(t: Tensor) -> float:
    """max |t| (inf or nan as it comes)."""
    return float(t.detach().abs().amax().double())


def _op(func: Callable[..., Any], template: list[Any], spec: Any,
        refs: list[tuple[int, int]], outs: list[int | None], out_spec: Any) -> _Op:
    """A replayed call: tensors put in by position or keyword when no argument is a
    container (the common case), else into the flat arguments, unflattened."""
    call_args, call_kwargs = tree_unflatten(template, spec)
    out = outs[0] if out_spec.is_leaf() else tuple(outs)
    if not call_kwargs and len(call_args) == 1 and type(call_args[0]) is list \
            and len(refs) == len(template):  # a foreach call on a list of tensors
        return _Op(func, (), {}, tuple(refs), _LIST, out)
    if len(call_args) + len(call_kwargs) == len(template) and not any(
            isinstance(a, (list, tuple, dict)) for a in (*call_args, *call_kwargs.values())):
        # no containers (a list of one tensor, cat([x], 1), flattens to as many leaves)
        names = list(call_kwargs)
        placed = tuple((i if i < len(call_args) else names[i - len(call_args)], slot)
                       for i, slot in refs)
        return _Op(func, tuple(call_args), call_kwargs, placed, None, out)
    return _Op(func, tuple(template), {}, tuple(refs), spec, out)
