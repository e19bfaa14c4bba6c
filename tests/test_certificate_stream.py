"""The certificate's passes over the training sample streamed in batches (issue 39, "At
scale"): the sample as tensors, a Dataset, a DataLoader or a list of batches of any sizes
gives the same certificate, bit for bit; counts and duplicates against independent
computations; bad sources refused in one line."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from pathlift.bounds import compression_bound
from pathlift.bounds.compression import CompressionSearch
from pathlift.bounds.disagreement import certify, count_disagreements
from pathlift.bounds.entry import check_sample
from pathlift.bounds.sample import Batches
from pathlift.errors import InvalidParameterError

QUICK = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(3, 6),
                          refine=0, subsample=64)


class Subclassed(nn.Module):
    """Layers in __init__, functional ReLU and max-pool in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(F.max_pool1d(F.relu(self.conv(x)), 2).flatten(1))


class DictOut(nn.Module):
    """Logits and features in a dict, as detection/feature models return them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 12)
        self.cls = nn.Linear(12, 3)

    def forward(self, x):
        h = torch.relu(self.body(x.flatten(1)))
        return {"features": h, "logits": self.cls(h)}


def _logits(out):
    return out["logits"] if isinstance(out, dict) else out


def _trained(kind: str, n: int = 300, seed: int = 0):
    torch.manual_seed(seed)
    net = {"mlp": lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 16), nn.ReLU(),
                                        nn.Linear(16, 3)),
           "subclassed": Subclassed, "dict": DictOut}[kind]()
    x = torch.randn(n, 1, 6)
    y = x.reshape(n, -1)[:, :3].argmax(1)
    opt = torch.optim.Adam(net.parameters(), 0.03)
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(_logits(net(x)), y).backward()
        opt.step()
    return net.eval(), x, y, ("logits" if kind == "dict" else None)


class Rows(Dataset):
    """A map-style dataset of (x_i, y_i) pairs, read row by row."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _uneven(x, y):
    """Batches of sizes 1, 2, 3, ... (a list: re-iterable)."""
    out, start, size = [], 0, 1
    while start < len(x):
        out.append((x[start:start + size], y[start:start + size]))
        start, size = start + size, size + 1
    return out


def _bits(cert) -> dict:
    return {k: (v.hex() if isinstance(v, float) else v) for k, v in cert.summary().items()}


@pytest.mark.parametrize("kind", ["mlp", "subclassed", "dict"])
def test_streamed_certificate_equals_the_tensor_one_bit_for_bit(kind):
    net, x, y, key = _trained(kind)
    ref = compression_bound(net, (1, 6), x, y, search=QUICK, outputs=key)
    # the counts against a plain forward over all of x at once (float64, independent)
    with torch.no_grad():
        out = _logits(net.double()(x.double()))
    net.float()
    others = out.scatter(1, y[:, None], -math.inf).amax(1)
    assert ref.train_error == float((out.gather(1, y[:, None])[:, 0] <= others).sum()) / 300
    assert ref.n == 300 and ref.sample.duplicates == 0
    top = Counter(y.tolist()).most_common(1)[0][1]
    assert ref.sample.chance == 1 - top / 300
    sources = [Batches(x, y, batch_size=b) for b in (1, 7, 64, 303)]
    sources += [DataLoader(TensorDataset(x, y), batch_size=b) for b in (1, 64)]
    sources += [_uneven(x, y), Rows(x, y), Batches(Rows(x, y), batch_size=41)]
    for source in sources:
        got = compression_bound(net, (1, 6), source, search=QUICK, outputs=key)
        assert _bits(got) == _bits(ref), type(source).__name__
        assert got.value == ref.value and got.statement() == ref.statement()


def _set_count(x, y) -> int:
    rows = [(x[i].numpy().tobytes(), int(y[i])) for i in range(len(x))]
    return len(rows) - len(set(rows))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(0, 39), st.integers(1, 50), st.integers(0, 2 ** 31))
def test_duplicates_are_counted_exactly_whatever_the_batches(n, copies, batch, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, 3), generator=g).double()  # small values: many repeats
    y = torch.randint(0, 2, (n,), generator=g)
    x[torch.randint(0, n, (min(copies, n),), generator=g)] = -0.0  # -0.0 differs from 0.0
    expected = _set_count(x, y)
    assert check_sample(x, y).duplicates == expected
    assert check_sample(Batches(x, y, batch_size=batch)).duplicates == expected


def test_hash_collisions_never_merge_different_rows(monkeypatch):
    """A hash that collides for every row of a label: the exact re-check still counts."""
    import pathlift.bounds.duplicates as dup
    import pathlift.bounds.entry as entry

    def weak(x, y):
        return y.to(torch.int64)

    monkeypatch.setattr(dup, "row_hashes", weak)
    monkeypatch.setattr(entry, "row_hashes", weak)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(50, 4, generator=g), torch.randint(0, 3, (50,), generator=g)
    x[10:20], y[10:20] = x[:10], y[:10]  # 10 duplicates across batches
    for batch in (1, 6, 50):
        assert check_sample(Batches(x, y, batch_size=batch)).duplicates == 10 == \
            _set_count(x, y)


def test_the_search_subsample_is_the_same_rows_as_the_tensor_path():
    x, y = torch.randn(100, 5), torch.randint(0, 4, (100,))
    pick = torch.randperm(100, generator=torch.Generator().manual_seed(0))[:37]
    for source in (Batches(x, y, batch_size=8), _uneven(x, y), Rows(x, y)):
        xs, ys = Batches(source, batch_size=9).rows(pick) if not isinstance(source, Batches) \
            else source.rows(pick)
        assert torch.equal(xs, x[pick]) and torch.equal(ys, y[pick])


class Shrinking:
    """A source that gives fewer rows on its second pass."""

    def __init__(self, x, y):
        self.x, self.y, self.passes = x, y, 0

    def __iter__(self):
        self.passes += 1
        stop = len(self.x) - (self.passes > 1)
        return iter([(self.x[:stop], self.y[:stop])])


def test_bad_sources_are_refused_in_one_line():
    net, x, y, _ = _trained("mlp", n=120)
    bad_x = x.clone()
    bad_x[70, 0, 2] = math.nan
    late_label = y.clone()
    late_label[100] = 5
    cases = [
        (DataLoader(TensorDataset(bad_x, y), batch_size=16), r"NaN/inf in 1 of 120 samples "
                                                             r"\(first: index 70\)"),
        (Batches(x, late_label, batch_size=32), "label 5 but the network has 3 outputs"),
        (DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), "shuffle=False"),
        ((b for b in _uneven(x, y)), "one-shot iterator"),
        ([(x[:60], y[:60]), (x[60:, :, :5], y[60:])], "batch at row 60: inputs of shape"),
        ([(x[:60], y[:60]), (x[60:], y[60:].float())], "batch at row 60: y must hold integer"),
        (Shrinking(x, y), "gave 119 rows on one pass and 120 on another"),
    ]
    for source, message in cases:
        with pytest.raises(InvalidParameterError, match=message) as err:
            compression_bound(net, (1, 6), source, search=QUICK)
        assert "\n" not in str(err.value)
    with pytest.raises(InvalidParameterError, match="one label per input"):
        Batches(x, y[:-1])
    with pytest.raises(InvalidParameterError, match=r"TensorDataset of 1 tensors; a sample "
                                                    r"is \(inputs, labels\)"):
        Batches(TensorDataset(x))
    with pytest.raises(InvalidParameterError, match="tensor only"):
        compression_bound(net, (1, 6), Batches(x, y), y)


def test_disagreement_counts_and_routes_streamed_equal_the_tensor_ones():
    net, x, y, _ = _trained("mlp", n=200)
    other, _, _, _ = _trained("mlp", n=200, seed=1)
    u = torch.randn(150, 1, 6)
    u[7] = 0.0  # every logit equal to its bias: a tie only where biases tie
    with torch.no_grad():
        a, b = net.double()(u.double()), other.double()(u.double())
    net.float(), other.float()

    def unique_top(out):
        two = out.topk(2, dim=1)
        return two.indices[:, 0], two.values[:, 0] > two.values[:, 1]

    (ta, ua), (tb, ub) = unique_top(a), unique_top(b)
    expected = int((~(ua & ub & (ta == tb))).sum())  # dis = 1 unless one same unique top
    assert 0 < expected < 150
    for source in (u, Batches(u, batch_size=1, labels=False),
                   Batches(u, batch_size=16, labels=False),
                   [ub_ for ub_ in u.split(33)], DataLoader(TensorDataset(u), batch_size=40)):
        assert count_disagreements(net, other, source) == (expected, 150)
    ref = certify(net, (1, 6), x, y, unlabeled=u, surrogates={"other": other}, search=QUICK)
    got = certify(net, (1, 6), Batches(x, y, batch_size=13), unlabeled=Batches(
        u, batch_size=17, labels=False), surrogates={"other": other}, search=QUICK)
    assert got.routes() == ref.routes() and got.statement() == ref.statement()
    bad = u.clone()
    bad[100, 0, 0] = math.inf
    with pytest.raises(InvalidParameterError, match="NaN or inf"):
        count_disagreements(net, other, Batches(bad, batch_size=16, labels=False))
