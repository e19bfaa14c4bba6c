"""The checklist of docs/networks.md ("Adding an operation"), enforced: every pass over the
traced graph (an ``OpWalker`` subclass anywhere in pathlift) implements the hook of every
op kind or states in ``refuses`` that it refuses the kind, so a new kind fails here until
each pass has decided; a stated refusal is a typed error naming the node. Every kind has
its hook on ``OpWalker``, and every registered handler's kind is one of them."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import ClassVar

import pytest
import torch
from torch import nn

import pathlift
from pathlift.errors import UnsupportedModelError
from pathlift.graph import OpWalker, graph_of
from pathlift.graph.ops import FUNCTIONS, METHODS, MODULES, Kind


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(c) for c in found))


#: kinds whose neurons no pass can walk past without a rule of its own: OpWalker's hooks
#: for them only raise. The others have working defaults on OpWalker (relabel the
#: values, give back the input, run the Python op): a new kind goes in one of the two.
NEURON_KINDS = [Kind.AFFINE, Kind.RELU, Kind.ACTIVATION, Kind.MAXPOOL, Kind.POOL, Kind.ADD]
DEFAULTED_KINDS = [Kind.RESHAPE, Kind.CAT, Kind.IDENTITY, Kind.SHAPE]


def _implements(cls: type, kind: Kind) -> bool:
    return getattr(cls, f"on_{kind.value}") is not getattr(OpWalker, f"on_{kind.value}")


@functools.cache
def _passes() -> list[type]:
    """Every walker that implements a neuron kind (a base that only says how values move,
    such as ScaledWalker, is no pass of its own), every module of pathlift imported first
    so that a pass defined anywhere is a subclass. Imported when a test asks, not at
    collection: the walk imports every optional integration (Lightning, Torch-Pruning,
    timm), which each process collecting the suite would pay for."""
    for info in pkgutil.walk_packages(pathlift.__path__, "pathlift."):
        importlib.import_module(info.name)
    return sorted((w for w in _subclasses(OpWalker)
                   if any(_implements(w, k) for k in NEURON_KINDS)),
                  key=lambda w: f"{w.__module__}.{w.__qualname__}")


def test_every_kind_is_decided_has_a_hook_and_every_handler_a_kind():
    assert sorted(k.value for k in NEURON_KINDS + DEFAULTED_KINDS) == \
        sorted(k.value for k in Kind), "a new kind: add it to NEURON_KINDS or DEFAULTED_KINDS"
    for kind in Kind:
        assert callable(getattr(OpWalker, f"on_{kind.value}", None)), kind
    for handler in (*MODULES.values(), *FUNCTIONS.values(), *METHODS.values()):
        assert isinstance(handler.kind, Kind), handler


def test_the_passes_are_found():
    names = {w.__qualname__ for w in _passes()}
    assert {"AbsPowInterpreter", "LivePass", "_ProductPass", "_Labeller", "_Builder",
            "_LayerCount", "_BoxPass"} <= names


def test_every_pass_implements_or_refuses_every_kind():
    for walker in _passes():
        undecided = [k.value for k in NEURON_KINDS
                     if not _implements(walker, k) and k not in walker.refuses]
        assert not undecided, (f"{walker.__qualname__} neither implements on_<kind> nor "
                               f"lists in `refuses` the kinds {undecided}")
        both = [k.value for k in walker.refuses if _implements(walker, k)]
        assert not both, f"{walker.__qualname__} implements and refuses {both}"


def test_a_stated_refusal_is_a_typed_error_naming_the_node():
    class Refusing(OpWalker):
        purpose = "a test pass"
        refuses: ClassVar[dict[Kind, str]] = {Kind.RELU: " (it stops at ReLU)"}

        def on_affine(self, handler, call):
            return call.run()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return torch.relu(self.fc(x))

    with pytest.raises(UnsupportedModelError, match=r"relu.*a test pass is not implemented "
                                                    r"for this operation \(it stops at ReLU\)"):
        Refusing(graph_of(Net(), (3,)))(torch.ones(1, 3))
