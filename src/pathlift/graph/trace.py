"""Trace an ``nn.Module`` with torch.fx into a validated graph of supported operations,
once per model object: the graph is cached and reused while the model's structure is
unchanged (weights may change freely, the graph shares the model's submodules).

Validation runs on shape-only tensors (the meta device, on a meta copy of the model), so
it costs a fraction of one forward pass and never touches the caller's tensors:

1. every node gets the handler of its op (``ops.py``) or a problem naming it;
2. in-place ops whose overwritten tensor is read again are refused (the graph passes
   treat every op as pure);
3. the graph runs at batch 2 on meta tensors: each handler judges its concrete call, every
   node keeps dim 0 as the batch, and the output shape of every node is recorded;
4. the model's own ``forward`` runs on the same meta tensors, and the aten operations of
   both runs, with the operation that last wrote each tensor they read, must agree.
   This catches what torch.fx cannot see: ``h += y`` recorded out of place while an alias
   of ``h`` is read later, hooks on the root module or on a layer that change the result.
"""

from __future__ import annotations

import math
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.fx.passes.shape_prop import TensorMetadata
from torch.nn.utils import prune
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pathlift.errors import (
    LeadingDimensionWarning,
    PathliftError,
    Problem,
    ShapeError,
    UnsupportedModelError,
)
from pathlift.graph.boundary import (
    dtype_device,
    eval_mode,
    is_sharded,
    meta_clone,
    readable,
    structure_key,
    unwrap,
)
from pathlift.graph.collectives import all_objects
from pathlift.graph.memory import check as check_memory
from pathlift.graph.ops import (
    MODULES,
    BatchNormHandler,
    Call,
    Handler,
    Kind,
    UnsupportedHandler,
    handler_for,
    supported_summary,
)

HANDLER = "pathlift_handler"
_BATCH = 2  # validation batch: a size that exposes reshapes across the batch dimension


@dataclass(frozen=True, eq=False)
class LayerGraph:
    """A traced model whose every node has a registered handler and a known output shape.

    ``graph`` is the torch.fx graph; ``module`` holds the submodules it calls under their
    qualified names (the model's own modules, so their current weights), as a torch.fx
    ``GraphModule`` would, without its generated code and its reference cycle (a graph of
    a large model must free it as soon as the model goes). ``model`` is the traced model
    itself while it exists. ``derived`` keeps what passes compute from the structure alone
    (the channel map) with the graph; those with a ``rebind(graph)`` method
    carry over to the graph of a copy (``bind``).
    """

    module: nn.Module
    graph: fx.Graph
    input_shape: tuple[int, ...]
    dtype: torch.dtype = field(default=torch.float32)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    source: weakref.ref | None = field(default=None, repr=False)
    key: tuple = field(default=(), repr=False)
    derived: dict[str, Any] = field(default_factory=dict, repr=False)
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def model(self) -> nn.Module:
        model = self.source() if self.source is not None else None
        if model is None:
            raise ValueError("the model this graph was traced from no longer exists")
        return model

    @property
    def owner(self) -> nn.Module:
        """The traced model (which holds FSDP2's states) while it exists, else the graph's
        own table of the layers it calls (a graph bound to a copy that is gone)."""
        model = self.source() if self.source is not None else None
        return self.module if model is None else model

    def nodes(self) -> Iterator[fx.Node]:
        """Operation nodes in topological order (placeholder and output excluded)."""
        return (n for n in self.graph.nodes if n.op not in ("placeholder", "output"))

    def handler(self, node: fx.Node) -> Handler:
        return node.meta[HANDLER]

    def submodule(self, node: fx.Node) -> nn.Module | None:
        """The module a ``call_module`` node calls (looked up once per node), else None."""
        if node.op != "call_module":
            return None
        module = self._memo.get(node)
        if module is None:
            module = self._memo[node] = self.module.get_submodule(node.target)
        return module

    def last_uses(self) -> dict[fx.Node, list[fx.Node]]:
        """For each node, the nodes whose value it reads last (what torch.fx's Interpreter
        frees after running it), found once per graph."""
        found = self._memo.get("last_uses")
        if found is None:
            last: dict[fx.Node, fx.Node] = {}
            found = self._memo["last_uses"] = {}
            for node in reversed(self.graph.nodes):
                for n in node.all_input_nodes:
                    if n not in last:
                        last[n] = node
                        found.setdefault(node, []).append(n)
        return found

    def layers(self, kind: Kind = Kind.AFFINE) -> list[tuple[str, nn.Module]]:
        """(qualified name, module) of every module node of the given kind, in order."""
        return [(n.target, self.submodule(n)) for n in self.nodes()
                if self.handler(n).kind is kind and n.op == "call_module"]

    def affine_nodes(self) -> list[fx.Node]:
        """The nodes of layers with parameters, in topological order."""
        return [n for n in self.nodes() if self.handler(n).kind is Kind.AFFINE]

    def parametric_nodes(self) -> list[fx.Node]:
        """The nodes of ops with parameters of their own (layers, PReLU), in order."""
        return [n for n in self.nodes() if self.handler(n).parametric]

    def calls(self) -> dict[str, int]:
        """How many times each layer with parameters is called."""
        counts: dict[str, int] = {}
        for n in self.affine_nodes():
            counts[n.target] = counts.get(n.target, 0) + 1
        return counts

    def outputs(self) -> list[fx.Node]:
        """The nodes of the returned tensors, in order, a tensor returned twice twice (the
        fields of a returned namedtuple opened)."""
        out = next(n for n in self.graph.nodes if n.op == "output")
        return _tensor_nodes(out.args[0])

    @property
    def d_out(self) -> int:
        """Number of output neurons (batch 1), across every returned tensor."""
        return sum(math.prod(self.output_shape(n)) for n in self.outputs())

    def output_shape(self, node: fx.Node) -> tuple[int, ...]:
        """Shape of a node's output, without the batch dimension."""
        return tuple(node.meta["tensor_meta"].shape[1:])

    def example_input(self, batch: int = 1, dtype: torch.dtype | None = None) -> Tensor:
        return torch.zeros((batch, *self.input_shape), dtype=dtype or self.dtype,
                           device=self.device)

    def bind(self, model: nn.Module) -> LayerGraph:
        """The same graph over ``model``, a copy of the traced one (same structure): no
        tracing and no validation. The node handlers and shapes are shared."""
        model = unwrap(model)
        bound = LayerGraph(_holder(model, self.graph), self.graph, self.input_shape,
                           *dtype_device(model), weakref.ref(model), structure_key(model))
        bound.derived.update({k: v.rebind(bound) for k, v in self.derived.items()
                              if hasattr(v, "rebind")})  # structural results carry over
        _remember(model, bound)
        return bound

    def with_modules(self, replaced: dict[str, nn.Module]) -> LayerGraph:
        """The same graph calling ``replaced[target]`` in place of the module at each
        target (a pass's own view of a layer, such as its local shard); nothing else is
        copied."""
        return replace(self, module=_holder(self.module, self.graph, replaced))

    def value_problems(self) -> list[Problem]:
        """Every layer whose values make it unusable: NaN or inf parameters, a BatchNorm
        whose running_var + eps is not positive. Reads every parameter once."""
        problems, seen = [], set()
        for node in self.parametric_nodes():
            module = self.submodule(node)
            if id(module) in seen:
                continue
            seen.add(id(module))
            reason = self.handler(node).value_problem(module)
            if reason is not None:
                problems.append(Problem(node.target, type(module).__name__, reason))
        return problems

    def check_values(self) -> None:
        """Raise UnsupportedModelError naming every layer listed by ``value_problems``; on a
        sharded model every rank reads its shards and raises the problems of all ranks."""
        problems = self.value_problems()
        if is_sharded(self.owner):
            found = {str(p): p for ps in all_objects(problems) for p in ps}
            problems = list(found.values())
        if problems:
            raise UnsupportedModelError(problems)

    def differentiable_forward(self) -> GraphInterpreter:
        """The traced forward as a callable to run autograd through: every BatchNorm input
        is made contiguous first. torch 2.13's CPU eval BatchNorm backward returns a wrong
        input gradient for a channels-last input with a size-1 spatial dim, such as
        x.transpose(1, -1) of shape (1, 2, 3, 3, 1) (its forward is right)."""
        return _ContiguousBatchNorm(self)


class GraphInterpreter(fx.Interpreter):
    """torch.fx's Interpreter over a ``LayerGraph`` (its graph, its submodules): the base of
    every pass. Errors propagate unchanged (no fx note appended); call it like the model.

    A pass runs on every training step, so what torch.fx redoes per interpreter and per run
    is done once per graph (the table of last uses, ``LayerGraph.last_uses``) or skipped
    (the submodule table, built on demand; the progress bar; input flattening, pathlift
    graphs take one tensor or ``Scaled`` value): same nodes, same order, same values freed.
    """

    def __init__(self, graph: LayerGraph, garbage_collect_values: bool = True):
        self.module, self.graph, self.layer_graph = graph.module, graph.graph, graph
        self.env: dict[fx.Node, Any] = {}
        self.name = type(self).__name__
        self.garbage_collect_values = garbage_collect_values
        self.user_to_last_uses = graph.last_uses() if garbage_collect_values else {}
        self.extra_traceback = False

    @property
    def submodules(self) -> dict[str, nn.Module]:
        return dict(self.module.named_modules())

    def run(self, *args: Any, initial_env: dict[fx.Node, Any] | None = None,
            enable_io_processing: bool = True) -> Any:
        self.env = env = initial_env if initial_env is not None else {}
        if enable_io_processing and any(isinstance(a, (list, tuple, dict)) for a in args):
            args = self.graph.process_inputs(*args)
        self.args_iter = iter(args)
        no_uses: list[fx.Node] = []
        for node in self.graph.nodes:
            if node in env:
                continue
            env[node] = self.run_node(node)
            for dead in self.user_to_last_uses.get(node, no_uses):
                del env[dead]
            if node.op == "output":
                out = env[node]
                return self.graph.process_outputs(out) if enable_io_processing else out
        return None

    def run_node(self, n: fx.Node) -> Any:
        """fx's ``run_node`` without its debug log and current-node context (which only
        matter when a pass is traced again)."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return getattr(self, n.op)(n.target, args, kwargs)

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)


class _ContiguousBatchNorm(GraphInterpreter):
    def run_node(self, n: fx.Node) -> Any:
        if isinstance(n.meta.get(HANDLER), BatchNormHandler):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            return self.call_module(n.target, (args[0].contiguous(), *args[1:]), kwargs)
        return super().run_node(n)


def _tensor_nodes(value: Any) -> list[fx.Node]:
    """The nodes of the tensors in ``value``; a node building a tuple of them (a
    namedtuple) stands for its fields."""
    nodes = []
    for a in tree_leaves(value):
        if isinstance(a, fx.Node) and "tensor_meta" not in a.meta and a.op != "placeholder":
            nodes += _tensor_nodes((a.args, a.kwargs))
        elif isinstance(a, fx.Node):
            nodes.append(a)
    return nodes


def _holder(root: nn.Module, graph: fx.Graph, replaced: dict[str, nn.Module] | None = None
            ) -> nn.Module:
    """The submodules ``graph`` calls (``root``'s, or ``replaced``'s), under their
    qualified names in plain containers."""
    replaced = replaced or {}
    holder = nn.Module()
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        *path, leaf = str(node.target).split(".")
        parent = holder
        for atom in path:
            if not hasattr(parent, atom):
                parent.add_module(atom, nn.Module())
            parent = getattr(parent, atom)
        parent.add_module(leaf, replaced.get(node.target) or root.get_submodule(node.target))
    return holder


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


# --------------------------------------------------------------------------- the cache

_CACHE: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, ...], LayerGraph]] = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _remember(model: nn.Module, graph: LayerGraph) -> None:
    with _LOCK:
        graphs = _CACHE.setdefault(model, {})
        graphs.pop(graph.input_shape, None)  # the latest graph of a model comes last
        graphs[graph.input_shape] = graph


def graph_of(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
             as_eval: bool = False) -> LayerGraph:
    """The validated graph of ``model`` for ``input_shape`` (no batch dimension), traced
    once per model object and shape and reused while ``structure_key(model)`` is
    unchanged; a ``LayerGraph`` is returned as is while its model's structure is unchanged
    (else traced anew). Parameter values are not checked (see ``LayerGraph.check_values``).

    ``input_shape`` None takes the graph's own, else that of the model's latest graph, else
    one inferred from the model's first layer. ``as_eval``: the graph of the model as in
    eval mode, what ``with eval_mode(model): graph_of(model)`` returns, but a cached graph
    is found without flipping any flag (the model is traced under ``eval_mode``).
    DDP, DataParallel and torch.compile are looked through; FSDP2 models are traced as
    their plain skeleton; FSDP1 only inside ``summon_full_params`` and tensors that cannot
    be read as numbers are refused (``pathlift.graph.boundary.readable``).
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
    model = readable(model)
    if input_shape is None:
        with _LOCK:
            known = list(_CACHE.get(model, {}))
        input_shape = known[-1] if known else None
    shape = resolve_input_shape(model, input_shape)
    key = structure_key(model, as_eval)
    with _LOCK:
        cached = _CACHE.get(model, {}).get(shape)
    if cached is not None and cached.key == key:
        return cached
    if as_eval:
        with eval_mode(model):
            return graph_of(model, shape)
    graph = _trace(model, shape, key)
    check_memory(graph)  # MemoryLimitError before any pass allocates (graph/memory.py)
    _remember(model, graph)
    return graph


def trace(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None
          ) -> LayerGraph:
    """Trace and validate ``model`` (thesis Def. 2.2.2), parameters included. The model is
    not modified; the graph is cached (see ``graph_of``).

    Args:
        model: the network (plain, pruned, DDP-wrapped or compiled), or a ``LayerGraph``.
        input_shape: input size without the batch dimension; None reuses the model's
            latest graph or infers it from the first layer.

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


# --------------------------------------------------------------------------- input shapes


def as_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints; ShapeError for anything else."""
    hint = "give the input shape without the batch dimension, e.g. (3, 224, 224)"
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise ShapeError(f"input_shape must be a sequence of sizes, got {input_shape!r}; {hint}")
    sizes = []
    for s in input_shape:
        if isinstance(s, bool) or not (isinstance(s, int) or (
                isinstance(s, (float, Tensor)) and float(s).is_integer())):
            raise ShapeError(f"input_shape {tuple(input_shape)} must hold whole sizes; {hint}")
        sizes.append(int(s))
    if not sizes or any(s <= 0 for s in sizes):
        raise ShapeError(f"input_shape {tuple(input_shape)} must be positive sizes; {hint}")
    return tuple(sizes)


_SPATIAL_GUESSES = (32, 224, 64, 8, 28, 16, 96, 128, 256)


def resolve_input_shape(model: nn.Module, input_shape: Sequence[int] | None
                        ) -> tuple[int, ...]:
    """``input_shape`` itself, or one inferred from the first layer when it is None.

    A first Linear gives (in_features,); a first ConvNd gives (in_channels, s, ..., s) for
    the first spatial size s among common ones for which the model traces.
    """
    if input_shape is not None:
        return as_input_shape(input_shape)
    first = next((m for m in model.modules()
                  if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))), None)
    if isinstance(first, nn.Linear):
        return (first.in_features,)
    if first is not None:
        dims = len(first.kernel_size)
        for size in _SPATIAL_GUESSES:
            shape = (first.in_channels, *(size,) * dims)
            try:
                graph_of(model, shape)
            except (ShapeError, UnsupportedModelError):
                continue
            return shape
    raise ShapeError("cannot infer the input shape of this model; pass input_shape "
                     "(without the batch dimension), e.g. input_shape=(3, 32, 32)")


# --------------------------------------------------------------------------- tracing


class _Tracer(fx.Tracer):
    """torch.fx's default tracer (torch.nn modules are leaves), remembering where it failed.
    A user's subclass of a supported module that inherits its ``forward`` is a leaf too."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_in: str | None = None

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        forward = type(m).forward
        if any(cls in MODULES and cls.forward is forward for cls in type(m).__mro__):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.path_of_module(m)
            raise


def _node_label(node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    return node.name


def _op_label(node: fx.Node, module: nn.Module | None) -> str:
    if module is not None:
        return type(module).__name__
    return getattr(node.target, "__name__", str(node.target))


def _symbolic_trace(model: nn.Module) -> fx.Graph:
    tracer = _Tracer()
    try:
        graph = tracer.trace(model)
    except PathliftError:  # raised on purpose by a wrapper's forward (an unknown output)
        raise
    except Exception as err:  # fx raises TraceError, TypeError, ... on dynamic Python
        where = tracer.failed_in or type(model).__name__
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UnsupportedModelError([Problem(
            where or "<root>", "data-dependent control flow",
            f"torch.fx cannot trace it ({reason}); make the forward free of Python "
            "control flow on tensor values")]) from None
    finally:
        tracer.root = None  # the tracer's closures must not keep the model alive
    return graph


_UNKNOWN = "not an operation of the ReLU DAG model (Def. 2.2.2)"


def _classify(graph: fx.Graph, model: nn.Module) -> list[Problem]:
    """Attach a handler to every node, an ``UnsupportedHandler`` to unknown ops (so that
    validation lists their problem beside every other one); problems for parameter
    reads outside layers."""
    problems = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            problems.append(Problem(node.name, f"parameter access '{node.target}'",
                                    "functional layers with their own parameters are not "
                                    "supported; use nn.Linear / nn.Conv modules"))
            continue
        module = model.get_submodule(node.target) if node.op == "call_module" else None
        node.meta[HANDLER] = handler_for(node, module) or UnsupportedHandler(
            _op_label(node, module), _UNKNOWN)
    return problems


def _aliases(node: fx.Node) -> bool:
    return node.meta[HANDLER].aliases_input


def _mutates_input(node: fx.Node, model: nn.Module) -> bool:
    """An in-place activation (relu_, inplace=True) or residual sum (add_). torch.fx
    records ``a += b`` as an out-of-place add: that mutation is caught by the dataflow
    check."""
    module = model.get_submodule(node.target) if node.op == "call_module" else None
    return node.meta[HANDLER].mutates(node, module)


def _in_place_problems(graph: fx.Graph, model: nn.Module) -> list[Problem]:
    """In-place ops whose overwritten tensor is read again afterwards.

    The graph passes treat every op as pure; eager PyTorch reads the overwritten values
    (``h = fc(x); relu_(h); h + 1``), so such a model computes another function.
    """
    order = {n: i for i, n in enumerate(graph.nodes)}
    problems = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr") or not _mutates_input(node, model):
            continue
        root = node.args[0]
        if not isinstance(root, fx.Node):
            continue
        while (isinstance(root, fx.Node) and root.op not in ("placeholder", "output", "get_attr")
               and (_aliases(root) or _mutates_input(root, model))):
            root = root.args[0]
        aliases, todo = set(), [root]
        while todo:  # the tensors sharing storage with the overwritten one
            a = todo.pop()
            aliases.add(a)
            todo += [u for u in a.users if u is not node and u not in aliases
                     and u.op not in ("output", "get_attr")
                     and (_aliases(u) or _mutates_input(u, model))]
        late = [u for a in aliases for u in a.users
                if u is not node and u not in aliases and order[u] > order[node]]
        if late:
            module = model.get_submodule(node.target) if node.op == "call_module" else None
            problems.append(Problem(
                _node_label(node), _op_label(node, module),
                f"overwrites a tensor that '{_node_label(late[0])}' reads afterwards, so "
                "PyTorch computes another function than the graph; use inplace=False / x = x + y"))
    return problems


# --------------------------------------------------------------------------- validation


def _shape_only(func, output):
    """``func`` run on meta tensors as ``output(*args)``: torch's meta kernels for these
    ops are Python references costing more than the rest of the validation together (and
    the first call of one imports torch._dynamo, about 1 s)."""
    def run(x, *args, **kwargs):
        first = next(t for t in _flat((x,)) if isinstance(t, Tensor))
        if first.device.type != "meta":
            return func(x, *args, **kwargs)
        return output(x, *args, **kwargs)
    return run


def _like(x: Tensor) -> Tensor:
    """An uninitialised tensor of x's shape, dtype and strides: torch.empty_like's meta
    kernel is a Python reference that imports sympy (0.7 s) on its first call."""
    return x.new_empty_strided(x.size(), x.stride())


def _batch_norm_outputs(x: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    return _like(x), x.new_empty((0,)), x.new_empty((0,))


def _sum(x: Tensor, y: Any, *args, **kwargs) -> Tensor:
    if isinstance(y, Tensor) and (y.shape != x.shape or y.dtype != x.dtype):
        return torch.ops.aten.add.Tensor(x, y, *args, **kwargs)
    return _like(x)


def _addmm(bias: Tensor, x: Tensor, weight: Tensor, *args, **kwargs) -> Tensor:
    """Linear's bias + x @ W^T, whose meta kernel (a decomposition into references) also
    imports torch._dynamo on its first call (about 1 s)."""
    if not (bias.dtype == x.dtype == weight.dtype and x.dim() == weight.dim() == 2
            and x.shape[1] == weight.shape[0] and bias.shape in ((weight.shape[1],),
                                                                 (1, weight.shape[1]))):
        return torch.ops.aten.addmm.default(bias, x, weight, *args, **kwargs)  # or its error
    return x.new_empty((x.shape[0], weight.shape[1]))


def _cat(tensors: list[Tensor], dim: int = 0) -> Tensor:
    first = tensors[0]
    dim %= max(first.dim(), 1)
    others = [s for d, s in enumerate(first.shape) if d != dim]
    if any(t.dtype != first.dtype or t.dim() != first.dim()
           or [s for d, s in enumerate(t.shape) if d != dim] != others for t in tensors):
        return torch.ops.aten.cat.default(tensors, dim)  # or its error
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return first.new_empty(shape)


def _mean(x: Tensor, dim: list[int] | None, keepdim: bool = False, **kwargs) -> Tensor:
    if not dim or kwargs.get("dtype") not in (None, x.dtype):
        return torch.ops.aten.mean.dim(x, dim, keepdim, **kwargs)
    reduced = {d % x.dim() for d in dim}
    shape = [1 if d in reduced else n for d, n in enumerate(x.shape) if keepdim or d not in reduced]
    return x.new_empty(shape)


def _relu(x: Tensor) -> Tensor:
    return _like(x)


def _relu_(x: Tensor) -> Tensor:
    return x  # in place: the same tensor, so the recorder sees the overwrite


_FAST = {
    torch.ops.aten.cat.default: _cat,
    torch.ops.aten.mean.dim: _mean,
    torch.ops.aten.relu.default: _relu,
    torch.ops.aten.relu_.default: _relu_,
    torch.ops.aten.native_batch_norm.default: _batch_norm_outputs,
    torch.ops.aten._native_batch_norm_legit_no_training.default: _batch_norm_outputs,
    torch.ops.aten.add.Tensor: _sum,
    torch.ops.aten.addmm.default: _addmm,
}
_FAST = {op: _shape_only(op, output) for op, output in _FAST.items()}


def _flat(values: Any) -> Iterator[Any]:
    """The arguments of an aten call, lists and tuples opened (what aten ops take)."""
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


def _storage(t: Tensor) -> int:
    return t.untyped_storage()._cdata


class _Dataflow(TorchDispatchMode):
    """Records the aten operations of a run: each one's name (in-place and out-of-place
    variants alike) and, for each tensor it reads, which earlier operation last wrote that
    tensor's storage and where the tensor sits in it. Two runs with equal records compute
    the same function of their common leaves (input, parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.writer: dict[int, int] = {}
        self.paused = False

    def describe(self, value: Any) -> Any:
        if not isinstance(value, Tensor):
            return value if isinstance(value, (int, float, bool, str, type(None))) \
                else type(value).__name__
        source = self.writer.get(_storage(value), ("leaf", _storage(value)))
        return (source, value.storage_offset(), tuple(value.shape), value.stride(),
                value.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _FAST.get(func, func)(*args, **kwargs)
        if not self.paused:
            reads = tuple(self.describe(a) for a in _flat((*args, *kwargs.values())))
            self.ops.append((func.overloadpacket.__name__.rstrip("_"), reads))
            for t in _flat(out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, Tensor):
                    self.writer[_storage(t)] = len(self.ops) - 1
        return out


# TorchDispatchMode wraps every __torch_dispatch__ in torch._disable_dynamo, whose first call
# imports torch._dynamo (about 1 s at start-up): the recorder never runs under
# torch.compile, so it is marked as already disabled and pathlift's commands that compile
# nothing never import it.
_dispatch = getattr(_Dataflow.__torch_dispatch__, "__wrapped__", None)
if _dispatch is not None:
    setattr(_dispatch, "__dynamo_disable", _dispatch)


def _without_hooks(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """A module call as the graph passes see it: its forward, after torch.nn.utils.prune's
    pre-hooks (the masks are part of the layer), without any other hook."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, prune.BasePruningMethod):
            hook(module, args)
    return module.forward(*args, **kwargs)


class _Validate(fx.Interpreter):
    """Runs the graph over a meta copy of the model, as torch.fx's ShapeProp does, recording
    each node's output ``tensor_meta``; asks each node's handler about its concrete call
    and calls layers without their hooks, under a dataflow recorder."""

    def __init__(self, graph: fx.Graph, clone: nn.Module, recorder: _Dataflow,
                 problems: list[Problem]):
        super().__init__(clone, graph=graph)
        self.clone, self.recorder = clone, recorder
        self.extra_traceback = False
        self.problems = list(problems)

    def call_module(self, target, args, kwargs):
        return _without_hooks(self.clone.get_submodule(target), args, kwargs)

    def run_node(self, n: fx.Node):
        module, reason = None, None
        if n.op in ("call_module", "call_function", "call_method"):
            module = self.clone.get_submodule(n.target) if n.op == "call_module" else None
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            call = Call(n, module, tuple(args), dict(kwargs))
            self.recorder.paused = True  # handlers may probe with small real tensors
            try:
                n.meta[HANDLER] = n.meta[HANDLER].resolve(call)  # this call's operation
                reason = n.meta[HANDLER].problem(call)
            except PathliftError:
                raise
            except Exception as err:  # a probe the shape cannot take (a pool too large)
                raise _shape_error(n, module, tuple(args), err) from None
            finally:
                self.recorder.paused = False
            if reason is not None:
                self.problems.append(Problem(_node_label(n), _op_label(n, module), reason))
        try:
            result = super().run_node(n)
        except Exception as err:
            if self.problems:  # an unsupported op may fail on meta tensors: say why first
                raise UnsupportedModelError(self.problems, supported_summary()) from None
            raise _shape_error(n, module, self.fetch_args_kwargs_from_env(n)[0], err) from None
        if isinstance(result, Tensor):  # ShapeProp's record, without its costly layout probes
            n.meta["tensor_meta"] = TensorMetadata(result.shape, result.dtype, False,
                                                   result.stride(), None, False, {})
        handler = n.meta.get(HANDLER)
        if reason is None and handler is not None and handler.kind is not Kind.SHAPE:
            self._check_result(n, module, result)
        return result

    def _check_result(self, n: fx.Node, module: nn.Module | None, result: Any) -> None:
        """Every tensor a neuron op returns (``chunk`` returns several) keeps the batch."""
        parts = list(result) if isinstance(result, (tuple, list)) else [result]
        if not parts or not all(isinstance(t, Tensor) for t in parts):
            self.problems.append(Problem(_node_label(n), _op_label(n, None),
                                         "returns a non-tensor value"))
        elif any(t.dim() == 0 or t.shape[0] != _BATCH for t in parts):
            self.problems.append(Problem(
                _node_label(n), _op_label(n, None),
                "mixes the batch dimension with features; keep dim 0 as the batch"))
        elif any(t.numel() == 0 for t in parts):
            self.problems.append(Problem(
                _node_label(n), _op_label(n, module),
                f"its output of shape {tuple(parts[0].shape[1:])} holds no neuron; every "
                "layer needs at least one output feature or channel"))


def _shape_error(node: fx.Node, module: nn.Module | None, args: tuple, err: Exception
                 ) -> ShapeError:
    """One or two lines: the layer, the shape it got and what it expects where the layer
    says (in_features, in_channels, num_features; the whole input shape when the layer
    reads the network input), else torch's own reason."""
    got = next((tuple(a.shape[1:]) for a in args if isinstance(a, Tensor)), None)
    reason = f" ({str(err).splitlines()[0][:200]})" if str(err) else ""
    reads_input = any(a.op == "placeholder" for a in node.all_input_nodes)
    for attr, dim, where in (("in_features", -1, "features in its last dim"),
                             ("in_channels", 0, "channels (dim 0)"),
                             ("num_features", 0, "channels (dim 0)")):
        expected = getattr(module, attr, None)
        if got and expected is not None and got[dim] != expected:
            wanted = list(got)
            wanted[dim] = expected
            reason = (f": it expects {tuple(wanted)}" if reads_input
                      else f": it expects {expected} {where}")
            break
    return ShapeError(f"layer '{_node_label(node)}' ({_op_label(node, module)}) cannot take "
                      f"an input of shape {got}{reason}.\ninput_shape excludes the batch "
                      "dimension.")


def _validate(graph: fx.Graph, clone: nn.Module, shape: tuple[int, ...],
              dtype: torch.dtype, problems: list[Problem]) -> None:
    """Steps 3 and 4 of the module docstring, on ``clone``, the model's meta copy;
    ``problems`` found before are raised with those found here, all at once."""
    example = torch.empty((_BATCH, *shape), dtype=dtype, device="meta")
    with torch.no_grad():
        traced_flow = _Dataflow()
        validator = _Validate(graph, clone, traced_flow, problems)
        with traced_flow:
            traced = validator.run(example)
            traced_out = [traced_flow.describe(t) for t in tree_leaves(traced)]
        if validator.problems:
            raise UnsupportedModelError(validator.problems, supported_summary())
        try:
            with _Dataflow() as eager_flow:
                eager = clone(example)
                eager_out = [eager_flow.describe(t) for t in tree_leaves(eager)]
        except Exception as err:
            raise UnsupportedModelError([Problem(
                "<forward>", type(clone).__name__,
                f"model.forward fails on shape-only (meta) tensors ({str(err)[:160]}); a "
                "forward hook that reads values? remove it while measuring")]) from None
    if traced_flow.ops != eager_flow.ops or traced_out != eager_out:
        raise UnsupportedModelError([Problem(
            "<forward>", "torch.fx trace",
            "the traced graph computes another function than model.forward (an in-place "
            "update of a tensor that is read elsewhere, such as `h += y` with an alias of h, "
            "or a forward hook that changes a result?); write the update out of place and "
            "remove such hooks while measuring")])


def _trace(model: nn.Module, shape: tuple[int, ...], key: tuple) -> LayerGraph:
    """Trace and validate the meta copy of ``model`` (same structure and names; torch.fx
    runs the hooks of the modules it traces through, and those of FSDP would gather
    parameters), then bind the graph to the model's own modules."""
    dtype, device = dtype_device(model)
    clone = meta_clone(model)
    graph = _symbolic_trace(clone)
    problems = _classify(graph, clone) + _in_place_problems(graph, clone)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UnsupportedModelError([Problem(
            "<inputs>", "forward signature",
            f"forward takes {len(placeholders)} inputs; pathlift needs exactly one tensor")])
    _validate(graph, clone, shape, dtype, problems)
    _warn_leading_dimension(graph, clone, shape)
    return LayerGraph(_holder(model, graph), graph, shape, dtype, device, weakref.ref(model),
                      key)


def _warn_leading_dimension(graph: fx.Graph, model: nn.Module, shape: tuple[int, ...]) -> None:
    """Warn when the input reaches a Linear layer (through views only) with more than one
    dimension: the layer reads the last dimension only, so each row of the others is a
    separate input of the network, and every result counts all of their outputs."""
    if len(shape) < 2:
        return
    node = next(n for n in graph.nodes if n.op == "placeholder")
    while len(node.users) == 1:
        node = next(iter(node.users))
        if node.op != "call_module" or node.meta[HANDLER].kind is not Kind.AFFINE:
            return
        module = model.get_submodule(node.target)
        rows = math.prod(shape[:-1])
        if isinstance(module, nn.Linear) and rows > 1:
            warnings.warn(LeadingDimensionWarning(
                f"input_shape {shape}: the first layer '{node.target}' (Linear) reads the "
                f"last dimension only, so pathlift computes for {rows} separate inputs of "
                f"size {shape[-1]} at once (all their outputs count: the l1 path-norm is "
                f"{rows} times that of one). If {shape[0]} is a batch size, pass input_shape="
                f"{shape[1:]}"), stacklevel=4)
        return
