"""``KSLinear`` as an op of the graph engine (``pathlift.graph.ops.kron``): the factors are
layers of the DAG, so the path-norms and the Lipschitz bound of a network with designed
Kronecker-sparse layers equal those of its densified copy, where each KSLinear is a chain
of dense ``nn.Linear`` layers holding the factors, computed by the engine's Linear
handler (dense products, not the factors' (a, b, c, d) storage). For a chain whose product
reaches each entry by one path (Monarch) they also equal those of the single dense layer
K_1 ⋯ K_L. Checked at 1e-12 in float64, q = 1, 2 and q = 9 (which normalises the
network first, through the op's rescaling), and against a direct sampled check of the
Lipschitz bound. Path-magnitude pruning of factor entries through torch prune masks and
quantisation of the factors: scores against the path-norm lost by zeroing an entry,
certificates (Cor. 3.4.1) against sampled inputs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.bounds import certified_error, lipschitz_input
from pathlift.kron import (
    KSLinear,
    KSPattern,
    design,
    monarch,
    replace_linears,
    to_dense,
)
from pathlift.lift import path_metric, path_norm
from pathlift.models import mlp
from pathlift.prune import factor_scores, prune_factors
from pathlift.quant import quantize
from pathlift.symmetry import random_rescale

OVERLAPPING = [KSPattern(1, 8, 8, 2), KSPattern(2, 8, 8, 1)]  # several paths per entry


def factor_chain(m: KSLinear) -> nn.Sequential:
    """One dense Linear per factor (K_L first), the bias on the last: the same DAG."""
    layers = []
    for k, (w, p) in enumerate(reversed(list(zip(m.factors, m.patterns, strict=True)))):
        last = k == len(m.patterns) - 1
        linear = nn.Linear(p.in_features, p.out_features, bias=last and m.bias is not None,
                           dtype=w.dtype)
        with torch.no_grad():
            linear.weight.copy_(to_dense(w.detach(), p))
            if linear.bias is not None:
                linear.bias.copy_(m.bias)
        layers.append(linear)
    return nn.Sequential(*layers)


def densified(model: nn.Sequential) -> nn.Sequential:
    """The copy of a flat Sequential with each KSLinear its ``factor_chain``."""
    return nn.Sequential(*[factor_chain(m) if isinstance(m, KSLinear) else m for m in model])


def single_dense(model: nn.Sequential) -> nn.Sequential:
    """The copy with each KSLinear one Linear of weight K_1 ⋯ K_L."""
    out = nn.Sequential(*model)
    for i, m in enumerate(out):
        if isinstance(m, KSLinear):
            linear = nn.Linear(m.in_features, m.out_features, dtype=m.bias.dtype)
            with torch.no_grad():
                linear.weight.copy_(m.to_dense())
                linear.bias.copy_(m.bias)
            out[i] = linear
    return out


def designed_network() -> nn.Sequential:
    """An MLP 16-64-64-10 whose hidden layer is the fastest chain a design finds, its first
    layer a chain with several paths per entry, in float64."""
    torch.manual_seed(0)
    found = design(64, 64, budget=0.25, batch=16, top_k=2, repeats=1).best_chain.patterns
    chains = {"1": [KSPattern(1, 8, 4, 8), KSPattern(2, 16, 8, 1)], "3": found, "5": None}
    return replace_linears(mlp(16, (64, 64), num_classes=10), design=chains,
                           init="random").model.double()


@pytest.mark.parametrize("q", [1.0, 2.0, 9.0])
def test_path_norm_of_a_designed_network_equals_its_densified_copy(q):
    net = designed_network()
    ours = path_norm(net, (16,), q=q)
    dense = path_norm(densified(net), (16,), q=q)
    assert ours.log10 == pytest.approx(dense.log10, abs=1e-12 / 2.3)  # 1e-12 relative
    assert ours.value == pytest.approx(dense.value, rel=1e-12)


def test_a_one_path_monarch_has_the_dense_layer_s_path_norm():
    torch.manual_seed(1)
    # Monarch with p blocks of p for n = p^2: entry (u, v) of the product is reached only
    # through the one intermediate neuron of block v // p and position u // p
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), KSLinear(monarch(16, 16, 4)), nn.ReLU(),
                        nn.Linear(16, 3)).double()
    for q in (1.0, 2.0):
        assert path_norm(net, (8,), q=q).value == pytest.approx(
            path_norm(single_dense(net), (8,), q=q).value, rel=1e-12)
    # with several paths per entry |K_1||K_2| > |K_1 K_2|: the DAG's norm is larger
    over = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), KSLinear(OVERLAPPING), nn.ReLU(),
                         nn.Linear(16, 3)).double()
    assert path_norm(over, (8,)).value > path_norm(single_dense(over), (8,)).value


def test_rescaling_keeps_function_and_path_norm():
    net = designed_network()
    x = torch.randn(5, 16, dtype=torch.float64)
    for m in net.modules():
        if isinstance(m, KSLinear):
            m.algorithm = "bmm"
    other = random_rescale(net, seed=3, input_shape=(16,))
    for m in other.modules():
        if isinstance(m, KSLinear):
            m.algorithm = "bmm"
    torch.testing.assert_close(other(x), net(x), rtol=1e-10, atol=1e-12)
    assert path_norm(other, (16,), q=2.0).value == pytest.approx(
        path_norm(net, (16,), q=2.0).value, rel=1e-10)
    assert not torch.equal(other[1].factors[0], net[1].factors[0])


def test_the_lipschitz_bound_holds_on_samples_and_equals_the_densified_one():
    net = designed_network()
    bound = lipschitz_input(net, (16,))
    assert bound.path_norm.value == pytest.approx(
        lipschitz_input(densified(net), (16,)).path_norm.value, rel=1e-12)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(256, 16, generator=g, dtype=torch.float64)
    y = x + 1e-2 * torch.randn(256, 16, generator=g, dtype=torch.float64)
    with torch.no_grad():
        ratio = (net(x) - net(y)).abs().sum(1) / (x - y).abs().amax(1)
    assert float(ratio.max()) <= bound.path_norm.value


def test_factor_scores_are_the_path_norm_lost_by_zeroing_each_entry():
    """Path-Mag(theta, i) = ||Phi(theta)||_1 - ||Phi(theta_{-i})||_1 (paper 002 eq. 11):
    the scores read off the densified network against the path-norm recomputed with one
    factor entry zeroed, for a few entries of each factor."""
    net = designed_network()
    scores = factor_scores(net, (16,))
    base = path_norm(net, (16,)).value
    scale = None
    g = torch.Generator().manual_seed(5)
    for name in ("1", "3"):
        for idx, s in enumerate(scores[name]):
            for flat in torch.randint(s.numel(), (3,), generator=g).tolist():
                other = copy.deepcopy(net)
                with torch.no_grad():
                    other.get_submodule(name).factors[idx].view(-1)[flat] = 0
                lost = base - path_norm(other, (16,)).value
                score = float(s.reshape(-1)[flat])
                scale = scale or lost / score  # the common scale of the mantissas
                assert lost == pytest.approx(score * scale, rel=1e-9, abs=1e-12 * base)


def test_pruned_factors_keep_their_mask_and_the_certificate_holds_on_samples():
    net = designed_network()
    pruned = prune_factors(net, 0.5, (16,))
    layers = [m for m in pruned.modules() if isinstance(m, KSLinear)]
    zeros = sum(int((m.factor(i) == 0).sum()) for m in layers for i in range(len(m.patterns)))
    total = sum(f.numel() for m in layers for f in m.factors.parameters())
    assert zeros == round(0.5 * total)
    assert all(hasattr(m.factors, "0_mask") for m in layers)
    # the smallest scores went: every pruned entry scored at most every kept one
    scores = factor_scores(net, (16,))
    cut = [(s, m.factor(i) == 0) for name, m in pruned.named_modules()
           if isinstance(m, KSLinear) for i, s in enumerate(scores[name])]
    assert max(float(s[z].max()) for s, z in cut) <= min(float(s[~z].min()) for s, z in cut)
    # |R_theta(x) - R_theta'(x)|_1 <= max(||x||_inf, 1) d(theta, theta') (Cor. 3.4.1)
    metric = path_metric(net, pruned, (16,))
    assert metric.exact
    x = 3 * torch.randn(512, 16, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        gap = (net(x) - pruned(x)).abs().sum(1)
    assert bool((gap <= x.abs().amax(1).clamp_min(1) * metric.value).all())
    # the mask holds through training: the factor is orig * mask, zeros stay zero
    optimizer = torch.optim.SGD(pruned.parameters(), lr=0.1)
    pruned(x).square().mean().backward()
    optimizer.step()
    assert sum(int((m.factor(i) == 0).sum()) for m in layers
               for i in range(len(m.patterns))) >= zeros


def test_quantised_factors_come_with_a_certified_error_that_holds_on_samples():
    net = designed_network()
    quantized = quantize(net, (16,), bits=6)
    layer = quantized.model.get_submodule("3")
    assert len(torch.unique(layer.factors[0].detach())) <= 2**6
    bound = certified_error(net, quantized, (16,))
    x = 3 * torch.randn(512, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    with torch.no_grad():
        gap = (net(x) - quantized.model(x)).abs().sum(1)
    assert float(gap.max()) > 0
    assert bool((gap <= x.abs().amax(1).clamp_min(1) * bound.metric.value).all())
