"""The certificates are valid for every input the API takes, or refuse it in one line
(issue 39): constants written in forward are coded, non-finite data and bad labels are
refused, train-mode layers are refused, duplicates are counted."""

from __future__ import annotations

import copy
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds import compression_bound
from pathlift.bounds.code import (
    Architecture,
    CodedNetwork,
    architecture_of,
    constants_of,
    decode,
    encode,
)
from pathlift.bounds.compression import CompressionSearch
from pathlift.bounds.entry import check_sample
from pathlift.bounds.kl import occam_bound
from pathlift.bounds.top1 import certified_top1
from pathlift.errors import InvalidParameterError

QUICK = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(3, 6),
                          refine=0)


def _float_layer(h, weights: list[list[float]]):
    """sum_j h_j w_ij for each row i of Python floats, as a user writes it in forward."""
    outs = []
    for row in weights:
        total = h[:, 0:1] * row[0]
        for j in range(1, len(row)):
            total = total + h[:, j:j + 1] * row[j]
        outs.append(total)
    return torch.cat(outs, 1)


class FloatNet(nn.Module):
    """A user's network whose weights are Python floats written in forward, read out by an
    identity Linear (its only parameters)."""

    def __init__(self, first: list[list[float]], second: list[list[float]]):
        super().__init__()
        self.first, self.second = first, second
        self.out = nn.Linear(len(second), len(second))
        with torch.no_grad():
            self.out.weight.copy_(torch.eye(len(second)))
            self.out.bias.zero_()

    def forward(self, x):
        return self.out(_float_layer(torch.relu(_float_layer(x, self.first)), self.second))


def _fit_random_labels(n: int, d: int, hidden: int, classes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, hidden, bias=False), nn.ReLU(),
                        nn.Linear(hidden, classes, bias=False))
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(600):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return FloatNet(*(m.weight.detach().double().tolist() for m in (net[0], net[2]))), x, y


def test_python_float_weights_fitted_to_random_labels_are_paid_for():
    """Weights as Python floats fitted to random labels (10 classes): the network
    memorises its training set, errs ~0.9 on fresh labels, and the certificate, which
    codes every float in forward, stays >= 0.9 (free constants would give ~0.51)."""
    head, x, y = _fit_random_labels(n=150, d=12, hidden=16, classes=10, seed=0)
    with torch.no_grad():
        train_error = float((head(x).argmax(1) != y).float().mean())
        g = torch.Generator().manual_seed(1)
        xt, yt = torch.randn(4000, 12, generator=g), torch.randint(0, 10, (4000,), generator=g)
        test_error = float((head(xt).argmax(1) != yt).float().mean())
    assert train_error <= 0.35 and test_error >= 0.8  # fitted to noise
    found = constants_of(head, (12,))
    floats = [w for layer in (head.first, head.second) for row in layer for w in row]
    assert [v for v in found if isinstance(v, float)] == floats  # every weight, in order
    cert = compression_bound(head, (12,), x, y, search=QUICK)
    assert cert.length.constants >= 20 * len(floats)  # ~ 17 digits each
    assert cert.value >= 0.9
    # the same event without paying for the constants would certify well below 0.9
    free = occam_bound(cert.occam.empirical, cert.n, cert.length.total - cert.length.constants,
                       cert.occam.events, cert.delta)
    assert free.value < 0.6
    # the signature does not hold the values: two fits share one architecture
    other, *_ = _fit_random_labels(n=150, d=12, hidden=16, classes=10, seed=5)
    assert architecture_of(other, (12,)) == architecture_of(head, (12,))
    assert constants_of(other, (12,)) != found


def test_constants_cost_their_shortest_decimal():
    """0.5 in forward costs a few bits, a 17-digit float ~60: the length of the constants
    part is the sum of sign + gamma(digits + 1) + signed gamma(exponent) per number."""
    class Scaled(nn.Module):
        def __init__(self, c: float):
            super().__init__()
            self.fc, self.c = nn.Linear(3, 2), c

        def forward(self, x):
            return self.fc(x) * self.c

    x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
    short = compression_bound(Scaled(0.5), (3,), x, y, search=QUICK).length.constants
    long = compression_bound(Scaled(0.123456789012345), (3,), x, y, search=QUICK)
    # 0.5 = 5e-1: 1 + gamma(6) 5 + signed(-1) 3 = 9 bits
    assert short == 9
    # 123456789012345e-15: 1 + gamma (2 * 47 - 1) + signed(-15) (2 * 5 - 1)
    assert long.length.constants == 1 + (2 * (123456789012346).bit_length() - 1) + 9


@pytest.mark.parametrize("bad", ["nan", "inf", "float labels", "negative", "too large"])
def test_bad_samples_are_refused_from_python(bad):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    if bad == "nan":
        x[7, 2] = float("nan")
    elif bad == "inf":
        x[3, 0] = -float("inf")
    elif bad == "float labels":
        y = y.float()
    elif bad == "negative":
        y[5] = -1
    else:
        y[9] = 3
    before = copy.deepcopy(net.state_dict())
    for certify in (lambda: compression_bound(net, (4,), x, y, search=QUICK),
                    lambda: certified_top1(net, (4,), x, y)):
        with pytest.raises(InvalidParameterError) as err:
            certify()
        assert "\n" not in str(err.value)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())


def test_train_mode_layers_are_refused_and_eval_mode_is_stated():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3),
                        nn.Linear(8, 3))
    x, y = torch.randn(60, 4), torch.randint(0, 3, (60,))
    net.train()
    with pytest.raises(InvalidParameterError, match=r"layer '1' \(BatchNorm1d\) is in "
                                                    r"training mode.*model.eval\(\)"):
        compression_bound(net, (4,), x, y, search=QUICK)
    assert all(m.training for m in net.modules())  # the caller's flags are untouched
    cert = compression_bound(net.eval(), (4,), x, y, search=QUICK)
    assert cert.eval_layers == ("1", "3")
    assert "in eval mode (1, 3" in cert.statement()
    plain = compression_bound(nn.Sequential(net[0], net[2], net[4]), (4,), x, y, search=QUICK)
    assert "eval mode" not in plain.statement()


def test_exact_duplicates_are_counted_and_the_statement_asks_for_iid():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 2, 3, generator=g), torch.randint(0, 4, (30,), generator=g)
    x[4] = x[1]
    y[4] = y[1]  # one duplicate pair inside
    x[5], y[5] = x[2], (y[2] + 1) % 4  # same input, other label: not a duplicate pair
    twice_x, twice_y = torch.cat([x, x]), torch.cat([y, y])
    rows = [(tuple(a.reshape(-1).tolist()), int(b)) for a, b in zip(twice_x, twice_y,
                                                                      strict=True)]
    assert check_sample(twice_x, twice_y).duplicates == len(rows) - len(set(rows)) == 31
    net = nn.Sequential(nn.Flatten(), nn.Linear(6, 4))
    cert = compression_bound(net, (2, 3), twice_x, twice_y, search=QUICK)
    assert cert.sample.duplicates == 31 and cert.n == 60
    assert "i.i.d." in cert.statement() and "31 exact duplicate" in cert.statement()
    once = compression_bound(net, (2, 3), x, y, search=QUICK)
    assert once.sample.duplicates == 1 and "1 exact duplicate" in once.statement()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-10**15, 10**15),
                min_size=1, max_size=6))
def test_constants_round_trip_bit_for_bit(values):
    """Any finite float (subnormals, -0.0, 17 digits) or integer constant decodes to the same
    float64, sign of zero included, whatever the bits after the code word."""
    arch = architecture_of(nn.Sequential(nn.Linear(1, 1)), (1,))
    arch = Architecture(arch.signature, arch.tensors, len(values))
    coded = CodedNetwork(0, (0, 0), (0, 0), (torch.tensor([[1]]), torch.tensor([0])),
                         (torch.tensor([[False]]), torch.tensor([False])), tuple(values))
    word = encode(coded, [arch])
    back, used = decode([*word.bits, 1, 0, 1], [arch])
    assert used == len(word.bits) == word.length.total
    assert [struct.pack("<d", v) for v in back.constants] == \
        [struct.pack("<d", float(v)) for v in values]
