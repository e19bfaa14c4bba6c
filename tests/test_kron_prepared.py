"""The prepared factor kept between calls: ``ks_multiply``'s cache (keyed by the storage,
the view and the version counter) and ``KSLinear``'s, never stale after an in-place
update (an optimizer step), a ``torch.nn.utils.prune`` mask, a ``.to(dtype)``, a new
tensor at a freed address; each result against the dense product in float64."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.kron import (
    ALGORITHMS,
    KSLinear,
    KSPattern,
    chain_to_dense,
    ks_multiply,
    monarch,
    random_factor,
    to_dense,
)
from pathlift.kron import multiply as multiply_module

P = KSPattern(2, 12, 8, 3)


def dense(x: torch.Tensor, w: torch.Tensor, p: KSPattern = P) -> torch.Tensor:
    return x.double() @ to_dense(w.detach().double(), p).T


def close(y: torch.Tensor, ref: torch.Tensor, tol: float = 1e-12) -> bool:
    return ((y.double() - ref).abs().max() <= tol * ref.abs().max()).item()


@pytest.fixture
def prepares(monkeypatch):
    """The calls of multiply.prepare, by algorithm."""
    calls: list[str] = []
    prepare = multiply_module.prepare

    def counted(w, pattern, algorithm):
        calls.append(algorithm)
        return prepare(w, pattern, algorithm)

    monkeypatch.setattr(multiply_module, "prepare", counted)
    multiply_module._PREPARED.clear()
    return calls


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_factor_is_prepared_once_and_again_after_an_in_place_update(algorithm, prepares):
    w = random_factor(P, torch.float64)
    x = torch.randn(5, P.in_features, dtype=torch.float64)
    first = ks_multiply(x, w, P, algorithm)
    assert close(ks_multiply(x, w, P, algorithm), dense(x, w)) and prepares == [algorithm]
    w.mul_(-0.5)  # in place: the version counter moves
    assert close(ks_multiply(x, w, P, algorithm), -0.5 * dense(x, w.mul(-2)))
    assert prepares == [algorithm] * 2 and not torch.equal(first, ks_multiply(x, w, P,
                                                                                algorithm))


def test_an_optimizer_step_is_seen_by_the_next_call():
    w = nn.Parameter(random_factor(P, torch.float64))
    x = torch.randn(6, P.in_features, dtype=torch.float64)
    opt = torch.optim.SGD([w], lr=0.3)
    for _ in range(3):
        with torch.no_grad():  # an evaluation between steps: the cached path
            assert close(ks_multiply(x, w, P, "fused"), dense(x, w))
        opt.zero_grad()
        ks_multiply(x, w, P, "fused").pow(2).sum().backward()  # recorded: prepared anew
        opt.step()
    with torch.no_grad():
        assert close(ks_multiply(x, w, P, "fused"), dense(x, w))


def test_a_prune_mask_and_a_new_mask_are_seen():
    holder = nn.Module()
    holder.weight = nn.Parameter(random_factor(P, torch.float64))
    x = torch.randn(4, P.in_features, dtype=torch.float64)
    with torch.no_grad():
        before = ks_multiply(x, holder.weight, P, "fused")
        prune.random_unstructured(holder, "weight", amount=0.5)
        masked = holder.weight  # orig * mask, recomputed by the pruning hook
        assert close(ks_multiply(x, masked, P, "fused"), dense(x, masked))
        assert not torch.equal(before, ks_multiply(x, masked, P, "fused"))
        prune.random_unstructured(holder, "weight", amount=0.5)  # more entries masked
        assert close(ks_multiply(x, holder.weight, P, "fused"), dense(x, holder.weight))
        holder.weight_mask[0].zero_()  # the mask changed in place, weight not recomputed
        assert close(ks_multiply(x, holder.weight_orig * holder.weight_mask, P, "fused"),
                     dense(x, holder.weight_orig * holder.weight_mask))


def test_to_dtype_and_views_are_prepared_for_themselves():
    w = random_factor(P, torch.float64)
    x = torch.randn(3, P.in_features, dtype=torch.float64)
    assert close(ks_multiply(x, w, P, "fused"), dense(x, w))
    w32 = w.to(torch.float32)
    y = ks_multiply(x.float(), w32, P, "fused")
    assert y.dtype == torch.float32 and close(y, dense(x, w32), 1e-6)
    # the transposed view shares the storage: its own entry (pattern (a, c, b, d))
    wt = w.transpose(1, 2)
    gy = torch.randn(3, P.out_features, dtype=torch.float64)
    assert close(ks_multiply(gy, wt, P.transpose(), "fused"), dense(gy, wt, P.transpose()))


def test_a_new_tensor_at_a_freed_address_is_not_served_the_old_factor():
    x = torch.randn(4, P.in_features, dtype=torch.float64)
    w = random_factor(P, torch.float64)
    ks_multiply(x, w, P, "fused")
    address = w.data_ptr()
    del w
    gc.collect()
    for _ in range(20):  # the allocator usually hands the same block back
        w = random_factor(P, torch.float64)
        assert close(ks_multiply(x, w, P, "fused"), dense(x, w))
        if w.data_ptr() == address:
            break
        del w


def test_entries_die_with_their_storage_and_the_cache_is_bounded():
    multiply_module._PREPARED.clear()
    x = torch.randn(2, P.in_features)
    w = random_factor(P)
    ks_multiply(x, w, P, "bmm")
    assert len(multiply_module._PREPARED) == 1
    del w
    gc.collect()
    assert len(multiply_module._PREPARED) == 0
    kept = [random_factor(P) for _ in range(multiply_module._PREPARED_MAX + 5)]
    for w in kept:
        ks_multiply(x, w, P, "bmm")
    assert len(multiply_module._PREPARED) == multiply_module._PREPARED_MAX


def test_where_autograd_records_w_every_call_prepares(prepares):
    w = random_factor(P).requires_grad_()
    x = torch.randn(2, P.in_features)
    ks_multiply(x, w, P, "fused").sum().backward()
    ks_multiply(x, w, P, "fused").sum().backward()
    assert prepares == ["fused", "fused"]
    with torch.no_grad():
        ks_multiply(x, w, P, "fused")
        ks_multiply(x, w, P, "fused")
    assert prepares == ["fused"] * 3


@pytest.mark.parametrize("algorithm", ["fused", "bmm"])
def test_kslinear_training_with_evaluations_between_steps_matches_the_dense_layer(algorithm):
    """SGD on a KSLinear and on the dense linear layer it equals (float64), an evaluation
    under no_grad after each step (the cached operands), then the same after .to(float32)
    and under a pruning mask."""
    torch.manual_seed(0)
    layer = KSLinear(monarch(16, 16, 4), algorithm=algorithm, dtype=torch.float64)
    factors = [f.detach().clone().requires_grad_() for f in layer.factors]
    bias = layer.bias.detach().clone().requires_grad_()
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD([*factors, bias], lr=0.05)
    x = torch.randn(9, 16, dtype=torch.float64)
    target = torch.randn(9, 16, dtype=torch.float64)

    def reference(inputs: torch.Tensor) -> torch.Tensor:
        return inputs @ chain_to_dense(factors, layer.patterns).T + bias

    for _ in range(4):
        for o in (opt, ref_opt):
            o.zero_grad()
        (layer(x) - target).pow(2).sum().backward()
        (reference(x) - target).pow(2).sum().backward()
        opt.step()
        ref_opt.step()
        with torch.no_grad():
            assert close(layer(x), reference(x), 1e-10)
    with torch.no_grad():
        layer.float()  # new storages: prepared again
        assert close(layer(x.float()), reference(x), 1e-5)
        prune.random_unstructured(layer.factors, "0", amount=0.5)  # factor 0 = orig * mask
        masked = layer.factor(0).double()
        expected = x @ chain_to_dense([masked, factors[1].detach()], layer.patterns).T + bias
        assert close(layer(x.float()), expected, 1e-5)
