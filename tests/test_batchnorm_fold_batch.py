"""Every eval BatchNorm of a graph folded in one batch before a |theta|^q pass
(``fold_batchnorms``, ``BatchNormHandler.prepare``): the same folds bit for bit as one module
at a time, kept only while nothing they were computed from changed (the kept fold of one
module of the batch is a view of the batch's tensors: a write into it recomputes the
others' too), and the path-norm of a user's network after each kind of change equal to
explicit path enumeration (on ConvBlock of tests/test_batchnorm_fold.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift.graph.ops import affine, batchnorm_affine
from pathlift.lift import path_norm
from pathlift.testing.neurons import NeuronDAG
from test_batchnorm_fold import ConvBlock, _randomise_


def _batchnorm(size: int, eps: float, dtype: torch.dtype, seed: int) -> nn.BatchNorm1d:
    bn = nn.BatchNorm1d(size, eps=eps).to(dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.running_var.copy_(torch.rand(size, generator=generator, dtype=dtype) * 5 + 1e-6)
        bn.running_mean.copy_(torch.randn(size, generator=generator, dtype=dtype) * 3)
        bn.weight.copy_(torch.randn(size, generator=generator, dtype=dtype))
        bn.bias.copy_(torch.randn(size, generator=generator, dtype=dtype))
    return bn


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([1e-5, 1e-3, 0.1]),
                          st.sampled_from([torch.float32, torch.float64])),
                min_size=2, max_size=6),
       st.integers(0, 2**16))
def test_the_batched_folds_are_those_of_one_module_at_a_time_bit_for_bit(specs, seed):
    bns = [_batchnorm(size, eps, dtype, seed + i) for i, (size, eps, dtype) in enumerate(specs)]
    affine.fold_batchnorms(bns)
    for bn in bns:
        a, c = batchnorm_affine(bn, torch.float64)
        assert a._base is not None  # found in the batch, not folded again here
        want_a, want_c = affine._fold(bn, torch.float64, True)
        assert torch.equal(a, want_a) and torch.equal(c, want_c)
        narrow = batchnorm_affine(bn, torch.float32)
        assert torch.equal(narrow[0], want_a.float()) and torch.equal(narrow[1], want_c.float())


def test_modules_the_batch_cannot_take_are_folded_one_at_a_time():
    bns = [_batchnorm(3, 1e-5, torch.float64, 0), nn.BatchNorm1d(4, affine=False).eval(),
           _batchnorm(5, 1e-5, torch.float64, 1)]
    affine.fold_batchnorms(bns)
    a, c = batchnorm_affine(bns[1], torch.float64)
    assert torch.equal(a, torch.full((4,), 1e-5, dtype=torch.float64).add(1).rsqrt())
    assert torch.equal(c, torch.zeros(4, dtype=torch.float64))


def test_a_write_into_one_kept_fold_recomputes_every_fold_of_its_batch():
    bns = [_batchnorm(3, 1e-5, torch.float64, 0), _batchnorm(5, 1e-3, torch.float64, 1)]
    affine.fold_batchnorms(bns)
    batchnorm_affine(bns[0], torch.float64)[0].mul_(7.0)  # a caller's write into a view
    for bn in bns:
        a, c = batchnorm_affine(bn, torch.float64)
        want_a, want_c = affine._fold(bn, torch.float64, True)
        assert torch.equal(a, want_a) and torch.equal(c, want_c)


SHAPE = (2, 4, 4)  # ConvBlock: three BatchNorms after convolutions, one after its Linear


def _scale_var(m):
    m.bn2.running_var.mul_(3.0)


def _assign_weight(m):
    m.bn1.weight = nn.Parameter(torch.tensor([1.0, -3.0, 0.25]))


def _eps(m):
    m.bn3.eps = 0.5  # the BatchNorm1d after the Linear


def _load_checkpoint(m):
    state = m.state_dict()
    state["bn2.running_mean"] = state["bn2.running_mean"] + 2.0
    m.load_state_dict(state)


@pytest.mark.parametrize("update", [_scale_var, _assign_weight, _eps, _load_checkpoint],
                         ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_path_norm_after_a_change_is_the_enumerated_one(update, dtype):
    model = _randomise_(ConvBlock(), 0)
    path_norm(model, SHAPE, q=1.0, dtype=dtype)  # every fold now kept from one batch
    with torch.no_grad():
        update(model)
    for q in (1.0, 2.0):
        expected = NeuronDAG.from_module(model, SHAPE).path_norm_log10(q)
        tolerance = 1e-12 if dtype == torch.float64 else 1e-5
        assert path_norm(model, SHAPE, q=q, dtype=dtype).log10 == pytest.approx(
            expected, abs=tolerance)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([1e-5, 0.1]),
                          st.sampled_from([torch.float32, torch.float64]),
                          st.sampled_from([0, 20, -20, 60, -60]),
                          st.sampled_from([0, 30, -30])),
                min_size=2, max_size=6),
       st.integers(0, 2**16), st.booleans())
def test_the_batched_units_are_those_of_one_module_at_a_time(specs, seed, nan):
    """The units of each fold (``AffineHandler.units``: powers of two near max |a|, max |c|)
    kept by the batch are those ``unit_of`` finds on the module's own fold, rounded to its
    dtype: far from 1 (weights times 2^+-60), and with a NaN statistic."""
    bns = []
    for i, (size, eps, dtype, weight_exp, bias_exp) in enumerate(specs):
        bn = _batchnorm(size, eps, dtype, seed + i)
        with torch.no_grad():
            bn.weight.mul_(2.0 ** weight_exp)
            bn.bias.mul_(2.0 ** bias_exp)
            if nan and i == 1:
                bn.running_mean[size // 2] = float("nan")
        bns.append(bn)
    with torch.no_grad():  # a pass outside autograd (under it, units are read per module)
        affine.fold_batchnorms(bns)
    for bn in bns:
        kept = affine._UNITS[bn][1]
        a, c = (t.to(bn.running_var.dtype) for t in affine._fold(bn, torch.float64, True))
        assert kept == (affine.unit_of(a), affine.unit_of(c))
        assert affine.MODULES[nn.BatchNorm1d].units(bn) == kept  # found, not computed
