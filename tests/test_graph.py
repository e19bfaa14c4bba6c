"""The graph engine refuses what the ReLU DAG model (thesis Def. 2.2.2) does not cover,
naming the node, and never modifies the model it reads."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pathlift.errors import ShapeError, UnsupportedModelError
from pathlift.graph import Kind, check, trace
from pathlift.lift import path_norm


def _wrap(layer: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), layer, nn.Linear(4, 2)).eval()


class _Functional(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.fc(x))


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 1, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0]


class _ControlFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _ControlFlow()

    def forward(self, x):
        return self.block(x)


UNSUPPORTED = {
    "GELU": (_wrap(nn.GELU()), (4,), "1", "GELU"),
    "sigmoid": (_wrap(nn.Sigmoid()), (4,), "1", "Sigmoid"),
    "softmax": (_wrap(nn.Softmax(dim=-1)), (4,), "1", "Softmax"),
    "hardswish": (_wrap(nn.Hardswish()), (4,), "1", "Hardswish"),
    "LayerNorm": (_wrap(nn.LayerNorm(4)), (4,), "1", "LayerNorm"),
    "functional gelu": (_Functional(F.gelu), (4,), "gelu", "gelu"),
    "functional sigmoid": (_Functional(torch.sigmoid), (4,), "sigmoid", "sigmoid"),
    "attention": (_Attention().eval(), (3, 4), "attn", "MultiheadAttention"),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_unsupported_op_is_named(name):
    model, shape, node, op = UNSUPPORTED[name]
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(model, shape)
    problems = info.value.problems
    assert [p.node for p in problems] == [node]
    assert problems[0].op == op
    assert node in str(info.value) and problems[0].reason in str(info.value)


def test_batchnorm_in_training_mode_is_refused_and_not_updated():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU())
    model.train()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(UnsupportedModelError, match=r"call model\.eval"):
        path_norm(model, (1, 5, 5))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_control_flow_names_the_module():
    with pytest.raises(UnsupportedModelError) as info:
        trace(_Outer(), (4,))
    assert info.value.problems[0].node == "block"
    assert info.value.problems[0].op == "data-dependent control flow"


def test_check_lists_every_problem_at_once():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4), nn.Tanh(),
                          nn.Linear(4, 4), nn.ReLU()).eval()
    report = check(model, (4,))
    assert not report.ok
    assert [(p.node, p.op) for p in report.problems] == [("1", "GELU"), ("3", "Tanh")]
    assert check(_wrap(nn.ReLU()), (4,)).ok


def test_nan_weights_are_refused_with_the_parameter_named():
    model = _wrap(nn.ReLU())
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    with pytest.raises(UnsupportedModelError, match="'weight' holds NaN"):
        path_norm(model, (4,))


def test_reflect_padding_is_the_padding_module_then_the_conv():
    """Conv2d(padding_mode='reflect') is read as F.pad(mode='reflect') + the unpadded
    conv: the path-norm of nn.ReflectionPad2d + Conv2d (tests/test_padding_modes.py)."""
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")).eval()
    twin = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(1, 2, 3)).eval()
    twin[1].load_state_dict(model[0].state_dict())
    assert path_norm(model, (1, 4, 4)).value == pytest.approx(path_norm(twin, (1, 4, 4)).value,
                                                              rel=1e-12)


def test_reshape_across_batch_is_refused():
    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).reshape(-1)

    with pytest.raises(UnsupportedModelError, match="batch dimension"):
        trace(Mix(), (4,))


def test_shape_errors_name_the_node():
    with pytest.raises(ShapeError, match="'0'"):
        trace(nn.Sequential(nn.Linear(4, 2)), (5,))
    with pytest.raises(ShapeError, match="positive sizes"):
        trace(nn.Sequential(nn.Linear(4, 2)), (0,))


def test_trace_classifies_a_residual_unet_style_graph():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding=1)
            self.bn = nn.BatchNorm2d(2)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.Upsample(scale_factor=2)

        def forward(self, x):
            y = F.relu(self.bn(self.conv(x)))
            y = y + x
            z = self.up(self.pool(y))
            return torch.cat([y, z], dim=1).mean((2, 3))

    graph = trace(Net().eval(), (2, 4, 4))
    kinds = [graph.handler(n).kind for n in graph.nodes()]
    assert kinds == [Kind.AFFINE, Kind.AFFINE, Kind.RELU, Kind.ADD, Kind.MAXPOOL, Kind.POOL,
                     Kind.CAT, Kind.POOL]
    assert graph.output_shape(list(graph.nodes())[-1]) == (4,)


def test_public_calls_leave_the_state_dict_bit_identical():
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(inplace=True),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check(model, (1, 10, 10))
    for q in (0.5, 1, 2, 4):
        path_norm(model, (1, 10, 10), q=q)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert before[k].dtype == after[k].dtype and torch.equal(before[k], after[k]), k
    assert all(p.grad is None for p in model.parameters())


class _ViewThenAugmented(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        h = self.fc1(x)
        v = h.view(-1, 2)
        h += self.fc2(x)  # eager: v sees the sum, the graph's v does not
        return v


def test_the_dataflow_check_catches_what_fx_cannot_see():
    """The graph is compared with model.forward op by op (aten ops on meta tensors and the
    op that last wrote every tensor read): an alias read after `+=`, and a hook on the
    root module that changes the output, are both refused; an observing hook is not."""
    assert "another function" in str(check(_ViewThenAugmented().eval(), (2,)))
    model = _wrap(nn.ReLU())
    handle = model.register_forward_hook(lambda m, i, out: out * 2)
    assert "another function" in str(check(model, (4,)))
    handle.remove()
    model.register_forward_hook(lambda m, i, out: None)
    assert check(model, (4,)).ok
