"""The quantisation-aware recipe (pathlift.train.quantized, recipe "quantized"): the
quantiser is the code's, the trained network lies on the grid, and its compression
certificate is the Occam bound of its own training margins (Q = theta, d = 0)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlift.bounds.code import BIT_LENGTHS, ENUMERATIVE, architecture_of, decode, encode
from pathlift.bounds.compression import CompressionSearch, compression_bound, input_scale
from pathlift.bounds.kl import occam_bound
from pathlift.data.images import load_digit_images
from pathlift.errors import InvalidParameterError
from pathlift.train.quantized import quantize_towards_zero, quantized_forward
from pathlift.train.recipes import compact_model, train_recipe
from test_bounds_code import _bisect


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.floats(-30, 30))
def test_quantiser_truncates_towards_zero_on_the_grid(seed, offset, log2_scale):
    w = torch.randn(50, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64) * 2.0 ** log2_scale
    q = quantize_towards_zero(w, offset)
    step = 2.0 ** (math.floor(math.log2(float(w.abs().max()))) - offset)
    assert torch.equal(q / step, torch.round(q / step))  # on the grid
    assert bool((q.abs() <= w.abs()).all()) and bool((q * w >= 0).all())
    assert bool(((w - q).abs() < step).all())
    assert torch.equal(quantize_towards_zero(q, offset), q)  # grid points stay
    top = float(q.abs().max())
    assert math.floor(math.log2(top)) == math.floor(math.log2(float(w.abs().max())))
    assert torch.equal(quantize_towards_zero(torch.zeros(3), offset), torch.zeros(3))


def test_straight_through_gradient_is_the_plain_one():
    """The gradient through the quantised forward equals the plain gradient taken at the
    quantised parameters (straight-through: the quantiser's derivative counts as 1)."""
    torch.manual_seed(0)
    net = compact_model("mlp-small", (8,), 3)
    x = torch.randn(16, 8)
    quantized_forward(net, x, 2).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    with torch.no_grad():  # the plain gradient at the quantised point, by hand
        for p in net.parameters():
            p.copy_(quantize_towards_zero(p, 2))
    net(x).sum().backward()
    for g, p in zip(grads, net.parameters(), strict=True):
        assert torch.allclose(g, p.grad, atol=1e-6)


def _linear_labels() -> tuple[torch.Tensor, torch.Tensor, int]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1200, 1, 8, 8, generator=gen)
    return x, (x.reshape(len(x), -1) @ torch.randn(64, 3, generator=gen)).argmax(1), 3


def _generated_images() -> tuple[torch.Tensor, torch.Tensor, int]:
    x, y = load_digit_images(n_train=1200, n_test=1, seed=0, size=8).train.tensors
    return x, y, 10


@pytest.mark.parametrize(("kind", "data"), [("mlp-small", _linear_labels),
                                            ("cnn-small", _generated_images)])
def test_quantized_recipe_network_is_its_own_code(kind, data):
    """Every parameter lies on its grid after training; the certificate finds Q = theta
    (d = 0, Q's training error = the network's) and equals the Occam bound of the share of
    training points with margin <= tau B(x), counted here independently. Also for a 2-d
    CNN on the generated digit images (``pathlift.data.images``)."""
    x, y, classes = data()
    torch.manual_seed(0)
    net = compact_model(kind, (1, 8, 8), classes)
    train_recipe(net, x, y, "quantized", 2, 30, 64, 3e-3, 0)
    for p in net.parameters():
        assert torch.equal(quantize_towards_zero(p.detach(), 2), p.detach())
    search = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(2,),
                               refine=0, transfers=("path-metric",))
    cert = compression_bound(net, (1, 8, 8), x, y, search=search)
    assert cert.d_log10 < -12  # rounding of the exact path-metric only
    assert cert.quantized_error == cert.train_error
    with torch.no_grad():
        out = net.double()(x.double())
    true = out.gather(1, y[:, None]).squeeze(1)
    margin = true - out.scatter(1, y[:, None], -math.inf).amax(1)
    hit = margin <= cert.tau * input_scale(x) + 1e-9 * (1 + out.abs().amax(1))
    expected = occam_bound(float(hit.double().mean()), len(x), cert.length.total,
                           cert.occam.events)
    assert cert.value == expected.value
    assert cert.length.mantissas <= 3 * cert.num_nonzero  # o + 1 bits a non-zero weight
    assert cert.value < 1


@pytest.mark.parametrize("strength", [0, 2.5, -1])
def test_quantized_recipe_refuses_a_non_integer_offset(strength):
    net = compact_model("mlp-small", (4,), 2)
    with pytest.raises(InvalidParameterError, match="quantized: strength"):
        train_recipe(net, torch.randn(8, 4), torch.randint(2, (8,)), "quantized", strength,
                     1, 4, 1e-3, 0)


def test_certificate_pays_the_shorter_code_and_its_choice_bit():
    """A ternary network (a quantised network's weights replaced by 0 or +-3/8, as a
    sign-quantised training leaves them; codes 0 or +-6 on the search's grid): the
    certificate's code word is the enumerative one (shorter than the bit-length word, which
    pays a sign and two mantissa bits a weight), decodes to the certified Q, and the bound
    equals the Occam bound of that length computed here from its terms by bisection on
    kl's closed form; and it lies below the bound of the bit-length code alone (its word
    less the choice bit)."""
    x, y, classes = _linear_labels()
    torch.manual_seed(0)
    net = compact_model("mlp-small", (1, 8, 8), classes)
    train_recipe(net, x, y, "quantized", 1, 10, 64, 3e-3, 0)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.sign(p) * 0.375)
    search = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(2,),
                               refine=0, transfers=("path-metric",))
    cert = compression_bound(net, (1, 8, 8), x, y, search=search)
    assert cert.d_log10 < -12  # Q is the network itself
    family = [architecture_of(net, (1, 8, 8))]
    words = {s: encode(cert.coded, family, s) for s in (BIT_LENGTHS, ENUMERATIVE)}
    assert cert.length.scheme == ENUMERATIVE == cert.summary()["code"]
    assert cert.length == words[ENUMERATIVE].length
    assert words[ENUMERATIVE].length.total < words[BIT_LENGTHS].length.total
    assert decode(words[ENUMERATIVE].bits, family) == (cert.coded, cert.length.total)
    n, events = len(x), cert.occam.events
    budget = (cert.length.total * math.log(2) + math.log(events) + math.log(1 / 0.05)) / n
    assert cert.value == pytest.approx(_bisect(cert.occam.empirical, budget), abs=1e-12)
    old_bits = words[BIT_LENGTHS].length.total - 1  # the bit-length code without the bit
    assert cert.value < occam_bound(cert.occam.empirical, n, old_bits, events).value


def test_sparsity_lowers_the_codes_and_keeps_the_grid():
    """The retraining's relative-l1 penalty: its value is mean |w| / max|w| per tensor
    (computed here by hand); a network trained with it (same seed, same data) is still on
    its grid and has fewer non-zero codes and a shorter code word than without it."""
    from pathlift.train.recipes import _relative_l1
    net = compact_model("mlp-small", (4,), 3)
    by_hand = sum(float((p.abs() / p.abs().max()).sum()) for p in net.parameters()) / sum(
        p.numel() for p in net.parameters())
    assert float(_relative_l1(net)) == pytest.approx(by_hand, rel=1e-6)
    x, y, classes = _linear_labels()
    search = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(2,),
                               refine=0, transfers=("path-metric",))
    certs = []
    for sparsity in (0.0, 3.0):
        torch.manual_seed(0)
        net = compact_model("mlp-small", (1, 8, 8), classes)
        train_recipe(net, x, y, "quantized", 2, 20, 64, 3e-3, 0, sparsity=sparsity)
        for p in net.parameters():
            assert torch.equal(quantize_towards_zero(p.detach(), 2), p.detach())
        certs.append(compression_bound(net, (1, 8, 8), x, y, search=search))
    assert certs[1].num_nonzero < certs[0].num_nonzero
    assert certs[1].length.total < certs[0].length.total
    with pytest.raises(InvalidParameterError, match="sparsity"):
        train_recipe(net, x, y, "quantized", 2, 1, 64, 3e-3, 0, sparsity=-1.0)
