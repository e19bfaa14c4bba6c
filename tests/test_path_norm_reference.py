"""Path-norms of deep networks: the published scale, and no overflow or underflow."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pathlift.lift import path_norm, path_norms
from pathlift.models import resnet18, resnet152


def test_random_resnet18_has_the_published_scale():
    """REFERENCE.md: a randomly initialised ResNet-18 has l1 ~ 6e30 and l2 ~ 5e2 (r = q)."""
    torch.manual_seed(0)
    norms = path_norms(resnet18().eval(), (3, 224, 224), qs=(1, 2), dtype=torch.float32)
    assert norms[1.0].log10 == pytest.approx(math.log10(6e30), abs=0.3)
    assert norms[2.0].log10 == pytest.approx(math.log10(5e2), abs=0.3)


def test_resnet152_l1_l2_l4_in_one_call_beyond_float32_range():
    """l1 of a random ResNet-152 is ~1e226: float32 mantissas carried in log space hold it."""
    torch.manual_seed(0)
    model = resnet152().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    norms = path_norms(model, (3, 224, 224), qs=(1, 2, 4), dtype=torch.float32)
    assert set(norms) == {1.0, 2.0, 4.0}
    for q, result in norms.items():
        assert math.isfinite(result.log10), q
        assert len(result.per_output_log10) == 1000
    assert norms[1.0].log10 > 100  # far beyond float32's 3.4e38
    assert norms[1.0].log10 > norms[2.0].log10 > norms[4.0].log10  # l^q decreasing in q
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_float32_mantissas_agree_with_float64():
    torch.manual_seed(1)
    model = resnet18(num_classes=10).eval()
    for q in (1.0, 2.0, 4.0):
        f64 = path_norm(model, (3, 64, 64), q=q, r=q)
        f32 = path_norm(model, (3, 64, 64), q=q, r=q, dtype=torch.float32)
        assert f32.log10 == pytest.approx(f64.log10, abs=1e-5)


@pytest.mark.parametrize("weight", [10.0, 0.1])
def test_deep_chain_leaves_float64_without_overflow_or_underflow(weight):
    """A chain of 400 scalar layers of weight w has exactly one path: ||Phi||_q = |w|^400."""
    layers = []
    for _ in range(400):
        linear = nn.Linear(1, 1, bias=False)
        nn.init.constant_(linear.weight, weight)
        layers += [linear, nn.ReLU()]
    model = nn.Sequential(*layers)
    for q in (0.5, 1.0, 3.0):
        result = path_norm(model, (1,), q=q)
        stored = layers[0].weight.item()  # the float32 value of w
        assert result.log10 == pytest.approx(400 * math.log10(stored), rel=1e-12)
    assert path_norm(model, (1,)).value == (math.inf if weight > 1 else 0.0)
