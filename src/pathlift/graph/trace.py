"""Trace an ``nn.Module`` with torch.fx into a validated graph of supported operations
(``pathlift.graph.layer_graph``), once per model object: the graph is cached and reused
while the model's structure is unchanged (weights may change freely, the graph shares the
model's submodules). Validation (``pathlift.graph.validate``) runs on a meta copy of the
model and never touches the caller's tensors.
"""

from __future__ import annotations

import gc
import inspect
import os
import traceback
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx, nn

from pathlift.errors import PathliftError, Problem, ShapeError, UnsupportedModelError
from pathlift.graph import cache
from pathlift.graph.boundary import (
    Survey,
    eval_mode,
    meta_clone,
    readable,
    structure_key,
    survey,
)
from pathlift.graph.dataflow import ShapeOnly
from pathlift.graph.functional import (
    commute_scales,
    fold_shape_reads,
    lower_calls,
    select_values,
)
from pathlift.graph.input_shape import as_input_shape, resolve_input_shape
from pathlift.graph.layer_graph import LayerGraph, called, holder
from pathlift.graph.memory import check as check_memory
from pathlift.graph.ops import MODULES, Handler
from pathlift.graph.ops.selection import lower_where
from pathlift.graph.validate import (
    BATCH,
    classify,
    in_place_problems,
    validate,
    warn_leading_dimension,
)


@dataclass(frozen=True)
class CheckReport:
    """Every problem found in a model at once (empty when the model is supported)."""

    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if self.ok:
            return "model is supported"
        return "\n".join(str(p) for p in self.problems)



def graph_of(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
             as_eval: bool = False) -> LayerGraph:
    """The validated graph of ``model`` for ``input_shape`` (no batch dimension), traced
    once per model object and shape and reused while ``structure_key(model)`` is
    unchanged; a ``LayerGraph`` is returned as is while its model's structure is unchanged
    (else traced anew). Parameter values are not checked (see ``LayerGraph.check_values``).

    ``input_shape`` None takes the graph's own, else the one the model declares, never an
    earlier call's (``pathlift.graph.input_shape``). ``as_eval``: the graph of the model as in
    eval mode, what ``with eval_mode(model): graph_of(model)`` returns, but a cached graph
    is found without flipping any flag (the model is traced under ``eval_mode``).
    DDP, DataParallel and torch.compile are looked through; FSDP2 models are traced as
    their plain skeleton; FSDP1 only inside ``summon_full_params`` and tensors that cannot
    be read as numbers are refused (``pathlift.graph.boundary.readable``). An exception the
    forward raises from its own code on a plain call too (a missing key, a bad index) is
    raised as it is; Python control flow on tensor values is an UnsupportedModelError.
    """
    if isinstance(model, LayerGraph):
        if input_shape is not None and as_input_shape(input_shape) != model.input_shape:
            raise ShapeError(f"the graph was traced for input shape {model.input_shape}, "
                             f"not {tuple(input_shape)}")
        source = model.source() if model.source is not None else None
        if source is None or structure_key(source, as_eval) == model.key:
            readable(model.module)  # its tensors may be freed since (FSDP1 outside summon)
            return model
        return graph_of(source, model.input_shape, as_eval)
    found = survey(model, as_eval)
    model = found.module
    shape = resolve_input_shape(model, input_shape)
    cached = cache.lookup(model, shape)
    if cached is not None and cached.key == found.key:
        return cached
    if as_eval:
        with eval_mode(model):
            return graph_of(model, shape)
    with _collector_paused():
        graph = _trace(found, shape)
    check_memory(graph)  # MemoryLimitError before any pass allocates (pathlift.graph.memory)
    cache.remember(model, graph)
    return graph


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a graph is traced and validated:
    tracing makes tens of thousands of objects that live on (nodes, meta tensors, dataflow
    records), and the collections they set off walk every object of the process (up to half
    of a first call on timm's DenseNet-121). Reference counting still frees whatever is not
    in a cycle; the collector is restored as it was (a user's ``gc.disable()`` stays)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def trace(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None
          ) -> LayerGraph:
    """Trace and validate ``model`` (thesis Def. 2.2.2), parameters included. The model is
    not modified; the graph is cached (see ``graph_of``).

    Args:
        model: the network (plain, pruned, DDP-wrapped or compiled), or a ``LayerGraph``.
        input_shape: input size without the batch dimension; None takes the one the
            model declares (``pathlift.graph.input_shape``), else raises ShapeError.

    Returns:
        The ``LayerGraph``, which every public function accepts in place of the model.

    Raises:
        UnsupportedModelError listing every unsupported node (name, op, reason) or layer
        holding NaN/inf; ShapeError when an input of ``input_shape`` does not fit.

    Example::

        graph = trace(model, (3, 224, 224))
        path_norm(graph, q=2), path_magnitude_scores(graph)   # no second trace
    """
    graph = graph_of(model, input_shape)
    graph.check_values()
    return graph


def check(model: nn.Module, input_shape: Sequence[int] | None = None) -> CheckReport:
    """Every reason why ``model`` is outside the supported ReLU DAG model, all at once."""
    try:
        return CheckReport(tuple(graph_of(model, input_shape).value_problems()))
    except UnsupportedModelError as err:
        return CheckReport(tuple(err.problems))



# --------------------------------------------------------------------------- tracing


class _SizedProxy(fx.Proxy):
    """A proxy that knows its value on meta tensors at the traced input shape: its sizes
    are numbers (so Python control flow on shapes, ``torch._assert`` on ranks and "same"
    padding computed from the input size specialise at that shape), except the batch
    size, which stays a node of the graph."""

    @property
    def value(self) -> Any:
        return self.tracer.value_of(self.node)

    def size(self, dim: int | None = None) -> Any:
        if not isinstance(self.value, Tensor):
            self.tracer.asked = self.node  # a refusal that follows names why it is unknown
            return self.tracer.create_proxy("call_method", "size",
                                            (self,) if dim is None else (self, dim), {})
        if dim is None:
            return (self.size(0), *self.value.shape[1:])
        if dim % self.value.dim() == 0:
            return self.tracer.create_proxy("call_method", "size", (self, dim), {})
        return self.value.shape[dim]

    @property
    def shape(self) -> Any:
        return self.size()

    def dim(self) -> Any:
        if not isinstance(self.value, Tensor):
            self.tracer.asked = self.node
            return self.tracer.create_proxy("call_method", "dim", (self,), {})
        return self.value.dim()

    @property
    def ndim(self) -> Any:
        return self.dim()


class _Tracer(fx.Tracer):
    """torch.fx's default tracer (torch.nn modules are leaves), remembering where it failed.
    A user's subclass of a supported module that inherits its ``forward`` is a leaf too.

    Every proxy carries its value on meta tensors for ``example`` (``_SizedProxy``), found
    by running each recorded op on the values of its arguments, as torch.fx's
    experimental MetaTracer does; an op that cannot run on them leaves its proxy
    symbolic (the plain torch.fx behaviour), and ``unknown`` keeps, for each value so
    lost, the op that failed and its error, which the refusal of a trace that then fails
    names (``asked``: the last proxy whose shape was asked while unknown). Values are
    found when first asked for (a shape, a rank), running every op recorded until then in
    order: a model whose Python never reads a shape pays no meta run at all here
    (validation runs the graph anyway)."""

    def __init__(self, example: Tensor | None = None) -> None:
        super().__init__()
        self.failed_in: str | None = None
        self.example = example
        self.values: dict[fx.Node, Any] = {}
        self.pending: deque[tuple[fx.Node, str, Any, tuple, dict]] = deque()
        self.unknown: dict[fx.Node, tuple[fx.Node, Exception]] = {}
        self.asked: fx.Node | None = None
        self.raised_in_op: Exception | None = None  # what stopped an op run on meta values
        self._tables: dict[bool, dict[int, str]] = {}
        self._running = False
        self.shape_only = ShapeOnly()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        kind = type(m)
        forward, registered, handler = _LEAVES.get(kind, (None, -1, None))
        if forward is not kind.forward or registered != len(MODULES):
            forward, registered, handler = _LEAVES[kind] = kind.forward, len(MODULES), next(
                (MODULES[cls] for cls in kind.__mro__
                 if cls in MODULES and cls.forward is kind.forward), None)
        if handler is not None and handler.traced_through(m):
            return False
        return handler is not None or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        if self._running:  # a leaf's own submodules, run on meta values
            return forward(*args, **kwargs)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.path_of_module(m)
            raise

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        """torch.fx's, finding a parameter's name in a table made once (``_names``)."""
        if self._running:
            return attr_val
        if isinstance(attr_val, nn.Parameter) and not self.param_shapes_constant:
            name = self._names(True).get(id(attr_val))
            if name is not None:
                if name not in parameter_proxy_cache:
                    parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
                return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_arg(self, a: Any) -> Any:
        """torch.fx's, finding a parameter's or buffer's name in a table made once; a
        proxy (its node) and a plain constant (itself), most arguments, without fx's
        walk through every kind of value (what fx ends up returning for them)."""
        kind = type(a)
        if kind is _SizedProxy:
            return a.node
        if kind in _CONSTANTS:
            return a
        if kind is tuple:  # a call's arguments
            return tuple([self.create_arg(e) for e in a])
        if isinstance(a, Tensor):
            name = self._names(isinstance(a, nn.Parameter)).get(id(a))
            if name is not None:
                return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)

    def _names(self, parameters: bool) -> dict[int, str]:
        """{id: the qualified name torch.fx finds first} of the root's parameters (or
        buffers), made once per trace: torch.fx searches ``named_parameters()`` linearly at
        every read of a tensor attribute, quadratic in the model's size (most of a first
        call on timm's DenseNet, whose fused norm-activation layers read their own
        tensors). A tensor not in it (registered during the trace) is left to torch.fx."""
        found = self._tables.get(parameters)
        if found is None:
            found = self._tables[parameters] = {}
            named = self.root.named_parameters() if parameters else self.root.named_buffers()
            for name, t in named:
                found.setdefault(id(t), name)
        return found

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _SizedProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None,
                     proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr,
                                     proxy_factory_fn)
        if isinstance(proxy, fx.Proxy) and self.example is not None:
            self.pending.append((proxy.node, kind, target, args, kwargs))
        return proxy

    def value_of(self, node: fx.Node) -> Any:
        """``node``'s value on meta tensors, or None: the ops recorded before it run
        first, in the order they were recorded (an in-place op sees what ran before it)."""
        while node not in self.values and self.pending:
            done, *op = self.pending.popleft()
            self.values[done] = self._value(done, *op)
        return self.values.get(node)

    def _value(self, node: fx.Node, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        """The op's value on the meta values of its arguments, or None (an op that fails
        on them records why in ``unknown``; one whose argument is unknown, that cause)."""
        if kind == "placeholder":  # the input, or a specialised argument (its default)
            return node.args[0] if node.args else self.example
        unknown: list[fx.Node] = []

        def meta(a: Any) -> Any:
            if isinstance(a, fx.Proxy):  # an Attribute proxy too (``.T``)
                value = self.values.get(a.node)
                if value is None:
                    unknown.append(a.node)
                return value
            return a
        values = fx.node.map_aggregate(args, meta)
        kw = fx.node.map_aggregate(kwargs, meta)
        if unknown:
            cause = next((self.unknown[n] for n in unknown if n in self.unknown), None)
            if cause is not None:
                self.unknown[node] = cause
            return None
        self._running = self.shape_only.running = True
        try:
            if kind == "call_function":
                return target(*values, **kw)
            if kind == "call_method":
                return getattr(values[0], target)(*values[1:], **kw)
            if kind == "call_module":
                return self.root.get_submodule(target)(*values, **kw)
            if kind == "get_attr":
                owner, _, leaf = str(target).rpartition(".")
                return getattr(self.root.get_submodule(owner), leaf)
        except _META_FAILURES as err:  # an op meta tensors cannot run: its proxy stays symbolic
            self.unknown[node] = (node, err)
            return None
        except Exception as err:  # no such op (an assertion on values...): the trace stops
            self.raised_in_op = err
            raise
        finally:
            self._running = self.shape_only.running = False
        return None

    def unknown_cause(self) -> tuple[str, Exception | None]:
        """Why the last shape asked for was unknown, as a clause for a refusal, and the
        error of the op that could not run on meta tensors; ("", None) when none was."""
        cause = self.unknown.get(self.asked) if self.asked is not None else None
        if cause is None:
            return "", None
        failed, err = cause
        op = failed.target if isinstance(failed.target, str) else \
            getattr(failed.target, "__name__", str(failed.target))
        reason = str(err).splitlines()[0][:160] if str(err) else ""
        node = "" if failed.name == op else f" ('{failed.name}')"
        return (f"; a shape read there is unknown: `{op}`{node} cannot run on shape-only "
                f"tensors ({type(err).__name__}: {reason})"), err


#: The handler of a module class that is a supported op's class or a subclass inheriting
#: its ``forward``, else None (asked for every module call of every trace), with the
#: ``forward`` and the number of registered classes it was found for (``ops.register``
#: may add one).
_LEAVES: weakref.WeakKeyDictionary[type, tuple[Any, int, Handler | None]] = \
    weakref.WeakKeyDictionary()

#: What an op raises when it cannot run on shape-only (meta) values: no meta kernel or data
#: read from a meta tensor (RuntimeError, NotImplementedError), a Python function given a
#: tensor it cannot take (TypeError, ValueError, LookupError, AttributeError,
#: ArithmeticError). Anything else (an assertion, a PathliftError raised on purpose, a
#: user's own exception) is no such op: it stops the trace, and the refusal names it.
_META_FAILURES = (RuntimeError, TypeError, ValueError, LookupError, AttributeError,
                  ArithmeticError)


#: Arguments torch.fx records as they are (its ``base_types`` that need no lookup).
_CONSTANTS = frozenset({int, float, bool, str, type(None)})


def _symbolic_trace(model: nn.Module, example: Tensor | None = None) -> fx.Graph:
    tracer = _Tracer(example)
    try:
        with tracer.shape_only:  # the proxies' meta values at the cost of validation's runs
            graph = _at_defaults(tracer.trace(model, concrete_args=_defaults(model)))
    except PathliftError:  # raised on purpose by a wrapper's forward (an unknown output)
        raise
    except Exception as err:  # fx raises TraceError, TypeError, ... on dynamic Python
        _refuse_torchscript(model)
        where = tracer.failed_in or type(model).__name__
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(err, AssertionError) and err is not tracer.raised_in_op:
            # an assertion of the forward's own code on sizes, which are numbers here
            raise ShapeError(f"'{where}' asserts on the input's shape and fails at this one "
                             f"({reason}){_user_line(err)}; give the input shape it expects "
                             "(without the batch dimension)") from None
        if err is not tracer.raised_in_op and example is not None and \
                _raises_alone(model, example, err):
            raise  # the forward's own error (a missing key...), not control flow: theirs
        unknown, cause = tracer.unknown_cause()
        raise UnsupportedModelError([Problem(
            where or "<root>", "data-dependent control flow",
            f"torch.fx cannot trace it ({reason}){_user_line(err)}{unknown}; make the "
            "forward free of Python control flow on tensor values")]) from cause
    finally:
        tracer.root = None  # the tracer's closures must not keep the model alive
    return graph


def _refuse_torchscript(model: nn.Module) -> None:
    """UnsupportedModelError naming the first TorchScript module of ``model`` (the model
    itself, or a submodule made by ``torch.jit.script`` / ``torch.jit.trace``), whose
    forward is compiled code torch.fx cannot read: asked once a trace has failed."""
    scripted = next((name for name, m in model.named_modules()
                     if isinstance(m, torch.jit.ScriptModule)), None)
    if scripted is not None:
        raise UnsupportedModelError([Problem(
            scripted or "<root>", "TorchScript",
            f"{'submodule ' + repr(scripted) if scripted else 'the model'} is a TorchScript "
            "module (torch.jit.script / torch.jit.trace), whose compiled forward torch.fx "
            "cannot read; pass the eager module (script it after measuring)")]) from None


def _defaults(model: nn.Module) -> dict[str, Any] | None:
    """The optional arguments of ``model.forward`` after its input, at their defaults
    (timm's vision transformers: ``forward(x, attn_mask=None, is_causal=False)``):
    ``model(x)`` runs with them, so the trace specialises to them. None when there are
    none, or when an argument has no default (the one-input refusal then names them)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())[1:]
    except (TypeError, ValueError):  # a forward without a signature (a C function)
        return None
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not parameters or any(p.kind not in plain or p.default is inspect.Parameter.empty
                             for p in parameters):
        return None
    return {p.name: p.default for p in parameters}


def _at_defaults(graph: fx.Graph) -> fx.Graph:
    """``graph`` without the placeholders torch.fx keeps for specialised arguments
    (``concrete_args``) and the checks it adds on them, which nothing else reads: the graph
    of ``forward(x)``, the defaults in place."""
    for node in [n for n in graph.nodes if n.op == "placeholder"][1:]:
        checks = _readers(node)
        if all(n.op == "call_function" and n.target in _SPECIALISATION_CHECKS
               for n in checks if not n.users):
            for check in reversed(checks):
                graph.erase_node(check)
            graph.erase_node(node)
    return graph


def _readers(node: fx.Node) -> list[fx.Node]:
    """Every node computed from ``node``, in graph order."""
    found: dict[fx.Node, None] = {}
    stack = list(node.users)
    while stack:
        user = stack.pop()
        if user not in found:
            found[user] = None
            stack.extend(user.users)
    return sorted(found, key=lambda n: n._sort_key)


#: What torch.fx records to check a specialised argument's value (``concrete_args``).
_SPECIALISATION_CHECKS = (torch._assert, torch.fx._symbolic_trace._assert_is_none)


def _raises_alone(model: nn.Module, example: Tensor, err: Exception) -> bool:
    """Whether the forward raises ``err``'s type at ``err``'s line of the model's own code
    when simply called on the (meta) example, without torch.fx: an error of that code (a
    missing key, a bad index), not a value torch.fx cannot trace."""
    try:
        with torch.no_grad():
            model(example)
    except Exception as plain:  # the same exception at the same line, or something else
        return type(plain) is type(err) and _user_line(plain) == _user_line(err) != ""
    return False


def _user_line(err: Exception) -> str:
    """`` at file:line `code` `` of the innermost frame of the model's own code (outside
    torch and pathlift) where ``err`` was raised, or ""."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not any(part in f.filename for part in (f"{os.sep}torch{os.sep}",
                                                         f"{os.sep}pathlift{os.sep}"))]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {os.path.basename(frame.filename)}:{frame.lineno} `{(frame.line or '').strip()}`"


def _trace(found: Survey, shape: tuple[int, ...]) -> LayerGraph:
    """Trace and validate the meta copy of the model ``found`` (same structure and names;
    torch.fx runs the hooks of the modules it traces through, and those of FSDP would
    gather parameters), then bind the graph to the model's own modules."""
    model, dtype, device = found.module, found.dtype, found.device
    copies: dict[int, nn.Module] = {}
    clone = meta_clone(model, copies)
    graph = _symbolic_trace(clone, torch.empty((BATCH, *shape), dtype=dtype, device="meta"))
    fold_shape_reads(graph, clone)
    commute_scales(graph)
    lower_calls(graph, clone)
    select_values(graph)
    lower_where(graph)
    modules = called(clone, graph, modules={name: copies[id(m)]
                                             for name, m in found.modules.items()})[1]
    problems = classify(graph, modules) + in_place_problems(graph, modules)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UnsupportedModelError([Problem(
            "<inputs>", "forward signature",
            f"forward takes {len(placeholders)} inputs; pathlift needs exactly one tensor")])
    validate(graph, clone, shape, dtype, problems, modules)
    warn_leading_dimension(graph, shape)
    return LayerGraph(holder(model, graph, modules=found.modules), graph, shape, dtype, device,
                      weakref.ref(model), found.key)

