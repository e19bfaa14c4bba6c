"""Local identifiability from samples (thesis Sec. 7.1.1; Stock & Gribonval 2023; Bona-Pellissier,
Bachoc & Malgouyres 2022) on small networks whose answer is known.

Every rank is checked against an independent computation: the Jacobian of a hand-written
forward by ``torch.autograd.functional.jacobian`` (one backward per output) and numpy's
``matrix_rank``; the rank of dPhi/dtheta against the explicit path enumeration of
``NeuronDAG`` (dPhi_p/dtheta_e = Phi_p / theta_e for every edge or bias e of path p).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from nets import SHAPE, residual_cnn, tied_mlp
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.symmetry import identify, symmetry_dimension
from pathlift.symmetry.jacobian import Parameterized, activation_patterns
from pathlift.testing.neurons import Activation, NeuronDAG
from random_nets import NEW_OPS, random_network

WIDTHS = (3, 5, 4, 2)  # 9 hidden neurons, 54 parameters


def lfcn(widths=WIDTHS, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).double().eval()


def inputs(n: int, dim: int = 3, scale: float = 3.0, seed: int = 5) -> torch.Tensor:
    return scale * torch.randn(n, dim, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(seed))


def reference_rank(model: nn.Sequential, x: torch.Tensor) -> int:
    """numpy rank of the autograd Jacobian of a hand-written forward of the LFCN."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    shapes = [(m.weight.shape, m.bias.shape) for m in linears]
    theta = torch.cat([t.detach().reshape(-1) for m in linears for t in (m.weight, m.bias)])

    def forward(flat: torch.Tensor) -> torch.Tensor:
        h, start = x, 0
        for i, (ws, bs) in enumerate(shapes):
            w = flat[start:start + ws.numel()].reshape(ws)
            start += ws.numel()
            b = flat[start:start + bs.numel()]
            start += bs.numel()
            h = h @ w.T + b
            if i < len(shapes) - 1:
                h = torch.clamp(h, min=0)
        return h.reshape(-1)

    jac = torch.autograd.functional.jacobian(forward, theta).numpy()
    return int(np.linalg.matrix_rank(jac))


def test_generic_lfcn_identified_with_deficiency_the_hidden_neurons():
    model = lfcn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = inputs(1000)
    result = identify(model, x)
    assert result.identified and result.missing == 0
    assert result.num_params == 54
    assert result.deficiency == 9 == sum(WIDTHS[1:-1])
    assert result.rank.rank == reference_rank(model, x) == 45
    assert result.symmetry.predicted == 9 and result.symmetry.phi_kernel == 9
    assert result.rank.gap > 1e6
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_too_few_inputs_report_the_missing_directions():
    model = lfcn()
    x = inputs(40)
    result = identify(model, x)
    expected_rank = reference_rank(model, x)
    assert result.rank.rank == expected_rank < 45
    assert not result.identified
    assert result.missing == 45 - expected_rank
    assert result.involved  # the layers carrying them are named
    assert set(result.involved) <= {"0", "2", "4"}


def test_twin_neurons_raise_the_deficiency_by_the_predicted_amount():
    model = lfcn()
    with torch.no_grad():  # neuron 1 = 2 x neuron 0: twins read by 4 neurons
        model[0].weight[1] = 2 * model[0].weight[0]
        model[0].bias[1] = 2 * model[0].bias[0]
    x = inputs(1000)
    result = identify(model, x)
    obstructions = result.symmetry.obstructions
    assert obstructions.twin_groups == (("0[0]", "0[1]"),)
    assert obstructions.twins == 4  # (t - 1) * m, m = 4 outgoing weights each
    assert result.deficiency == 9 + 4 == 54 - reference_rank(model, x)
    assert result.identified


def test_dead_neuron_raises_the_deficiency_by_the_predicted_amount():
    model = lfcn((3, 6, 2))
    with torch.no_grad():  # input-dead-like: never active
        model[0].weight[2] = 0
        model[0].bias[2] = -1
    x = inputs(500)
    result = identify(model, x)
    obstructions = result.symmetry.obstructions
    assert obstructions.dead_neurons == ("0[2]",)
    assert obstructions.dead == 3 + 1 + 2 - 1  # incoming + bias + outgoing - its rescaling
    assert result.deficiency == 6 + 5 == 38 - reference_rank(model, x)
    assert result.identified


def test_inputs_in_one_linear_region_do_not_identify():
    model = lfcn()
    x = 0.01 * inputs(100, scale=1.0) + inputs(1, scale=1.0, seed=9)
    result = identify(model, x)
    assert result.regions == 1
    expected = reference_rank(model, x)
    # one region: R is one affine map of x there, so at most d_out * (d_in + 1) numbers
    assert result.rank.rank == expected <= 2 * (3 + 1)
    assert not result.identified
    assert result.missing == 54 - result.symmetry.predicted - expected > 0


def test_phi_rank_matches_path_enumeration():
    model = lfcn()
    dag = NeuronDAG.from_module(model, (3,))
    par = Parameterized.of(model, (3,))
    column = {name: part for name, part in par.slices()}
    phi = dag.phi().values
    jac = np.zeros((len(phi), par.size))
    for p, path in enumerate(dag.phi().paths):
        entries = []  # (theta index, value) of every parameter on the path
        start = dag.neurons[path[0]]
        if start.activation is not Activation.INPUT:
            entries.append((column[f"{start.node}.bias"].start + start.index[0], start.bias))
        for u, v in itertools.pairwise(path):
            nv, nu = dag.neurons[v], dag.neurons[u]
            fan_in = par.shapes[par.names.index(f"{nv.node}.weight")][1]
            k = nv.antecedents.index(u)
            entries.append((column[f"{nv.node}.weight"].start + nv.index[0] * fan_in
                            + (nu.index[0] if nu.activation is not Activation.INPUT else u),
                            nv.weights[k]))
        for index, value in entries:
            jac[p, index] += phi[p] / value
    expected = int(np.linalg.matrix_rank(jac))
    dim = symmetry_dimension(model, (3,))
    assert dim.phi_rank.rank == expected == 54 - 9
    assert dim.phi_kernel == dim.obstructions.rescaling == 9


def distinct_path_activations(model: nn.Module, shape: tuple[int, ...], x: torch.Tensor
                              ) -> tuple[int, int]:
    """(distinct activation patterns, distinct A(theta, x_i) by path enumeration)."""
    dag = NeuronDAG.from_module(model, shape)
    patterns = activation_patterns(Parameterized.of(model, shape).graph, x)
    distinct = {dag.activations(x[i]).active.tobytes() for i in range(len(x))}
    return patterns.count_regions(), len(distinct)


def test_regions_are_the_relu_patterns_of_the_oracle_and_bound_path_activations():
    model, x = lfcn(), inputs(300, scale=1.0)
    dag = NeuronDAG.from_module(model, (3,))
    relu = [v.activation is Activation.RELU for v in dag.neurons]
    bits = {(dag.values(x[i])[relu] > 0).tobytes() for i in range(len(x))}
    patterns, paths = distinct_path_activations(model, (3,), x)
    # an on/off bit hides from A when everything downstream of that neuron is off
    assert patterns == len(bits) == 35 >= paths == 32


def test_regions_bound_distinct_path_activations_with_max_pool():
    # a ReLU neuron that loses its max-pool window shows in the pattern, not in A
    model = nn.Sequential(nn.Conv2d(1, 2, 2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8, 3), nn.ReLU(), nn.Linear(3, 1)).double().eval()
    x = torch.randn(60, 1, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    patterns, paths = distinct_path_activations(model, (1, 5, 5), x)
    assert patterns == 60 >= paths == 58


@pytest.mark.parametrize(("activation", "rescaling", "unclipped"), [
    (nn.LeakyReLU(0.1), 9, 0),  # positively homogeneous: every hidden neuron rescales
    (nn.Hardtanh(), 4, 0),  # clips (+-1 reached): the 5 neurons it reads keep their scale
    (nn.ReLU6(), 4, 4),  # 6 is reached by one of the 5 only: 4 rescale on this domain
])
def test_piecewise_linear_activations(activation, rescaling, unclipped):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), activation, nn.Linear(5, 4), nn.ReLU(),
                          nn.Linear(4, 2)).double().eval()
    x = inputs(1500)
    result = identify(model, x)
    par = Parameterized.of(model, (3,))
    jac = torch.autograd.functional.jacobian(par.outputs(x), par.theta).numpy()
    obstructions = result.symmetry.obstructions
    assert (obstructions.rescaling, obstructions.unclipped) == (rescaling, unclipped)
    assert result.symmetry.phi_kernel == rescaling
    assert result.deficiency == rescaling + unclipped == 54 - int(np.linalg.matrix_rank(jac))
    assert result.identified


CASES = {
    "lfcn": (lambda: lfcn(), (3,), 300),
    "tied": (tied_mlp, (5,), 200),
    "residual_cnn": (residual_cnn, SHAPE, 80),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(12, 4), nn.ReLU(),
                                  nn.Linear(4, 2)).double().eval(), (1, 4, 4), 100),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_randomized_rank_equals_exact(name):
    build, shape, n = CASES[name]
    model = build()
    exact = identify(model, n, shape, method="exact")
    randomized = identify(model, n, shape, method="randomized", phi=True)
    assert randomized.rank.rank == exact.rank.rank
    assert randomized.rank.error_bound < exact.rank.tolerance * 1e3
    assert randomized.symmetry.phi_rank.rank == exact.symmetry.phi_rank.rank


DAG_SEEDS = [(s, None) for s in range(20)
             if any(True for _ in random_network(s)[0].parameters())][:6]
NEW_OP_SEEDS = [(s, NEW_OPS) for s in (0, 20, 25, 32)]  # slicing, padding, PReLU, clamp...


@pytest.mark.parametrize(("seed", "new_ops"), DAG_SEEDS + NEW_OP_SEEDS)
def test_random_dags_exact_rank_matches_autograd_and_randomized(seed, new_ops):
    model, shape = random_network(seed, new_ops=new_ops)
    model = model.double()
    n = 30
    x = torch.randn(n, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    exact = identify(model, x, method="exact")
    par = Parameterized.of(model, shape)
    jac = torch.autograd.functional.jacobian(par.outputs(x), par.theta).numpy()
    assert exact.rank.rank == int(np.linalg.matrix_rank(jac))
    assert identify(model, x, method="randomized").rank.rank == exact.rank.rank
    if exact.symmetry.phi_rank is not None:  # None with PReLU's trainable slopes
        assert exact.symmetry.phi_kernel >= exact.symmetry.obstructions.rescaling


@pytest.mark.slow
@pytest.mark.parametrize(("widths", "params", "hidden"), [
    ((20, 40, 30, 10), 2380, 70),
    ((20, 100, 60, 10), 8770, 160),
])
def test_randomized_equals_exact_up_to_ten_thousand_parameters(widths, params, hidden):
    model = lfcn(widths)
    samples = params // widths[-1]  # as many rows as parameters
    exact = identify(model, samples, method="exact", exact_max=10_000, phi=False)
    randomized = identify(model, samples, method="randomized")
    assert exact.num_params == params and exact.symmetry.predicted == hidden
    assert randomized.rank.rank == exact.rank.rank
    assert randomized.rank.error_bound < exact.rank.tolerance


def test_wrong_inputs_raise_typed_errors():
    with pytest.raises(ShapeError, match=r"input shape \(3,\)"):
        identify(lfcn(), torch.zeros(4, 5, dtype=torch.float64), (3,))
    with pytest.raises(InvalidParameterError, match="method"):
        identify(lfcn(), 4, (3,), method="svd")
    with pytest.raises(InvalidParameterError, match="samples"):
        identify(lfcn(), 0, (3,))


def test_identify_draws_its_own_scaled_inputs_as_the_command_did():
    """identify(net, n, shape, seed=s, scale=c) is identify on c * N(0, 1) inputs drawn
    with seed s, as ``pathlift identify`` drew them before."""
    net = lfcn()
    generator = torch.Generator().manual_seed(7)
    x = 2.5 * torch.randn((40, 3), generator=generator, dtype=torch.float64)
    by_hand = identify(net, x, method="exact", seed=7)
    drawn = identify(net, 40, (3,), method="exact", seed=7, scale=2.5)
    assert repr(drawn) == repr(by_hand) and drawn == by_hand


def test_a_sample_count_that_cannot_succeed_is_refused_before_the_jacobian():
    """n x d_out rows below dim theta - predicted symmetries: no rank can be enough, so no
    Jacobian is computed ('pathlift identify mlp --samples 256' ran 1 min 42 s for a
    verdict known in advance); the message gives the smallest n that could succeed."""
    import math

    from cli_runner import invoke

    d_out = WIDTHS[-1]
    needed = math.ceil(45 / d_out)  # 54 parameters - 9 rescalings
    with pytest.raises(InvalidParameterError, match=f"use at least {needed} inputs"):
        identify(lfcn(), needed - 1, (3,))
    assert identify(lfcn(), needed, (3,)).samples == needed  # runs (too few regions: no)
    result = invoke("identify", "mlp", "--samples", "256", "--scale", "3")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "2,560 rows" in result.stderr and "use at least 1,704 inputs" in result.stderr
