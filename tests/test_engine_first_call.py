"""What a first call does once instead of several times (issue 41, the engine's first call)
gives what the separate steps gave: the one walk of the model (``boundary.survey``)
finds the dtype, device and named modules that torch's own walks find and refuses what
``readable`` refused; the trace's tables of called modules are those of
``named_modules``; a BatchNorm folded once in float64 gives every dtype's fold; a class
whose ``forward`` changes after a trace is traced anew. Each on models written the way
users write them (functional layers, a shared layer, a pruned layer, a subclass)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

from nets import SHAPE, residual_cnn
from pathlift.errors import InvalidParameterError
from pathlift.graph import graph_of
from pathlift.graph.boundary import dtype_device, readable, structure_key, survey
from pathlift.graph.ops import batchnorm_affine
from pathlift.lift import path_norm
from pathlift.testing.neurons import NeuronDAG


class Projection(nn.Module):
    """A user's own layer: its tensors, a functional forward."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in))
        self.bias = nn.Parameter(torch.randn(d_out))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Functional(nn.Module):
    """A functional layer, a layer called twice, BatchNorm with buffers only, dict output."""

    def __init__(self):
        super().__init__()
        self.inp = Projection(4, 5)
        self.shared = nn.Linear(5, 5)
        self.bn = nn.BatchNorm1d(5, affine=False)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(5, 2))

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = self.shared(F.relu(self.shared(h)))
        return {"logits": self.out(self.bn(h))}


def _models() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    pruned = residual_cnn()
    prune.l1_unstructured(pruned.head, "weight", amount=0.5)
    shared = Functional().eval()
    shared.alias = shared.out  # the same module under two names
    return [("residual", residual_cnn(), SHAPE), ("pruned", pruned, SHAPE),
            ("functional", shared, (4,)),
            ("buffers only", nn.Sequential(nn.BatchNorm1d(3, affine=False)).eval().half(), (3,))]


@pytest.mark.parametrize("name,model,shape", _models(), ids=[m[0] for m in _models()])
def test_the_one_walk_finds_what_torchs_walks_find(name, model, shape):
    found = survey(model)
    assert found.module is model
    assert (found.dtype, found.device) == dtype_device(model)
    assert list(found.modules.items()) == list(model.named_modules(remove_duplicate=False))
    assert found.key == structure_key(model)
    assert survey(model, as_eval=True).key == structure_key(model, as_eval=True)


def test_the_key_changes_with_each_part_it_stands_for():
    model = residual_cnn()
    key = survey(model).key
    with torch.no_grad():
        model.head.weight.mul_(2.0)  # an optimiser step keeps it
    assert survey(model).key == key
    changes = [lambda m: m.train(), lambda m: setattr(m.head, "weight", nn.Parameter(
        m.head.weight.detach().clone())), lambda m: m.head.register_forward_hook(
        lambda *a: None), lambda m: prune.identity(m.head, "bias"),
        lambda m: m.head.to(torch.float32)]
    for change in changes:
        model = residual_cnn()
        change(model)
        assert survey(model).key != key


def test_a_tensor_without_values_is_refused_naming_it():
    model = residual_cnn()
    model.head.to_empty(device="meta")
    with pytest.raises(InvalidParameterError, match=r"^'head\.weight' \(Linear\) is on the meta"):
        survey(model)
    with pytest.raises(InvalidParameterError, match=r"'head\.weight'"):
        readable(model)
    with pytest.raises(InvalidParameterError, match=r"'head\.weight'"):
        path_norm(model, SHAPE)


@pytest.mark.parametrize("name,model,shape", _models()[:3], ids=[m[0] for m in _models()[:3]])
def test_a_graph_finds_the_modules_named_modules_finds(name, model, shape):
    graph = graph_of(model, shape)
    table = dict(graph.module.named_modules(remove_duplicate=False))
    called = [n for n in graph.graph.nodes if n.op == "call_module"]
    assert called
    for node in called:
        assert graph.submodule(node) is table[node.target]
    # the path-norm over those modules, against explicit path enumeration
    for q in (1.0, 2.0):
        expected = NeuronDAG.from_module(model, shape).path_norm_log10(q)
        assert path_norm(model, shape, q=q).log10 == pytest.approx(expected, abs=1e-12)


def _batchnorm() -> nn.BatchNorm2d:
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_var.uniform_(0.1, 3.0)
        bn.running_mean.normal_()
        bn.weight.normal_()
        bn.bias.normal_()
    return bn


def _fold_here(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """x*a + c of an eval BatchNorm, in float64, by the formula (thesis, below Def. 2.2.2)."""
    v, m = bn.running_var.double(), bn.running_mean.double()
    a = bn.weight.detach().double() / torch.sqrt(v + bn.eps)
    return a, bn.bias.detach().double() - m * a


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_dtypes_fold_is_the_float64_fold_rounded(dtype):
    bn = _batchnorm()
    for _ in range(2):  # a change of the statistics reaches every dtype
        a, c = batchnorm_affine(bn, dtype)
        want_a, want_c = _fold_here(bn)
        assert a.dtype == c.dtype == dtype
        torch.testing.assert_close(a.double(), want_a.to(dtype).double(), rtol=0, atol=1e-15)
        torch.testing.assert_close(c.double(), want_c.to(dtype).double(), rtol=0, atol=1e-15)
        with torch.no_grad():
            bn.running_var.mul_(2.0)


def test_a_class_whose_forward_changes_after_a_trace_is_traced_anew():
    class Doubled(nn.Linear):
        pass  # inherits Linear's forward: a supported leaf

    torch.manual_seed(2)
    model = nn.Sequential(Doubled(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    plain = path_norm(model, (3,)).log10
    assert plain == pytest.approx(NeuronDAG.from_module(model, (3,)).path_norm_log10(1.0),
                                  abs=1e-12)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) * 2.0

    Doubled.forward = forward  # no longer Linear's forward: traced through, not a leaf
    copy = nn.Sequential(*model)  # a model object never traced
    graph = graph_of(copy, (3,))
    assert any(n.op == "call_function" and "mul" in str(n.target) for n in graph.graph.nodes)
    doubled = path_norm(copy, (3,)).log10
    assert doubled == pytest.approx(NeuronDAG.from_module(copy, (3,)).path_norm_log10(1.0),
                                    abs=1e-12)
    assert doubled > plain + 0.1  # every path through the first layer counts twice
