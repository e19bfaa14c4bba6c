"""Validation of a traced graph against the model it was traced from, on shape-only tensors
(the meta device, on a meta copy of the model), so it costs a fraction of one forward pass
and never touches the caller's tensors:

1. every node gets the handler of its op (``pathlift.graph.ops``) or a problem naming it;
2. in-place ops whose overwritten tensor is read again are refused (the graph passes
   treat every op as pure);
3. the graph runs at batch 2 on meta tensors: each handler judges its concrete call, every
   node keeps dim 0 as the batch, and the output shape of every node is recorded;
4. the model's own ``forward`` runs on the same meta tensors, and the aten operations of
   both runs, with the operation that last wrote each tensor they read, must agree
   (``pathlift.graph.dataflow``). This catches what torch.fx cannot see: ``h += y``
   recorded out of place while an alias of ``h`` is read later, hooks on the root module
   or on a layer that change the result.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.fx.passes.shape_prop import TensorMetadata
from torch.nn.utils import prune
from torch.utils._pytree import tree_leaves

from pathlift.errors import (
    LeadingDimensionWarning,
    PathliftError,
    Problem,
    ShapeError,
    UnsupportedModelError,
)
from pathlift.graph.dataflow import Dataflow
from pathlift.graph.functional import COMPUTED, LOWERED, REFUSED
from pathlift.graph.layer_graph import HANDLER, node_arguments
from pathlift.graph.ops import Call, Kind, UnsupportedHandler, handler_for, supported_summary
from pathlift.graph.ops.relabel import SHAPE

BATCH = 2  # validation batch: a size that exposes reshapes across the batch dimension


def _node_label(node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    return node.name


def _op_label(node: fx.Node, module: nn.Module | None) -> str:
    if module is not None:
        return type(module).__name__
    return getattr(node.target, "__name__", str(node.target))



_UNKNOWN = "not an operation of the ReLU DAG model (Def. 2.2.2)"


def classify(graph: fx.Graph, modules: dict[str, nn.Module]) -> list[Problem]:
    """Attach a handler to every node, an ``UnsupportedHandler`` to unknown ops (so that
    validation lists their problem beside every other one); problems for tensor reads
    outside layers. A functional layer lowered to its module form has its handler
    already (``pathlift.graph.functional``); one refused there is refused for the reason
    found there, alone. ``modules``: the model's ``dict(named_modules())``."""
    problems = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if COMPUTED in node.meta:  # computes a tensor of a refused layer, which says why
            node.meta[HANDLER] = SHAPE
            continue
        if node.op == "get_attr":
            if not any(REFUSED in u.meta for u in node.users):
                problems.append(Problem(
                    node.name, f"tensor '{node.target}'",
                    "read outside any layer of the ReLU DAG model (a functional layer reads "
                    "its module's own `weight` and `bias`); use it in such a layer"))
            continue
        if LOWERED in node.meta:
            node.meta[HANDLER] = node.meta[LOWERED].handler
            continue
        if REFUSED in node.meta:
            node.meta[HANDLER] = UnsupportedHandler(_op_label(node, None), node.meta[REFUSED])
            continue
        module = modules[node.target] if node.op == "call_module" else None
        node.meta[HANDLER] = handler_for(node, module) or UnsupportedHandler(
            _op_label(node, module), _UNKNOWN)
    return problems


def _aliases(node: fx.Node) -> bool:
    return node.meta[HANDLER].aliases_input


def _mutates_input(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """An in-place activation (relu_, inplace=True) or residual sum (add_). torch.fx
    records ``a += b`` as an out-of-place add: that mutation is caught by the dataflow
    check."""
    return node.meta[HANDLER].mutates(node, modules.get(node.target)
                                      if node.op == "call_module" else None)


def in_place_problems(graph: fx.Graph, modules: dict[str, nn.Module]) -> list[Problem]:
    """In-place ops whose overwritten tensor is read again afterwards.

    The graph passes treat every op as pure; eager PyTorch reads the overwritten values
    (``h = fc(x); relu_(h); h + 1``), so such a model computes another function.
    """
    order = {n: i for i, n in enumerate(graph.nodes)}
    problems = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr") or not _mutates_input(node, modules):
            continue
        root = node.args[0]
        if not isinstance(root, fx.Node):
            continue
        while (isinstance(root, fx.Node) and root.op not in ("placeholder", "output", "get_attr")
               and (_aliases(root) or _mutates_input(root, modules))):
            root = root.args[0]
        aliases, todo = set(), [root]
        while todo:  # the tensors sharing storage with the overwritten one
            a = todo.pop()
            aliases.add(a)
            todo += [u for u in a.users if u is not node and u not in aliases
                     and u.op not in ("output", "get_attr")
                     and (_aliases(u) or _mutates_input(u, modules))]
        late = [u for a in aliases for u in a.users
                if u is not node and u not in aliases and order[u] > order[node]]
        if late:
            module = modules.get(node.target) if node.op == "call_module" else None
            problems.append(Problem(
                _node_label(node), _op_label(node, module),
                f"overwrites a tensor that '{_node_label(late[0])}' reads afterwards, so "
                "PyTorch computes another function than the graph; use inplace=False / x = x + y"))
    return problems



# --------------------------------------------------------------------------- steps 3 and 4


def _prune_hooks(module: nn.Module) -> list[prune.BasePruningMethod]:
    return [h for h in module._forward_pre_hooks.values()
            if isinstance(h, prune.BasePruningMethod)]


class _Validate(fx.Interpreter):
    """Runs the graph over a meta copy of the model, as torch.fx's ShapeProp does, recording
    each node's output ``tensor_meta``; asks each node's handler about its concrete call
    and calls layers without their hooks, under a dataflow recorder."""

    def __init__(self, graph: fx.Graph, modules: dict[str, nn.Module], clone: nn.Module,
                 recorder: Dataflow, problems: list[Problem]):
        # fx.Interpreter's state without its module table (``modules``, made once by the
        # tracer) and its last-use walk (meta values hold no memory: none is freed)
        self.module, self.graph, self.submodules = clone, graph, modules
        self.env, self.name = {}, "Interpreter"
        self.garbage_collect_values, self.extra_traceback = False, False
        self.clone, self.recorder = clone, recorder
        self.problems = list(problems)
        self.masked = {t for t, m in modules.items() if _prune_hooks(m)}
        self.masks_applied: set[str] = set()

    def run(self, example: Tensor) -> Any:
        """fx's ``run`` over the graph's nodes in order, without its progress bar: tqdm
        takes a lock shared by every process forked after it was made, which a sibling
        killed while holding it leaves held (a run killed mid-way, then resumed by a fork
        of the same parent, would wait forever)."""
        self.args_iter = iter((example,))
        for node in self.graph.nodes:
            self.env[node] = self.run_node(node)
            if node.op == "output":
                return self.graph.process_outputs(self.env[node])
        return None

    def fetch_args_kwargs_from_env(self, n: fx.Node) -> tuple[tuple, dict]:
        return node_arguments(self.env, n)

    def call_module(self, target, args, kwargs):
        """A module call as the graph passes see it: its forward, after torch.nn.utils.
        prune's pre-hooks (the masks are part of the layer), without any other hook."""
        self._apply_masks(target)
        self.masks_applied.discard(target)
        return self.submodules[target].forward(*args, **kwargs)

    def _apply_masks(self, target: str) -> None:
        """Run the prune pre-hooks of the pruned layer ``target`` once for its call, when
        its first op runs: as ``model.forward`` does at the call, before ops its forward
        runs ahead of the layer's own (the ``F.pad`` of a Conv2d with reflect padding)."""
        if target in self.masked and target not in self.masks_applied:
            module = self.submodules[target]
            for hook in _prune_hooks(module):
                hook(module, ())
            self.masks_applied.add(target)

    def get_attr(self, target, args, kwargs):
        """A tensor read outside any layer, from the model (the graph's own table holds
        the layers it calls only)."""
        owner, _, name = str(target).rpartition(".")
        return getattr(self.clone.get_submodule(owner), name)

    def run_node(self, n: fx.Node):
        module, reason = None, None
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if n.op in ("call_module", "call_function", "call_method"):
            module = self.submodules[n.target] if n.op == "call_module" else None
            if self.masked:
                for path, _ in n.meta.get("nn_module_stack", {}).values():
                    self._apply_masks(path)
            call = Call(n, module, tuple(args), dict(kwargs))
            self.recorder.paused = True  # handlers may probe with small real tensors
            try:
                n.meta[HANDLER] = n.meta[HANDLER].resolve(call)  # this call's operation
                if module is not None and module.training:
                    reason = n.meta[HANDLER].training_problem(module)
                reason = reason or n.meta[HANDLER].problem(call)
            except PathliftError:
                raise
            except Exception as err:  # a probe the shape cannot take (a pool too large)
                raise _shape_error(n, module, tuple(args), err) from None
            finally:
                self.recorder.paused = False
            if reason is not None:
                self.problems.append(Problem(_node_label(n), _op_label(n, module), reason))
        try:  # fx's run_node, without its current-node context (no trace runs here)
            result = getattr(self, n.op)(n.target, args, kwargs)
        except Exception as err:
            if self.problems:  # an unsupported op may fail on meta tensors: say why first
                raise UnsupportedModelError(self.problems, supported_summary()) from None
            raise _shape_error(n, module, args, err) from None
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
        elif any(t.dim() == 0 or t.shape[0] != BATCH for t in parts):
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


def validate(graph: fx.Graph, clone: nn.Module, shape: tuple[int, ...],
             dtype: torch.dtype, problems: list[Problem], modules: dict[str, nn.Module]
             ) -> None:
    """Steps 3 and 4 of the module docstring, on ``clone``, the model's meta copy;
    ``problems`` found before are raised with those found here, all at once. ``modules``:
    the layers the graph calls by target (``holder(clone, graph)``'s table)."""
    example = torch.empty((BATCH, *shape), dtype=dtype, device="meta")
    with torch.no_grad():
        traced_flow = Dataflow()
        validator = _Validate(graph, modules, clone, traced_flow, problems)
        with traced_flow:
            traced = validator.run(example)
            traced_out = [traced_flow.describe(t) for t in tree_leaves(traced)]
        if validator.problems:
            raise UnsupportedModelError(validator.problems, supported_summary())
        try:
            with Dataflow() as eager_flow:
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



def warn_leading_dimension(graph: fx.Graph, shape: tuple[int, ...]) -> None:
    """Warn when the input reaches a Linear layer (through views only) with more than one
    dimension: the layer reads the last dimension only, so each row of the others is a
    separate input of the network, and every result counts all of their outputs."""
    if len(shape) < 2:
        return
    node = next(n for n in graph.nodes if n.op == "placeholder")
    while len(node.users) == 1:
        node = next(iter(node.users))
        if node.op != "call_module" or not node.meta[HANDLER].dense_rows:
            return
        rows = math.prod(shape[:-1])
        if rows > 1:
            warnings.warn(LeadingDimensionWarning(
                f"input_shape {shape}: the first layer '{node.target}' (Linear) reads the "
                f"last dimension only, so pathlift computes for {rows} separate inputs of "
                f"size {shape[-1]} at once (all their outputs count: the l1 path-norm is "
                f"{rows} times that of one). If {shape[0]} is a batch size, pass input_shape="
                f"{shape[1:]}"), stacklevel=4)
        return
