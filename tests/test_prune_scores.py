"""Path-magnitude scores (paper 002 eq. 11, 14) against path enumeration and two passes."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_norm
from pathlift.prune import global_masks, magnitude_scores, path_magnitude_scores
from random_nets import randomise_batchnorm_


def _mlp(widths: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).double()


def _enumerated_path_mag(model: nn.Sequential) -> dict[str, torch.Tensor]:
    """Path-Mag(theta, i) = sum of |Phi_p| over the paths p through i (paper 002 eq. 10).

    Paths of an MLP (Def. 2.3.3): from any input neuron, or from the bias of any hidden or
    output neuron, to an output neuron; every path is listed explicitly.
    """
    linears = [m for m in model if isinstance(m, nn.Linear)]
    names = [f"{i}" for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    W = [m.weight.detach() for m in linears]
    b = [m.bias.detach() for m in linears]
    scores = {f"{n}.{p}": torch.zeros_like(getattr(m, p))
              for n, m in zip(names, linears, strict=True) for p in ("weight", "bias")}
    for start in range(len(W) + 1):  # start=0: input neuron; start=l: bias of layer l-1 output
        first = W[0].shape[1] if start == 0 else W[start - 1].shape[0]
        for neurons in itertools.product(range(first),
                                         *[range(w.shape[0]) for w in W[start:]]):
            value = 1.0 if start == 0 else abs(float(b[start - 1][neurons[0]]))
            coords = [] if start == 0 else [(f"{names[start - 1]}.bias", (neurons[0],))]
            for k, layer in enumerate(range(start, len(W))):
                value *= abs(float(W[layer][neurons[k + 1], neurons[k]]))
                coords.append((f"{names[layer]}.weight", (neurons[k + 1], neurons[k])))
            for name, idx in coords:
                scores[name][idx] += value
    return scores


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.integers(0, 10_000))
def test_scores_equal_path_enumeration(widths: list[int], seed: int) -> None:
    model = _mlp(widths, seed)
    scores = path_magnitude_scores(model, (widths[0],), include_biases=True)
    expected = _enumerated_path_mag(model)
    assert set(scores.tensors) == set(expected)
    for name, exact in expected.items():
        torch.testing.assert_close(scores.value(name), exact, rtol=1e-9, atol=0.0)


class _Net(nn.Module):
    """Conv, eval BatchNorm, max-pool, a residual add, average pooling and two Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(3)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(3, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.relu(x + self.conv2(x))
        return self.fc2(torch.relu(self.fc1(torch.flatten(self.avg(x), 1))))


def _cnn(seed: int = 0) -> _Net:
    torch.manual_seed(seed)
    return randomise_batchnorm_(_Net().double())


class _RowsNet(nn.Module):
    """A Linear over the last dim of 3 rows (its weight gradient is not an outer product of
    two vectors), a transposed convolution, and a Linear on one row (it is); the output is
    a dict holding a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = nn.Linear(5, 4)
        self.up = nn.ConvTranspose1d(3, 2, 2, stride=2)
        self.out = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.up(torch.relu(self.rows(x))))
        return {"logits": (self.out(torch.flatten(x, 1)),)}


def _rows_net() -> _RowsNet:
    torch.manual_seed(3)
    return _RowsNet().double().eval()


@pytest.mark.parametrize(("build", "shape"), [(_cnn, (2, 4, 4)), (_rows_net, (3, 5))])
def test_scores_equal_two_pass_cost_of_every_coordinate(build, shape) -> None:
    model = build()
    scores = path_magnitude_scores(model, shape, include_biases=True)
    assert "bn1.weight" not in scores.tensors and "conv2.bias" not in scores.tensors
    dense = path_norm(model, shape).value
    for name, mantissas in scores.tensors.items():
        module_name, p = name.rsplit(".", 1)
        for index in range(mantissas.numel()):
            pruned = copy.deepcopy(model)
            with torch.no_grad():
                getattr(pruned.get_submodule(module_name), p).view(-1)[index] = 0.0
            cost = dense - path_norm(pruned, shape).value  # eq. 11, two passes
            score = float(scores.value(name).view(-1)[index])
            # the two-pass difference cancels: its own error is ~1e-15 of the norm
            assert abs(score - cost) <= 1e-9 * abs(cost) + 1e-14 * dense, (name, index)


def test_scores_are_rescaling_invariant_and_magnitudes_are_not() -> None:
    model, shape = _cnn(1), (2, 4, 4)
    rescaled = copy.deepcopy(model)
    lam = torch.tensor([1.0, 128.0, 4096.0], dtype=torch.float64)
    with torch.no_grad():  # conv1's neurons times lam, BN's a = gamma/sd divided by lam
        rescaled.conv1.weight.mul_(lam.view(-1, 1, 1, 1))
        rescaled.conv1.bias.mul_(lam)
        rescaled.bn1.running_mean.mul_(lam)
        rescaled.bn1.weight.div_(lam)
        rescaled.fc1.weight.mul_(4.0)
        rescaled.fc1.bias.mul_(4.0)
        rescaled.fc2.weight.div_(4.0)
    x = torch.rand(5, *shape, dtype=torch.float64) * 4 - 2
    torch.testing.assert_close(model(x), rescaled(x), rtol=1e-12, atol=1e-12)  # a symmetry
    a, b = path_magnitude_scores(model, shape), path_magnitude_scores(rescaled, shape)
    for name in a.tensors:
        torch.testing.assert_close(a.value(name), b.value(name), rtol=1e-10, atol=0.0)
    assert not torch.equal(magnitude_scores(model, shape).tensors["fc1.weight"],
                           magnitude_scores(rescaled, shape).tensors["fc1.weight"])


def test_scores_of_a_deep_network_beyond_float64_sum_to_depth_times_norm() -> None:
    """Without biases every path has D edges, so by Euler's identity for the degree-D
    homogeneous ||Phi||_1: sum_i Path-Mag(theta, i) = D ||Phi||_1 (here beyond 1e308)."""
    depth = 100
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(6, 6, bias=False), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for m in model:
            if isinstance(m, nn.Linear):
                m.weight.uniform_(-1e3, 1e3)
    norm = path_norm(model, (6,))
    assert norm.log10 > 320
    scores = path_magnitude_scores(model, (6,))
    assert all(torch.isfinite(t).all() for t in scores.tensors.values())
    assert scores.log10_sum() == pytest.approx(math.log10(depth) + norm.log10, abs=1e-6)


def test_pruned_coordinates_score_zero_and_others_match_explicit_zeroing() -> None:
    model, shape = _cnn(2), (2, 4, 4)
    zeroed = copy.deepcopy(model)
    mask = (torch.rand_like(model.fc1.weight) > 0.5).double()
    torch.nn.utils.prune.custom_from_mask(model.fc1, "weight", mask)
    with torch.no_grad():
        zeroed.fc1.weight.mul_(mask)
    a, b = path_magnitude_scores(model, shape), path_magnitude_scores(zeroed, shape)
    assert set(a.tensors) == set(b.tensors)
    assert torch.all(a.tensors["fc1.weight"][mask == 0] == 0)
    for name in a.tensors:
        torch.testing.assert_close(a.value(name), b.value(name), rtol=1e-12, atol=0.0)


def test_model_is_not_modified() -> None:
    model = _cnn(3)
    model.conv2.weight.requires_grad_(False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    scores = path_magnitude_scores(model, (2, 4, 4), include_biases=True)
    assert scores.tensors["conv2.weight"].abs().sum() > 0  # frozen weights are scored too
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert all(p.grad is None for p in model.parameters())
    assert not model.conv2.weight.requires_grad and model.conv1.weight.requires_grad


def test_float32_mantissas_agree_with_float64() -> None:
    model, shape = _cnn(4), (2, 4, 4)
    a = path_magnitude_scores(model, shape)
    b = path_magnitude_scores(model, shape, dtype=torch.float32)
    for name in a.tensors:
        torch.testing.assert_close(b.value(name), a.value(name), rtol=1e-5, atol=0.0)


def test_layer_called_twice_is_refused() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.fc(x)))

    with pytest.raises(UnsupportedModelError, match=r"fc.*called several times"):
        path_magnitude_scores(Twice(), (3,))


@pytest.mark.parametrize("amount", [0.0, 0.3, 0.8, 1.0, 17])
def test_global_masks_are_torchs_global_unstructured_masks(amount):
    """The threshold found by counting (the sharded models' way) prunes what
    torch.nn.utils.prune.global_unstructured with L1Unstructured prunes."""
    from torch.nn.utils import prune

    from pathlift.graph import graph_of
    from pathlift.models import small_cnn
    from pathlift.prune import prunable_parameters

    torch.manual_seed(0)
    model = small_cnn()
    scores = path_magnitude_scores(model, (1, 8, 8))
    masks = global_masks(scores, amount)
    targets = prunable_parameters(graph_of(model, (1, 8, 8)))
    prune.global_unstructured([(m, p) for _, m, p in targets], prune.L1Unstructured,
                              importance_scores={(m, p): scores.tensors[f"{n}.{p}"]
                                                 for n, m, p in targets}, amount=amount)
    for n, m, p in targets:
        assert torch.equal(masks[f"{n}.{p}"], getattr(m, p + "_mask")), n
    pruned = sum(int((1 - v).sum()) for v in masks.values())
    assert pruned == (amount if isinstance(amount, int) else round(amount * scores.numel()))
