"""Permutations, canonical forms and functional equivalence (slides on functional equivalence)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.symmetry import analyse, random_rescale
from pathlift.symmetry.equivalence import (
    _lexicographic_order,
    canonicalize,
    equivalent,
    permutable_units,
    permute,
    symmetries,
)
from test_rescale import ZOO, assert_bit_identical, build, inputs, snapshot


def random_permutations(model: nn.Module, shape, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {u.producer.name: torch.randperm(u.producer.neurons.numel(), generator=g)
            for u in permutable_units(analyse(model, shape))}


def one_weight_changed(model: nn.Module, delta: float = 1e-3) -> nn.Module:
    out = copy.deepcopy(model)
    with torch.no_grad():
        weight = [p for p in out.parameters() if p.dim() > 1][1]
        weight.view(-1)[0] += delta
    return out


@pytest.mark.parametrize("name", ["mlp", "vgg_like", "residual", "unet_like"])
def test_permuted_and_rescaled_copy_is_equivalent(name):
    model = build(name)
    shape = ZOO[name][1]
    before = snapshot(model)
    perms = random_permutations(model, shape, seed=1)
    assert perms and any(not torch.equal(p, torch.arange(len(p))) for p in perms.values())
    copy_ = random_rescale(permute(model, perms, shape), seed=2, input_shape=shape)
    x = inputs(name)
    with torch.no_grad():  # really the same function, really different parameters
        assert torch.allclose(model(x), copy_(x), rtol=1e-10, atol=1e-12)
    result = equivalent(model, copy_, shape)
    assert result.equivalent and result.parameter_gap < 1e-10 and result.output_gap < 1e-10
    changed = equivalent(model, one_weight_changed(model), shape)
    assert not changed.equivalent and changed.parameter_gap > 1e-5
    assert_bit_identical(model, before)


def test_canonical_form_sorts_biases_and_inverts_the_permutation():
    model = build("mlp")
    perm = torch.tensor([3, 0, 8, 1, 2, 7, 4, 6, 5])
    permuted = permute(model, {"0": perm}, (6,))
    assert torch.equal(permuted[0].bias, model[0].bias[perm])
    assert torch.equal(permuted[2].weight, model[2].weight[:, perm])
    canon = canonicalize(permuted, (6,), normalized=False)
    bias = canon.model[0].bias
    assert (bias[:-1] >= bias[1:]).all()  # descending
    assert torch.equal(canon.model[0].bias, canonicalize(model, (6,), normalized=False)
                       .model[0].bias)


def test_units_exclude_tied_grouped_and_output_layers():
    cmap = analyse(build("residual"), (3, 8, 8))
    names = {u.producer.name: [c.name for c in u.carried] for u in permutable_units(cmap)}
    assert names == {"a1": ["abn1"], "b1": ["bbn1"]}  # a2/b2/down feed the tied stream
    assert permutable_units(analyse(build("depthwise"), (3, 8, 8))) == []
    with pytest.raises(InvalidParameterError, match="cannot be permuted"):
        permute(build("residual"), {"a2": [0, 1, 2, 3, 4, 5]}, (3, 8, 8))
    with pytest.raises(InvalidParameterError, match="permutation"):
        permute(build("mlp"), {"0": [0, 0, 1, 2, 3, 4, 5, 6, 7]}, (6,))


def test_different_architectures_are_refused():
    with pytest.raises(ArchitectureMismatchError):
        equivalent(build("mlp"), nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 3)),
                   (6,))


def test_symmetry_table_of_the_slides():
    relu, tanh, sigmoid = symmetries("ReLU"), symmetries("tanh"), symmetries("sigmoid")
    assert relu.scaling and relu.permutation and not relu.sign_flip
    assert symmetries("leaky ReLU").scaling
    assert tanh.sign_flip and not tanh.scaling and tanh.permutation
    assert sigmoid.sign_flip and "0.5" in sigmoid.note
    with pytest.raises(InvalidParameterError):
        symmetries("gelu")
    # the table is right: check each claimed symmetry numerically on a 1-hidden-layer net
    x = torch.randn(50, 3, dtype=torch.float64)
    w1, b1, w2 = (torch.randn(4, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64),
                  torch.randn(2, 4, dtype=torch.float64))
    relu_net = (lambda a, b, c: torch.relu(x @ a.T + b) @ c.T)  # noqa: E731
    assert torch.allclose(relu_net(w1, b1, w2), relu_net(3 * w1, 3 * b1, w2 / 3))
    tanh_net = (lambda a, b, c: torch.tanh(x @ a.T + b) @ c.T)  # noqa: E731
    assert torch.allclose(tanh_net(w1, b1, w2), tanh_net(-w1, -b1, -w2))
    assert not torch.allclose(tanh_net(w1, b1, w2), tanh_net(3 * w1, 3 * b1, w2 / 3))


@pytest.mark.slow
def test_resnet18_permuted_and_rescaled_is_equivalent():
    from pathlift.models import get_model

    torch.manual_seed(0)
    model = get_model("resnet18", num_classes=10).double().eval()
    shape = (3, 32, 32)
    copy_ = random_rescale(permute(model, random_permutations(model, shape, 0), shape),
                           seed=1, input_shape=shape)
    assert equivalent(model, copy_, shape).equivalent
    assert not equivalent(model, one_weight_changed(model), shape).equivalent


def test_cli_symmetry_commands(tmp_path):
    """rescale -> normalize -> equivalent / metric / lipschitz on one checkpoint chain."""
    from typer.testing import CliRunner

    from pathlift.cli import app
    from pathlift.models import get_model, load_model, save_checkpoint

    torch.manual_seed(0)
    base = save_checkpoint(get_model("mlp"), tmp_path / "base.safetensors", "mlp")
    rescaled, normalized = tmp_path / "r.safetensors", tmp_path / "n.safetensors"
    runner = CliRunner()
    result = runner.invoke(app, ["rescale", str(base), "--seed", "3", "--out", str(rescaled)])
    assert result.exit_code == 0, result.output
    assert "log10 ||Phi||_1" in result.output
    result = runner.invoke(app, ["normalize", str(rescaled), "-q", "2", "--out",
                                 str(normalized)])
    assert result.exit_code == 0, result.output
    net_b, shape = load_model(str(base))
    net_n, _ = load_model(str(normalized))
    x = torch.randn(4, *shape)
    with torch.no_grad():
        assert torch.allclose(net_b(x), net_n(x), rtol=1e-4, atol=1e-5)
    result = runner.invoke(app, ["equivalent", str(base), str(normalized)])
    assert result.exit_code == 0 and "not equivalent" not in result.output
    result = runner.invoke(app, ["metric", str(rescaled), str(normalized)])
    assert result.exit_code == 0 and "interval" in result.output, result.output
    result = runner.invoke(app, ["lipschitz", str(base), "--other", str(normalized)])
    assert result.exit_code == 0 and "Thm 3.3.1" in result.output, result.output


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_random_networks_permuted_and_rescaled_are_equivalent(seed):
    """Random networks of every supported op: a permuted, rescaled copy is recognised."""
    from random_nets import random_network

    model, shape = random_network(seed)
    model = model.double()
    other = random_rescale(permute(model, random_permutations(model, shape, seed), shape),
                           factors=(0.37, 3.1, 250.0), seed=seed, input_shape=shape)
    result = equivalent(model, other, shape)
    assert result.equivalent, result


@pytest.mark.parametrize("counts", [(2, 2, 2, 2), (1, 3, 2, 2)])
def test_outgoing_rows_are_each_neurons_weights_sorted(counts):
    """``_outgoing``'s rows (one sort for all when every neuron is read alike, one per
    neuron else) against each neuron's weights gathered and sorted by hand, a neuron that
    is not read padded with zeros."""
    from pathlift.symmetry.equivalence import _outgoing

    torch.manual_seed(0)
    inputs = torch.tensor([i for i, c in enumerate(counts) for _ in range(c)])[
        torch.randperm(sum(counts))]
    weight = torch.randn(len(inputs), 3, dtype=torch.float64)
    neurons = torch.tensor([2, 0, 7, 1, 3])  # 7 is read by no weight
    got = _outgoing(weight, inputs, neurons)
    width = 3 * max(counts)
    for row, n in zip(got, neurons.tolist(), strict=True):
        mine = weight[inputs == n].reshape(-1).sort(descending=True).values
        assert torch.equal(row, torch.cat([mine, mine.new_zeros(width - len(mine))]))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12).flatmap(lambda n: st.lists(
    st.lists(st.lists(st.sampled_from([-1.0, -0.0, 0.0, 0.5, 2.0]), min_size=n, max_size=n),
             min_size=0, max_size=4), min_size=0, max_size=3).map(lambda blocks: (n, blocks))))
def test_the_lazy_lexicographic_order_is_numpys_lexsort(case):
    """Rows of several blocks of columns with many ties (equal rows too, -0 beside 0): the
    column-by-column refinement gives np.lexsort's order of the whole rows."""
    n, blocks = case
    arrays = [np.array(b, dtype=np.float64).reshape(len(b), n).T for b in blocks]
    whole = np.concatenate([np.zeros((n, 0)), *arrays], axis=1)
    want = np.lexsort(whole.T[::-1]) if whole.shape[1] else np.arange(n)  # no key: as is
    assert np.array_equal(_lexicographic_order(iter(arrays), n), want)
