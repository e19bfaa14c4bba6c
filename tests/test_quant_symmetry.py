"""Symmetry-aware quantisation on a digits CNN (thesis Sec. 7.5): the certified error of plain
quantisation depends on the rescaling, the symmetry-aware one does not."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pathlift.bounds import certified_error
from pathlift.bounds.symmetry_aware import compare, symmetry_aware_quantize
from pathlift.data import load_digits, loaders
from pathlift.data.training import train_classifier
from pathlift.models import small_cnn
from pathlift.quant import quantize
from pathlift.symmetry import random_rescale

SHAPE = (1, 8, 8)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return small_cnn().eval()


@pytest.fixture(scope="module")
def digits_cnn():
    digits = load_digits()
    train, _ = loaders(digits, batch_size=64, seed=0)
    torch.manual_seed(0)
    model = small_cnn()
    train_classifier(model, train, epochs=15, lr=0.05, progress=False, seed=0)
    return model.eval(), digits.test.tensors


def test_symmetry_aware_certified_error_is_rescaling_invariant(cnn):
    before = copy.deepcopy(cnn.state_dict())
    rescaled = random_rescale(cnn, seed=1, input_shape=SHAPE)
    plain = [certified_error(m, quantize(m, SHAPE, bits=6), SHAPE) for m in (cnn, rescaled)]
    aware = [symmetry_aware_quantize(m, SHAPE, 6, qs=(math.inf,)) for m in (cnn, rescaled)]
    # plain quantisation is fooled by the rescaling: it erases nearly every path
    assert plain[1].relative > 0.95 and plain[1].value > 2 * plain[0].value
    assert aware[1].certified.value == pytest.approx(aware[0].certified.value, rel=1e-6)
    assert aware[1].certified.value < plain[1].value / 1.5
    assert all(torch.equal(v, cnn.state_dict()[k]) for k, v in before.items())


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 6, 8])
def test_symmetry_aware_beats_plain_on_a_rescaled_digits_cnn(digits_cnn, bits):
    model, (x, y) = digits_cnn
    rescaled = random_rescale(model, seed=0, input_shape=SHAPE)
    plain, aware = compare(rescaled, SHAPE, bits, x, y)
    # plain quantisation erases nearly every path of the rescaled network ...
    assert plain.relative > 0.95 and plain.accuracy < 0.5
    # ... the symmetry-aware one keeps the function; both bounds hold on the test set
    assert aware.certified < plain.certified / {4: 1.1, 6: 2.0, 8: 5.0}[bits]
    assert aware.accuracy > 0.8
    for report in (plain, aware):
        assert report.measured <= report.bound
        assert report.relative <= 1.0  # d <= ||Phi||_1 (Lemma 3.4.1): caps any gain
