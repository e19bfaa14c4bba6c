"""A tape as one straight-line Python function: the recorded calls of a |theta|^q pass
(Thm 3.1.1) written out once, as ``torch.fx`` writes a graph's ``forward``, so a replay
pays for the calls and nothing else.

``Tape.run`` interprets its list of calls: per call it copies the argument template,
puts the slots in, dispatches the output and frees what no later call reads. For the
small networks a training step regularises (a few calls of a few microseconds each)
that interpretation costs as much as the calls. ``straight_line(tape)`` generates the
same sequence as source, each slot a local variable, each constant argument a global of
the function, each freed slot a ``del``: the same calls with the same arguments, so the
same numbers bit for bit. ``straight_line(tape, calls=True)`` also appends each call's
(args, kwargs, output) to a list, for the transpose's reverse loop
(``pathlift.lift.transpose``).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["LIST", "straight_line"]

LIST = "list"  # the nesting of a call whose one argument is a list of tensors (``Tape``)


def _flat(out: Any, n: int) -> Any:
    """The flat outputs of a call with several (a tuple or list of tensors as it comes)."""
    if type(out) in (list, tuple) and len(out) == n and all(type(v) is not tuple for v in out):
        return out
    return tree_flatten(out)[0]


def straight_line(tape: Any, calls: bool = False, aliases: Container[int] = ()
                  ) -> Callable[..., list[Any]]:
    """The tape's calls as generated code: a function of no argument (of the list
    receiving the calls, with ``calls=True``) giving every slot's value (those no later
    call reads None unless ``calls``). The calls of index in ``aliases`` give their first
    tensor argument's values (``detach``, ``requires_grad_`` in a run without autograd):
    their output is that argument and their logged call None."""
    env: dict[str, Any] = {"_flat": _flat}
    lines = []
    for i, (table, key) in enumerate(tape.inputs):
        env[f"T{i}"], env[f"K{i}"] = table, key
        lines.append(f"v{i} = T{i}[K{i}]")
    for index, value in tape.constants.items():
        env[f"C{index}"] = value
        lines.append(f"v{index} = C{index}")
    for i, ((func, args, kwargs, refs, nested, outs), done) in enumerate(
            zip(tape.ops, tape.frees, strict=True)):
        if i in aliases:
            lines.append(f"v{outs} = v{refs[0][1]}")
            lines += ["calls.append(None)"] if calls else []
            continue
        env[f"F{i}"] = func
        call_args, call_kwargs = _arguments(env, i, args, kwargs, refs, nested)
        if calls:  # the arguments kept for the transpose's rules
            lines.append(f"a = ({call_args}{',' if call_args else ''})")
            lines.append(f"k = {{{call_kwargs}}}")
            lines.append(f"o = F{i}(*a, **k)")
        else:
            keywords = f"**{{{call_kwargs}}}" if call_kwargs else ""
            lines.append(f"o = F{i}({', '.join(p for p in (call_args, keywords) if p)})")
        if type(outs) is int:
            lines.append(f"v{outs} = o")
        else:
            lines.append(f"o_ = _flat(o, {len(outs)})")
            lines += [f"v{slot} = o_[{j}]" for j, slot in enumerate(outs) if slot is not None]
        if calls:
            lines.append("calls.append((a, k, o))")
        elif done:
            lines.append("del " + ", ".join(f"v{slot}" for slot in done))
    freed = set() if calls else {slot for done in tape.frees for slot in done}
    lines.append("return [" + ", ".join("None" if s in freed else f"v{s}"
                                        for s in range(tape.slots)) + "]")
    source = "def run(calls=None):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(source, f"<pathlift tape of {len(tape.ops)} calls>", "exec"), env)
    return env["run"]


class _Slot:
    """Where a slot's tensor sits among a call's nested arguments (code generation)."""

    def __init__(self, slot: int):
        self.slot = slot


def _arguments(env: dict[str, Any], i: int, args: tuple, kwargs: dict[str, Any],
               refs: tuple, nested: Any) -> tuple[str, str]:
    """The source of call ``i``'s positional and keyword arguments: each slot a local,
    each container holding one a literal, anything else a global of the function."""
    if nested == LIST:  # a foreach call on a list of tensors
        return "[" + ", ".join(f"v{slot}" for _, slot in refs) + "]", ""
    placed = dict(refs)
    if nested is None:
        args = tuple(_Slot(placed[j]) if j in placed else a for j, a in enumerate(args))
        kwargs = {**kwargs, **{k: _Slot(s) for k, s in placed.items() if type(k) is str}}
    else:  # the flat leaves, slots put in, nested again
        args, kwargs = tree_unflatten([_Slot(placed[j]) if j in placed else a
                                       for j, a in enumerate(args)], nested)
    names = iter(range(1 << 30))

    def source(value: Any) -> str:
        if isinstance(value, _Slot):
            return f"v{value.slot}"
        if isinstance(value, (list, tuple)) and _holds_slot(value):  # fx's immutable_list too
            inner = ", ".join(source(v) for v in value)
            return f"({inner},)" if isinstance(value, tuple) else f"[{inner}]"
        name = f"A{i}_{next(names)}"
        env[name] = value
        return name

    return (", ".join(source(a) for a in args),
            ", ".join(f"{k!r}: {source(v)}" for k, v in kwargs.items()))


def _holds_slot(value: Any) -> bool:
    return any(isinstance(v, _Slot) or (isinstance(v, (list, tuple)) and _holds_slot(v))
               for v in value)
