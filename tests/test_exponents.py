"""q, r and dtype are checked in one place (``pathlift.exponents``) for every entry point:
the domains of Def. 3.1.1 (q in (0, inf), r in (0, inf]), q >= 1 where |w|^q must be
differentiable, q = inf for Alg. 3.2.1's max-normalisation; a typed error names the value."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pathlift.errors import InvalidParameterError
from pathlift.exponents import check_dtype, check_exponents, check_q, check_r
from pathlift.graph.normalize import normalize
from pathlift.lift import average_case_path_norm, path_norm
from pathlift.lift.differentiable import differentiable_path_norm
from pathlift.models import mlp


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_q_is_accepted_exactly_on_its_domain(q):
    for minimum, infinite in ((0.0, False), (1.0, False), (0.0, True)):
        inside = (q >= minimum if minimum else q > 0) and (math.isfinite(q) or
                                                          (infinite and q == math.inf))
        if inside:
            assert check_q(q, minimum, infinite) == q
        else:
            with pytest.raises(InvalidParameterError, match="q must be in"):
                check_q(q, minimum, infinite)


@pytest.mark.parametrize("bad", [True, "2", None, 1j])
def test_a_non_number_is_refused_typed(bad):
    with pytest.raises(InvalidParameterError, match="must be a number"):
        check_q(bad)
    with pytest.raises(InvalidParameterError, match="must be a number"):
        check_exponents(1.0, bad)


def test_r_and_dtype():
    assert check_r(math.inf) == math.inf
    with pytest.raises(InvalidParameterError, match=r"r must be in \(0, inf\]"):
        check_r(0.0)
    with pytest.raises(InvalidParameterError, match="floating torch dtype"):
        check_dtype(torch.int64)
    with pytest.warns(UserWarning, match="mantissas"):
        check_dtype(torch.float16)


def test_every_entry_point_refuses_through_it():
    model = mlp(4, (3,), num_classes=2)
    calls = [lambda: path_norm(model, (4,), q=0.0),
             lambda: path_norm(model, (4,), q=1.0, r=-1.0),
             lambda: differentiable_path_norm(model, (4,), q=0.5),
             lambda: differentiable_path_norm(model, (4,), q="1"),
             lambda: average_case_path_norm(model, (4,), torch.zeros(2, 4), q=0.5),
             lambda: normalize(model, (4,), q=-1.0)]
    for call in calls:
        with pytest.raises(InvalidParameterError, match=r"(q|r) must be"):
            call()
