"""Channel (structured) path-magnitude: exact channel costs, torch.nn.utils.prune, Torch-Pruning."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores
from pathlift.prune.structured import channel_path_magnitude, channel_scores
from pathlift.symmetry import random_rescale


def _cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 5, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(5 * 2 * 2, 7), nn.ReLU(), nn.Linear(7, 3)).double().eval()


SHAPE = (2, 4, 4)


def test_channel_score_is_the_exact_cost_of_silencing_its_incoming_weights() -> None:
    """Each path enters a channel through one incoming weight, so zeroing all of them costs
    the sum of their Path-Mag exactly (paper 002 eq. 10)."""
    model = _cnn()
    scores = path_magnitude_scores(model, SHAPE)
    channels = channel_scores(scores)
    dense = path_norm(model, SHAPE).value
    for layer in ("0", "3", "6"):
        for c in range(channels[layer].numel()):
            silenced = copy.deepcopy(model)
            with torch.no_grad():
                silenced.get_submodule(layer).weight[c] = 0.0
            cost = dense - path_norm(silenced, SHAPE).value
            value = float(channels[layer][c]) * 10**scores.log10_scale
            assert value == pytest.approx(cost, rel=1e-9, abs=1e-13 * dense)


def test_channel_pruning_zeroes_the_cheapest_channels_and_ignores_rescaling() -> None:
    model = _cnn(1)
    pruned = copy.deepcopy(model)
    scores = channel_scores(channel_path_magnitude(pruned, SHAPE, 0.5))
    rescaled = random_rescale(model, seed=3, input_shape=SHAPE)
    pruned_rescaled = copy.deepcopy(rescaled)
    channel_path_magnitude(pruned_rescaled, SHAPE, 0.5)
    for layer, n_pruned in (("0", 3), ("3", 2), ("6", 4)):
        mask = pruned.get_submodule(layer).weight_mask
        dead = mask.flatten(1).sum(1) == 0
        assert int(dead.sum()) == n_pruned
        assert torch.all(mask.flatten(1)[~dead] == 1)
        assert scores[layer][dead].max() <= scores[layer][~dead].min()
        assert torch.equal(mask, pruned_rescaled.get_submodule(layer).weight_mask)
    assert not hasattr(pruned.get_submodule("8"), "weight_mask")  # outputs are kept


def test_torch_pruning_importance_ranks_groups_by_channel_path_magnitude() -> None:
    tp = pytest.importorskip("torch_pruning")
    from pathlift.prune.torch_pruning import PathMagnitudeImportance

    model = _cnn(2).float()
    example = torch.randn(1, *SHAPE)
    importance = PathMagnitudeImportance(model, SHAPE)
    graph = tp.DependencyGraph().build_dependency(model, example_inputs=example)
    group = graph.get_pruning_group(model[0], tp.prune_conv_out_channels, idxs=list(range(6)))
    expected = channel_scores(path_magnitude_scores(model, SHAPE))["0"]
    torch.testing.assert_close(importance(group).double(), expected, rtol=1e-6, atol=0.0)

    rescaled = random_rescale(model, seed=4, input_shape=SHAPE)
    graph_r = tp.DependencyGraph().build_dependency(rescaled, example_inputs=example)
    group_r = graph_r.get_pruning_group(rescaled[0], tp.prune_conv_out_channels,
                                        idxs=list(range(6)))
    ratio = PathMagnitudeImportance(rescaled, SHAPE)(group_r) / importance(group)
    torch.testing.assert_close(ratio, ratio[:1].expand(6), rtol=1e-5, atol=0.0)  # one scale

    before = model[0].weight.detach().clone()
    pruner = tp.pruner.MetaPruner(model, example, importance=importance, pruning_ratio=0.5,
                                  ignored_layers=[model[8]])
    pruner.step()  # physically removes the cheapest half of the channels of each layer
    kept = {int((before == row).flatten(1).all(1).nonzero()) for row in model[0].weight}
    assert kept == set(expected.topk(3).indices.tolist())
    assert model(torch.randn(4, *SHAPE)).shape == (4, 3)
