"""Normalisation (Alg. 3.2.1): same function, same path-norms, Def. 3.2.1 holds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import InvalidParameterError
from pathlift.graph.factors import incoming_norms
from pathlift.lift import path_norms
from pathlift.symmetry import analyse, normalize, normalize_report
from test_rescale import (
    ZOO,
    assert_bit_identical,
    assert_same_outputs,
    build,
    inputs,
    snapshot,
)


def hidden_norms(model: nn.Module, shape, q: float) -> dict[str, torch.Tensor]:
    """||(theta^{->v}, b_v)||_q of every hidden channel not tied to another, by layer."""
    cmap = analyse(model, shape)
    members = cmap.members()
    tied = {g for g, m in members.items() if sum(idx.numel() for _, idx in m) > 1}
    out = {}
    for p in cmap.producers:
        groups = cmap.group[p.neurons]
        keep = (groups != 0) & ~torch.isin(groups, torch.tensor(sorted(tied) or [-1]))
        if keep.any() and not p.passthrough:
            out[p.name] = incoming_norms(model.get_submodule(p.name), p, q)[keep]
    return out


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("q", [1.0, 2.0])
def test_normalize_keeps_function_and_path_norms(name, q):
    model = build(name)
    shape = ZOO[name][1]
    with torch.no_grad():  # make the raw scales far from 1 first
        for p in model.parameters():
            p.mul_(7.0)
    before = snapshot(model)
    out = normalize(model, shape, q)
    x = inputs(name)
    with torch.no_grad():
        y, y2 = model(x), out(x)
    assert float((y - y2).abs().max()) <= 1e-10 * float(y.abs().max())
    a, b = path_norms(model, shape), path_norms(out, shape)
    for qq in a:
        assert abs(a[qq].log10 - b[qq].log10) * math.log(10) <= 1e-9
    assert_bit_identical(model, before)
    for layer, norms in hidden_norms(out, shape, q).items():  # Def. 3.2.1
        assert torch.allclose(norms, torch.ones_like(norms), rtol=1e-12), layer


def test_float32_model_stays_within_1e_5():
    model = build("residual", torch.float32)
    out = normalize(model, (3, 8, 8))
    x = inputs("residual", torch.float32)
    with torch.no_grad():
        assert float((model(x) - out(x)).abs().max()) <= 1e-5 * float(model(x).abs().max())
    assert out.conv1.weight.dtype == torch.float32


def test_dead_neuron_gets_zero_outgoing_weights():
    """Alg. 3.2.1 line 6: lambda_v = 0 sets theta^{v->} = 0 (Def. 3.2.1, item 2)."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    with torch.no_grad():
        model[0].weight[1] = 0.0
        model[0].bias[1] = 0.0
    report = normalize_report(model, (3,))
    out = report.model
    assert report.dead_neurons == 1
    assert torch.equal(out[2].weight[:, 1], torch.zeros(2, dtype=torch.float64))
    assert model[2].weight[:, 1].abs().sum() > 0
    x = torch.randn(6, 3, dtype=torch.float64)
    assert torch.allclose(out(x), model(x), rtol=1e-12, atol=1e-12)
    norms = incoming_norms(out[0], analyse(out, (3,)).producers[0], 1.0)
    assert torch.allclose(norms, torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64))


def test_normalize_matches_the_algorithm_by_hand():
    """Two hidden layers, q = 2: lambda_1 = row norms of (W1, b1), then of the updated W2."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 5), nn.ReLU(),
                          nn.Linear(5, 2)).double()
    W1, b1 = model[0].weight.detach(), model[0].bias.detach()
    W2, b2 = model[2].weight.detach(), model[2].bias.detach()
    W3 = model[4].weight.detach()
    l1 = torch.cat([W1, b1[:, None]], 1).norm(dim=1)
    W2u = W2 * l1[None, :]
    l2 = torch.cat([W2u, b2[:, None]], 1).norm(dim=1)
    out = normalize(model, (3,), q=2.0)
    assert torch.allclose(out[0].weight, W1 / l1[:, None], rtol=1e-14)
    assert torch.allclose(out[2].weight, W2u / l2[:, None], rtol=1e-14)
    assert torch.allclose(out[2].bias, b2 / l2, rtol=1e-14)
    assert torch.allclose(out[4].weight, W3 * l2[None, :], rtol=1e-14)


def test_residual_groups_share_one_factor():
    """Tied channels: the stream BNs are divided by one factor per channel."""
    model = build("residual")
    out = normalize(model, (3, 8, 8))
    ratio_stem = out.bn1.bias / model.bn1.bias
    ratio_block = out.abn2.bias / model.abn2.bias
    # a BN bias follows only its own output factor, so both BNs of the group show it
    assert torch.allclose(ratio_stem, ratio_block, rtol=1e-12)
    assert not torch.allclose(ratio_stem, torch.ones_like(ratio_stem))


def test_bad_q_is_refused():
    with pytest.raises(InvalidParameterError):
        normalize(nn.Linear(2, 2), (2,), q=0.0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 100_000), q=st.sampled_from([1.0, 2.0, math.inf]))
def test_random_networks_of_every_layer(seed, q):
    """Alg. 3.2.1 on random networks of every supported op: function and path-norms kept,
    untied hidden neurons normalised (Def. 3.2.1)."""
    from random_nets import random_network

    model, shape = random_network(seed)
    model = model.double()
    out = normalize(model, shape, q)
    assert_same_outputs(model, out, shape)
    a, b = path_norms(model, shape, qs=(1.0, 2.0)), path_norms(out, shape, qs=(1.0, 2.0))
    for qq in a:
        assert a[qq].log10 == b[qq].log10 or abs(a[qq].log10 - b[qq].log10) < 1e-9
    for layer, norms in hidden_norms(out, shape, q).items():
        assert ((norms == 0) | ((norms - 1).abs() < 1e-9)).all(), layer


def test_compare_normalized_is_the_command_in_one_call(tmp_path):
    """normalize_report, compare_models and save_like by hand give the same copy, numbers
    and file as compare_normalized; without spec the checkpoint names the model's class."""
    from safetensors.torch import load_file

    from pathlift.jobs.transform import compare_normalized
    from pathlift.models import load_model, mlp, save_like, small_cnn
    from pathlift.symmetry import compare_models

    net, shape = mlp(), (1, 8, 8)
    result = compare_normalized(net, shape, 2.0, samples=6, out=tmp_path / "a.safetensors",
                                spec="mlp")
    report = normalize_report(net, shape, 2.0)
    assert (result.normalized.q, result.normalized.dead_neurons,
            result.normalized.tied_groups) == (2.0, report.dead_neurons, report.tied_groups)
    assert all(torch.equal(a, b) for a, b in zip(result.model.state_dict().values(),
                                                 report.model.state_dict().values(),
                                                 strict=True))
    assert result.comparison == compare_models(net, report.model, shape, 6)
    by_hand = save_like(report.model, "mlp", tmp_path / "b.safetensors", shape)
    a, b = load_file(result.path), load_file(by_hand)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    plain = compare_normalized(small_cnn(), shape, out=tmp_path / "c.safetensors")
    loaded, loaded_shape = load_model(str(plain.path), trust_arch=True)  # a class's path
    assert tuple(loaded_shape) == shape
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 plain.model.state_dict().values(),
                                                 strict=True))
    assert "\n" not in repr(result) and "normalized q=2" in repr(result)
