"""Functional layers over their own module's tensors, as the field writes them:
``F.linear(x, self.weight, self.bias)``, ``F.conv2d(x, self.weight, ...)``,
``F.batch_norm(x, self.running_mean, ...)`` in a BatchNorm subclass that then applies its
activation (timm's ``BatchNormAct2d``), ``x @ self.weight.T``, ``einsum("bi,oi->bo", x,
self.weight)``. Each is the op of its module form (thesis Def. 2.2.2: identity neurons with
weights and a bias), so the traced graph calls it as that module: ``lower_calls``
replaces the call by a ``call_module`` node whose target is the calling module's path, and
``functional_view`` gives that target a view of the calling module as the module form
(its own tensors, shared, so every pass reads and writes the module's state_dict entries:
``fc.weight`` is ``fc.weight``). Which calls are layers, and as what, the op table says
(``pathlift.graph.ops.base.LOWERINGS``, filled by each op module).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from torch import Tensor, fx, nn
from torch.nn.utils import prune

from pathlift.graph.ops import Handler
from pathlift.graph.ops.base import INPUT, LOWERINGS, VALUES_OF, Lowered, Operand

LOWERED = "pathlift_lowered"  # node.meta key of a lowered call's ``FunctionalCall``
REFUSED = "pathlift_refused"  # node.meta key of the reason a functional layer is refused
COMPUTED = "pathlift_computed"  # node.meta key of a tensor computed from parameters alone,
# for a refused layer (its reason says why; the node itself is no problem of its own)


@dataclass(frozen=True)
class FunctionalCall:
    """What a lowered node runs: ``target`` (a function, or a method name) with ``args``
    and ``kwargs`` in which ``INPUT`` stands for the activation and an ``Operand`` for a
    tensor of the view; ``form`` and ``settings`` make the view (``functional_view``)."""

    handler: Handler
    form: type
    settings: dict[str, Any]
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self, view: nn.Module, x: Tensor) -> Any:
        """The original call on ``x`` with the view's tensors, as the module's forward
        reads them (under torch.nn.utils.prune, what its pre-hook, run by the view's
        ``__call__``, has just computed)."""
        def fill(a: Any) -> Any:
            if a is INPUT:
                return x
            if isinstance(a, Operand):
                return a.read(getattr(view, a.role))
            return a
        args = fx.node.map_aggregate(self.args, fill)
        kwargs = fx.node.map_aggregate(self.kwargs, fill)
        if isinstance(self.target, str):
            return getattr(args[0], self.target)(*args[1:], **kwargs)
        return self.target(*args, **kwargs)


_VIEW_CLASSES: dict[type, type] = {}


def _view_class(form: type) -> type:
    """``form`` whose forward is the lowered call (one class per form)."""
    if form not in _VIEW_CLASSES:
        def forward(self: nn.Module, x: Tensor) -> Any:
            return self.pathlift_call.run(self, x)
        _VIEW_CLASSES[form] = type(f"Functional{form.__name__}", (form,),
                                   {"forward": forward, "__module__": __name__})
    return _VIEW_CLASSES[form]


def functional_view(owner: nn.Module, call: FunctionalCall) -> nn.Module:
    """``owner`` seen as ``call.form``: an instance of (a subclass of) the module form that
    shares ``owner``'s parameter and buffer tables (its tensors, pruning masks
    included), with the call's settings, no submodules and only the owner's pruning
    pre-hooks; its forward runs the original call. ``owner`` is not touched."""
    view = object.__new__(_view_class(call.form))
    state = view.__dict__
    state.update(vars(owner))
    state.update(call.settings)
    state["pathlift_call"] = call
    state["_modules"] = {}
    for table in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                  "_backward_pre_hooks", "_backward_hooks"):
        state[table] = OrderedDict()
    state["_forward_pre_hooks"].update(
        (k, h) for k, h in owner._forward_pre_hooks.items()
        if isinstance(h, prune.BasePruningMethod))
    return view


def lower_calls(graph: fx.Graph, root: nn.Module) -> None:
    """Replace every functional call that the op table reads as a layer over its module's
    own tensors by a ``call_module`` node of that module (``node.meta[LOWERED]``), or mark
    why such a call is refused (``node.meta[REFUSED]``: a tensor of the model's root, a
    module holding it under another name, settings the module contradicts)."""
    lowered: dict[str, tuple[str, ...]] = {}
    live = _reading_input(graph)
    for node in list(graph.nodes):
        reader = LOWERINGS.get(node.target) if node.op in ("call_function", "call_method") \
            and node in live else None
        found = reader(node, lambda n: _value(root, n)) if reader is not None else None
        if found is None and reader is not None:
            found = _computed_tensor(node, live)
        if found is None:
            continue
        owner, reason = _owner(found, root) if isinstance(found, Lowered) else ("", found)
        computed = [n.name for n in node.all_input_nodes
                    if isinstance(found, Lowered) and n not in found.marks]
        if reason is None and computed:
            reason = (f"a functional layer with arguments computed in forward "
                      f"({', '.join(computed)}); pass constants, or use the module form")
        if reason is None and lowered.get(owner, _tensors(found)) != _tensors(found):
            reason = (f"module '{owner}' calls several functional layers; pathlift needs "
                      "one module per layer (its weight and bias as `weight` and `bias`)")
        if reason is not None:
            node.meta[REFUSED] = reason
            _explained(node, live)
            continue
        lowered[owner] = _tensors(found)
        _replace(graph, node, found, owner)


def select_values(graph: fx.Graph) -> None:
    """``torch.max(h, dim)`` (or ``h.max(dim)``) whose users read only ``.values`` or
    ``[0]`` becomes one node of the op table's function of its values
    (``pathlift.graph.ops.base.VALUES_OF``): max-pool neurons. A call whose indices are
    read is refused (``node.meta[REFUSED]``)."""
    for node in list(graph.nodes):
        values = VALUES_OF.get(node.target) if node.op in ("call_function", "call_method") \
            else None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if values is None or dim is None or isinstance(dim, fx.Node) or not node.users:
            continue
        if not all(_reads_values(u, node) for u in node.users):
            node.meta[REFUSED] = ("its indices (argmax) are read: they are no neuron of Def. "
                                  "2.2.2; read only .values (max-pool neurons)")
            continue
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        with graph.inserting_before(node):
            new = graph.call_function(values, (node.args[0], dim, keepdim))
        for user in list(node.users):
            user.replace_all_uses_with(new)
            graph.erase_node(user)
        graph.erase_node(node)


def _reads_values(user: fx.Node, node: fx.Node) -> bool:
    return user.op == "call_function" and user.args[0] is node and (
        (user.target is getattr and user.args[1] == "values")
        or (user.target is operator.getitem and user.args[1] == 0))


def _reading_input(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose value depends on the model's input."""
    live: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or any(n in live for n in node.all_input_nodes):
            live.add(node)
    return live


def _computed_tensor(node: fx.Node, live: set[fx.Node]) -> str | None:
    """Why a layer call whose tensor is computed in forward from parameters alone (a
    standardised weight, as timm's StdConv2d and ScaledStdConv2d) is refused, marking
    that computation as explained by it (``COMPUTED``); None when it has no such tensor."""
    if not any(n not in live and n.op != "get_attr" for n in node.all_input_nodes):
        return None
    reads = _explained(node, live)
    owners = sorted({r.rpartition(".")[0] or "<root>" for r in reads})
    return (f"module '{', '.join(owners)}': its weight is computed in forward from "
            f"{', '.join(sorted(reads))} (a weight "
            "standardisation, as timm's StdConv2d); pathlift measures a layer on its stored "
            "weight and bias, and rescaling or pruning the stored tensors would not act "
            "on the computed ones; use a plain convolution holding the effective weight")


def _explained(node: fx.Node, live: set[fx.Node]) -> set[str]:
    """Mark what ``node`` reads that is computed from parameters alone as explained by
    its refusal (``COMPUTED``); the module tensors it reads."""
    reads, todo = set(), [n for n in node.all_input_nodes if n not in live]
    while todo:
        n = todo.pop()
        n.meta[COMPUTED] = True
        if n.op == "get_attr":
            reads.add(str(n.target))
        todo += n.all_input_nodes
    return reads


def _value(root: nn.Module, node: fx.Node) -> Any:
    """The tensor a ``get_attr`` node reads (a meta tensor when tracing), else None."""
    if node.op != "get_attr":
        return None
    *path, leaf = str(node.target).split(".")
    module = root.get_submodule(".".join(path))
    return getattr(module, leaf, None)


def _tensors(found: Lowered) -> tuple[str, ...]:
    return tuple(sorted(_path(n) for n, m in found.marks.items() if m is not INPUT))


def _path(node: fx.Node) -> str:
    """The qualified name of the module tensor an operand node reads (``fc.weight``, also
    through a transposition and torch.nn.utils.prune's ``weight_orig * weight_mask``)."""
    while node.op != "get_attr":  # a flip reads its first argument, a mask its second
        node = node.args[1] if node.target is operator.mul else node.args[0]
    return str(node.target).removesuffix("_orig")


def _owner(found: Lowered, root: nn.Module) -> tuple[str, str | None]:
    """(the path of the module holding the call's tensors, why it cannot be its layer)."""
    names = {m.role: _path(n) for n, m in found.marks.items() if m is not INPUT}
    owners = {name.rpartition(".")[0] for name in names.values()}
    what = f"{found.form.__name__}'s op over {', '.join(sorted(names.values()))}"
    if len(owners) != 1 or "" in owners:
        return "", (f"{what}: pathlift measures a functional layer whose tensors belong to "
                    "one submodule (not the model's root), as its `weight` and `bias`; move "
                    "them into a module of their own, or use the module form")
    owner = owners.pop()
    wrong = sorted(f"'{name}' as its {role}" for role, name in names.items()
                   if name != f"{owner}.{role}")
    if wrong:
        return owner, (f"{what} reads {', '.join(wrong)}; name the module's tensors as the "
                       f"module form does ({', '.join(names)}), or use the module form")
    module = root.get_submodule(owner)
    for key, default in found.checked.items():
        own = getattr(module, key, default)
        if own != found.settings[key]:
            return owner, (f"{what} is called with {key}={found.settings[key]!r} but "
                           f"module '{owner}' holds {key}={own!r}, which pathlift reads "
                           "when it rescales or quantises it; make them agree")
    return owner, None


def _replace(graph: fx.Graph, node: fx.Node, found: Lowered, owner: str) -> None:
    """``node`` becomes ``call_module(owner, (x,))`` running a ``FunctionalCall``; the
    tensor reads it leaves unused are erased."""
    x = next(n for n, m in found.marks.items() if m is INPUT)
    marks = dict(found.marks)
    args = fx.node.map_arg(node.args, lambda n: marks.get(n, n))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: marks.get(n, n))
    call = FunctionalCall(found.handler, found.form, found.settings, node.target,
                          tuple(args), dict(kwargs))
    with graph.inserting_before(node):
        new = graph.call_module(owner, (x,))
    new.meta[LOWERED] = call
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    todo = [n for n in marks if n is not x]
    while todo:  # the operand nodes, then what they read, once unused
        dead = todo.pop()
        if not dead.users and dead.op in ("get_attr", "call_function", "call_method"):
            todo += dead.all_input_nodes
            graph.erase_node(dead)
