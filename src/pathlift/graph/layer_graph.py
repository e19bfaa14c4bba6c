"""The layer graph: a traced model's torch.fx graph whose every node carries its handler
(``pathlift.graph.ops``) and output shape, over the model's own submodules, and the
interpreter every pass derives from (``pathlift.graph.walk.OpWalker``). Tracing and
validation build it (``pathlift.graph.trace``)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.utils._pytree import tree_leaves

from pathlift.errors import Problem, UnsupportedModelError
from pathlift.graph.boundary import dtype_device, is_sharded, structure_key, unwrap
from pathlift.graph.cache import remember
from pathlift.graph.collectives import all_objects
from pathlift.graph.functional import LOWERED, functional_view
from pathlift.graph.ops import Handler, Kind

HANDLER = "pathlift_handler"


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
        """The module a ``call_module`` node calls (found once through the holder's own
        tables, without a walk of every module), else None."""
        if node.op != "call_module":
            return None
        modules = self._memo.setdefault("modules", {})
        found = modules.get(node.target)
        if found is None:
            found = self.module
            for atom in str(node.target).split("."):
                found = found._modules[atom]
            modules[node.target] = found
        return found

    def stored_in(self, node: fx.Node) -> nn.Module | None:
        """The module of the traced model whose tensors a layer node computes with, as
        torch.nn.utils.prune reparametrises it: the called module, or for a functional
        layer (``pathlift.graph.functional``) the module whose forward calls it (its view
        in ``submodule`` shares its tensors, not its forward)."""
        if LOWERED not in node.meta:
            return self.submodule(node)
        return self.owner.get_submodule(str(node.target))

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

    def folds(self) -> dict[fx.Node, fx.Node]:
        """{layer node: the node of the diagonal op folded into it}: each layer whose
        handler ``scales_rows`` and whose output only a folding diagonal op (eval
        BatchNorm) reads, on the same channel axis; found once per graph."""
        found = self._memo.get("folds")
        if found is None:
            found = self._memo["folds"] = {}
            for node in self.affine_nodes():
                users = list(node.users)
                if node.op != "call_module" or len(users) != 1 \
                        or not self.handler(node).scales_rows:
                    continue
                user, ndim = users[0], len(node.meta["tensor_meta"].shape)
                if user.op != "call_module" or user.all_input_nodes != [node]:
                    continue
                handler = self.handler(user)
                if handler.folds and handler.diagonal and user.args[0] is node \
                        and handler.channel_dim % ndim == self.handler(node).channel_dim % ndim:
                    found[node] = user
        return found

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
        bound = LayerGraph(holder(model, self.graph), self.graph, self.input_shape,
                           *dtype_device(model), weakref.ref(model), structure_key(model))
        bound.derived.update({k: v.rebind(bound) for k, v in self.derived.items()
                              if hasattr(v, "rebind")})  # structural results carry over
        remember(model, bound, made=True)
        return bound

    def with_modules(self, replaced: dict[str, nn.Module]) -> LayerGraph:
        """The same graph calling ``replaced[target]`` in place of the module at each
        target (a pass's own view of a layer, such as its local shard); nothing else is
        copied."""
        return replace(self, module=holder(self.module, self.graph, replaced))

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

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple, dict]:
        return node_arguments(self.env, n)

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


_ATOMS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})


def node_arguments(env: dict[fx.Node, Any], n: fx.Node) -> tuple[tuple, dict]:
    """(args, kwargs) of node ``n`` with each node replaced by its value in ``env``: what
    torch.fx's ``fetch_args_kwargs_from_env`` gives, with an argument that is a node or a
    plain constant (most of them) read without fx's generic walk of nested arguments
    (every node of every pass asks)."""
    def value(a: Any) -> Any:
        if type(a) is fx.Node:
            return env[a]
        return a if type(a) in _ATOMS else fx.node.map_arg(a, env.__getitem__)
    return tuple(map(value, n.args)), {k: value(v) for k, v in n.kwargs.items()}


class _ContiguousBatchNorm(GraphInterpreter):
    def run_node(self, n: fx.Node) -> Any:
        handler = n.meta.get(HANDLER)
        if handler is not None and handler.contiguous_backward:
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


def holder(root: nn.Module, graph: fx.Graph, replaced: dict[str, nn.Module] | None = None,
           modules: dict[str, nn.Module] | None = None) -> nn.Module:
    """The submodules ``graph`` calls (``root``'s, or ``replaced``'s), under their
    qualified names in plain containers; a lowered functional layer's target holds a view
    of its module as the module form (``pathlift.graph.functional``), whose submodules
    called as layers of their own hang below it. ``modules``: root's
    ``dict(named_modules(remove_duplicate=False))`` where the caller has it already."""
    return called(root, graph, replaced, modules)[0]


def called(root: nn.Module, graph: fx.Graph, replaced: dict[str, nn.Module] | None = None,
           modules: dict[str, nn.Module] | None = None
           ) -> tuple[nn.Module, dict[str, nn.Module]]:
    """``holder`` and the module it holds for each ``call_module`` target of ``graph``
    (what ``dict(holder.named_modules())`` gives for those names, without the walk)."""
    replaced = replaced or {}
    if modules is None:
        modules = dict(root.named_modules(remove_duplicate=False))
    holder, done, table = nn.Module(), set(), {}
    for node in graph.nodes:
        if node.op != "call_module" or node.target in done:
            continue
        done.add(node.target)
        *path, leaf = str(node.target).split(".")
        parent = holder
        for atom in path:  # the tables themselves: names from a trace need no checks
            if atom not in parent._modules:
                parent._modules[atom] = nn.Module()
            parent = parent._modules[atom]
        module = replaced.get(node.target) or modules[node.target]
        if LOWERED in node.meta and node.target not in replaced:
            module = functional_view(module, node.meta[LOWERED])
            module._modules.update(getattr(parent._modules.get(leaf), "_modules", {}))
        parent._modules[leaf] = table[node.target] = module
    return holder, table

