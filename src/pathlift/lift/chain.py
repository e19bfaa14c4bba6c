"""A recorded |theta|^q pass that is a chain of dense layers, run with its gradient by one
compiled C call (``path_chain.c``): the training step's penalty and Path-SGD's gamma on an
MLP at the cost of arithmetic, not of one Python call per torch operation.

The pass of Thm 3.1.1 on an MLP is v_k = |W_k|^q v_{k-1} + |b_k|^q from v_0 = 1 and
T = sum_v o_v = sum_i v_L[i]; ln ||Phi||_q = (1/q) ln T. Its gradient is the chain run
backwards (g_L = 1/T, g_{k-1} = |W_k|^q^T g_k; d ln T / d|W_k|^q = g_k v_{k-1}^T, Thm
3.1.1 differentiated), which the C code computes in double with a scale per layer, so
nothing overflows between layers (``path_chain.c``).

``Chain.of(tape, out)`` recognises such a pass in a recorded tape
(``pathlift.lift.tape``): magnitudes |p|^q of the model's parameters (``abs``, ``square``,
their foreach forms, ``pow`` of an ``abs``; the leaves' ``detach`` and ``requires_grad_``),
a chain of ``linear`` calls on them from the all-ones input, the ``sum`` of the last, and
for the penalty ``log`` and scalar ``add``/``mul``/``div`` of it. Any other call (a prune
mask, a LeakyReLU's sub-DAG, BatchNorm, a convolution, a layer taken in a unit other
than 1) keeps the tape. The plan is kept only if the kernel gives the recorded value
(float64: 1e-12 relative). ``replay()`` is the penalty as one autograd node whose
forward computes the value and its gradient by one call and whose backward only scales
that gradient by the upstream one; ``gradients()`` gamma's d T / d|p|^q without
autograd (the contracts of ``Tape.replay`` and ``Transposed.gradients``). The kernel's
array of parameter addresses is built again only when a parameter's storage moves;
which parameters there are is ``pathlift.lift.replay.Watch``'s to check.
"""

from __future__ import annotations

import ctypes
import math
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pathlift.kron.cpu_kernel import compiled_library
from pathlift.lift.tape import Tape

__all__ = ["Chain"]

SOURCE = Path(__file__).with_name("path_chain.c").read_text()

# Calls making |p|^q of parameters: q by name (pow of an abs: its exponent)
_MAGNITUDES = {"_foreach_abs": 1.0, "abs": 1.0, "foreach_square": 2.0, "square": 2.0}
# Calls that change a tensor's autograd flags, not its values (the leaves of gamma's pass)
_ALIASES = frozenset({"detach", "requires_grad_"})
# Scalar maps of ln T after the log: (a, b) -> the affine map a ln T + b composed with it
_AFTER = {"add": lambda a, b, c: (a, b + c), "sub": lambda a, b, c: (a, b - c),
          "mul": lambda a, b, c: (a * c, b * c), "div": lambda a, b, c: (a / c, b / c)}
# Agreement with the recorded pass demanded of the kernel (relative, at least 1 absolute)
_AGREE = {torch.float32: 1e-4, torch.float64: 1e-12}

class _Kernel(NamedTuple):
    """The typed entry points of ``path_chain.c`` for one dtype."""

    chain: Any  # path_chain: ln T, and in modes 1 and 2 a gradient
    scale: Any  # path_chain_scale: a gradient times c, in place


def _library(dtype: torch.dtype) -> _Kernel | None:
    """``path_chain.c`` compiled for ``dtype`` and typed, or None (one warning)."""
    lib = compiled_library(SOURCE, "path_chain", dtype)
    if lib is None:
        return None
    ptr, long_, double = ctypes.c_void_p, ctypes.c_long, ctypes.c_double
    fn, scale = lib.path_chain, lib.path_chain_scale
    fn.argtypes = [long_, ptr, ptr, double, ctypes.c_int, double, double, ptr, ptr]
    fn.restype = ctypes.c_int
    scale.argtypes = [long_, ptr, ptr, double]
    scale.restype = None
    return _Kernel(fn, scale)


class Chain:
    """A tape recognised as a chain of dense layers (see the module), run by the kernel."""

    def __init__(self, tape: Tape, kernel: _Kernel, inputs: list[tuple[dict, str] | None],
                 widths: list[int], q: float, affine: tuple[float, float],
                 leaves: list[int] | None, dtype: torch.dtype):
        self.tape, self.kernel, self.q, self.affine, self.dtype = tape, kernel, q, affine, dtype
        self.inputs = inputs  # (table, key) of W_0, b_0, W_1, ... (None: no bias)
        self.present = [i for i, where in enumerate(inputs) if where is not None]
        self._where = [inputs[i] for i in self.present]
        self.layers = len(widths) - 1
        self.widths = (ctypes.c_long * len(widths))(*widths)
        # gamma: each leaf of the result as an index into the present parameters
        self.leaves = None if leaves is None else [self.present.index(i) for i in leaves]
        self._pointers = ctypes.c_void_p * len(inputs)
        # the kernel's array of the parameters, built again when one's storage moves
        self._at: tuple[int, ...] = ()
        self._array = self._pointers()

    @classmethod
    def of(cls, tape: Tape, out: Any) -> Chain | None:
        """The kernel's plan of ``tape`` (recorded with result ``out``), or None where the
        tape is no chain of dense layers, the kernel cannot be built, or it disagrees."""
        found = _recognise(tape)
        if found is None:
            return None
        inputs, widths, q, affine, leaves = found
        tensors = [None if w is None else w[0][w[1]] for w in inputs]
        dtype = tensors[0].dtype
        if any(t is not None and (t.dtype != dtype or t.device.type != "cpu"
                                  or t.dim() != (1 if i % 2 else 2)
                                  or t.shape[0] != widths[i // 2 + 1]
                                  or (i % 2 == 0 and t.shape[1] != widths[i // 2]))
               for i, t in enumerate(tensors)):
            return None
        kernel = _library(dtype) if dtype in _AGREE else None
        if kernel is None:
            return None
        plan = cls(tape, kernel, inputs, widths, q, affine, leaves, dtype)
        return plan if plan._agrees(out) else None

    def _agrees(self, out: Any) -> bool:
        """Whether the kernel gives the recorded pass's number (ln T's map, or T)."""
        if self._parameters() is None:
            return False
        ln = self._run(self._array)
        if self.leaves is None:
            mine, recorded = self.affine[0] * ln + self.affine[1], float(out.detach())
        else:
            mine, recorded = _exp(ln), float(out[-2].detach())
        if not (math.isfinite(mine) and math.isfinite(recorded)):
            return False
        return abs(mine - recorded) <= _AGREE[self.dtype] * max(1.0, abs(recorded))

    def _parameters(self) -> list[Tensor] | None:
        """The current W_0, b_0, ... (biases only where present), their addresses in
        ``_array``; None where one is no longer contiguous (the kernel reads rows)."""
        found = [table[key] for table, key in self._where]
        if not all(map(Tensor.is_contiguous, found)):
            return None
        at = tuple(map(Tensor.data_ptr, found))
        if at != self._at:  # a new storage (.data reassigned, .to(...)): new addresses
            self._array, self._at = self._addresses(found), at
        return found

    def _run(self, params: ctypes.Array, mode: int = 0, c: float = 1.0,
             into: ctypes.Array | None = None, a: float = 0.0) -> float:
        """ln T by the kernel on the parameters at ``params`` (``_addresses``); ``mode`` 1:
        c T^a d ln T / d p, 2: c d T / d|p|^q for each parameter p, written into the
        tensors at ``into``; 3: as 1, added to them where ln T is finite (``path_chain.c``)."""
        out = ctypes.c_double()  # one per call: the call runs without the GIL
        if self.kernel.chain(self.layers, self.widths, params, self.q, mode, c, a, into,
                             ctypes.byref(out)):
            raise MemoryError("pathlift.lift.chain: no memory for the pass's vectors")
        return out.value

    def _addresses(self, tensors: Sequence[Tensor]) -> ctypes.Array:
        """The kernel's array W_0, b_0, W_1, ... of ``tensors`` (NULL: no bias)."""
        if len(tensors) == len(self.inputs):  # every layer has its bias
            return self._pointers(*map(Tensor.data_ptr, tensors))
        found = self._pointers()
        for i, t in zip(self.present, tensors, strict=True):
            found[i] = t.data_ptr()
        return found

    def replay(self) -> Any:
        """The penalty a ln T + b on the current parameters: in autograd where grad mode is
        on and a parameter requires grad (one node, its gradient computed with the value,
        ``_Penalty``), else a plain number; the tape's replay where a parameter is no
        longer contiguous."""
        params = self._parameters()
        if params is None:
            return self.tape.replay()
        if torch.is_grad_enabled() and any(map(_REQUIRES_GRAD, params)):
            return _penalty(self, params)
        a, b = self.affine
        return torch.scalar_tensor(a * self._run(self._array) + b, dtype=self.dtype)

    def add_gradient(self, weight: float, exponentiate: bool) -> float | None:
        """The penalty y = a ln T + b (``exponentiate``: e^y) on the current parameters,
        weight times its gradient added to each parameter's ``.grad`` (a zero one where it
        is None; frozen parameters untouched) by one kernel call, without autograd. None,
        and nothing written, where autograd must do it: a parameter no longer contiguous
        or holding a tensor hook, a ``.grad`` that is not a plain dense tensor of the
        parameter's dtype, or a y that is not finite (the caller's refusal)."""
        params = self._parameters()
        if params is None:
            return None
        trained = [p for p in params if p.requires_grad]
        for p in trained:
            g = p.grad
            if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None) or (
                    g is not None and (g.layout != torch.strided or g.requires_grad
                                       or g.dtype != p.dtype or not g.is_contiguous())):
                return None
        made = [p for p in trained if p.grad is None]
        for p in made:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        into = self._pointers()  # NULL: a frozen parameter, not written
        for i, p in zip(self.present, params, strict=True):
            if p.requires_grad:
                into[i] = p.grad.data_ptr()
        a, b = self.affine
        c = weight * a * (math.exp(b) if exponentiate else 1.0)
        y = a * self._run(self._array, 3, c, into, a if exponentiate else 0.0) + b
        if not math.isfinite(y):  # nothing was added (path_chain.c)
            for p in made:
                p.grad = None
            return None
        return _exp(y) if exponentiate else y

    def gradients(self) -> tuple[Any, list[Tensor | None]] | None:
        """Gamma's pass: the tape's result (..., T, [|p|^q leaves]) and d T / d leaf, or
        None (record again) where T leaves the dtype's finite numbers or a parameter is
        no longer contiguous."""
        params = self._parameters()
        if params is None:
            return None
        with torch.no_grad():
            grads = [torch.empty_like(p) for p in params]
            ln = self._run(self._array, 2, 1.0, self._addresses(grads))
            total = torch.tensor(_exp(ln), dtype=self.dtype)
            if not 0 < float(total) < math.inf:
                return None
            mags = _magnitudes(params, self.q)
        flat = self.tape.result[0][:-len(self.leaves) - 1]
        return (*flat, total, [mags[i] for i in self.leaves]), [grads[i] for i in self.leaves]


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _exp(x: float) -> float:
    """e^x, inf beyond float64's range."""
    return math.exp(x) if x < 709.0 else math.inf


def _magnitudes(params: list[Tensor], q: float) -> list[Tensor]:
    """|p|^q of every tensor, as the tape made them."""
    if q == 2.0:
        return torch._foreach_mul(params, params)
    found = torch._foreach_abs(params)
    return found if q == 1.0 else torch._foreach_pow(found, q)


class _Penalty(torch.autograd.Function):
    """a ln T + b of a chain (``Chain.replay``) and its gradient a d ln T / d p, both by one
    kernel call in the forward into new tensors; the backward scales them by the upstream
    gradient in place (one more call) and hands them over: they are never written again.
    A second backward of the same graph (``retain_graph``) computes them anew from the
    parameters. Autograd's rules kept at a step's cost: a parameter changed in place
    since the forward is refused by its version counter (what ``save_for_backward``
    checks); under ``create_graph`` the gradient is ``once_differentiable``'s (a second
    derivative raises, never silently zero)."""

    @staticmethod
    def forward(ctx: Any, chain: Chain, *params: Tensor) -> Tensor:
        grads = [torch.empty_like(p) for p in params]
        ctx.chain, ctx.grads, ctx.at = chain, grads, chain._addresses(grads)
        ctx.params, ctx.versions = params, tuple(map(_VERSION, params))
        a, b = chain.affine
        return torch.scalar_tensor(a * chain._run(chain._array, 1, a, ctx.at) + b,
                                   dtype=chain.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():
            return _once(ctx, grad)
        return _gradients(ctx, grad)


def _gradients(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    """``_Penalty``'s backward (see there)."""
    chain: Chain = ctx.chain
    params = ctx.params
    if tuple(map(_VERSION, params)) != ctx.versions:
        raise RuntimeError(
            "pathlift.lift.chain: a parameter of the path-norm penalty was modified by an "
            "inplace operation after the penalty was computed; compute the penalty again "
            "after changing the parameters")
    c = grad.item()
    grads, ctx.grads = ctx.grads, None
    if grads is None:  # a second backward: the first one's tensors are the caller's
        grads = [torch.empty_like(p) for p in params]
        chain._run(chain._addresses(params), 1, chain.affine[0] * c, chain._addresses(grads))
    elif c != 1.0:
        chain.kernel.scale(chain.layers, chain.widths, ctx.at, c)
    return (None, *grads)


_once = once_differentiable(_gradients)
_VERSION = operator.attrgetter("_version")


def _penalty(chain: Chain, params: list[Tensor]) -> Tensor:
    """``_Penalty.apply(chain, *params)``, by autograd's C entry point where no functorch
    transform is active (``Function.apply``'s own checks are for those) and this torch
    has both (private: any other torch takes ``Function.apply``)."""
    if _APPLY is None or _TRANSFORMS_ACTIVE is None or _TRANSFORMS_ACTIVE():
        return _Penalty.apply(chain, *params)
    return _APPLY(chain, *params)


_APPLY = getattr(super(torch.autograd.Function, _Penalty), "apply", None)
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)


def _recognise(tape: Tape) -> tuple[list, list[int], float, tuple[float, float],
                                    list[int] | None] | None:
    """(inputs by position W_0, b_0, W_1, ...; widths; q; the affine map of ln T giving
    the result, or None for gamma's pass; gamma's leaves as positions) of a chain tape."""
    params = range(len(tape.inputs))
    magnitude: dict[int, tuple[int, float]] = {}  # slot -> (its parameter's slot, q)
    inputs: list[tuple[dict, str] | None] = []
    widths: list[int] = []
    positions: dict[int, int] = {}  # magnitude slot -> its position in ``inputs``
    vector = total = ln = None
    affine = (1.0, 0.0)
    for op in tape.ops:
        name = getattr(op.func, "__name__", "")
        slots = [slot for _, slot in op.refs]
        outs = [op.outs] if type(op.outs) is int else list(op.outs)
        extra = [a for j, a in enumerate(op.args) if j not in dict(op.refs)]
        if op.kwargs and not all(type(k) is str and k in dict(op.refs) for k in op.kwargs):
            return None
        if name in _MAGNITUDES and not extra and len(outs) == len(slots) \
                and all(s in params for s in slots):
            magnitude.update({o: (s, _MAGNITUDES[name]) for s, o in zip(slots, outs,
                                                                         strict=True)})
        elif name == "pow" and len(slots) == 1 and slots[0] in magnitude \
                and magnitude[slots[0]][1] == 1.0 and len(extra) == 1 \
                and type(extra[0]) is float and extra[0] >= 1:
            magnitude[outs[0]] = (magnitude[slots[0]][0], extra[0])
        elif name in _ALIASES and len(slots) == 1 and slots[0] in magnitude and not extra:
            magnitude[outs[0]] = magnitude[slots[0]]
        elif name == "linear" and all(a is None for a in extra) and len(slots) in (2, 3) \
                and total is None:  # linear(x, |W|^q, |b|^q) or linear(x, |W|^q, None)
            x, *pair = slots
            if x != vector and not (vector is None and _ones(tape, x)):
                return None
            if vector is None:
                widths.append(tape.constants[x].shape[-1])
            if any(s not in magnitude or s in positions for s in pair) \
                    or [j for j, _ in op.refs] != list(range(len(slots))):
                return None  # a magnitude used twice (tied weights): one leaf, two layers
            for s in (*pair, None)[:2]:
                if s is not None:
                    positions[s] = len(inputs)
                inputs.append(None if s is None else tape.inputs[magnitude[s][0]])
            table, key = inputs[-2]
            widths.append(table[key].shape[0])
            vector = outs[0]
        elif name == "sum" and slots == [vector] and not extra and total is None:
            total = outs[0]
        elif name == "log" and slots == [total] and not extra and ln is None:
            ln = outs[0]
        elif name in _AFTER and slots == [ln] and len(extra) == 1 and op.refs[0][0] == 0 \
                and type(extra[0]) in (int, float):
            affine, ln = _AFTER[name](*affine, float(extra[0])), outs[0]
        else:
            return None
    qs = {magnitude[s][1] for s in positions if s is not None}
    if total is None or len(qs) != 1:
        return None
    result = tape.result_slots()
    if ln is not None and result == [ln]:
        return inputs, widths, qs.pop(), affine, None
    leaves = [s for s in result if s is not None and s in magnitude]
    if ln is None and leaves and result[-len(leaves) - 1:] == [total, *leaves] \
            and result.count(None) == len(result) - len(leaves) - 1 \
            and all(s in positions for s in leaves):
        return inputs, widths, qs.pop(), affine, [positions[s] for s in leaves]
    return None


def _ones(tape: Tape, slot: int) -> bool:
    """Whether ``slot`` is a constant all-ones row (the pass's input)."""
    c = tape.constants.get(slot)
    return c is not None and c.dim() == 2 and c.shape[0] == 1 and bool((c == 1).all())

