"""The one-pass mixed path-norm (thesis Thm 3.1.1) equals ||Phi||_{q,r} (Def. 3.1.1) summed
path by path over the explicit neuron DAG (Def. 2.2.2, 2.3.3), on 200 random networks."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune

from pathlift.graph import trace
from pathlift.lift import path_norm, path_norms
from pathlift.testing.neurons import NeuronDAG
from random_nets import networks, random_network

QS = (0.5, 1.0, 2.0, 4.0)
RS = (1.0, 2.0, math.inf)
REL = 1e-9


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k


@pytest.mark.parametrize("seed", range(200))
def test_one_pass_equals_enumeration(seed):
    model, shape = random_network(seed)
    dag = NeuronDAG.from_module(model, shape)
    graph = trace(model, shape)
    for q in QS:
        per_output = 10.0 ** (dag.output_path_norms_log(q) / math.log(10.0))
        for r in RS:
            one_pass = path_norm(graph, None, q, r)
            assert one_pass.value == pytest.approx(dag.path_norm(q, r), rel=REL), (q, r)
        np.testing.assert_allclose(10.0 ** np.array(one_pass.per_output_log10), per_output,
                                   rtol=REL)


@settings(max_examples=25, deadline=None)
@given(networks(), st.floats(0.2, 6.0), st.sampled_from((0.5, 1.0, 3.0, math.inf)))
def test_public_path_norm_any_exponent(net, q, r):
    model, shape = net
    before = _state(model)
    expected = NeuronDAG.from_module(model, shape).path_norm(q, r)
    assert path_norm(model, shape, q, r).value == pytest.approx(expected, rel=REL)
    several = path_norms(model, shape, (q, 1.0), r)
    assert several[q].value == pytest.approx(expected, rel=REL)
    _assert_same_state(model, before)


def test_figure_3_1_needs_the_max_pool_replacement():
    """Thm 3.1.1, Figure 3.1: a max-pool over two paths. The |theta| network with the
    max-pool kept gives 1 on the all-ones input; the l1 path-norm is 2."""
    model = nn.Sequential(nn.Linear(1, 2, bias=False), nn.Unflatten(1, (1, 2)),
                          nn.MaxPool1d(2), nn.Flatten()).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0], [-1.0]]))
    kept = copy.deepcopy(model)
    with torch.no_grad():
        kept[0].weight.abs_()
        naive = kept(torch.ones(1, 1)).item()
    dag = NeuronDAG.from_module(model, (1,))
    assert naive == 1.0
    assert dag.path_norm(1, 1) == pytest.approx(2.0, rel=1e-14)
    assert path_norm(model, (1,), 1, 1).value == pytest.approx(2.0, rel=1e-14)


def test_batchnorm_is_folded_in_float64():
    """Float32 BatchNorm statistics are folded in float64: folding in float32 is off by
    ~1e-7 relative (this failed before the fold took a dtype)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.1, 3)
        model[1].weight.uniform_(-2, 2)
    model.eval()
    dag = NeuronDAG.from_module(model, (3,))
    for q in QS:
        assert path_norm(model, (3,), q).value == pytest.approx(dag.path_norm(q), rel=1e-13)


PRUNED = ((0, "weight"), (3, "weight"), (6, "bias"))


def _pruned_cnn() -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(3, 2, 2), nn.ReLU(), nn.Flatten(), nn.Linear(2, 3)).eval()
    for (i, name), amount in zip(PRUNED, (0.5, 0.4, 1), strict=True):
        prune.l1_unstructured(model[i], name, amount=amount)
    with torch.no_grad():  # the cached `weight` attributes are now stale: masks still rule
        model[0].weight_orig.mul_(1.5)
    return model


def test_pruning_masks_are_respected():
    model = _pruned_cnn()
    before = _state(model)
    dag = NeuronDAG.from_module(model, (1, 4, 4))
    baked, unpruned = _pruned_cnn(), _pruned_cnn()
    for i, name in PRUNED:
        prune.remove(baked[i], name)  # masked weights written into plain parameters
        orig = getattr(unpruned[i], name + "_orig").detach().clone()
        prune.remove(unpruned[i], name)
        getattr(unpruned[i], name).data.copy_(orig)
    for q in QS:
        expected = dag.path_norm(q)
        assert path_norm(model, (1, 4, 4), q).value == pytest.approx(expected, rel=REL)
        assert NeuronDAG.from_module(baked, (1, 4, 4)).path_norm(q) == pytest.approx(
            expected, rel=REL)
        assert path_norm(unpruned, (1, 4, 4), q).value > expected * (1 + 1e-3)
    _assert_same_state(model, before)


def test_state_dict_bit_identical():
    """Neither the one-pass norms nor the DAG (construction, Phi, A, output) change the
    model, its buffers (BatchNorm statistics) or the input."""
    for seed in range(20):
        model, shape = random_network(seed)
        before = _state(model)
        modes = [m.training for m in model.modules()]
        path_norm(model, shape, 2.0, math.inf)
        path_norms(model, shape, QS)
        dag = NeuronDAG.from_module(model, shape)
        x = torch.randn(1, *shape)
        x_before = x.clone()
        dag.output(x)
        dag.activations(x).matrix()
        assert torch.equal(x, x_before)
        _assert_same_state(model, before)
        assert [m.training for m in model.modules()] == modes


def test_random_networks_cover_the_supported_layers():
    """The 200 networks above exercise every layer and option the issue lists."""
    seen: set[str] = set()
    for seed in range(200):
        model, shape = random_network(seed)
        graph = trace(model, shape)
        outputs = next(n for n in graph.graph.nodes if n.op == "output").args[0]
        if isinstance(outputs, tuple):
            seen.add("several outputs")
        for node in graph.nodes():
            m = graph.submodule(node)
            seen.add(type(m).__name__ if m is not None else
                     getattr(node.target, "__name__", str(node.target)))
            if node.kwargs.get("inplace") or str(node.target).endswith("_") or getattr(
                    m, "inplace", False):
                seen.add("in-place relu")
            if isinstance(m, nn.modules.pooling._MaxPoolNd):
                flags = {"padding": m.padding != 0, "dilation": m.dilation != 1,
                         "ceil_mode": m.ceil_mode}
                seen |= {f"max {k}" for k, on in flags.items() if on}
            if isinstance(m, (nn.AvgPool2d, nn.AvgPool3d)) and m.divisor_override:
                seen.add("divisor_override")
            if isinstance(m, nn.modules.pooling._AvgPoolNd) and not m.count_include_pad:
                seen.add("count_include_pad=False")
            if isinstance(m, nn.modules.conv._ConvNd) and m.groups > 1:
                seen.add("groups")
    expected = {"Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                "BatchNorm1d", "BatchNorm2d", "ReLU", "relu", "MaxPool1d", "MaxPool2d",
                "max_pool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AvgPool1d", "AvgPool2d",
                "avg_pool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "mean", "add", "cat",
                "Upsample", "interpolate", "Flatten", "reshape", "Identity", "Dropout",
                "several outputs", "in-place relu", "max padding", "max dilation",
                "max ceil_mode", "divisor_override", "count_include_pad=False", "groups"}
    assert expected <= seen, expected - seen


class _NestedOutputs(nn.Module):
    """Returns a dict holding a tensor and a tuple (torchvision segmentation models return
    dicts): path_norm used to fail with AttributeError on such outputs."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv1d(1, 2, 2), nn.Linear(3, 2)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        return {"out": self.fc(h), "aux": (h.mean(-1), nn.functional.max_pool1d(h, 2))}


def test_nested_and_dict_outputs():
    torch.manual_seed(2)
    model = _NestedOutputs().eval()
    dag = NeuronDAG.from_module(model, (1, 4))
    assert len(dag.outputs) == 4 + 2 + 2
    for q in QS:
        for r in RS:
            assert path_norm(model, (1, 4), q, r).value == pytest.approx(dag.path_norm(q, r),
                                                                          rel=REL)
    per_output = path_norm(model, (1, 4), 2.0).per_output_log10
    np.testing.assert_allclose(per_output, dag.output_path_norms_log(2.0) / math.log(10.0),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("weight, bias", [(1e10, 1e8), (1e-10, 1e-30)])
def test_norms_beyond_float64_agree_in_log_space(weight, bias):
    """A 40-layer chain whose path-norms overflow (~1e390) or whose paths underflow float64:
    the log-space pass and the log-space enumeration agree on log10."""
    layers: list[nn.Module] = []
    for i in range(40):
        layers += [nn.Linear(2 if i == 0 else 1, 1), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).eval()
    with torch.no_grad():
        for i, layer in enumerate(model[::2]):
            layer.weight.fill_(weight if i % 2 else -3 * weight)
            layer.bias.fill_(bias)
    dag = NeuronDAG.from_module(model, (2,))
    for q in QS:
        one_pass = path_norm(model, (2,), q)
        assert one_pass.log10 == pytest.approx(dag.path_norm_log10(q), abs=1e-9)
        assert one_pass.value == pytest.approx(dag.path_norm(q), rel=REL)  # inf beyond float64


def test_r_defaults_to_q_everywhere():
    """path_norm(model, shape, q) is ||Phi||_q, as path_norms, layer_norm_product's r and
    ``pathlift norm -q`` give (it was the mixed (q, 1) norm); r=1 still gives the mixed one,
    both equal to enumeration."""
    from cli_runner import invoke
    from pathlift.lift import layer_norm_product
    from pathlift.models import load_model

    model, shape = random_network(3)
    dag = NeuronDAG.from_module(model, shape)
    for q in (2.0, 4.0):
        plain = path_norm(model, shape, q)
        assert plain.r == q and plain.log10 == path_norms(model, shape, qs=(q,))[q].log10
        assert plain.log10 == pytest.approx(dag.path_norm_log10(q, q), abs=1e-12)
        mixed = path_norm(model, shape, q, r=1)
        assert mixed.log10 == pytest.approx(dag.path_norm_log10(q, 1.0), abs=1e-12)
        assert mixed.log10 > plain.log10  # several outputs: the l1 sum of their q-norms
        flat = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
        assert layer_norm_product(flat, (4,), q).r == q  # (no residual sums)
    net, net_shape = load_model("mlp", seed=0)
    assert f"{path_norm(net, net_shape, 2).log10:.6f}" in invoke("norm", "mlp", "-q", "2").stdout
