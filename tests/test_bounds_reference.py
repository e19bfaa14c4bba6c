"""The certificate with a data-dependent code (pathlift.bounds.reference): the code relative
to a reference network A is prefix-free given A and decodes back to Q; the certificate
through it equals an Occam bound computed here on the held-out part S2 alone; Q = A costs
a few bits a tensor, so its certificate is nearly a test-set bound on S2; the events can
be counted on S2 only; the fine-tuning stays on A's grids."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds.code import SCHEMES, CodedNetwork, architecture_of, decode, encode
from pathlift.bounds.compression import CompressionSearch, compression_bound, input_scale
from pathlift.bounds.reference import (
    Reference,
    absolute,
    reference_of,
    relative,
    split_sample,
)
from pathlift.bounds.sample import as_batches
from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.graph.outputs import select_output
from pathlift.train.quantized import grid_step, quantize_towards_zero, snap_
from pathlift.train.recipes import (
    compact_model,
    train_recipe,
    train_with_reference,
    tune_from_reference_,
)
from random_nets import random_network
from test_bounds_code import _assert_prefix_free, _bisect, _random_coded

ONE = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(2,),
                        refine=0, transfers=("path-metric",))


def _reference(values: list[torch.Tensor]) -> Reference:
    """A reference holding ``values`` (float64), as ``reference_of`` makes one."""
    return Reference(tuple(f"t{i}" for i in range(len(values))),
                     tuple(v.to(torch.float64) for v in values), 4, torch.tensor([0, 1]), "")


@pytest.mark.parametrize("a_weight", [0.75, -0.5, 0.0])
def test_relative_code_is_prefix_free_given_the_reference_and_decodes_to_q(a_weight):
    """Every network of a one-weight, one-bias architecture with codes in [-3, 3] (0
    pruned or not), step exponents in {-2, -1} / {-1, 0} and f - e in {0, 1}, coded
    relative to a reference whose weight is ``a_weight`` (0: pruned in A) and bias 0.5,
    in both schemes: the words decode (from any continuation) to the relative network and
    back to Q, are distinct and prefix-free, Kraft sum <= 1."""
    arch = architecture_of(nn.Sequential(nn.Linear(1, 1)), (1,))
    ref = _reference([torch.tensor([[a_weight]]), torch.tensor([0.5])])
    values = [(k, False) for k in range(-3, 4)] + [(0, True)]
    words, seen = [], set()
    for (w, pw), (b, pb) in itertools.product(values, repeat=2):
        for ew, eb, fw, fb in itertools.product((-2, -1), (-1, 0), (0, 1), (0, 1)):
            q = CodedNetwork(0, (ew, eb), (ew + fw, eb + fb),
                             (torch.tensor([[w]]), torch.tensor([b])),
                             (torch.tensor([[pw]]), torch.tensor([pb])))
            d = relative(q, ref)
            key = (d.exponents, d.zero_exponents, tuple(int(c.item()) for c in d.codes),
                   tuple(bool(p.item()) for p in d.pruned))
            assert key not in seen  # the map is injective given A
            seen.add(key)
            for scheme in SCHEMES:
                bits = encode(d, [arch], scheme).bits
                back, used = decode([*bits, 0, 1], [arch])
                assert used == len(bits) and back == d and absolute(back, ref) == q
                words.append("".join(map(str, bits)))
    _assert_prefix_free(words)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_relative_map_round_trips_on_random_networks(seed):
    """Random networks of every layer kind, random codes, masks and exponents, a random
    reference (a third of its coordinates 0, scales 2^-8 .. 2^8): absolute(relative(Q)) ==
    Q, and the relative word decodes to the relative network."""
    model, shape = random_network(seed)
    family = [architecture_of(model, shape)]
    q = _random_coded(family[0], 0, seed)
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    values = []
    for c in q.codes:
        v = torch.randn(c.shape, generator=g, dtype=torch.float64) * 2.0 ** rng.randint(-8, 8)
        values.append(torch.where(torch.rand(c.shape, generator=g) < 1 / 3, 0.0, v))
    ref = _reference(values)
    d = relative(q, ref)
    assert absolute(d, ref) == q
    assert decode(encode(d, family).bits, family)[0] == d


def test_reference_codes_are_a_on_q_grid_exactly():
    ref = _reference([torch.tensor([0.75, -0.75, 1.0, -3e-9, 0.0])])
    assert ref.codes([-2])[0].tolist() == [3, -3, 4, 0, 0]
    assert ref.codes([-1])[0].tolist() == [1, -1, 2, 0, 0]  # truncation towards zero
    assert ref.codes([1])[0].tolist() == [0, 0, 0, 0, 0]
    with pytest.raises(InvalidParameterError, match="overflow"):
        ref.codes([-80])
    with pytest.raises(ArchitectureMismatchError):
        relative(CodedNetwork(0, (0,), (0,), (torch.zeros(4, dtype=torch.int64),),
                              (torch.zeros(4, dtype=torch.bool),)), ref)


def test_split_is_a_seeded_partition():
    s1, s2 = split_sample(1001, 0.5, seed=3)
    assert (len(s1), len(s2)) == (500, 501)
    assert sorted(torch.cat([s1, s2]).tolist()) == list(range(1001))
    again = split_sample(1001, 0.5, seed=3)
    assert torch.equal(again[0], s1) and torch.equal(again[1], s2)
    assert not torch.equal(split_sample(1001, 0.5, seed=4)[0], s1)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(InvalidParameterError, match="prior_fraction"):
            split_sample(10, bad)
    with pytest.raises(InvalidParameterError, match="empty"):
        split_sample(1, 0.5)


def _linear_labels(n: int = 1200, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=gen)
    return x, (x.reshape(len(x), -1) @ torch.randn(64, 3, generator=gen)).argmax(1)


def _own_margins(net: nn.Module, x: torch.Tensor, y: torch.Tensor):
    with torch.no_grad():
        out = net.double()(x.double())
    true = out.gather(1, y[:, None]).squeeze(1)
    return true - out.scatter(1, y[:, None], -math.inf).amax(1), out.abs().amax(1)


def test_certificate_through_reference_is_occam_on_the_held_out_part():
    """A network trained by ``train_with_reference``: the certificate's code word is
    the encoding of Q relative to A, decodes back to the certified Q, and the bound is
    kl^-1 (by bisection on the closed form) of the event's frequency counted here on S2
    alone, with the budget (L ln 2 + ln T + ln 1/delta) / n2."""
    x, y = _linear_labels()
    torch.manual_seed(0)
    net = compact_model("mlp-small", (1, 8, 8), 3)
    ref = train_with_reference(net, x, y, 2, 30, 64, 3e-3, 0, prior_fraction=0.5,
                               pull=1.0)
    cert = compression_bound(net, (1, 8, 8), x, y, search=ONE, reference=ref)
    s1, s2 = split_sample(len(x), 0.5, seed=0)
    assert torch.equal(ref.prior, s1)
    assert cert.n == len(s2) == 600 and cert.prior_samples == len(s1) == 600
    assert "code from the first n1 = 600 samples" in cert.statement()
    assert "bound on the other n2 = 600" in cert.statement()
    assert "n 600 (code relative to a reference from n1 = 600 others)" in repr(cert)
    family = [architecture_of(net, (1, 8, 8))]
    word = encode(relative(cert.coded, ref), family)
    assert word.length == cert.length
    back, used = decode(word.bits, family)
    assert used == len(word.bits) and absolute(back, ref) == cert.coded
    assert cert.d_log10 < -12  # Q is the network, on A's grids
    margin, sizes = _own_margins(net, x[s2], y[s2])
    hit = margin <= cert.tau * input_scale(x[s2]) + 1e-9 * (1 + sizes)
    budget = (cert.length.total * math.log(2) + math.log(cert.occam.events)
              + math.log(1 / 0.05)) / len(s2)
    assert cert.occam.empirical == float(hit.double().mean())
    assert cert.value == pytest.approx(_bisect(float(hit.double().mean()), budget), abs=1e-12)
    # the relative code is far shorter than the network's own code
    assert cert.length.total < compression_bound(net, (1, 8, 8), x, y,
                                                 search=ONE).length.total / 2


def test_reference_itself_gets_nearly_a_test_set_bound():
    """Q = A (A trained on S1 alone, certified relative to itself): every difference is
    0, the code is a few bits a tensor, and the certificate is kl^-1 of A's error on S2
    with a budget within 3 / n2 nats a tensor of the test-set bound's ln(T / delta) / n2."""
    x, y = _linear_labels()
    s1, s2 = split_sample(len(x), 0.5, seed=0)
    torch.manual_seed(0)
    net = compact_model("mlp-small", (1, 8, 8), 3)
    train_recipe(net, x[s1], y[s1], "quantized", 2, 30, 64, 3e-3, 0)
    ref = reference_of(net, (1, 8, 8), x, y, s1)
    cert = compression_bound(net, (1, 8, 8), x, y, search=ONE, reference=ref)
    tensors = len(ref.values)
    assert all(int(c.abs().sum()) == 0 for c in relative(cert.coded, ref).codes)
    assert cert.length.total <= 16 * tensors
    margin, _ = _own_margins(net, x[s2], y[s2])
    assert cert.train_error == float((margin <= 0).double().mean())
    test_set = (math.log(cert.occam.events) + math.log(1 / 0.05)) / len(s2)
    assert cert.occam.budget - test_set <= 16 * tensors * math.log(2) / len(s2)
    assert cert.value < 2 * cert.occam.empirical + 0.1


def _on_its_grid() -> nn.Module:
    """A 6-input, 3-class ``mlp-small`` whose weights lie on its grid at offset 2."""
    torch.manual_seed(1)
    net = compact_model("mlp-small", (6,), 3)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(quantize_towards_zero(p, 2))
    return net


def test_events_are_counted_on_the_held_out_part_only():
    """A fixed network, labels equal to its own predictions on S1 and shifted by one on
    S2: the certificate's empirical term is S2's error (1), never S's (1/2); passing a
    sample whose S1 rows differ from those the reference saw, the rows permuted, a part
    alone or batches is refused."""
    net = _on_its_grid()
    x = torch.randn(400, 6, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        predicted = net(x).argmax(1)
    s1, s2 = split_sample(len(x), 0.5, seed=0)
    y = predicted.clone()
    y[s2] = (y[s2] + 1) % 3
    ref = reference_of(net, (6,), x, y, s1)
    cert = compression_bound(net, (6,), x, y, search=ONE, reference=ref)
    assert cert.train_error == 1.0 and cert.occam.empirical == 1.0 and cert.n == len(s2)
    relabelled = y.clone()
    relabelled[s1[:5]] = (relabelled[s1[:5]] + 1) % 3  # S1's rows changed: refused
    with pytest.raises(InvalidParameterError, match="not those it was trained on"):
        compression_bound(net, (6,), x, relabelled, search=ONE, reference=ref)
    with pytest.raises(InvalidParameterError, match="not those it was trained on"):
        compression_bound(net, (6,), x.flip(0), y.flip(0), search=ONE, reference=ref)
    with pytest.raises(InvalidParameterError, match="split from 400 samples"):
        compression_bound(net, (6,), x[s2], y[s2], search=ONE, reference=ref)
    with pytest.raises(InvalidParameterError, match="two tensors"):
        compression_bound(net, (6,), as_batches(x, y), search=ONE, reference=ref)
    other = nn.Sequential(nn.Flatten(), nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 3))
    with pytest.raises(InvalidParameterError, match="not the certified network's"):
        compression_bound(other, (6,), x, y, search=ONE, reference=ref)
    with pytest.raises(InvalidParameterError, match="distinct indices"):
        reference_of(net, (6,), x, y, torch.tensor([0, 0]))


def test_tuning_stays_on_the_reference_grids_and_keeps_its_zeros():
    """``tune_from_reference_``: with 0 epochs the network is A exactly; after a few
    epochs every parameter lies on A's grid (A's step), A's zeros are still 0, the model's
    function changed; a strong pull keeps more codes at A's than no pull."""
    x, y = _linear_labels(600)
    torch.manual_seed(0)
    a = compact_model("mlp-small", (1, 8, 8), 3)
    train_recipe(a, x, y, "quantized", 2, 10, 64, 3e-3, 0)
    kept = {name: p.detach().clone() for name, p in a.named_parameters()}
    steps = {name: grid_step(p, 2) for name, p in kept.items()}
    same = compact_model("mlp-small", (1, 8, 8), 3)
    same.load_state_dict(a.state_dict())
    tune_from_reference_(same, x, y, 2, 0, 64, 1e-3, 0)
    assert all(torch.equal(p, kept[name]) for name, p in same.named_parameters())
    moved = {}
    for pull in (0.0, 0.3):
        net = compact_model("mlp-small", (1, 8, 8), 3)
        net.load_state_dict(a.state_dict())
        tune_from_reference_(net, x, y, 2, 3, 64, 3e-3, 1, pull=pull)
        for name, p in net.named_parameters():
            assert torch.equal(p / steps[name], torch.round(p / steps[name]))
            assert bool((p[kept[name] == 0] == 0).all())
        moved[pull] = sum(int((p != kept[name]).sum()) for name, p in net.named_parameters())
    assert 0 < moved[0.3] < moved[0.0]
    with pytest.raises(InvalidParameterError, match="pull"):
        tune_from_reference_(same, x, y, 2, 1, 64, 1e-3, 0, pull=-1.0)


class _Hidden(nn.Module):
    """A functional layer in a module of its own."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 6))
        self.b = nn.Parameter(torch.randn(12))

    def forward(self, x):
        return F.relu(F.linear(x, self.w, self.b))


class _DictNet(nn.Module):
    """A user's network: a subclassed functional layer, a head, a dict of outputs."""

    def __init__(self):
        super().__init__()
        self.body, self.head = _Hidden(), nn.Linear(12, 3)

    def forward(self, x):
        h = self.body(x)
        return {"features": h, "logits": self.head(h)}


def test_user_network_with_dict_outputs_against_a_moved_reference():
    """A subclassed functional network with dict outputs, A on its grid, Q = A with four
    codes moved one step towards 0: the certificate (``outputs="logits"``) codes Q relative to A
    (Q decoded back from the word), its bits are those of the four differences' word, and
    its empirical term is the event counted by hand on S2."""
    torch.manual_seed(3)
    a = _DictNet()
    snap_(a, 2)
    x = torch.randn(500, 6, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y = a(x)["logits"].argmax(1)
    s1, s2 = split_sample(len(x), 0.5, seed=0)
    ref = reference_of(a, (6,), x, y, s1, outputs="logits")
    q = _DictNet()
    q.load_state_dict(a.state_dict())
    with torch.no_grad():  # four codes of 2 steps or more moved one step towards 0
        flat = q.body.w.view(-1)
        step = grid_step(flat, 2)
        moved = (flat.abs() >= 2 * step).nonzero().squeeze(1)[:4]
        flat[moved] -= torch.sign(flat[moved]) * step
    cert = compression_bound(q, (6,), x, y, search=ONE, reference=ref, outputs="logits")
    assert cert.d_log10 < -12 and cert.prior_samples == len(s1) and cert.n == len(s2)
    diff = relative(cert.coded, ref)
    assert sum(int((c != 0).sum()) for c in diff.codes) == 4
    family = [architecture_of(select_output(q.double(), "logits", (6,)), (6,))]
    word = encode(diff, family)
    assert word.length == cert.length
    assert absolute(decode(word.bits, family)[0], ref) == cert.coded
    with torch.no_grad():
        out = q.double()(x[s2].double())["logits"]
    true = out.gather(1, y[s2][:, None]).squeeze(1)
    margin = true - out.scatter(1, y[s2][:, None], -math.inf).amax(1)
    hit = margin <= cert.tau * input_scale(x[s2]) + 1e-9 * (1 + out.abs().amax(1))
    assert cert.occam.empirical == float(hit.double().mean())
    assert cert.length.total < 100


def test_a_sample_passed_twice_reports_the_rows_the_reference_saw():
    """A sample passed twice puts most rows in both parts: the statement reports every
    row of S2 equal to a row of S1 or to an earlier row of S2, counted here by hand (the
    S2 rows A saw are no fresh draws); a sample without repeats reports none."""
    net = _on_its_grid()
    once = torch.randn(200, 6, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(3, (200,), generator=torch.Generator().manual_seed(3))
    for x, y, twice in ((once, labels, False),
                        (torch.cat([once, once]), torch.cat([labels, labels]), True)):
        s1, s2 = split_sample(len(x), 0.5, seed=0)
        cert = compression_bound(net, (6,), x, y, search=ONE,
                                 reference=reference_of(net, (6,), x, y, s1))
        seen = {(x[i].numpy().tobytes(), int(y[i])) for i in s1.tolist()}
        expected = 0
        for i in s2.tolist():
            row = (x[i].numpy().tobytes(), int(y[i]))
            expected += row in seen
            seen.add(row)
        assert cert.sample.duplicates == expected and (expected > 50) == twice
        assert ("duplicate(s) of earlier points" in cert.statement()) == twice
