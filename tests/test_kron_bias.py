"""The bias the fused kernel adds as it stores Y (``apply(..., bias=)``, KSLinear's last
factor): Y + bias and the gradients of x, w and the bias against bmm's product with the bias
added by torch and against the float64 dense product, at every vector width this CPU runs,
on every batch-size-first path (GEMM, flat, phased, along d), both layouts, with and
without autograd, for one factor and a chain."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kron_fixtures import WIDTHS, isolated_kron_cache  # noqa: F401
from pathlift.errors import ShapeError
from pathlift.kron import (
    KSLinear,
    KSPattern,
    apply,
    cpu_kernel,
    prepare,
    random_factor,
    to_dense,
    vector_width,
)
from test_kron_backward import CASES, rel_err


def biased_gradients(x, w, bias, gy, p, layout, algorithm):
    """(Y, dX, dw, dbias) of sum(gy * (X K^T + bias)) through ``apply``, batch-size-first."""
    x, w, bias = (t.detach().clone().requires_grad_() for t in (x, w, bias))
    y = apply(x if layout == "bsf" else x.T, prepare(w, p, algorithm), p, algorithm, layout,
              bias=bias)
    y = y if layout == "bsf" else y.T
    (y * gy).sum().backward()
    return y.detach(), x.grad, w.grad, bias.grad


def dense_reference(x, w, bias, gy, p):
    """The same four by autograd through the dense matrix, in float64."""
    x, w, bias = (t.detach().double().requires_grad_() for t in (x, w, bias))
    y = x @ to_dense(w, p).T + bias
    (y * gy.double()).sum().backward()
    return y.detach(), x.grad, w.grad, bias.grad


@pytest.mark.parametrize("bits", WIDTHS, ids=lambda b: f"{b}bit")
@pytest.mark.parametrize("layout", ["bsf", "bsl"])
@pytest.mark.parametrize("pattern,batch", CASES, ids=str)
def test_the_bias_added_by_the_kernel_matches_the_dense_product_in_float64(
        pattern, batch, layout, bits):
    """With autograd (the kernel's forward and backward) and without (the prepared,
    packed factor): Y + bias and every gradient to 1e-12."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(sum(pattern) + batch)
    w = random_factor(p, torch.float64, generator=g)
    x = torch.randn(batch, p.in_features, dtype=torch.float64, generator=g)
    bias = torch.randn(p.out_features, dtype=torch.float64, generator=g)
    gy = torch.randn(batch, p.out_features, dtype=torch.float64, generator=g)
    ref = dense_reference(x, w, bias, gy, p)
    with vector_width(bits):
        got = biased_gradients(x, w, bias, gy, p, layout, "fused")
        with torch.no_grad():
            xin = x if layout == "bsf" else x.T.contiguous()
            y = apply(xin, prepare(w, p, "fused"), p, "fused", layout, bias=bias)
    assert all(rel_err(a, b) <= 1e-12 for a, b in zip(got, ref, strict=True))
    assert rel_err(y if layout == "bsf" else y.T, ref[0]) <= 1e-12


def test_the_cases_run_every_path_with_a_bias():
    """The cases above reach each batch-size-first path of each width."""
    for bits in WIDTHS:
        with vector_width(bits):
            kernel = cpu_kernel.current_kernel(torch.float64)
        paths = {cpu_kernel.bsf_path(kernel, p[3], p[2]) for p, _ in CASES}
        assert {"flat", "along_d", "gemm"} <= paths


patterns = st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 140),
                     st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12, 16, 24]))
batches = st.one_of(st.just(1), st.integers(1, 40).map(lambda n: 2 * n + 1),
                    st.integers(2, 300))


@pytest.mark.parametrize("bits", WIDTHS, ids=lambda b: f"{b}bit")
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=patterns, batch=batches, dtype=st.sampled_from([torch.float32, torch.float64]),
       layout=st.sampled_from(["bsf", "bsl"]), seed=st.integers(0, 2**16))
def test_the_fused_bias_matches_bmm_plus_the_bias(bits, pattern, batch, dtype, layout, seed):
    """Y + bias and the three gradients of the kernel of this width against bmm's product
    with torch's addition: 1e-12 in float64, 1e-5 in float32."""
    p = KSPattern(*pattern)
    g = torch.Generator().manual_seed(seed)
    w = random_factor(p, dtype, generator=g)
    x = torch.randn(batch, p.in_features, dtype=dtype, generator=g)
    bias = torch.randn(p.out_features, dtype=dtype, generator=g)
    gy = torch.randn(batch, p.out_features, dtype=dtype, generator=g)
    with vector_width(bits):
        fused = biased_gradients(x, w, bias, gy, p, layout, "fused")
    bmm = biased_gradients(x, w, bias, gy, p, layout, "bmm")
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert all(rel_err(a, b) <= 2 * tol for a, b in zip(fused, bmm, strict=True))


@pytest.mark.parametrize("bits", WIDTHS, ids=lambda b: f"{b}bit")
def test_kslinear_adds_its_bias_once_in_the_kernel(bits, monkeypatch):
    """A chain of three factors (flat, GEMM and along-d paths): the layer's output and its
    gradients equal the dense layer's, the bias passed to the kernel once (the last
    product) and never added by torch afterwards."""
    chain = [(1, 16, 12, 8), (2, 16, 70, 3), (1, 420, 5, 1)]
    layer = KSLinear(chain, algorithm="fused", dtype=torch.float64)
    x = torch.randn(5, layer.in_features, dtype=torch.float64, requires_grad=True)
    seen = []
    multiply = cpu_kernel.multiply

    def spy(*args, **kwargs):
        seen.append(args[-1] if len(args) > 5 else kwargs.get("bias"))
        return multiply(*args, **kwargs)

    monkeypatch.setattr(cpu_kernel, "multiply", spy)
    with vector_width(bits):
        kernel = cpu_kernel.current_kernel(torch.float64)
        assert [cpu_kernel.bsf_path(kernel, p[3], p[2]) for p in chain] == \
            ["along_d", "gemm", "flat"]
        with torch.no_grad():
            y0 = layer(x)
        y = layer(x)
    y.square().sum().backward()
    xd = x.detach().clone().requires_grad_()
    dense = layer.to_dense().detach().requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()
    ref = xd @ dense.T + bias
    ref.square().sum().backward()
    assert rel_err(y0, ref.detach()) <= 1e-12 and rel_err(y.detach(), ref.detach()) <= 1e-12
    assert rel_err(x.grad, xd.grad) <= 1e-12 and rel_err(layer.bias.grad, bias.grad) <= 1e-12
    given_bias = [b for b in seen[:3] if b is not None]  # the no-grad forward's three calls
    assert len(given_bias) == 1 and torch.equal(given_bias[0], layer.bias.detach())


def test_a_bias_of_the_wrong_shape_is_refused_in_one_line():
    p = KSPattern(1, 4, 3, 2)
    op = prepare(random_factor(p), p, "fused")
    with pytest.raises(ShapeError, match=r"bias must have shape \(8,\)"):
        apply(torch.randn(2, 6), op, p, "fused", bias=torch.zeros(6))
