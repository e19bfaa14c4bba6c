"""Results other than PathNorm say which input shape they were computed at and where it
came from (issue 38: no silent shape): path-magnitude and magnitude scores, the path-metric.
Each is checked against the same call at the shape given explicitly (the numbers agree,
the source differs), on a global-average-pool net whose numbers depend on the shape."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from pathlift.graph.input_shape import GIVEN
from pathlift.lift import path_metric
from pathlift.prune import magnitude_scores, path_magnitude_scores


class Declared(nn.Module):
    input_shape = (1, 6, 6)

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)  # border windows: the norm depends on hw
        self.fc = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = Declared().double().eval()
    b = Declared().double().eval()
    b.load_state_dict({k: v * 0.5 for k, v in a.state_dict().items()})  # |b| <= |a|
    return a, b


@pytest.mark.parametrize("scores", [path_magnitude_scores, magnitude_scores])
def test_scores_say_their_shape_and_its_source(scores):
    a, _ = _pair()
    declared, given = scores(a), scores(a, (1, 6, 6))
    assert declared.input_shape == (1, 6, 6) and declared.input_shape.source != GIVEN
    assert "input_shape" in declared.input_shape.source
    assert given.input_shape == (1, 6, 6) and given.input_shape.source == GIVEN
    for name in declared.tensors:
        torch.testing.assert_close(declared.value(name), given.value(name), rtol=1e-12,
                                   atol=0)
    other = scores(a, (1, 9, 9))  # another shape, another number (the pool weighs 1/hw)
    assert other.input_shape == (1, 9, 9)
    if scores is path_magnitude_scores:
        assert not math.isclose(other.log10_sum(), declared.log10_sum(), rel_tol=1e-6)


def test_the_path_metric_says_its_shape_and_its_source():
    a, b = _pair()
    declared, given = path_metric(a, b), path_metric(a, b, (1, 6, 6))
    assert declared.input_shape == (1, 6, 6) and "input_shape" in declared.input_shape.source
    assert given.input_shape.source == GIVEN
    assert declared.upper_log10 == pytest.approx(given.upper_log10, abs=1e-12)
    assert path_metric(a, b, (1, 9, 9)).input_shape == (1, 9, 9)
