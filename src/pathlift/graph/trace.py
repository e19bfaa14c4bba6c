"""Trace an ``nn.Module`` with torch.fx into a validated graph of supported operations.

``trace`` is the one entry point of pathlift into a user's model. It never copies
parameters and never modifies the model: the returned ``LayerGraph`` holds an fx
``GraphModule`` that shares the model's submodules by reference.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, fx, nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.utils._pytree import tree_leaves

from pathlift.errors import Problem, ShapeError, UnsupportedModelError
from pathlift.graph.ops import (
    BatchNormHandler,
    Call,
    Handler,
    Kind,
    ReshapeHandler,
    handler_for,
)

HANDLER = "pathlift_handler"
_SLICE = ReshapeHandler("getitem")  # x[:, :k] on a tensor keeps some neurons: a relabelling


class _Tracer(fx.Tracer):
    """torch.fx's default tracer (torch.nn modules are leaves), remembering where it failed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_in: str | None = None

    def call_module(self, m, forward, args, kwargs):
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.path_of_module(m)
            raise


@dataclass(frozen=True)
class LayerGraph:
    """A traced model whose every node has a registered handler and a known output shape."""

    module: fx.GraphModule
    input_shape: tuple[int, ...]
    dtype: torch.dtype = field(default=torch.float32)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph

    def nodes(self) -> Iterator[fx.Node]:
        """Operation nodes in topological order (placeholder and output excluded)."""
        return (n for n in self.graph.nodes if n.op not in ("placeholder", "output"))

    def handler(self, node: fx.Node) -> Handler:
        return node.meta[HANDLER]

    def submodule(self, node: fx.Node) -> nn.Module | None:
        return self.module.get_submodule(node.target) if node.op == "call_module" else None

    def layers(self, kind: Kind = Kind.AFFINE) -> list[tuple[str, nn.Module]]:
        """(qualified name, module) of every node of the given kind, in topological order."""
        return [(n.target, self.submodule(n)) for n in self.nodes()
                if self.handler(n).kind is kind and n.op == "call_module"]

    def outputs(self) -> list[fx.Node]:
        """The nodes of the returned tensors, in order, a tensor returned twice twice."""
        out = next(n for n in self.graph.nodes if n.op == "output")
        return [a for a in tree_leaves(out.args[0]) if isinstance(a, fx.Node)]

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

    def differentiable_module(self) -> fx.GraphModule:
        """A copy of the traced module (same submodules) to run autograd through: every
        BatchNorm input is made contiguous first. torch 2.13's CPU eval BatchNorm backward
        returns a wrong input gradient for a channels-last input with a size-1 spatial dim,
        such as x.transpose(1, -1) of shape (1, 2, 3, 3, 1) (its forward is right)."""
        module = fx.GraphModule(self.module, copy.deepcopy(self.graph))
        for node in list(module.graph.nodes):
            if isinstance(node.meta.get(HANDLER), BatchNormHandler):
                with module.graph.inserting_before(node):
                    contiguous = module.graph.call_method("contiguous", (node.args[0],))
                node.replace_input_with(node.args[0], contiguous)
        module.recompile()
        return module


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


def _node_label(node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    return node.name


def _op_label(node: fx.Node, module: nn.Module | None) -> str:
    if module is not None:
        return type(module).__name__
    return getattr(node.target, "__name__", str(node.target))


def _symbolic_trace(model: nn.Module) -> fx.GraphModule:
    tracer = _Tracer()
    try:
        graph = tracer.trace(model)
    except Exception as err:  # fx raises TraceError, TypeError, ... on dynamic Python
        where = tracer.failed_in or type(model).__name__
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UnsupportedModelError([Problem(
            where or "<root>", "data-dependent control flow",
            f"torch.fx cannot trace it ({reason}); make the forward free of Python "
            "control flow on tensor values")]) from err
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def _input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ShapeError(
            f"input_shape {tuple(input_shape)} must be positive sizes without the batch "
            "dimension, e.g. (3, 224, 224)")
    return shape


def _model_dtype(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    for p in (*model.parameters(), *model.buffers()):  # BatchNorm(affine=False): buffers only
        if p.is_floating_point():
            return p.dtype, p.device
    return torch.float32, torch.device("cpu")


@contextmanager
def _buffers_preserved(model: nn.Module) -> Iterator[None]:
    """Restore every buffer afterwards: a training-mode BatchNorm must not be updated."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def _classify(gm: fx.GraphModule) -> list[Problem]:
    """Attach a handler to every node; problems for unknown ops (instance checks come later)."""
    problems = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            problems.append(Problem(node.name, f"parameter access '{node.target}'",
                                    "functional layers with their own parameters are not "
                                    "supported; use nn.Linear / nn.Conv modules"))
            continue
        module = gm.get_submodule(node.target) if node.op == "call_module" else None
        handler = handler_for(node, module)
        if handler is None:
            problems.append(Problem(
                _node_label(node), _op_label(node, module),
                "not an operation of the ReLU DAG model (Def. 2.2.2); supported: Linear, "
                "Conv, ConvTranspose, eval BatchNorm, ReLU, max/avg pooling, mean, +, cat, "
                "nearest upsampling, reshapes"))
            continue
        node.meta[HANDLER] = handler
    return problems


_ALIASING = (Kind.RESHAPE, Kind.IDENTITY, Kind.SHAPE)  # may return a view of their input


def _mutates_input(node: fx.Node, gm: fx.GraphModule) -> bool:
    """An in-place ReLU (relu_, inplace=True) or residual sum (add_). torch.fx records
    ``a += b`` as an out-of-place add: that mutation is invisible here."""
    kind = node.meta[HANDLER].kind
    if kind not in (Kind.RELU, Kind.ADD):
        return False
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(node.target), "inplace", False))
    if node.op == "call_method":
        return str(node.target).endswith("_")
    name = getattr(node.target, "__name__", "")
    return name.endswith("_") or bool(
        node.kwargs.get("inplace", len(node.args) > 1 and node.args[1] is True))


def _in_place_problems(gm: fx.GraphModule) -> list[Problem]:
    """In-place ops whose overwritten tensor is read again afterwards.

    The graph passes treat every op as pure; eager PyTorch reads the overwritten values
    (``h = fc(x); relu_(h); h + 1``), so such a model computes another function.
    """
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    problems = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or not _mutates_input(node, gm):
            continue
        root = node.args[0]
        if not isinstance(root, fx.Node):
            continue
        while (isinstance(root, fx.Node) and root.op not in ("placeholder", "output")
               and (root.meta[HANDLER].kind in _ALIASING or _mutates_input(root, gm))):
            root = root.args[0]
        aliases, todo = set(), [root]
        while todo:  # the tensors sharing storage with the overwritten one
            a = todo.pop()
            aliases.add(a)
            todo += [u for u in a.users if u is not node and u not in aliases
                     and u.op != "output" and (u.meta[HANDLER].kind in _ALIASING
                                               or _mutates_input(u, gm))]
        late = [u for a in aliases for u in a.users
                if u is not node and u not in aliases and order[u] > order[node]]
        if late:
            module = gm.get_submodule(node.target) if node.op == "call_module" else None
            problems.append(Problem(
                _node_label(node), _op_label(node, module),
                f"overwrites a tensor that '{_node_label(late[0])}' reads afterwards, so "
                "PyTorch computes another function than the graph; use inplace=False / x = x + y"))
    return problems


class _Validate(ShapeProp):
    """ShapeProp that also asks each node's handler about the concrete call."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.problems: list[Problem] = []

    def run_node(self, n: fx.Node):
        reason = None
        if n.op in ("call_module", "call_function", "call_method"):
            module = self.module.get_submodule(n.target) if n.op == "call_module" else None
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if n.target is operator.getitem and isinstance(args[0], Tensor):
                n.meta[HANDLER] = _SLICE  # not shape arithmetic: every pass must see it
            reason = n.meta[HANDLER].problem(Call(n, module, tuple(args), dict(kwargs)))
            if reason is not None:
                self.problems.append(Problem(_node_label(n), _op_label(n, module), reason))
        try:
            result = super().run_node(n)
        except UnsupportedModelError:
            raise
        except Exception as err:
            module = self.module.get_submodule(n.target) if n.op == "call_module" else None
            raise ShapeError(f"node '{_node_label(n)}' ({_op_label(n, module)}) fails on the "
                             f"example input: {err}") from err
        handler = n.meta.get(HANDLER)
        if reason is None and handler is not None and handler.kind is not Kind.SHAPE:
            if not isinstance(result, Tensor):
                self.problems.append(Problem(_node_label(n), _op_label(n, None),
                                             "returns a non-tensor value"))
            elif result.dim() == 0 or result.shape[0] != _BATCH:
                self.problems.append(Problem(
                    _node_label(n), _op_label(n, None),
                    "mixes the batch dimension with features; keep dim 0 as the batch"))
        return result


_BATCH = 2  # validation batch: a size that exposes reshapes across the batch dimension


def check(model: nn.Module, input_shape: Sequence[int]) -> CheckReport:
    """Every reason why ``model`` is outside the supported ReLU DAG model, all at once."""
    try:
        _trace(model, input_shape)
    except UnsupportedModelError as err:
        return CheckReport(tuple(err.problems))
    return CheckReport(())


def trace(model: nn.Module, input_shape: Sequence[int]) -> LayerGraph:
    """Trace and validate ``model`` (thesis Def. 2.2.2). The model is not modified.

    Raises UnsupportedModelError listing every unsupported node (name, op, reason) and
    ShapeError when the example input of ``input_shape`` (no batch dim) does not fit.
    """
    return _trace(model, input_shape)


def _trace(model: nn.Module, input_shape: Sequence[int]) -> LayerGraph:
    shape = _input_shape(input_shape)
    gm = _symbolic_trace(model)
    problems = _classify(gm)
    problems += [] if problems else _in_place_problems(gm)
    if problems:
        raise UnsupportedModelError(problems)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UnsupportedModelError([Problem(
            "<inputs>", "forward signature",
            f"forward takes {len(placeholders)} inputs; pathlift needs exactly one tensor")])
    dtype, device = _model_dtype(model)
    generator = torch.Generator().manual_seed(0)  # the caller's RNG state is left alone
    example = torch.randn((_BATCH, *shape), generator=generator, dtype=dtype).to(device)
    validator = _Validate(gm)
    with torch.no_grad(), _buffers_preserved(model):
        traced = validator.propagate(example.clone())
        if validator.problems:
            raise UnsupportedModelError(validator.problems)
        eager = model(example.clone())
    if not _same_outputs(traced, eager):
        raise UnsupportedModelError([Problem(
            "<forward>", "torch.fx trace",
            "the traced graph computes another function than model.forward (an in-place "
            "update of a tensor that is read elsewhere, such as `h += y` with an alias of h?); "
            "write the update out of place")])
    return LayerGraph(gm, shape, dtype, device)


def _same_outputs(traced: object, eager: object) -> bool:
    """Whether the traced graph reproduced the eager forward on the example input."""
    a, b = tree_leaves(traced), tree_leaves(eager)
    return len(a) == len(b) and all(
        isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape
        and torch.allclose(x, y, rtol=1e-5, equal_nan=True,
                           atol=1e-6 * float(y.nan_to_num(0, 0, 0).abs().max().clamp(min=1)))
        for x, y in zip(a, b, strict=True))
