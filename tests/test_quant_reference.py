"""Cor. 3.4.1 on every reference architecture and every bit width 2..16 (slow): the certified
bound max(1, ||x||_inf) d(theta, Q(theta)) holds for sampled inputs, outputs in float64."""

from __future__ import annotations

import copy

import pytest
import torch

from pathlift.bounds import certified_error
from pathlift.models import REFERENCE_MODELS
from pathlift.quant import quantize

SMALL_SHAPES = {"alexnet": (3, 64, 64), "unet": (1, 16, 16), "mlp": (1, 8, 8),
                "small_cnn": (1, 8, 8)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS))
def test_certified_bound_on_every_reference_architecture(name):
    torch.manual_seed(0)
    model = REFERENCE_MODELS[name].constructor().eval()
    shape = SMALL_SHAPES.get(name, (3, 32, 32))
    reference = copy.deepcopy(model).double()
    x = torch.randn((4, *shape), dtype=torch.float64) * torch.tensor([0.1, 1.0, 3.0, 10.0],
                                                                    dtype=torch.float64
                                                                    ).view(-1, 1, 1, 1)
    with torch.no_grad():
        expected = reference(x)
    del reference
    for bits in range(2, 17):
        qm = quantize(model, shape, bits=bits, per_channel=bits % 2 == 1)
        ce = certified_error(model, qm, shape)
        assert ce.exact and 0 < ce.relative <= 1
        with torch.no_grad():
            diff = (expected - qm.model.double()(x)).abs().flatten(1).sum(1)
        assert torch.all(diff <= ce.bound(x)), (name, bits)
