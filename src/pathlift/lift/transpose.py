"""The gradient of a recorded |theta|^q pass without autograd: the tape's calls replayed
as plain tensor code, then the same calls in reverse order, each through its adjoint
(``pathlift.lift.adjoint``): the pass's transpose, one Python loop each way.

Path-SGD's gamma_p = d||Phi||_q^q / d|p|^q (``magnitude_gradients``) is the gradient of
the pass's output sum with respect to its magnitudes A = |W|^q: with the forward vector
o_u and the backward vector b_v of an edge u -> v, d||Phi||_q^q / dA_vu = o_u b_v (Thm
3.1.1 differentiated), the outer products the ``linear`` adjoint forms. Autograd's
replay spends a node, saved tensors and a backward dispatch per call, and the leaves'
detach and requires_grad_; this loop only the calls.

``Transposed.plan(tape, sources, target)`` gives None (keep autograd's replay) for a
tape with a call that carries a gradient from the sources and has no adjoint (an
in-place update, an operation outside ``ADJOINTS`` or outside its rule's arguments).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pathlift.lift.adjoint import Rule, UncoveredError, adjoint_of
from pathlift.lift.program import straight_line
from pathlift.lift.tape import Tape

__all__ = ["Transposed"]

_Calls = list[tuple[Any, Any, Any]]
# Calls that change a tensor's autograd flags or stop its gradient, not its values (the
# leaves' detach and requires_grad_)
_ALIASES = frozenset({"requires_grad_", "retain_grad", "detach"})


def _name(func: Any) -> str:
    return getattr(func, "__name__", "")


class Transposed:
    """d target / d sources of a tape (slots: the inputs of the pass or tensors it makes,
    such as Path-SGD's leaves) as a reverse replay (see the module)."""

    def __init__(self, tape: Tape, sources: list[int], target: int,
                 steps: list[tuple[Rule | None, tuple[int, ...]]], aliases: set[int]) -> None:
        self.tape, self.sources, self.target, self.steps = tape, sources, target, steps
        # the forward, logging each call for the reverse loop; the calls that change
        # flags or stop gradients (detach, requires_grad_) pass their argument on
        self.program = straight_line(tape, calls=True, aliases=aliases)

    @classmethod
    def plan(cls, tape: Tape, sources: list[int], target: int) -> Transposed | None:
        """The transposed form, or None where it does not cover the tape (see the
        module): found once, by one trial run. The tape's result is a tuple of single
        leaves ending with the list of the sources (``replay.replayed_gradients``)."""
        live = set(sources)
        steps: list[tuple[Rule | None, tuple[int, ...]]] = []
        aliases = set()
        written = {op.refs[0][1] for op in tape.ops if op.refs and _name(op.func).endswith("_")
                   and _name(op.func) not in _ALIASES}  # updated in place: never aliased
        for i, (func, _, _, refs, _, outs) in enumerate(tape.ops):
            carried = tuple(sorted({slot for _, slot in refs if slot in live}))
            rule = adjoint_of(func) if carried else None
            name = _name(func)
            if name in _ALIASES and type(outs) is int and refs \
                    and not {outs, refs[0][1]} & written:  # flags; a gradient stop
                steps.append((None, ()))
                aliases.add(i)
                continue
            if carried and (rule is None or name.endswith("_")):
                return None  # no adjoint, or an in-place update of a carried tensor
            steps.append((rule, carried))
            if carried:
                live.update([outs] if type(outs) is int else [s for s in outs if s is not None])
        if target not in live:
            return None
        plan = cls(tape, sources, target, steps, aliases)
        try:
            plan.gradients()
        except UncoveredError:
            return None
        return plan

    def gradients(self) -> tuple[Any, list[Tensor | None]] | None:
        """The tape's result on the current parameters and d target / d source for each
        source (None: no path from it), or None to record the pass again (its scales no
        longer fit)."""
        with torch.no_grad():
            ran = self.forward()
            if ran is None:
                return None
            env, calls = ran
            return self._result(env), self.backward(env, calls, torch.ones_like(env[self.target]))

    def forward(self) -> tuple[list[Any], _Calls] | None:
        """The recorded calls on the current parameters (every slot kept, with each
        call's arguments and output for ``backward``), or None when the scales no longer
        fit. Call it under ``torch.no_grad()``."""
        calls: _Calls = []
        env = self.program(calls)
        return (env, calls) if self.tape.in_range(env) else None

    def _result(self, env: list[Any]) -> Any:
        """The result, a tuple (leaves..., total, [sources]): built from its flat leaves."""
        flat = [env[v] if v is not None else c for v, c in zip(
            self.tape.result_slots(), self.tape.result[0], strict=True)]
        head = len(flat) - len(self.sources)
        return (*flat[:head], flat[head:])

    def backward(self, env: list[Any], calls: _Calls, seed: Tensor) -> list[Tensor | None]:
        """d target / d source (times ``seed``, the gradient reaching the target) for each
        source, from a ``forward``: the recorded calls in reverse order, each through its
        adjoint."""
        grads: dict[int, Tensor] = {self.target: seed}
        for (rule, carried), call, op in zip(
                reversed(self.steps), reversed(calls), reversed(self.tape.ops), strict=True):
            if rule is None:
                continue
            args, kwargs, out = call
            outs = op.outs
            if type(outs) is int:
                g = grads.pop(outs, None)
                if g is None:
                    continue
            else:
                g = [None if s is None else grads.pop(s, None) for s in outs]
                if all(v is None for v in g):
                    continue
            slots = {id(env[s]): s for s in carried}
            for tensor, found in rule(args, kwargs, out, g, slots):
                slot = slots[id(tensor)]
                grads[slot] = grads[slot] + found if slot in grads else found
        return [grads.get(i) for i in self.sources]
