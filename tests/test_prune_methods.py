"""Pruning methods on torch.nn.utils.prune: counts, rankings, invariance, certificates."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.errors import InvalidParameterError
from pathlift.lift import path_norm
from pathlift.models import REFERENCE_MODELS, get_model
from pathlift.prune import (
    PathMagnitudeUnstructured,
    global_magnitude,
    global_path_magnitude,
    layerwise_path_magnitude,
    path_magnitude_scores,
    prune_model,
)
from pathlift.symmetry import adversarial_rescale, random_rescale


def _mlp(widths: tuple[int, ...] = (6, 8, 8, 3), seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).double()


def _masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b != 0 for n, b in model.named_buffers() if n.endswith("_mask")}


def test_global_path_magnitude_prunes_the_smallest_scores_through_torch() -> None:
    model = _mlp()
    scores = path_magnitude_scores(model, (6,))
    pruned = copy.deepcopy(model)
    result = global_path_magnitude(pruned, (6,), 0.5)
    masks = {n[: -len("_mask")]: m for n, m in _masks(pruned).items()}
    assert set(masks) == set(scores.tensors)
    assert all(hasattr(pruned.get_submodule(n.rsplit(".", 1)[0]), "weight_orig") for n in masks)
    flat_scores = torch.cat([scores.tensors[n].reshape(-1) for n in masks])
    flat_masks = torch.cat([m.reshape(-1) for m in masks.values()])
    total = flat_scores.numel()
    assert result.pruned == round(0.5 * total) == int((flat_masks == 0).sum())
    assert result.total == total
    assert flat_scores[flat_masks == 0].max() <= flat_scores[flat_masks == 1].min()
    for name, mask in masks.items():  # the forward uses orig * mask
        module_name, p = name.rsplit(".", 1)
        torch.testing.assert_close(getattr(pruned.get_submodule(module_name), p),
                                   getattr(model.get_submodule(module_name), p) * mask)


def test_layerwise_counts_follow_the_thesis_convention() -> None:
    model = _mlp((6, 10, 10, 4))
    layerwise_path_magnitude(model, (6,), 0.6, last_layer_factor=0.5)
    zeros = {n: int((m == 0).sum()) for n, m in _masks(model).items()}
    assert zeros == {"0.weight_mask": 36, "2.weight_mask": 60, "4.weight_mask": 12}


def test_path_magnitude_unstructured_apply_needs_the_network() -> None:
    model = _mlp()
    scores = path_magnitude_scores(model, (6,)).tensors["2.weight"]
    PathMagnitudeUnstructured.apply(model[2], "weight", 20, model=model, input_shape=(6,))
    mask = model[2].weight_mask
    assert int((mask == 0).sum()) == 20
    assert scores[mask == 0].max() <= scores[mask == 1].min()
    with pytest.raises(InvalidParameterError, match="whole network"):
        PathMagnitudeUnstructured.apply(model[0], "weight", 3)


def test_amounts_are_validated() -> None:
    with pytest.raises(InvalidParameterError, match="amount"):
        global_path_magnitude(_mlp(), (6,), 1.5)
    with pytest.raises(InvalidParameterError, match="last_layer_factor"):
        layerwise_path_magnitude(_mlp(), (6,), 0.8, last_layer_factor=2.0)


_FAST = ("mlp", "small_cnn", "unet")


def _reference(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    spec = REFERENCE_MODELS[name]
    shape = spec.input_shape if spec.input_shape[-1] <= 64 else (3, 64, 64)
    torch.manual_seed(0)
    return get_model(name).eval(), shape


@pytest.mark.parametrize("name", [
    n if n in _FAST else pytest.param(n, marks=pytest.mark.slow) for n in REFERENCE_MODELS])
def test_path_magnitude_masks_survive_random_rescaling_and_magnitude_masks_do_not(
        name: str) -> None:
    model, shape = _reference(name)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rescaled = random_rescale(model, seed=1, input_shape=shape).eval()
    masks = {}
    for which, net in (("plain", model), ("rescaled", rescaled)):
        for method in (global_path_magnitude, global_magnitude):
            pruned = copy.deepcopy(net)
            method(pruned, shape, 0.6)
            masks[which, method.__name__] = _masks(pruned)
            del pruned  # the largest reference networks hold 130M weights
    path_a, path_b = masks["plain", "global_path_magnitude"], masks["rescaled",
                                                                     "global_path_magnitude"]
    assert path_a.keys() == path_b.keys()
    assert all(torch.equal(path_a[k], path_b[k]) for k in path_a)
    mag_a, mag_b = masks["plain", "global_magnitude"], masks["rescaled", "global_magnitude"]
    assert not all(torch.equal(mag_a[k], mag_b[k]) for k in mag_a)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", [
    pytest.param(n) if n in _FAST
    else pytest.param(n, marks=pytest.mark.slow) for n in REFERENCE_MODELS])
def test_path_magnitude_masks_survive_adversarial_rescaling(name: str) -> None:
    """adversarial_rescale picks the rescaling that hurts magnitude pruning most."""
    model, shape = _reference(name)
    attacked = adversarial_rescale(model, amount=0.6, input_shape=shape).eval()
    masks = []
    for net in (model, attacked):
        pruned = copy.deepcopy(net)
        global_path_magnitude(pruned, shape, 0.6)
        masks.append(_masks(pruned))
        del pruned
    assert masks[0].keys() == masks[1].keys()
    assert all(torch.equal(masks[0][k], masks[1][k]) for k in masks[0])


def _check_certificate(dense: nn.Module, pruned: nn.Module, shape: tuple[int, ...], result,
                       inputs: torch.Tensor) -> None:
    two_pass = path_norm(dense, shape).log10, path_norm(pruned, shape).log10
    assert result.log10_path_norm == pytest.approx(two_pass[0], abs=1e-9)
    expected = two_pass[0] + math.log10(-math.expm1((two_pass[1] - two_pass[0]) * math.log(10)))
    assert result.log10_path_metric == pytest.approx(expected, abs=1e-6)
    assert result.log10_path_metric <= result.log10_bound + 1e-9
    with torch.no_grad():
        gap = (dense(inputs) - pruned(inputs)).abs().flatten(1).sum(1)
    scale = inputs.flatten(1).abs().amax(1).clamp(min=1.0)
    assert torch.all(gap <= result.path_metric * scale * (1 + 1e-9))


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["path-magnitude", "magnitude"]), st.sampled_from(["global", "layerwise"]),
       st.integers(1, 3), st.floats(0.1, 0.9), st.integers(0, 1000))
def test_certified_bound_holds_on_sampled_inputs(criterion: str, scope: str, steps: int,
                                                 amount: float, seed: int) -> None:
    """Thesis eq. 3.19 and Thm 3.4.1: ||R_theta(x) - R_theta'(x)||_1 <= d max(1, ||x||_inf)."""
    dense = _mlp(seed=seed)
    pruned = copy.deepcopy(dense)
    result = prune_model(pruned, (6,), amount, criterion, scope, steps=steps)
    inputs = torch.randn(256, 6, dtype=torch.float64) * 3
    _check_certificate(dense, pruned, (6,), result, inputs)


@pytest.mark.parametrize("name", ["small_cnn", pytest.param("resnet18", marks=pytest.mark.slow)])
def test_certified_bound_holds_for_pruned_reference_networks(name: str) -> None:
    model, shape = _reference(name)
    dense = model.double()
    pruned = copy.deepcopy(dense)
    result = layerwise_path_magnitude(pruned, shape, 0.8, last_layer_factor=0.5, steps=2)
    assert 0.7 < result.sparsity < 0.8
    _check_certificate(dense, pruned, shape, result, torch.rand(8, *shape,
                                                                dtype=torch.float64) * 2)


def test_pruning_one_coordinate_costs_exactly_its_score() -> None:
    model = _mlp()
    scores = path_magnitude_scores(model, (6,))
    pruned = copy.deepcopy(model)
    result = global_path_magnitude(pruned, (6,), 1 / scores.numel())
    assert result.pruned == 1
    smallest = min(float(t.min()) for t in scores.tensors.values())
    expected = math.log10(smallest) + scores.log10_scale
    assert result.log10_bound == pytest.approx(expected, abs=1e-12)
    assert result.log10_path_metric == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("criterion", "scope"), [("path-magnitude", "global"),
                                                  ("magnitude", "global"),
                                                  ("path-magnitude", "layerwise")])
def test_a_channels_last_model_gets_the_masks_of_the_contiguous_one(criterion: str,
                                                                    scope: str) -> None:
    """torch's global_unstructured flattens scores and masks with view(-1): channels_last
    weights (and their scores) are pruned like the contiguous model, twice in a row."""
    torch.manual_seed(0)
    plain = get_model("small_cnn").double().eval()
    last = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    assert not last.features[3].weight.is_contiguous()
    for _ in range(2):  # the second round starts from masks
        want = prune_model(plain, (1, 8, 8), 0.4, criterion, scope)
        got = prune_model(last, (1, 8, 8), 0.4, criterion, scope)
        assert (got.pruned, got.log10_path_metric) == (want.pruned, want.log10_path_metric)
        assert all(torch.equal(m, _masks(plain)[n]) for n, m in _masks(last).items())
    assert _masks(last).keys() == _masks(plain).keys()
