"""The explicit neuron DAG (thesis Def. 2.2.2) reproduces the torch model: its realization,
the path-lifting identity of Thm 2.4.2, hand-computed Phi, max-pool argmax selection and the
rescaling invariance of Thm 2.4.1."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError, UnsupportedModelError
from pathlift.graph import check
from pathlift.lift import path_norm
from pathlift.testing.neurons import Activation, NeuronDAG
from random_nets import networks, random_input, random_network


def _torch_output(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """The model's outputs, flattened and concatenated, computed by torch in float64."""
    with torch.no_grad():
        out = copy.deepcopy(model).double()(x.clone())
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    return torch.cat([o.reshape(-1) for o in outs]).numpy()


def _inner_product(dag: NeuronDAG, x: torch.Tensor) -> np.ndarray:
    """<Phi^{->v}, A^{->v}(theta, x)(x; 1)> per output v, with the sparse matrix A."""
    phi = dag.phi()
    x1 = np.append(x.reshape(-1).numpy(), 1.0)
    per_path = phi.values * (dag.activations(x).matrix() @ x1)
    return np.bincount(phi.ends, weights=per_path, minlength=len(dag.outputs))


@pytest.mark.parametrize("seed", range(100))
def test_theorem_2_4_2_on_random_networks(seed):
    model, shape = random_network(seed)
    dag = NeuronDAG.from_module(model, shape)
    for k in range(3):
        x = random_input(shape, seed=1000 * seed + k)
        expected = _torch_output(model, x)
        scale = max(1.0, float(np.abs(expected).max()))
        realization = dag.values(x)[list(dag.outputs)]  # Def. 2.2.2 recursion
        np.testing.assert_allclose(realization, expected, rtol=1e-9, atol=1e-12 * scale)
        np.testing.assert_allclose(_inner_product(dag, x), expected, rtol=1e-9,
                                   atol=1e-12 * scale)
        np.testing.assert_allclose(dag.output(x), expected, rtol=1e-9, atol=1e-12 * scale)


@settings(max_examples=20, deadline=None)
@given(networks(), st.integers(0, 2**31 - 1))
def test_theorem_2_4_2_property(net, seed):
    model, shape = net
    x = random_input(shape, seed)
    expected = _torch_output(model, x)
    got = NeuronDAG.from_module(model, shape).output(x)
    np.testing.assert_allclose(got, expected, rtol=1e-9,
                               atol=1e-12 * max(1.0, float(np.abs(expected).max())))


def _one_hidden_layer() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -2.0], [3.0, 0.5]]))
        model[0].bias.copy_(torch.tensor([0.25, -1.0]))
        model[2].weight.copy_(torch.tensor([[2.0, -4.0]]))
        model[2].bias.copy_(torch.tensor([0.5]))
    return model.eval()


def test_phi_by_hand():
    """Def. 2.3.3 on 2-2-1: 4 input paths, 2 hidden-bias paths, 1 output-bias path."""
    dag = NeuronDAG.from_module(_one_hidden_layer(), (2,))
    assert [v.activation for v in dag.neurons] == [Activation.INPUT] * 2 + [
        Activation.RELU] * 2 + [Activation.IDENTITY]
    by_path = dict(zip(dag.phi().paths, dag.phi().values, strict=True))
    assert by_path == {(0, 2, 4): 1.0 * 2.0, (1, 2, 4): -2.0 * 2.0, (0, 3, 4): 3.0 * -4.0,
                       (1, 3, 4): 0.5 * -4.0, (2, 4): 0.25 * 2.0, (3, 4): -1.0 * -4.0,
                       (4,): 0.5}
    assert dag.num_paths == 7
    assert dag.path_norm(1) == pytest.approx(2 + 4 + 12 + 2 + 0.5 + 4 + 0.5, rel=1e-15)
    assert dag.path_norm(2) == pytest.approx(math.sqrt(4 + 16 + 144 + 4 + 0.25 + 16 + 0.25),
                                             rel=1e-15)


def test_activations_by_hand():
    """On x = (1, 1): hidden pre-activations (-0.75, 2.5), so only neuron 3 is active."""
    dag = NeuronDAG.from_module(_one_hidden_layer(), (2,))
    x = torch.tensor([1.0, 1.0])
    act = dag.activations(x)
    active = {p for p, a in zip(dag.phi().paths, act.active, strict=True) if a}
    assert active == {(0, 3, 4), (1, 3, 4), (3, 4), (4,)}
    dense = act.matrix().toarray()
    assert dense.shape == (7, 3)
    assert dense.sum() == 4 and dense[:, 2].sum() == 2  # (3, 4) and (4,) use the bias column
    assert dag.output(x)[0] == pytest.approx(3.0 * -4.0 + 0.5 * -4.0 + 4.0 + 0.5, rel=1e-15)


def test_max_pool_selects_torch_argmax():
    """A max-pool edge u -> v is active iff u is the argmax of v's window (Def. 2.3.3)."""
    model = nn.Sequential(nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True))
    dag = NeuronDAG.from_module(model, (2, 5, 5))
    x = random_input((2, 5, 5), seed=3)
    _, argmax = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    act = dag.activations(x)
    chosen = {p[1]: p[0] for p, a in zip(dag.phi().paths, act.active, strict=True)
              if a and len(p) == 2}
    channel_offset = (torch.arange(2) * 25).reshape(1, 2, 1, 1)
    expected_inputs = (argmax + channel_offset).reshape(-1).tolist()
    assert [chosen[v] for v in dag.outputs] == expected_inputs
    assert all(dag.neurons[v].activation is Activation.MAXPOOL for v in dag.outputs)


def test_rescaling_leaves_phi_and_a_invariant():
    """Thm 2.4.1: hidden neuron j's incoming weights and bias times lambda, outgoing weights
    divided by lambda: same Phi and A. A non-symmetry (scaling only the input side) is seen."""
    model = _one_hidden_layer()
    rescaled, broken = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for net, out_factor in ((rescaled, 1 / 8.0), (broken, 1.0)):
            net[0].weight[1] *= 8.0
            net[0].bias[1] *= 8.0
            net[2].weight[:, 1] *= out_factor
    x = torch.tensor([0.3, -0.7])
    dags = [NeuronDAG.from_module(m, (2,)) for m in (model, rescaled, broken)]
    np.testing.assert_allclose(dags[1].phi().values, dags[0].phi().values, rtol=1e-15)
    assert np.array_equal(dags[1].activations(x).active, dags[0].activations(x).active)
    assert not np.allclose(dags[2].phi().values, dags[0].phi().values)


def test_relu_is_merged_only_when_its_input_is_not_read_elsewhere():
    class Reuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            h = self.fc(x)
            return h + torch.relu(h)  # h is read twice: the ReLU gets its own neurons

    merged = NeuronDAG.from_module(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), (3,))
    assert len(merged.neurons) == 6
    model = Reuse().eval()
    dag = NeuronDAG.from_module(model, (3,))
    assert [v.activation for v in dag.neurons].count(Activation.RELU) == 3
    assert len(dag.neurons) == 12
    x = random_input((3,), seed=0)
    np.testing.assert_allclose(dag.output(x), _torch_output(model, x), rtol=1e-12)


def test_repeated_reads_go_through_identity_copies():
    """x + x: two edges of weight 1 (Def. 2.2.2 has no parallel edges, so one goes through
    an identity copy): ||Phi||_2^2 = 2 w^2, as the one-pass norm counts it."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(1, 1, bias=False)

        def forward(self, x):
            h = self.fc(x)
            return h + h

    model = Twice().eval()
    w = model.fc.weight.item()
    dag = NeuronDAG.from_module(model, (1,))
    assert dag.path_norm(2) == pytest.approx(math.sqrt(2) * abs(w), rel=1e-14)
    assert path_norm(model, (1,), 2).value == pytest.approx(dag.path_norm(2), rel=1e-12)


def _mlp(widths: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).eval()


def test_path_count_and_limit():
    """|P| of an MLP: c_0 = 1, c_l = 1 + d_{l-1} c_{l-1} paths end at each layer-l neuron."""
    widths = (3, 4, 5, 2)
    c = 1
    for d in widths[:-1]:
        c = 1 + d * c
    dag = NeuronDAG.from_module(_mlp(widths), (3,))
    assert dag.num_paths == widths[-1] * c == len(list(dag.paths()))
    with pytest.raises(UnsupportedModelError, match="max_paths"):
        NeuronDAG.from_module(_mlp(widths), (3,), max_paths=widths[-1] * c - 1)
    with pytest.raises(UnsupportedModelError, match="max_paths=1000000"):
        NeuronDAG.from_module(_mlp((30, 40, 40, 40, 10)), (30,))


def test_model_is_not_modified():
    model, shape = random_network(7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dag = NeuronDAG.from_module(model, shape)
    dag.output(random_input(shape, seed=0))
    after = model.state_dict()
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_errors():
    dag = NeuronDAG.from_module(_one_hidden_layer(), (2,))
    with pytest.raises(ShapeError, match=r"\(2,\)"):
        dag.output(torch.zeros(3))
    with pytest.raises(InvalidParameterError):
        dag.path_norm(q=0)
    with pytest.raises(InvalidParameterError):
        dag.path_norm(r=-1)
    with pytest.raises(UnsupportedModelError, match="GELU"):
        NeuronDAG.from_module(nn.Sequential(nn.Linear(2, 2), nn.GELU()), (2,))


def test_buffer_only_float64_model_traces():
    """A float64 model whose only floating tensors are buffers (BatchNorm(affine=False)):
    the example input used to be float32 and the trace failed with a ShapeError."""
    bn = nn.BatchNorm1d(3, affine=False).eval()
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 2.0)
        bn.running_mean.uniform_(-1.0, 1.0)
    model = nn.Sequential(bn, nn.AdaptiveAvgPool1d(2)).double().eval()
    dag = NeuronDAG.from_module(model, (3, 4))
    x = random_input((3, 4), seed=1)
    np.testing.assert_allclose(dag.output(x), _torch_output(model, x), rtol=1e-12)
    assert path_norm(model, (3, 4), 2).value == pytest.approx(dag.path_norm(2), rel=1e-12)


def test_max_pool_window_inside_padding_is_refused():
    """MaxPool1d(2, 2, padding=1, dilation=2) on length 1: the only window is padding and
    torch returns -inf, which no path describes; check() names the node."""
    model = nn.Sequential(nn.Linear(1, 1), nn.Unflatten(1, (1, 1)),
                          nn.MaxPool1d(2, 2, padding=1, dilation=2))
    report = check(model, (1,))
    assert [p.node for p in report.problems] == ["2"]
    assert "padding" in report.problems[0].reason


def test_tensor_slicing_is_a_relabelling():
    """x[:, :2] keeps two neurons: path_norm used to crash on it (AttributeError); a slice
    across the batch dimension is refused."""

    class Slice(nn.Module):
        def __init__(self, batch_slice: bool = False):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(2, 1)
            self.batch_slice = batch_slice

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return h[:1] if self.batch_slice else self.fc2(h[:, :2])

    model = Slice().eval()
    dag = NeuronDAG.from_module(model, (4,))
    assert dag.num_paths == 1 + 2 * (1 + 4)
    x = random_input((4,), seed=2)
    np.testing.assert_allclose(dag.output(x), _torch_output(model, x), rtol=1e-12)
    for q in (0.5, 1.0, 2.0):
        assert path_norm(model, (4,), q).value == pytest.approx(dag.path_norm(q), rel=1e-12)
    assert "batch" in str(check(Slice(batch_slice=True), (4,)))


class _InPlace(nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        self.fc, self.relu, self.mode = nn.Linear(4, 4), nn.ReLU(inplace=True), mode

    def forward(self, x):
        h = self.fc(x)
        if self.mode == "relu_ then read":
            return h + torch.relu_(h)
        if self.mode == "module through a view":
            v = h.view(-1, 4)
            return self.relu(h) + v
        if self.mode == "functional, output read":
            F.relu(h, inplace=True)
            return h
        if self.mode == "input overwritten":
            return self.fc(torch.relu_(x)) + x
        if self.mode == "safe +=":
            h += torch.relu(h)
            return self.relu(h)
        return self.relu(h)


@pytest.mark.parametrize("mode", ["relu_ then read", "module through a view",
                                  "functional, output read", "input overwritten"])
def test_in_place_op_on_a_value_read_again_is_refused(mode):
    """Eager PyTorch reads the overwritten values, the graph passes would not: refused
    (path_norm used to return the norm of another network)."""
    report = check(_InPlace(mode).eval(), (4,))
    assert len(report.problems) == 1 and "overwrites" in report.problems[0].reason


@pytest.mark.parametrize("mode", ["safe +=", "plain"])
def test_safe_in_place_ops_are_accepted(mode):
    model = _InPlace(mode).eval()
    dag = NeuronDAG.from_module(model, (4,))
    x = random_input((4,), seed=5)
    np.testing.assert_allclose(dag.output(x), _torch_output(model, x), rtol=1e-12)
    assert path_norm(model, (4,), 2).value == pytest.approx(dag.path_norm(2), rel=1e-12)


def test_augmented_assignment_on_an_aliased_tensor_is_refused():
    """torch.fx records `h += y` as an out-of-place add, so an alias of h read later is
    invisible in the graph; trace compares the graph with the eager forward and refuses."""
    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x):
            h = self.fc1(x)
            skip = h
            h += self.fc2(x)  # eager: skip is overwritten too
            return skip

    assert not check(Aliased().eval(), (2,)).ok


def test_random_networks_are_differentiable():
    """Other tests differentiate the generated networks: in-place ops never overwrite a
    tensor autograd saved (random_network(14) used to fail in backward)."""
    for seed in range(200):
        model, shape = random_network(seed)
        x = random_input(shape, seed, batch=2, dtype=torch.float32).requires_grad_()
        out = model(x)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        sum(o.sum() for o in outs).backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("seed", range(30))
def test_symmetry_transforms_keep_phi_and_a(seed):
    """Thm 2.4.1 on random DAGs: pathlift.symmetry's random rescaling and normalisation
    (Alg. 3.2.1) leave every coordinate of Phi and every path activation unchanged (up to
    the float32 rounding of the rescaled weights)."""
    from pathlift.symmetry import normalize, random_rescale

    model, shape = random_network(seed)
    dag = NeuronDAG.from_module(model, shape)
    x = random_input(shape, seed)
    for moved in (random_rescale(model, seed=seed, input_shape=shape),
                  normalize(model, shape, q=2.0)):
        other = NeuronDAG.from_module(moved, shape)
        assert other.phi().paths == dag.phi().paths
        phi = dag.phi().values
        np.testing.assert_allclose(other.phi().values, phi, rtol=1e-5,
                                   atol=1e-6 * np.abs(phi).max())
        assert np.array_equal(other.activations(x).active, dag.activations(x).active)
