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

A weight the module computes in forward from its own tensors alone (weight
standardisation: timm's ``StdConv2d``, ``ScaledStdConv2d``, a user's
``F.conv2d(x, standardise(self.weight))``) is a ``Derivation``: the view computes it from
the module's current tensors whenever a pass reads it, so the layer is measured on its
effective weight (the weights of its DAG neurons, Def. 2.2.2), as a torch.nn.utils.
parametrize layer is; its handler (``pathlift.graph.ops.derived``) refuses the
transformations that would write the stored tensors in its place.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, fx, nn
from torch.nn.utils import prune

from pathlift.graph.boundary import own_param, param
from pathlift.graph.ops import Handler
from pathlift.graph.ops.base import INPUT, LOWERINGS, VALUES_OF, Lowered, Operand
from pathlift.graph.ops.derived import derived_layer

LOWERED = "pathlift_lowered"  # node.meta key of a lowered call's ``FunctionalCall``
REFUSED = "pathlift_refused"  # node.meta key of the reason a functional layer is refused
COMPUTED = "pathlift_computed"  # node.meta key of a tensor computed from parameters alone,
# for a refused layer (its reason says why; the node itself is no problem of its own)


@dataclass(frozen=True)
class Derivation:
    """A tensor a module's forward computes from that module's own tensors alone: its
    computation, a small fx graph (no input) whose ``get_attr`` nodes read ``reads``
    (qualified names in the traced model)."""

    graph: fx.Graph
    reads: tuple[str, ...]

    def compute(self, read: Callable[[str], Tensor]) -> Tensor:
        """The tensor, from ``read(qualified name)`` of each tensor it reads."""
        env: dict[fx.Node, Any] = {}
        for node in self.graph.nodes:
            if node.op == "output":
                return env[node.args[0]]
            if node.op == "get_attr":
                env[node] = read(str(node.target))
                continue
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            env[node] = getattr(args[0], node.target)(*args[1:], **kwargs) \
                if node.op == "call_method" else node.target(*args, **kwargs)
        raise AssertionError("a derivation graph has an output")


def _derivation(node: fx.Node, live: set[fx.Node]) -> Derivation | str:
    """The ``Derivation`` of ``node`` (not reading the input), or why it is none (it calls
    a submodule, or reads no tensor of the model)."""
    needed, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n not in needed:
            needed.add(n)
            todo += n.all_input_nodes
    graph, env = fx.Graph(), {}
    for n in node.graph.nodes:  # topological order
        if n in needed:
            if n.op not in ("get_attr", "call_function", "call_method"):
                return f"computes a weight with {n.op} '{n.name}'"
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(env[node])
    reads = tuple(sorted(str(n.target) for n in needed if n.op == "get_attr"))
    return Derivation(graph, reads) if reads else "computes a tensor from constants alone"


@dataclass(frozen=True)
class FunctionalCall:
    """What a lowered node runs: ``target`` (a function, or a method name) with ``args``
    and ``kwargs`` in which ``INPUT`` stands for the activation and an ``Operand`` for a
    tensor of the view; ``form`` and ``settings`` make the view (``functional_view``);
    ``derived`` the operands the module computes in forward, by role; ``names`` the
    module's own name of each role it holds under another (``{"weight": "w"}``)."""

    handler: Handler
    form: type
    settings: dict[str, Any]
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    derived: dict[str, Derivation] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    reads: frozenset[str] = frozenset()  # the module's names of every tensor it reads
    checked: frozenset[str] = frozenset()  # settings the module holds too (Lowered.checked)

    def run(self, view: nn.Module, x: Tensor) -> Any:
        """The original call on ``x`` with the view's tensors, as the module's forward
        reads them (under torch.nn.utils.prune, what its pre-hook, run by the view's
        ``__call__``, has just computed, under the module's own name)."""
        def fill(a: Any) -> Any:
            if a is INPUT:
                return x
            if isinstance(a, Operand):
                own = vars(view).get(self.names.get(a.role, ""))  # pruned, by _Masking
                return a.read(getattr(view, a.role) if own is None else own)
            return a
        args = fx.node.map_aggregate(self.args, fill)
        kwargs = fx.node.map_aggregate(self.kwargs, fill)
        if isinstance(self.target, str):
            return getattr(args[0], self.target)(*args[1:], **kwargs)
        return self.target(*args, **kwargs)


_SUFFIXES = ("", "_orig", "_mask")  # a tensor, and torch.nn.utils.prune's two for it


class RenamedTable(MutableMapping):
    """A module's parameter or buffer table as its functional layer reads it: only the
    tensors the call reads (``reads``, the module's names: a ``bias`` it does not pass is
    no bias of the layer), under the module form's names: ``names`` maps a role
    (``weight``) to the module's own name (``w``), also under torch.nn.utils.prune's
    suffixes (``weight_orig`` is ``w_orig``). A role is looked up first (so that names may
    swap: ``F.linear(x, self.bias, self.weight)``); a new key is the table's."""

    def __init__(self, table: dict[str, Any], names: dict[str, str], reads: frozenset[str]):
        self.table = table
        self.own = {role + s: name + s for role, name in names.items() for s in _SUFFIXES}
        self.role = {name: role for role, name in self.own.items()}
        self.reads = {name + s for name in reads for s in _SUFFIXES}

    def _key(self, key: str) -> str:
        if key in self.own:
            return self.own[key]
        if key in self.reads:
            return key
        raise KeyError(key)

    def __getitem__(self, key: str) -> Any:
        return self.table[self._key(key)]

    def __setitem__(self, key: str, value: Any) -> None:
        self.table[self.own.get(key, key)] = value

    def __delitem__(self, key: str) -> None:
        del self.table[self._key(key)]

    def __iter__(self) -> Iterator[str]:
        return (self.role.get(k, k) for k in list(self.table)
                if k in self.role or k in self.reads)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def tensor_name(node: fx.Node, role: str) -> str:
    """The name under which the module that a layer node computes with holds the tensor
    ``role`` (``weight``, ``bias``): its state_dict leaf, where torch.nn.utils.prune puts
    its mask (``w`` of ``F.linear(x, self.w)``; ``role`` itself for a module layer)."""
    call = node.meta.get(LOWERED)
    return role if call is None else call.names.get(role, role)


def layer_in(model: nn.Module, target: str, call: FunctionalCall | None) -> nn.Module:
    """The module a layer ``target`` computes with in ``model`` (the traced model or a
    copy of it), as its handler reads and writes it: the module itself, or for a lowered
    functional layer (``call``) holding its tensors under other names its view as the
    module form, sharing its tensors."""
    module = model.get_submodule(target)
    return module if call is None or not call.names else functional_view(module, call)


_VIEW_CLASSES: dict[tuple[type, tuple[str, ...]], type] = {}


def _derived(role: str) -> property:
    """The view's tensor ``role`` computed from the module's current tensors (its own
    tables, pruning masks applied), with their autograd history."""
    def compute(self: nn.Module) -> Tensor:
        return self.pathlift_call.derived[role].compute(
            lambda name: own_param(self, name.rpartition(".")[2], detach=False))
    return property(compute)


def _view_class(form: type, derived: tuple[str, ...] = ()) -> type:
    """``form`` whose forward is the lowered call, whose ``derived`` tensors are computed
    (one class per form and roles) and whose settings that its module holds too are
    written to the module as well (quantising an eval BatchNorm sets eps to 0)."""
    key = (form, derived)
    if key not in _VIEW_CLASSES:
        def forward(self: nn.Module, x: Tensor) -> Any:
            return self.pathlift_call.run(self, x)

        def set_attr(self: nn.Module, name: str, value: Any) -> None:
            if name in self.pathlift_call.checked:  # the module's own setting: it reads it
                setattr(self.pathlift_owner, name, value)
            form.__setattr__(self, name, value)
        _VIEW_CLASSES[key] = type(
            f"Functional{form.__name__}", (form,),
            {"forward": forward, "__setattr__": set_attr, "__module__": __name__,
             **{role: _derived(role) for role in derived}})
    return _VIEW_CLASSES[key]


def functional_view(owner: nn.Module, call: FunctionalCall) -> nn.Module:
    """``owner`` seen as ``call.form``: an instance of (a subclass of) the module form that
    shares ``owner``'s parameter and buffer tables (its tensors, pruning masks included;
    only those the call reads, under the form's names: ``RenamedTable``, when ``owner``
    holds others or names them otherwise), with the call's settings, no submodules and
    only the owner's pruning pre-hooks (but those of a tensor it computes, which reads the
    pruned tensor itself; ``_Masking`` those of a tensor held under another name); its
    forward runs the original call. ``owner`` is not touched."""
    view = object.__new__(_view_class(call.form, tuple(sorted(call.derived))))
    state = view.__dict__
    state.update(vars(owner))
    state.update(call.settings)
    state["pathlift_call"], state["pathlift_owner"] = call, owner
    state["_modules"] = {}
    for table in ("_parameters", "_buffers"):
        own = getattr(owner, table)
        if call.names or any(k.removesuffix("_orig").removesuffix("_mask") not in call.reads
                             for k in own):
            state[table] = RenamedTable(own, call.names, call.reads)
    for table in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                  "_backward_pre_hooks", "_backward_hooks"):
        state[table] = OrderedDict()
    renamed = set(call.names.values())
    state["_forward_pre_hooks"].update(
        (k, _Masking(owner, h) if h._tensor_name in renamed else h)
        for k, h in owner._forward_pre_hooks.items()
        if isinstance(h, prune.BasePruningMethod) and h._tensor_name not in call.derived)
    return view


class _Masking(prune.BasePruningMethod):
    """torch.nn.utils.prune's pre-hook ``method`` for a view whose tensor ``owner`` holds
    under another name: the pruned tensor computed as the hook computes it on ``owner``
    (whose tables the view shares), left on the view under that name."""

    def __init__(self, owner: nn.Module, method: prune.BasePruningMethod):
        self.owner, self.method, self._tensor_name = owner, method, method._tensor_name

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return self.method.compute_mask(t, default_mask)

    def __call__(self, view: nn.Module, inputs: Any) -> None:
        view.__dict__[self._tensor_name] = self.method.apply_mask(self.owner)


def lower_calls(graph: fx.Graph, root: nn.Module) -> None:
    """Replace every functional call that the op table reads as a layer over its module's
    own tensors by a ``call_module`` node of that module (``node.meta[LOWERED]``), or mark
    why such a call is refused (``node.meta[REFUSED]``: a tensor of the model's root, a
    module holding it under another name, settings the module contradicts)."""
    lowered: dict[str, tuple[str, ...]] = {}
    live = _reading_input(graph)
    derivations: dict[fx.Node, Derivation | str] = {}

    def value(n: fx.Node) -> Any:
        return _value(root, n, live, derivations)

    for node in list(graph.nodes):
        reader = LOWERINGS.get(node.target) if node.op in ("call_function", "call_method") \
            and node in live else None
        found = reader(node, value) if reader is not None else None
        if found is None and reader is not None:
            found = _computed_tensor(node, live)
        if found is None:
            continue
        derived = {m.role: derivations[n] for n, m in found.marks.items()
                   if isinstance(m, Operand) and m.derived} if isinstance(found, Lowered) else {}
        owner, reason = _owner(found, root, derived) if isinstance(found, Lowered) \
            else ("", found)
        computed = [n.name for n in node.all_input_nodes
                    if isinstance(found, Lowered) and n not in found.marks]
        if reason is None and computed:
            reason = (f"a functional layer with arguments computed in forward "
                      f"({', '.join(computed)}); pass constants, or use the module form")
        tensors = _tensors(found, derived) if isinstance(found, Lowered) else ()
        if reason is None and lowered.get(owner, tensors) != tensors:
            reason = (f"module '{owner}' calls several functional layers; pathlift needs "
                      "one module per layer: move each layer's tensors into a module of "
                      "their own")
        if reason is not None:
            node.meta[REFUSED] = reason
            _explained(node, live)
            continue
        lowered[owner] = tensors
        live.add(_replace(graph, node, found, owner, derived))


_SHAPE_ATTRIBUTES = ("shape", "ndim")
_SHAPE_METHODS = ("size", "dim", "numel")


def fold_shape_reads(graph: fx.Graph, root: nn.Module) -> None:
    """A module tensor's shape read in forward (``weight.shape[-2:]``, ``self.w.size(0)``:
    timm's ``Conv2dSame`` pads by its kernel's size) is a constant of the model: each read
    becomes its value, so the tensor is read by its layer alone."""
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        for user in list(node.users):
            attribute = user.op == "call_function" and user.target is getattr and \
                len(user.args) == 2 and user.args[1] in _SHAPE_ATTRIBUTES
            method = user.op == "call_method" and user.target in _SHAPE_METHODS and \
                not any(isinstance(a, fx.Node) for a in (*user.args[1:], *user.kwargs.values()))
            if not (attribute or method) or user.args[0] is not node:
                continue
            tensor = _read(root, str(node.target))
            value = getattr(tensor, user.args[1]) if attribute else \
                getattr(tensor, str(user.target))(*user.args[1:], **user.kwargs)
            _substitute(user, value)
            graph.erase_node(user)
        if not node.users:
            graph.erase_node(node)


def commute_scales(graph: fx.Graph) -> None:
    """``c * x`` (``operator.mul(2.0, h)``) becomes ``x * c``: the same constant scale, its
    activation first, where every op reads its input (and what Python runs: the tensor's
    ``__rmul__``, so validation's eager run records the same op)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is operator.mul and \
                len(node.args) == 2 and isinstance(node.args[0], int | float) and \
                not isinstance(node.args[0], bool) and isinstance(node.args[1], fx.Node):
            node.args = (node.args[1], node.args[0])


def _substitute(node: fx.Node, value: Any) -> None:
    """Every reader of ``node`` reads ``value`` in its place."""
    def put(n: fx.Node) -> Any:
        return value if n is node else n
    for reader in list(node.users):
        reader.args = fx.node.map_arg(reader.args, put)
        reader.kwargs = fx.node.map_arg(reader.kwargs, put)


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
            which = "argmin" if "min" in getattr(node.target, "__name__", str(node.target)) \
                else "argmax"
            node.meta[REFUSED] = (f"its indices ({which}) are read: they are no neuron of Def. "
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
    """Why a layer call with a tensor computed in forward from parameters alone that the
    op table does not read as a layer's weight or bias is refused, marking that
    computation as explained by it (``COMPUTED``); None when it has no such tensor."""
    if not any(n not in live and n.op != "get_attr" for n in node.all_input_nodes):
        return None
    reads = _explained(node, live)
    owners = sorted({r.rpartition(".")[0] or "<root>" for r in reads})
    return (f"module '{', '.join(owners)}' computes a tensor of this call in forward from "
            f"{', '.join(sorted(reads))}, which pathlift does not read as the layer's weight "
            "or bias; compute the weight (and bias) alone from the module's own tensors, "
            "or use a layer holding the effective weight")


def _explained(node: fx.Node, live: set[fx.Node]) -> set[str]:
    """Mark what ``node`` reads that is computed from parameters alone as explained by
    its refusal (``COMPUTED``); the module tensors it reads."""
    reads, todo = set(), [n for n in node.all_input_nodes if n not in live]
    seen: set[fx.Node] = set()
    while todo:
        n = todo.pop()
        if n in seen:  # shared sub-expressions: each node once, not once per path
            continue
        seen.add(n)
        n.meta[COMPUTED] = True
        if n.op == "get_attr":
            reads.add(str(n.target))
        todo += n.all_input_nodes
    return reads


def _value(root: nn.Module, node: fx.Node, live: set[fx.Node],
           derivations: dict[fx.Node, Derivation | str]) -> Any:
    """The tensor a node holds without reading the input (a meta tensor when tracing):
    what a ``get_attr`` node reads, or a tensor computed from the model's tensors alone
    (its ``Derivation`` kept in ``derivations``); None for a node reading the input."""
    if node.op == "get_attr":
        return _read(root, str(node.target))
    if node in live:
        return None
    if node not in derivations:
        derivations[node] = _derivation(node, live)
    found = derivations[node]
    return None if isinstance(found, str) else found.compute(lambda q: _read(root, q))


def _read(root: nn.Module, name: str) -> Any:
    *path, leaf = name.split(".")
    return param(root.get_submodule(".".join(path)), leaf, detach=False)


def _tensors(found: Lowered, derived: dict[str, Derivation]) -> tuple[str, ...]:
    return tuple(sorted({*(_path(n) for n, m in found.marks.items()
                           if m is not INPUT and not m.derived),
                         *(r for d in derived.values() for r in d.reads)}))


def _path(node: fx.Node) -> str:
    """The qualified name of the module tensor an operand node reads (``fc.weight``, also
    through a transposition and torch.nn.utils.prune's ``weight_orig * weight_mask``)."""
    while node.op != "get_attr":  # a flip reads its first argument, a mask its second
        node = node.args[1] if node.target is operator.mul else node.args[0]
    return str(node.target).removesuffix("_orig")


def _owner(found: Lowered, root: nn.Module, derived: dict[str, Derivation | str]
           ) -> tuple[str, str | None]:
    """(the path of the module holding the call's tensors, why it cannot be its layer);
    ``derived``: the tensors the call reads as computed in forward, by role. The module
    may hold them under any names (``_renames``)."""
    names = {m.role: _path(n) for n, m in found.marks.items()
             if m is not INPUT and not m.derived}
    reads = {r for d in derived.values() if not isinstance(d, str) for r in d.reads}
    owners = {name.rpartition(".")[0] for name in (*names.values(), *reads)}
    what = f"{found.form.__name__}'s op over {', '.join(sorted({*names.values(), *reads}))}"
    bad = [f"its {role} {d}" for role, d in derived.items() if isinstance(d, str)]
    if bad:
        return "", f"{what}: {'; '.join(bad)}; use a layer holding the effective weight"
    if len(owners) != 1 or "" in owners:
        made = "".join(f"its {role} is computed in forward from {', '.join(d.reads)} (such "
                       "as timm's BEiT concatenation of q_bias and v_bias); " for role, d in
                       derived.items() if not isinstance(d, str) and len(d.reads) > 1)
        return "", (f"{what}: {made}pathlift measures a functional layer whose tensors "
                    "belong to one submodule (not the model's root); move them into a module "
                    "of their own, or use the module form")
    owner = owners.pop()
    module = root.get_submodule(owner)
    renames = _renames(found)
    hidden = sorted(role for role in renames if role not in renames.values()
                    and (role in module._parameters or role in module._buffers))
    if hidden:
        return owner, (f"{what}: module '{owner}' also holds a tensor named "
                       f"{', '.join(hidden)} that the call does not read as its "
                       f"{', '.join(hidden)}; rename it")
    for key in found.checked:  # a module without the setting (BlurPool2d) takes the call's
        own = getattr(module, key, found.settings[key])
        if own != found.settings[key]:
            return owner, (f"{what} is called with {key}={found.settings[key]!r} but "
                           f"module '{owner}' holds {key}={own!r}, which pathlift reads "
                           "when it rescales or quantises it; make them agree")
    return owner, None


def _renames(found: Lowered) -> dict[str, str]:
    """The call's roles its module holds under another name: ``{"weight": "w"}``."""
    names = {m.role: _path(n).rpartition(".")[2] for n, m in found.marks.items()
             if m is not INPUT and not m.derived}
    return {role: name for role, name in names.items() if name != role}


def _replace(graph: fx.Graph, node: fx.Node, found: Lowered, owner: str,
             derived: dict[str, Derivation]) -> fx.Node:
    """``node`` becomes ``call_module(owner, (x,))`` running a ``FunctionalCall`` (the new
    node returned); the tensor reads it leaves unused are erased. A call with ``derived``
    tensors gets the handler of a layer whose weight is computed
    (``pathlift.graph.ops.derived``)."""
    x = next(n for n, m in found.marks.items() if m is INPUT)
    marks = dict(found.marks)
    args = fx.node.map_arg(node.args, lambda n: marks.get(n, n))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: marks.get(n, n))
    handler = derived_layer(found.handler, owner, sorted(
        {r for d in derived.values() for r in d.reads})) if derived else found.handler
    reads = frozenset(name.rpartition(".")[2] for name in _tensors(found, derived))
    call = FunctionalCall(handler, found.form, found.settings, node.target,
                          tuple(args), dict(kwargs), derived, _renames(found), reads,
                          frozenset(found.checked))
    with graph.inserting_before(node):
        new = graph.call_module(owner, (x,))
    new.meta[LOWERED] = call
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    todo, erased = [n for n in marks if n is not x], set()
    while todo:  # the operand nodes, then what they read, once unused
        dead = todo.pop()
        if dead not in erased and not dead.users and \
                dead.op in ("get_attr", "call_function", "call_method"):
            erased.add(dead)
            todo += dead.all_input_nodes
            graph.erase_node(dead)
    return new
