"""One walker for every pass over a traced graph: torch.fx's ``Interpreter`` sending each
operation node to the hook of its kind (``on_affine``, ``on_relu``, ``on_activation``,
``on_maxpool``, ``on_pool``, ``on_add``, ``on_cat``, ``on_reshape``, ``on_identity``,
``on_shape``), with the node's concrete ``Call`` and its handler. A pass overrides the
hooks it needs, reads handler traits and never lists kinds, except those it refuses
(``refuses``). ``cat`` defaults to
``on_reshape``, which runs the op on the pass's values as they are (right for tensors of
neuron ids), ``identity`` gives back a module's input; kinds that make neurons have no
default: a pass that meets one it does not handle raises a typed error naming the node.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import fx

from pathlift.errors import Problem, UnsupportedModelError
from pathlift.graph.layer_graph import HANDLER, GraphInterpreter
from pathlift.graph.ops import Call, Handler, Kind

_HOOKS = {kind: f"on_{kind.value}" for kind in Kind}


class OpWalker(GraphInterpreter):
    """Dispatch each operation node to ``on_<kind>(handler, call)``. ``purpose`` names
    the pass in the error raised for a kind it does not handle; ``refuses`` maps each kind
    the pass states it refuses to the reason appended to that error (a pass implements
    every kind's hook or lists the kind there: tests/test_op_checklist.py)."""

    purpose = "this pass"
    refuses: ClassVar[dict[Kind, str]] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("placeholder", "output"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        handler = n.meta[HANDLER]
        return self.dispatch(handler, Call(n, self.layer_graph.submodule(n), tuple(args),
                                           dict(kwargs)))

    def dispatch(self, handler: Handler, call: Call) -> Any:
        """The hook of the handler's kind on one call, or the refusal this pass states
        (a pass may also send one call of its own making, as ``antecedent_counts`` does)."""
        why = self.refuses.get(handler.kind)
        if why is not None:
            raise self.unsupported(handler, call, why)
        return getattr(self, _HOOKS[handler.kind])(handler, call)

    def unsupported(self, handler: Handler, call: Call, why: str = "") -> UnsupportedModelError:
        """The error for a node this pass cannot handle."""
        return UnsupportedModelError([Problem(
            call.label, handler.name,
            f"{self.purpose} is not implemented for this operation{why}")])

    def on_affine(self, handler: Handler, call: Call) -> Any:
        raise self.unsupported(handler, call)

    def on_relu(self, handler: Handler, call: Call) -> Any:
        raise self.unsupported(handler, call)

    def on_activation(self, handler: Handler, call: Call) -> Any:
        raise self.unsupported(handler, call)

    def on_maxpool(self, handler: Handler, call: Call) -> Any:
        raise self.unsupported(handler, call)

    def on_pool(self, handler: Handler, call: Call) -> Any:
        raise self.unsupported(handler, call)

    def on_add(self, handler: Handler, call: Call) -> Any:
        raise self.unsupported(handler, call)

    def on_reshape(self, handler: Handler, call: Call) -> Any:
        return call.run()

    def on_cat(self, handler: Handler, call: Call) -> Any:
        return self.on_reshape(handler, call)

    def on_identity(self, handler: Handler, call: Call) -> Any:
        """No neuron at all. A module (Identity, Dropout) gives back its input without
        running, so a Dropout left in training mode cannot drop a pass's values; a method
        (``contiguous``) runs as ``on_reshape``."""
        if call.module is not None:
            return call.args[0]
        return self.on_reshape(handler, call)

    def on_shape(self, handler: Handler, call: Call) -> Any:
        return call.run()
