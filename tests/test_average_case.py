"""The average-case path-norm E_x ||A(theta,x)^T Phi(theta)||_1 (thesis Sec. 7.2.2)."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError, UnsupportedModelError
from pathlift.graph.boundary import flat_outputs
from pathlift.lift import average_case_path_norm, local_affine, path_norm
from pathlift.models import mlp, small_cnn
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG
from random_nets import random_network


def _mlp(seed: int, widths=(3, 4, 3, 2)) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).double()


def _enumerated(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """A(theta,x)^T Phi^{->v}(theta) by explicit enumeration of the paths of a 2-hidden-layer
    MLP (Def. 2.3.3): Phi_p = product of the weights along p (times the bias of its first
    neuron if it starts at a hidden neuron), a_p(x) = 1 if every hidden neuron of p is
    active. Returns (d_out, d_in + 1): one column per input, the last for the bias paths."""
    (W1, b1), (W2, b2), (W3, b3) = [(m.weight.detach(), m.bias.detach()) for m in net
                                    if isinstance(m, nn.Linear)]
    z1 = W1 @ x + b1
    h1 = z1.clamp(min=0)
    z2 = W2 @ h1 + b2
    on1, on2 = (z1 > 0).double(), (z2 > 0).double()
    d_out, d_in = W3.shape[0], W1.shape[1]
    coef = torch.zeros(d_out, d_in + 1, dtype=torch.float64)
    for v in range(d_out):
        coef[v, d_in] += b3[v]  # the path made of the output neuron alone
        for j in range(W2.shape[0]):
            a2 = on2[j]
            coef[v, d_in] += b2[j] * W3[v, j] * a2  # paths starting at hidden neuron j
            for i in range(W1.shape[0]):
                a = on1[i] * a2
                coef[v, d_in] += b1[i] * W2[j, i] * W3[v, j] * a
                for u in range(d_in):
                    coef[v, u] += W1[i, u] * W2[j, i] * W3[v, j] * a
    return coef


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_equals_path_enumeration(seed):
    net = _mlp(seed)
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    got = local_affine(net, (3,), x).coefficients()
    want = torch.stack([_enumerated(net, xi) for xi in x])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for q in (1.0, 2.0):
        avg = average_case_path_norm(net, (3,), x, q=q)
        expected = want.abs().pow(q).sum(-1).pow(1 / q).sum(-1).mean()
        assert avg.mean == pytest.approx(float(expected), rel=1e-10)
        assert avg.n_samples == 6


def _dag_coefficients(dag: NeuronDAG, x: torch.Tensor) -> np.ndarray:
    """A(theta,x)^T Phi^{->v}(theta) from the explicit neuron DAG: sum of Phi_p a_p over the
    paths p ending at v, in the column of p's first neuron (d_in for the bias paths)."""
    phi, act = dag.phi(), dag.activations(x)
    coef = np.zeros((len(dag.outputs), dag.num_inputs + 1))
    np.add.at(coef, (phi.ends, act.column), phi.values * act.active)
    return coef


def test_local_affine_on_a_transposed_batchnorm_input() -> None:
    """Random network 201816206 feeds BatchNorm3d a channels-last view of shape
    (1, 2, 3, 3, 1) (x.transpose(1, -1)), on which torch 2.13's CPU backward of eval
    BatchNorm is wrong; local_affine must still equal the neuron DAG and finite differences."""
    net, shape = random_network(201816206, 3000)
    x = torch.randn(1, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = local_affine(net, shape, x).coefficients()[0]
    np.testing.assert_allclose(got.numpy(), _dag_coefficients(NeuronDAG.from_module(net, shape),
                                                               x[0]), rtol=1e-9, atol=1e-9)
    net, h = net.double(), 1e-6
    steps = h * torch.eye(x.numel(), dtype=torch.float64).reshape(-1, *shape)
    with torch.no_grad():
        differences = (flat_outputs(net(x + steps), len(steps)) - flat_outputs(net(x), 1)) / h
    torch.testing.assert_close(got[:, :-1], differences.T, rtol=0, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 1000))
def test_equals_neuron_dag_enumeration_on_random_networks(net_seed, seed):
    """On random DAGs (conv, pools, BatchNorm, residuals, cat, several outputs, ...)."""
    net, shape = random_network(net_seed, 3000)
    dag = NeuronDAG.from_module(net, shape)
    x = torch.randn(3, *shape, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed))
    got = local_affine(net, shape, x).coefficients().numpy()
    for i in range(len(x)):
        np.testing.assert_allclose(got[i], _dag_coefficients(dag, x[i]), rtol=1e-9,
                                   atol=1e-9 * (1 + np.abs(got[i]).max()))
    avg = average_case_path_norm(net, shape, x)
    assert avg.log10 <= dag.path_norm_log10(1.0) + 1e-9


def test_local_affine_map_reproduces_outputs_and_finite_differences():
    """On small_cnn (max-pooling): slopes . x + offset = R(x); slopes = finite differences."""
    torch.manual_seed(1)
    net = small_cnn().eval()
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    aff = local_affine(net, (1, 8, 8), x)
    ref = net.double()
    out = ref(x)
    rebuilt = (aff.slopes.flatten(2) * x.flatten(1).unsqueeze(1)).sum(-1) + aff.offsets
    torch.testing.assert_close(rebuilt, out.detach(), rtol=1e-10, atol=1e-10)
    h = 1e-7
    for k in (0, 17, 63):
        e = torch.zeros(64, dtype=torch.float64)
        e[k] = h
        diff = (ref(x + e.reshape(1, 1, 8, 8)) - out) / h
        torch.testing.assert_close(diff.detach(), aff.slopes.flatten(2)[:, :, k], rtol=1e-5,
                                   atol=1e-6)


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 10.0))
def test_never_exceeds_the_l1_path_norm(seed, scale):
    """|sum_p a_p Phi_p| <= sum_p |Phi_p| as every a_p is 0 or 1."""
    torch.manual_seed(seed)
    for net, shape in ((small_cnn().eval(), (1, 8, 8)), (mlp(64, (16, 8), 3), (64,))):
        x = scale * torch.randn(16, *shape)
        avg = average_case_path_norm(net, shape, x)
        worst = path_norm(net, shape, q=1)
        assert avg.log10 <= worst.log10 + 1e-9
        assert avg.worst_case_log10 == pytest.approx(worst.log10, abs=1e-12)
        per_output = [10**w for w in worst.per_output_log10]
        assert all(a <= w * (1 + 1e-9) for a, w in zip(avg.per_output_mean, per_output,
                                                        strict=True))


@pytest.mark.parametrize("make, shape", [(small_cnn, (1, 8, 8)), (lambda: mlp(64, (32, 16), 10),
                                                                    (1, 8, 8))])
def test_invariant_under_random_rescale(make, shape):
    torch.manual_seed(3)
    net = make().eval()
    rescaled = random_rescale(net, seed=5, input_shape=shape)
    assert not all(torch.equal(a, b) for a, b in zip(net.state_dict().values(),
                                                   rescaled.state_dict().values(), strict=True))
    x = torch.rand(32, *shape)
    a = average_case_path_norm(net, shape, x)
    b = average_case_path_norm(rescaled, shape, x)
    assert b.mean == pytest.approx(a.mean, rel=1e-9)
    assert b.per_output_mean == pytest.approx(a.per_output_mean, rel=1e-9)


def test_model_untouched_and_loader_input():
    torch.manual_seed(0)
    net = small_cnn()  # training mode on purpose
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.rand(20, 1, 8, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(20)),
                                         batch_size=6)
    from_loader = average_case_path_norm(net, (1, 8, 8), loader, max_samples=15)
    from_tensor = average_case_path_norm(net, (1, 8, 8), x[:15])
    assert from_loader.mean == pytest.approx(from_tensor.mean, rel=1e-12)
    assert from_loader.n_samples == 15
    assert net.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert next(net.parameters()).dtype == torch.float32
    assert math.isfinite(from_loader.std_error)


def test_errors():
    net = small_cnn()
    with pytest.raises(ShapeError):
        average_case_path_norm(net, (1, 8, 8), torch.rand(4, 1, 7, 7))
    with pytest.raises(InvalidParameterError):
        average_case_path_norm(net, (1, 8, 8), torch.rand(4, 1, 8, 8), q=0.5)
    with pytest.raises(UnsupportedModelError, match="GELU"):
        average_case_path_norm(nn.Sequential(nn.Linear(3, 3), nn.GELU()), (3,),
                               torch.rand(2, 3))
