"""The kl inverse, the Occam bookkeeping and the prefix code of quantised networks
(pathlift.bounds.kl, bitcode, code): the kl inverse against bisection on the closed form,
exact round trips from any continuation, lengths equal to the bits written, prefix-freeness
and Kraft's inequality on exhaustive small families."""

import itertools
import math
import random
from decimal import Decimal, localcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.bounds import enumerative as en
from pathlift.bounds.bitcode import (
    AdaptiveModel,
    ArithmeticDecoder,
    ArithmeticEncoder,
    BitReader,
    BitWriter,
    gamma_length,
    read_gamma,
    read_signed,
    signed_length,
    write_gamma,
    write_signed,
)
from pathlift.bounds.code import (
    BIT_LENGTHS,
    ENUMERATIVE,
    SCHEMES,
    CodedNetwork,
    architecture_of,
    decode,
    encode,
    estimated_length,
)
from pathlift.bounds.kl import kl_bernoulli, kl_inverse, occam_bound
from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from random_nets import random_network


def _closed_form_kl(q: Decimal, p: Decimal) -> Decimal:
    """q ln(q/p) + (1-q) ln((1-q)/(1-p)), written out in 60-digit decimal arithmetic."""
    left = Decimal(0) if q == 0 else q * (q / p).ln()
    right = Decimal(0) if q == 1 else (1 - q) * ((1 - q) / (1 - p)).ln()
    return left + right


def _bisect(q: float, c: float) -> float:
    """sup {p in [q, 1): kl(q||p) <= c} by 120 halvings of [q, 1] on the closed form."""
    with localcontext() as ctx:
        ctx.prec = 60
        qd, cd = Decimal(q), Decimal(c)
        low, high = qd, Decimal(1)
        for _ in range(120):
            mid = (low + high) / 2
            if _closed_form_kl(qd, mid) > cd:
                high = mid
            else:
                low = mid
        return float(high)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(0.0, 0.999), st.sampled_from([0.0, 1e-9, 0.5, 0.99])),
       st.one_of(st.floats(1e-6, 8.0), st.sampled_from([1e-12, 0.01, 1.0, 30.0])))
def test_kl_inverse_against_bisection_on_the_closed_form(q, c):
    ours = kl_inverse(q, c)
    reference = _bisect(q, c)
    assert ours == pytest.approx(reference, abs=1e-12)
    assert q <= ours <= 1.0
    if ours < 1.0:  # approached from above: kl(q || ours) >= c up to the rounding of kl
        assert kl_bernoulli(q, ours) >= c * (1 - 1e-12)
    p = min(ours, 1 - 1e-6)  # kl itself, where it is well conditioned
    with localcontext() as ctx:
        ctx.prec = 60
        exact = float(_closed_form_kl(Decimal(q), Decimal(p)))
    assert kl_bernoulli(q, p) == pytest.approx(exact, rel=1e-12, abs=1e-300)


def test_kl_edge_cases():
    assert kl_inverse(0.3, 0.0) == 0.3 and kl_inverse(1.0, 2.0) == 1.0
    assert kl_inverse(0.0, 0.1) == pytest.approx(1 - math.exp(-0.1), abs=1e-15)
    assert kl_bernoulli(0.2, 0.0) == math.inf and kl_bernoulli(0.0, 0.0) == 0.0
    with pytest.raises(InvalidParameterError):
        kl_inverse(1.2, 0.1)
    with pytest.raises(InvalidParameterError):
        kl_inverse(0.2, -0.1)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 10**4), st.integers(1, 10**5),
       st.floats(1e-6, 0.5), st.floats(0.0, 1.0))
def test_occam_bookkeeping_spends_delta_2_to_the_minus_bits_over_t(bits, events, n, delta,
                                                                  empirical):
    """exp(-n budget) = delta 2^-L / T: summed over a prefix code (Kraft, below) and the T
    events fixed in advance, the failure probabilities add up to at most delta."""
    b = occam_bound(empirical, n, bits, events, delta)
    log_spent = -n * b.budget  # ln of the failure probability given to this (Q, event)
    assert log_spent == pytest.approx(math.log(delta) - bits * math.log(2) - math.log(events),
                                      rel=1e-12, abs=1e-9)
    assert b.value == kl_inverse(empirical, b.budget)


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**6, 10**6), st.lists(st.integers(0, 1), max_size=40))
def test_gamma_codes_round_trip_from_any_continuation(v, suffix):
    w = BitWriter()
    write_signed(w, v)
    write_gamma(w, abs(v) + 1)
    r = BitReader(w.bits + suffix)
    assert read_signed(r) == v and read_gamma(r) == abs(v) + 1
    assert r.position == len(w.bits) == signed_length(v) + gamma_length(abs(v) + 1)


def _arith(symbols: list[int], size: int) -> list[int]:
    w = BitWriter()
    coder, model = ArithmeticEncoder(w), AdaptiveModel(size)
    for s in symbols:
        coder.encode_symbol(model, s)
    coder.finish()
    return w.bits


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 7), st.integers(0, 300), st.integers(0, 2**31 - 1))
def test_arithmetic_coder_decodes_from_any_continuation(size, count, seed):
    rng = random.Random(seed)
    weights = [rng.random() ** 4 for _ in range(size)]
    symbols = rng.choices(range(size), weights, k=count)
    bits = _arith(symbols, size)
    suffix = [rng.randint(0, 1) for _ in range(rng.randint(0, 80))]
    decoder, model = ArithmeticDecoder(BitReader(bits + suffix)), AdaptiveModel(size)
    assert [decoder.decode_symbol(model) for _ in symbols] == symbols
    assert decoder.length() == len(bits)
    # the adaptive code costs its ideal length plus at most the termination and rounding
    ideal, counts = 0.0, [0] * size
    for i, s in enumerate(symbols):
        ideal -= math.log2((2 * counts[s] + 1) / (2 * i + size))
        counts[s] += 1
    assert ideal <= len(bits) <= ideal + 2 + 1e-6 * count + 1e-9


@pytest.mark.parametrize("size, count", [(1, 4), (2, 9), (3, 6), (5, 4)])
def test_arithmetic_code_is_prefix_free_and_satisfies_kraft(size, count):
    _assert_prefix_free(["".join(map(str, _arith(list(s), size)))
                         for s in itertools.product(range(size), repeat=count)])


def _random_coded(arch, index: int, seed: int) -> CodedNetwork:
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    codes, pruned, exponents, zeros = [], [], [], []
    for _, shape in arch.tensors:
        scale = rng.choice((0, 1, 3, 40, 5000))
        c = (torch.randn(shape, generator=g) * scale).to(torch.int64)
        c[torch.rand(shape, generator=g) < rng.random()] = 0
        p = (c == 0) & (torch.rand(shape, generator=g) < 0.5)
        codes.append(c)
        pruned.append(p)
        e = rng.randint(-30, 5)
        exponents.append(e)
        zeros.append(e + rng.choice((0, 0, 1, 7)))
    constants = tuple(rng.choice((0, 3, -0.25, 1e-05, rng.uniform(-1e3, 1e3),
                                  rng.random() * 1e-300, -5e307))
                      for _ in range(arch.constants))
    return CodedNetwork(index, tuple(exponents), tuple(zeros), tuple(codes), tuple(pruned),
                        constants)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_network_code_round_trips_exactly_on_random_networks_of_every_layer(seed):
    """Random networks (Linear, Conv, ConvTranspose, eval BatchNorm, PReLU, ...), random
    integer codes, pruned masks and exponents: decode(encode(Q)) == Q read from the code
    word followed by any bits, and the length by part adds up to the bits written."""
    model, shape = random_network(seed)
    other = nn.Sequential(nn.Linear(3, 2))  # a second architecture of the family
    family = [architecture_of(other, (3,)), architecture_of(model, shape)]
    coded = _random_coded(family[1], 1, seed)
    rng = random.Random(seed)
    words = {}
    for scheme in (*SCHEMES, None):
        word = words[scheme] = encode(coded, family, scheme)
        assert len(word.bits) == word.length.total
        assert word.length.architecture == 1 and word.length.choice == 1
        suffix = [rng.randint(0, 1) for _ in range(rng.randint(0, 70))]
        back, used = decode(list(word.bits) + suffix, family)
        assert back == coded and used == len(word.bits)
    nonzero = sum(int((c != 0).sum()) for c in coded.codes)
    assert words[BIT_LENGTHS].length.signs == nonzero
    mantissas = sum(max(abs(v).bit_length() - 1, 0) for c in coded.codes
                    for v in c.reshape(-1).tolist() if v)
    assert words[BIT_LENGTHS].length.mantissas == mantissas
    # the default word is the shorter: never above the bit-length word, whose bits but the
    # choice bit are the code word of the single-scheme code
    assert words[None].length.total == min(words[s].length.total for s in SCHEMES)
    assert words[None].bits[0] == SCHEMES.index(words[None].length.scheme)


def _ceil_log2(v) -> int:
    """ceil(log2 v) of a positive rational, by exact comparison with powers of two."""
    k = 0
    while 2 ** k < v:
        k += 1
    return k


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_enumerative_length_is_the_written_length_and_the_multinomial(seed):
    """The enumerative scheme's estimated length is the bits written, part by part; its
    arrangement part is ceil(log2 n!/prod c!) per tensor, computed here from factorials,
    and never above n times the empirical entropy of the tensor's symbols (rounded up)."""
    model, shape = random_network(seed)
    family = [architecture_of(model, shape)]
    coded = _random_coded(family[0], 0, seed)
    word = encode(coded, family, ENUMERATIVE)
    assert estimated_length(coded, family, ENUMERATIVE) == word.length
    arrangement = 0
    for c, p in zip(coded.codes, coded.pruned, strict=True):
        keys = [("pruned",) if q else (v,) for v, q in zip(c.reshape(-1).tolist(),
                                                            p.reshape(-1).tolist(),
                                                            strict=True)]
        counts = [keys.count(k) for k in set(keys)]
        n = len(keys)
        ways = math.factorial(n)
        for k in counts:
            ways //= math.factorial(k)
        arrangement += _ceil_log2(ways)
        entropy = -sum(k * math.log2(k / n) for k in counts)
        assert _ceil_log2(ways) <= math.ceil(entropy + 1e-9)
    assert word.length.arrangement == arrangement


@pytest.mark.parametrize("n", range(1, 9))
def test_composition_code_is_a_bijection_onto_its_width(n):
    """Every composition of n into k positive parts (all of them, enumerated) has its own
    index, read back from any continuation, in exactly ceil(log2 C(n - 1, k - 1)) bits."""
    for k in range(1, n + 1):
        seen = set()
        for cuts in itertools.combinations(range(1, n), k - 1):
            ends = [*cuts, n]
            counts = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            w = BitWriter()
            en.write_composition(w, counts)
            assert len(w) == en.composition_width(n, k) == _ceil_log2(math.comb(n - 1, k - 1))
            assert en.read_composition(BitReader([*w.bits, 1, 1, 0]), n, k) == counts
            seen.add(tuple(w.bits))
        assert len(seen) == math.comb(n - 1, k - 1)


@pytest.mark.parametrize("counts", [(1,), (3,), (1, 1), (2, 1), (1, 2, 1), (3, 2, 2),
                                    (1, 1, 1, 1), (4, 1, 2)])
def test_arrangement_code_is_a_bijection_onto_its_width(counts):
    """Every sequence with the given counts (all of them, enumerated) gets its own index,
    decoded from any continuation, in ceil(log2 n!/prod c!) bits; the lexicographic order
    of sequences is the order of indices."""
    pool = [s for s, c in enumerate(counts) for _ in range(c)]
    sequences = sorted(set(itertools.permutations(pool)))
    width = en.arrangement_width(counts)
    assert width == _ceil_log2(len(sequences))
    for rank, seq in enumerate(sequences):
        w = BitWriter()
        en.write_arrangement(w, seq, counts)
        assert len(w) == width and BitReader(w.bits).read_uint(width) == rank
        assert en.read_arrangement(BitReader([*w.bits, 1, 0, 1]), counts) == list(seq)


def test_network_code_is_prefix_free_over_an_exhaustive_family():
    """Every network of a two-parameter architecture with codes in [-3, 3] (0 pruned or
    not) and exponents e in [-1, 1], f - e in {0, 1}, in both schemes (the code the
    default choice draws from): distinct words, none a prefix of another, Kraft sum below
    1; decoded back to the network."""
    arch = architecture_of(nn.Sequential(nn.Linear(1, 1)), (1,))
    words = []
    values = [(k, False) for k in range(-3, 4)] + [(0, True)]
    for (w, pw), (b, pb) in itertools.product(values, repeat=2):
        for ew, eb, fw, fb in itertools.product((-1, 0, 1), (-1, 0, 1), (0, 1), (0, 1)):
            coded = CodedNetwork(0, (ew, eb), (ew + fw, eb + fb),
                                 (torch.tensor([[w]]), torch.tensor([b])),
                                 (torch.tensor([[pw]]), torch.tensor([pb])))
            for scheme in SCHEMES:
                bits = encode(coded, [arch], scheme).bits
                assert decode(bits, [arch]) == (coded, len(bits))
                words.append("".join(map(str, bits)))
    _assert_prefix_free(words)


def test_enumerative_code_is_prefix_free_over_every_tensor_of_a_small_alphabet():
    """All 6^4 networks of one 2x2 weight tensor (and a bias of 2) over {pruned, -2, ..,
    2}, bias fixed, exponents fixed: the enumerative words are distinct and prefix-free
    (Kraft sum <= 1), exhaustively."""
    arch = architecture_of(nn.Sequential(nn.Linear(2, 2)), (2,))
    values = [(0, True)] + [(k, False) for k in range(-2, 3)]
    words = []
    for cells in itertools.product(values, repeat=4):
        codes = torch.tensor([[v for v, _ in cells[:2]], [v for v, _ in cells[2:]]])
        pruned = torch.tensor([[p for _, p in cells[:2]], [p for _, p in cells[2:]]])
        coded = CodedNetwork(0, (-3, 0), (-2, 0), (codes, torch.tensor([1, -1])),
                             (pruned, torch.tensor([False, False])))
        bits = encode(coded, [arch], ENUMERATIVE).bits
        assert decode([*bits, 1], [arch]) == (coded, len(bits))
        words.append("".join(map(str, bits)))
    _assert_prefix_free(words)


def _assert_prefix_free(words: list[str]) -> None:
    assert len(set(words)) == len(words)
    ordered = sorted(words)
    assert not any(b.startswith(a) for a, b in itertools.pairwise(ordered))
    assert sum(2.0 ** -len(w) for w in words) <= 1.0


def test_coded_network_checks_and_box():
    arch = architecture_of(nn.Sequential(nn.Linear(2, 1)), (2,))
    good = CodedNetwork(0, (-2, 0), (-1, 0), (torch.tensor([[3, 0]]), torch.tensor([-1])),
                        (torch.tensor([[False, False]]), torch.tensor([False])))
    (wl, wh), (bl, bh) = good.box()
    assert wl.tolist() == [[0.75, -0.5]] and wh.tolist() == [[1.0, 0.5]]
    assert (bl.item(), bh.item()) == (-2.0, -1.0)
    assert [v.tolist() for v in good.values()] == [[[0.75, 0.0]], [-1.0]]
    with pytest.raises(InvalidParameterError, match="pruned"):
        CodedNetwork(0, (0, 0), (0, 0), (torch.tensor([[1, 0]]), torch.tensor([0])),
                     (torch.tensor([[True, False]]), torch.tensor([False])))
    with pytest.raises(InvalidParameterError, match="below the step"):
        CodedNetwork(0, (0, 0), (-1, 0), good.codes, good.pruned)
    with pytest.raises(ArchitectureMismatchError):
        encode(good, [architecture_of(nn.Sequential(nn.Linear(3, 1)), (3,))])
    assert "symbols" in repr(encode(good, [arch], BIT_LENGTHS))
    assert "arrangement" in repr(encode(good, [arch], ENUMERATIVE))
    with pytest.raises(InvalidParameterError, match="scheme"):
        encode(good, [arch], "huffman")
