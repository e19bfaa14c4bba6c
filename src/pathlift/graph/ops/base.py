"""What every operation of the op table shares: its kind, its traits, one concrete call,
and the registry that maps torch modules, functions and methods to operations.

An operation (a ``Handler``) says which kind of DAG neurons it makes (thesis Def. 2.2.2)
and carries its traits as data; passes dispatch on the kind to one hook each
(``pathlift.graph.walk.OpWalker``) and read the traits, never the class. What a pass asks
of an op is a ``typing.Protocol`` next to that pass (``AbsPowLayer`` of the |theta|^q pass,
``LiveLayer`` of the differentiable pass, ``RescalableLayer`` of rescaling,
``ChannelLayer`` of the channel analysis, ``PermutableLayer`` of permutation,
``QuantizableOp`` of quantisation); validation (``problem``, ``training_problem``,
``resolve``) is here; each family's module implements them (``FixedLinear`` for
pooling-like maps, ``Activation`` for piecewise-linear activations, ``AffineHandler`` for
layers with parameters).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

import torch
from torch import Tensor, fx, nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.boundary import assign_, local, param


class Kind(Enum):
    """How an op maps to the neurons of Def. 2.2.2; each kind is one hook of a pass."""

    AFFINE = "affine"  # identity neurons with parameters: Linear, Conv, ConvTranspose, BatchNorm
    RELU = "relu"  # the ReLU activation of the neurons it follows
    ACTIVATION = "activation"  # a piecewise-linear activation, lowered to ReLU/identity neurons
    MAXPOOL = "maxpool"  # 1-max-pool neurons, weights 1, bias 0
    POOL = "pool"  # parameter-free identity neurons with fixed weights (pooling, resampling)
    ADD = "add"  # residual sum: skip edges with weight 1
    CAT = "cat"  # concatenation along a non-batch dim (U-Net skips)
    RESHAPE = "reshape"  # relabelling or selection of neurons (view, permute, slicing, ...)
    IDENTITY = "identity"  # no neuron at all (Identity, eval Dropout, contiguous)
    SHAPE = "shape"  # python-level values (sizes, shape arithmetic, picking from a tuple)


@dataclass(frozen=True)
class Call:
    """One concrete call of a node: its fx node, submodule (if any), and unwrapped args."""

    node: fx.Node
    module: nn.Module | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self, *args: Any) -> Any:
        """Run the original op, with ``args`` replacing the leading positional arguments."""
        new_args = tuple(args) + tuple(self.args[len(args) :])
        if self.module is not None:
            return self.module(*new_args, **self.kwargs)
        if self.node.op == "call_method":
            return getattr(new_args[0], self.node.target)(*new_args[1:], **self.kwargs)
        return self.node.target(*new_args, **self.kwargs)

    def replace(self, *args: Any) -> Call:
        """The same call with ``args`` replacing its leading positional arguments."""
        return Call(self.node, self.module, tuple(args) + tuple(self.args[len(args):]),
                    self.kwargs)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """A call argument given either positionally or by keyword."""
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(name, default)

    @property
    def label(self) -> str:
        """The node as errors name it: a module's qualified name, else the node name."""
        return str(self.node.target) if self.node.op == "call_module" else self.node.name


class Handler:
    """One supported operation: its kind, its traits, and why a call is refused.

    Traits (class attributes, data read by passes):
    ``creates_neurons`` the op makes neurons of its own (Def. 2.2.2);
    ``aliases_input`` its result may be a view of its input;
    ``idempotent`` applying it twice equals applying it once (ReLU);
    ``in_place`` it may overwrite its input (``inplace=True``, ``relu_``, ``add_``);
    ``folds`` an affine neuron right after an affine layer (eval BatchNorm), merged into
    it when layers are counted;
    ``family`` the op family it is listed under in messages and the docs' table;
    ``fixed_l1_exceeds_one`` the neurons it makes have fixed incoming weights and biases
    whose l1 norm exceeds 1 (True), never does (False), or depends on the call (None:
    ``FixedLinear.abs_pow`` at q = 1 says), which rules out the premise of Lemma F.3;
    ``contiguous_backward`` autograd through it needs a contiguous input; ``diagonal``
    each neuron it makes reads only its own input channel (eval BatchNorm); ``parametric``
    the op has parameters of its own (``Parametric``); ``live`` (ops with parameters) the
    differentiable pass reads its parameters in autograd.

    Traits of the DAG the structure passes read (``pathlift.graph.structure``):
    ``layer_on_path`` every path through the op crosses one layer of the neurons it makes,
    each with incoming weights (learned or fixed): the depth D = L + 1 of paper 002 Lemma
    F.3 is the most such layers on one path (affine layers, pooling and resampling; not
    activations, whose lowering is a sub-DAG of their own);
    ``maxpool`` its neurons are the 1-max-pool neurons of Def. 2.2.2: their largest window
    is the K, their presence makes P = 1 and their layers are the M of Thm 4.4.1 / Remark
    4.4.1;
    ``absorbs_folds`` a ``folds`` op right after it (x*a + c) merges into its neurons'
    weights and biases, the two making one layer of neurons (the depth D of Thm 4.4.1);
    ``dense_rows`` y = x W^T + b over the input's last dim, one row of a dense W per
    neuron: a layer of a layered fully connected network (Def. 2.1.1), which reads every
    leading dim as a separate input;
    ``derived`` its DAG parameters (Def. 2.2.2) are computed from its stored parameters and
    running statistics (eval BatchNorm's x*a + c), so a pass that needs them reads the
    op's ``dag_parameters`` / ``live_parameters``, never the stored tensors.
    """

    kind: ClassVar[Kind] = Kind.IDENTITY
    note: str = ""  # what of the op is supported, for the docs' table (``register``)
    creates_neurons: ClassVar[bool] = False
    aliases_input: ClassVar[bool] = False
    idempotent: ClassVar[bool] = False
    in_place: ClassVar[bool] = False
    folds: ClassVar[bool] = False
    family: ClassVar[str] = "structure"
    parametric: ClassVar[bool] = False
    live: ClassVar[bool] = False
    fixed_l1_exceeds_one: ClassVar[bool | None] = False
    contiguous_backward: ClassVar[bool] = False
    diagonal: ClassVar[bool] = False
    layer_on_path: ClassVar[bool] = False
    maxpool: ClassVar[bool] = False
    absorbs_folds: ClassVar[bool] = False
    dense_rows: ClassVar[bool] = False
    derived: ClassVar[bool] = False

    def __init__(self, name: str):
        self.name = name

    def problem(self, call: Call) -> str | None:
        """Why this call is outside the supported model, or None. Decided from shapes,
        module settings and non-tensor arguments only: ``call`` may hold meta tensors."""
        return None

    def traced_through(self, module: nn.Module) -> bool:
        """Whether the tracer records this module's ``forward`` op by op rather than as
        one call of the op: its settings make it a composition of ops of the table (a
        convolution with reflect padding is ``F.pad`` and an unpadded convolution)."""
        return False

    def training_problem(self, module: nn.Module) -> str | None:
        """Why the op's module in training mode (``module.training``) computes outside
        Def. 2.2.2 (batch statistics, randomness), or None: asked instead of nothing by
        validation for every module in training mode, so that no pass lists the ops that
        behave differently in training."""
        return None

    def resolve(self, call: Call) -> Handler:
        """The handler of this concrete call (validation time): one torch callable can be
        several operations (``x[:, 1:]`` slices neurons, ``sizes[1]`` picks a number)."""
        return self

    def mutates(self, node: fx.Node, module: nn.Module | None) -> bool:
        """Whether this node overwrites its first input (only for ``in_place`` ops)."""
        if not self.in_place:
            return False
        if node.op == "call_module":
            return bool(getattr(module, "inplace", False))
        if node.op == "call_method":
            return str(node.target).endswith("_")
        name = getattr(node.target, "__name__", "")
        if "inplace" in node.kwargs:
            return bool(node.kwargs["inplace"])
        return name.endswith("_") or any(a is True for a in node.args[1:])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.kind.value})"


class Parametric:
    """Mixin of operations with parameters of their own (layers, PReLU's slopes): what
    quantisation rounds, how the rounded values are written back, and whether the values
    are usable. ``parametric`` is the trait passes read; ``scored``: its parameters are
    coordinates of theta that pruning may zero; ``live``: the differentiable pass reads its
    parameters in autograd (``AffineHandler.live_magnitudes``), else as constants."""

    parametric: ClassVar[bool] = True
    scored: ClassVar[bool] = True

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        """(name, effective value, per-channel dim) of every tensor quantisation rounds."""
        names = [n.removesuffix("_orig") for n, _ in module.named_parameters(recurse=False)]
        return [(name, param(module, name), None) for name in names]

    def rank_one_input(self, x: Tensor) -> Tensor | None:
        """v with d<g, apply(x, W)>/dW = g v^T for every output gradient g, when the
        weight gradient is that outer product (a Linear layer on one row), else None.
        Lets a caller scale a huge weight by its gradient without forming it."""
        return None

    def row_split(self, module: nn.Module) -> str | None:
        """What the rows of its parameters are when they are split across ranks (dim-0
        shards, ``pathlift.graph.sharded``): None, they are gathered whole (layers say
        more, ``AffineHandler.row_split``)."""
        return None

    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        """(weights, bias) of the op's neurons in the DAG of Def. 2.2.2, up to sign."""
        return param(module, "weight"), param(module, "bias")

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        """Make the op compute with the rounded ``values`` of ``quantizable``."""
        for name, value in values.items():
            assign_(module, name, value)

    def unwritable(self, what: str) -> str | None:
        """Why ``what`` (prune, rescale, ...) cannot write the op's DAG parameters through
        its stored tensors (a weight its module computes in forward), or None."""
        return None

    def value_problem(self, module: nn.Module) -> str | None:
        """Why the op's values make it unusable (NaN or inf), or None."""
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if tensor.is_floating_point() and not all_finite(tensor):
                return f"parameter '{name}' holds NaN or inf; fix or reload the weights"
        return None


def refuse_unwritable(handlers: Iterable[Handler], what: str) -> None:
    """UnsupportedModelError (one line, saying why) when ``what`` (prune, rescale, ...)
    cannot write the DAG parameters of one of these ops through its stored tensors."""
    for handler in handlers:
        reason = handler.unwritable(what) if isinstance(handler, Parametric) else None
        if reason is not None:
            raise UnsupportedModelError(reason)


def all_finite(t: Tensor) -> bool:
    """No NaN or inf in ``t``: its min and max propagate both, and need no mask of t's size
    (allocating one costs more than reading t for large layers)."""
    t = local(t)  # a DTensor: this rank's shard
    if not t.numel():
        return True
    low, high = value_range(t)
    return math.isfinite(low) and math.isfinite(high)


_RANGES: ContextVar[dict[tuple, tuple[Tensor, float, float]] | None] = \
    ContextVar("pathlift_value_ranges", default=None)


@contextmanager
def reading_once() -> Iterator[None]:
    """Inside, ``value_range`` reads each tensor once: a call that checks every parameter's
    values and then takes each layer's units (``unit_of``) reads each weight once, not
    twice. The tensors read are kept until the block ends (so that no other tensor can
    take their memory and be mistaken for them)."""
    token = _RANGES.set({})
    try:
        yield
    finally:
        _RANGES.reset(token)


def value_range(t: Tensor) -> tuple[float, float]:
    """(min t, max t) of a non-empty tensor in one pass (NaN when t holds one), remembered
    inside ``reading_once`` by the memory, layout and version of ``t`` (a view or
    ``detach()`` of the same tensor is the same; an in-place update is not)."""
    memo = _RANGES.get()
    key = None
    if memo is not None and not torch.is_inference(t):  # inference tensors keep no version
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device, t._version)
        found = memo.get(key)
        if found is not None:
            return found[1], found[2]
    low, high = torch.aminmax(t.detach())
    found = (t, float(low), float(high))
    if key is not None:
        memo[key] = found
    return found[1], found[2]


class UnsupportedHandler(Handler):
    """An op known to be outside Def. 2.2.2: ``cause`` groups ops refused for one reason;
    ``instead`` names the family whose supported ops the message lists after it, read from
    the registry when the message is made (so a new op of the family is offered)."""

    family = "unsupported"

    def __init__(self, name: str, cause: str, instead: str = ""):
        super().__init__(name)
        self.cause, self.instead = cause, instead

    def problem(self, call: Call) -> str | None:
        if not self.instead:
            return self.cause
        return f"{self.cause} ({', '.join(supported_names(self.instead))})"


# --------------------------------------------------------------------------- lowerings


INPUT = "input"  # the activation a lowered functional call reads (a mark of ``Lowered``)


def fx_constant(node: object) -> bool:
    """Whether ``node`` reads a tensor torch.fx computed at trace time and keeps as a
    constant of the graph (``_tensor_constant0``: a buffer indexed in forward,
    ``torch.zeros(C)``), not a parameter or buffer of the model (the root's own read as
    ``gamma``, a submodule's as ``scale.gamma``)."""
    return isinstance(node, fx.Node) and node.op == "get_attr" and \
        str(node.target).startswith("_tensor_constant")


@dataclass(frozen=True)
class Operand:
    """A tensor of the calling module that a functional call reads: the module form's
    attribute ``role`` (``weight``, ``bias``, ``running_mean``...), as it is or transposed
    (``x @ self.weight.T``) by the attribute or method ``flip`` (``"T"``, ``"t"``...)
    with ``flip_args``; ``derived``: a tensor the module computes in forward from its own
    tensors (a standardised weight), read as computed (``pathlift.graph.functional``)."""

    role: str
    flip: str = ""
    flip_args: tuple[Any, ...] | None = None  # None: the attribute ``flip``, else a method
    derived: bool = False

    @property
    def transposed(self) -> bool:
        return bool(self.flip)

    def read(self, t: Tensor) -> Tensor:
        """The tensor as the call reads it, from the module's tensor ``t``."""
        if not self.flip:
            return t
        flipped = getattr(t, self.flip)
        return flipped if self.flip_args is None else flipped(*self.flip_args)


@dataclass(frozen=True)
class Lowered:
    """A functional call over its own module's tensors read as the op of the module class
    ``form`` (``F.linear(x, self.weight, self.bias)`` is ``nn.Linear``'s op): ``marks``
    says what each node among its arguments is (``INPUT`` or an ``Operand``; the other
    arguments are constants), ``settings`` the plain attributes of ``form`` the call fixes
    (stride, groups, eps, ...); ``checked`` those of them that passes also read off the
    calling module itself (rescaling a copy, quantisation), which must then hold the same
    value (the default given applies when the module has no such attribute; None: it must
    have it)."""

    handler: Handler
    form: type
    marks: dict[fx.Node, Any]
    settings: dict[str, Any]
    checked: dict[str, Any]


#: A reader per functional call that may be a layer: (node, meta value of a node) ->
#: ``Lowered``, a reason to refuse it, or None when the call is not a layer (a product of
#: two activations), found by the function or method name the node calls.
Reader = Callable[[fx.Node, Callable[[fx.Node], Any]], "Lowered | str | None"]
LOWERINGS: dict[Callable[..., Any] | str, Reader] = {}


def lower(functions: Iterable[Callable[..., Any] | str], reader: Reader) -> None:
    """Make ``reader`` say which functional calls of ``functions`` (torch functions or
    method names) are the op of a module form, over the calling module's own tensors."""
    for fn in functions:
        LOWERINGS[fn] = reader


#: Calls returning (values, indices) whose users read only the values (``.values``,
#: ``[0]``): the function of the same arguments returning those values, one op.
VALUES_OF: dict[Callable[..., Any] | str, Callable[..., Any]] = {}


# --------------------------------------------------------------------------- the registry

MODULES: dict[type, Handler] = {}
FUNCTIONS: dict[Callable[..., Any], Handler] = {}
METHODS: dict[str, Handler] = {}


def register(handler: Handler, modules: Iterable[type] = (),
             functions: Iterable[Callable[..., Any]] = (), methods: Iterable[str] = (),
             note: str = "") -> Handler:
    """Make ``handler`` the operation of these module classes (and their subclasses that
    inherit ``forward``), torch functions and tensor methods; ``note`` follows its name in
    the docs' table of supported operations (``supported_table``)."""
    if note:
        handler.note = note
    for cls in modules:
        MODULES[cls] = handler
    for fn in functions:
        FUNCTIONS[fn] = handler
    for name in methods:
        METHODS[name] = handler
    return handler


def handler_for(node: fx.Node, module: nn.Module | None) -> Handler | None:
    """The registered handler of a node, or None when the op is unknown. A module whose
    class is not registered takes the handler of the nearest registered base class whose
    ``forward`` it inherits (a subclass that only changes ``__init__``)."""
    if node.op == "call_module":
        forward = type(module).forward
        for cls in type(module).__mro__:
            if cls in MODULES:
                return MODULES[cls] if cls.forward is forward else None
        return None
    if node.op == "call_function":
        if _is_namedtuple(node.target):  # returning a namedtuple of tensors
            return FUNCTIONS.get(tuple)
        return FUNCTIONS.get(node.target)
    if node.op == "call_method":
        return METHODS.get(node.target)
    return None


def _is_namedtuple(target: object) -> bool:
    return isinstance(target, type) and issubclass(target, tuple) and hasattr(target, "_fields")


#: The families of supported operations, in the order the docs' table lists them: what
#: their forms are, and what they are as neurons of Def. 2.2.2.
FAMILIES = {
    "layers": ("", "identity neurons with weights and a bias (a convolution shares its "
               "weights; an eval BatchNorm is x·a + c; a Kronecker-sparse layer is a chain "
               "of factor layers)"),
    "activations": ("modules, functions, methods, in place", "ReLU neurons, lowered as below"),
    "pooling": ("modules and functions, every option",
                "1-max-pool neurons; identity neurons with fixed weights 1/K"),
    "resampling": ("", "identity neurons with fixed weights, read off torch's own op"),
    "structure": ("", "edges of weight ±1 or c; relabelling creates no neuron"),
}


def _supported() -> dict[str, dict[str, tuple[list[str], Handler]]]:
    """family -> name stem -> (its 1d/2d/3d variants, its first handler), registry order."""
    families: dict[str, dict[str, tuple[list[str], Handler]]] = {}
    for handler in (*MODULES.values(), *FUNCTIONS.values(), *METHODS.values()):
        if handler.family == "unsupported":
            continue
        stem, dims = re.fullmatch(r"(.*?)([123]d)?", handler.name).groups()
        names = families.setdefault(handler.family, {}).setdefault(stem, ([], handler))[0]
        if dims and dims not in names:
            names.append(dims)
    return families


def _is_torch_name(label: str) -> bool:
    """A module, function or method name (Conv1d/2d/3d read as Conv1d), or a symbol (+/-),
    as opposed to a description (views and splits)."""
    names = {cls.__name__ for cls in MODULES} | set(METHODS) | {
        getattr(fn, "__name__", "") for fn in FUNCTIONS}
    return label.split("/")[0] in names or not any(c.isalpha() for c in label)


def _label(stem: str, dims: list[str]) -> str:
    return stem + "/".join(sorted(dims))


def supported_names(family: str) -> list[str]:
    """The supported operations of ``family`` (Conv1d/2d/3d as one), from the registry."""
    return [_label(stem, dims) for stem, (dims, _) in _supported().get(family, {}).items()]


def supported_summary() -> str:
    """The supported operations by family, generated from the registry (for messages)."""
    return "; ".join(f"{family}: " + ", ".join(supported_names(family))
                     for family in _supported())


def supported_table() -> str:
    """The docs' table of supported operations (docs/networks.md), generated from the
    registry: one row per family of ``FAMILIES``, each operation with its ``note``."""
    rows = ["| family | operations | as neurons of Def. 2.2.2 |", "|---|---|---|"]
    families = _supported()
    for family, (forms, neurons) in FAMILIES.items():
        ops = [(f"`{name}`" if _is_torch_name(name) else name)
               + ("" if not h.note or h.note.startswith("/") else " ") + h.note
               for name, h in ((_label(stem, dims), h)
                               for stem, (dims, h) in families.pop(family, {}).items())]
        rows.append(f"| {family} | {', '.join(ops)}{f' ({forms})' if forms else ''} | "
                    f"{neurons} |")
    if families:
        raise ValueError(f"families missing from FAMILIES: {sorted(families)}")
    return "\n".join(rows)
