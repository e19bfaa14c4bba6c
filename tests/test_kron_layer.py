"""KSLinear: forward and gradients against the dense weight K_1 ⋯ K_L, conversion from a
dense matrix / nn.Linear, the cached operands, and the "auto" algorithm choice."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron import (
    ALGORITHMS,
    KSLinear,
    cache,
    chain_to_dense,
    fastest_algorithm,
    monarch,
    random_factor,
    square_dyadic_butterfly,
)
from pathlift.kron import layer as layer_module
from pathlift.kron.pattern import KSPattern
from pathlift.kron.timing import round_robin


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, "auto"])
def test_forward_and_gradients_match_the_dense_weight(algorithm):
    torch.manual_seed(0)
    layer = KSLinear(monarch(24, 16, 4), algorithm=algorithm)
    x = torch.randn(3, 5, 16)
    y = layer(x)
    assert y.shape == (3, 5, 24)
    expected = x.double() @ layer.to_dense().double().T + layer.bias.double()
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)
    # gradients of a scalar loss w.r.t. each factor, against autograd through the dense product
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    leaves = [f.detach().double().requires_grad_() for f in layer.factors]
    dense_w = chain_to_dense(leaves, layer.patterns)
    ((x.double() @ dense_w.T) * gy.double()).sum().backward()
    for param, leaf in zip(layer.factors, leaves, strict=True):
        torch.testing.assert_close(param.grad.double(), leaf.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.bias.grad, gy.sum((0, 1)))


def test_from_linear_is_exact_on_a_monarch_product_and_leaves_the_linear_untouched():
    chain = monarch(32, 16, 4)
    g = torch.Generator().manual_seed(1)
    linear = nn.Linear(16, 32)
    with torch.no_grad():
        linear.weight.copy_(chain_to_dense([random_factor(p, generator=g) for p in chain], chain))
    before = {k: v.clone() for k, v in linear.state_dict().items()}
    layer = KSLinear.from_linear(linear, chain, algorithm="bmm")
    for k, v in linear.state_dict().items():
        assert torch.equal(v, before[k])
    x = torch.randn(7, 16, generator=g)
    torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)
    assert sum(f.numel() for f in layer.factors) < linear.weight.numel()


def test_butterfly_layer_from_dense():
    chain = square_dyadic_butterfly(16)
    g = torch.Generator().manual_seed(2)
    weight = chain_to_dense([random_factor(p, torch.float64, generator=g) for p in chain], chain)
    layer = KSLinear.from_dense(weight, chain, bias=None, algorithm="fused")
    torch.testing.assert_close(layer.to_dense(), weight)
    assert layer.bias is None


@pytest.mark.parametrize("chain", [monarch(256, 256, 16), square_dyadic_butterfly(256)],
                         ids=["monarch", "butterfly8"])
def test_a_fresh_chain_starts_at_the_output_scale_of_a_fresh_linear(chain):
    """The product of a fresh KSLinear's factors maps N(0, 1) inputs to outputs of variance
    1/3, as nn.Linear's default init does, however many factors (App. D.2.1's bound alone
    gives 3^-L: 1.5e-4 for the 8-factor butterfly)."""
    torch.manual_seed(0)
    x = torch.randn(4096, 256, dtype=torch.float64)
    variances = []
    for _ in range(8):
        layer = KSLinear(chain, bias=False, dtype=torch.float64, algorithm="bmm")
        with torch.no_grad():
            variances.append(float(layer(x).var()))
    with torch.no_grad():
        dense = float(nn.Linear(256, 256, bias=False, dtype=torch.float64)(x).var())
    assert sum(variances) / len(variances) == pytest.approx(1 / 3, rel=0.15)
    assert dense == pytest.approx(1 / 3, rel=0.15)


def test_random_factor_refuses_a_depth_below_one():
    with pytest.raises(InvalidParameterError, match="depth"):
        random_factor(KSPattern(1, 2, 2, 1), depth=0)


def test_cached_operands_follow_in_place_updates():
    layer = KSLinear(monarch(8, 8, 2), bias=False, algorithm="dense")
    x = torch.randn(4, 8)
    with torch.no_grad():
        first = layer(x)
        layer.factors[0].mul_(2.0)  # bumps the version counter: the cached dense K is stale
        second = layer(x)
    torch.testing.assert_close(second, 2 * first)


def test_auto_picks_a_measured_algorithm_and_caches_it():
    p = KSPattern(1, 16, 16, 4)
    choice = fastest_algorithm(p, 32, torch.float32)
    assert choice in ALGORITHMS
    assert fastest_algorithm(p, 32, torch.float32) == choice
    assert KSLinear([p], algorithm="auto", batch=32).algorithms() == (choice,)


def test_fastest_algorithm_is_measured_once_per_machine(monkeypatch):
    """The choice is stored on disk under the machine's fingerprint: a new process (the
    in-memory table cleared) reads it back without timing; another kernel build or thread
    count is another machine and is measured anew."""
    p = KSPattern(2, 8, 8, 2)
    first = fastest_algorithm(p, 16, torch.float32)
    assert cache.lookup("fastest", f"{p}|16|{torch.float32}|cpu") == first
    layer_module._FASTEST.clear()

    def no_timing(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(layer_module, "_measure_fastest", no_timing)
    assert fastest_algorithm(p, 16, torch.float32) == first
    fingerprint = cache.fingerprint()
    monkeypatch.setenv("PATHLIFT_KRON_CFLAGS", "-O2")
    assert cache.fingerprint() != fingerprint
    with pytest.raises(AssertionError, match="measured again"):
        fastest_algorithm(p, 16, torch.float32)
    monkeypatch.delenv("PATHLIFT_KRON_CFLAGS")
    torch.set_num_threads(2)
    try:
        assert cache.fingerprint() != fingerprint
    finally:
        torch.set_num_threads(1)


def test_bad_inputs_raise():
    with pytest.raises(InvalidParameterError, match="do not chain"):
        KSLinear([(1, 4, 4, 1), (1, 3, 4, 1)])
    with pytest.raises(InvalidParameterError, match="unknown algorithm"):
        KSLinear(monarch(8, 8, 2), algorithm="fast")
    with pytest.raises(ShapeError, match=r"\(\.\.\., 8\)"):
        KSLinear(monarch(8, 8, 2))(torch.randn(2, 9))


def test_round_robin_changes_the_order_every_round():
    """What ran just before a call changes its time on CPU (cache write-backs of a large
    output), so no function may always follow the same one: each round runs a new order,
    the same in every process."""
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    times = round_robin(fns, 12, min_sample=0)
    assert all(len(t) == 12 for t in times.values())
    assert calls[:8] == list("aabbccdd")  # warm-up and one timed call each
    rounds = [tuple(calls[i:i + 4]) for i in range(8, len(calls), 4)]
    assert len(rounds) == 12 and all(sorted(r) == list("abcd") for r in rounds)
    predecessors = {(r[i - 1], r[i]) for r in rounds for i in range(1, 4)}
    assert len(predecessors) > 4, "every function followed the same one in every round"
    calls.clear()
    round_robin(fns, 12, min_sample=0)
    assert [tuple(calls[i:i + 4]) for i in range(8, len(calls), 4)] == rounds


def test_round_robin_times_short_calls_in_samples_of_several():
    """A sample of a short function is several back-to-back calls lasting at least
    min_sample; the times returned are per call."""
    count = [0]

    def spin(seconds: float = 2e-4) -> None:
        count[0] += 1
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    times = round_robin({"spin": spin}, 3, min_sample=5e-3)["spin"]
    # about 25 calls per sample on a quiet machine; a spin preempted past its end lasts a
    # time slice longer, so a loaded one (CI) is only asked for several
    assert count[0] >= 2 + 3 * 3
    assert all(t >= 2e-4 for t in times)  # per call (a spin never ends early)


def test_a_used_fused_layer_can_be_copied_and_pickled():
    """The operands a layer keeps hold the loaded kernel (a ctypes library): a deep copy
    shares it, a pickle carries its build and loads it again."""
    import copy
    import pickle

    layer = KSLinear(monarch(16, 16, 4), algorithm="fused")
    x = torch.randn(3, 16)
    with torch.no_grad():
        y = layer(x)
        clone = copy.deepcopy(layer)
        again = pickle.loads(pickle.dumps(layer))
        assert torch.equal(clone(x), y) and torch.equal(again(x), y)
