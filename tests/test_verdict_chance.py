"""Verdicts against chance (issue 39): every bound is compared with 1 and with the error
of the best constant classifier on the training labels, and prints on the right side of
both at every magnitude."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runner import invoke
from pathlift.bounds.verdict import format_bound, judge, verdict
from pathlift.logspace import format_log10


def test_chance_is_one_minus_the_largest_class_frequency():
    balanced = torch.arange(10).repeat(7)
    v = judge(math.log10(0.9688), balanced, 0.04)
    assert v.chance == pytest.approx(0.9) and not v.informative and v.below_one
    assert "1 - 1/C, C = 10 balanced classes" in str(v)
    assert str(v).startswith("not informative: 0.9688 < 1 but >= chance 0.9000")
    skewed = torch.tensor([0] * 70 + [1] * 20 + [2] * 10)
    w = judge(math.log10(0.25), skewed)
    assert w.chance == pytest.approx(0.3) and w.beats_chance
    assert "1 - max class frequency of the training labels, 3 classes" in str(w)
    assert str(w).startswith("beats chance: 0.2500 < chance 0.3000")
    assert verdict(math.log10(0.5)).startswith("informative: 0.5000 < 1")  # no labels
    assert verdict(2.5, labels=balanced).startswith("not informative: 316.2278 >= 1")
    assert verdict(math.inf, labels=balanced).startswith("not informative: inf >= 1")


def test_just_below_one_never_prints_as_one_or_ten():
    assert format_bound(math.log10(0.99999994)) == ("0.9999999", "")  # 7 digits do
    assert "10.0" not in format_log10(math.log10(0.99999994))
    assert format_log10(math.log10(0.99999994)) == "1.0000e+0"
    assert "informative: 0.9999999 < 1" in verdict(math.log10(0.99999994))


@settings(max_examples=500, deadline=None)
@given(st.floats(1e-300, 999.0) | st.sampled_from([1 - 2**-52, 1 - 6e-8, 0.9, 0.9 + 1e-16,
                                                  0.09999999999, 1e-3 - 1e-19]),
       st.floats(0.0, 1.0, exclude_max=True) | st.sampled_from([0.9, 0.5, 1 - 1e-12]))
def test_printed_bound_and_chance_compare_as_the_numbers(bound, chance):
    """At every magnitude and next to 1 or chance: the printed numbers, read back, order
    as the numbers do, and each is within its last printed digit."""
    log10 = math.log10(bound)
    shown, shown_chance = format_bound(log10, chance)
    value = 10**log10
    b, c = float(shown), float(shown_chance)
    assert (b < c) == (value < chance) and (b < 1) == (value < 1)
    assert (b == c) == (value == chance)
    digits = re.search(r"\.(\d+)", shown)
    last = 10.0 ** -len(digits.group(1)) if "e" not in shown else abs(b) * 1e-3
    assert abs(b - value) <= last


@settings(max_examples=300, deadline=None)
@given(st.floats(-400, 400))
def test_format_log10_mantissa_stays_below_ten(log10):
    mantissa, exponent = format_log10(log10).split("e")
    assert 1.0 <= float(mantissa) < 10.0
    assert abs(math.log10(float(mantissa)) + int(exponent) - log10) < 1e-4


def test_bounds_command_judges_against_chance():
    """``pathlift bounds`` prints chance for the union bound: the digits' training labels
    (1 - max class frequency)."""
    from pathlift.data import load_digits

    y = load_digits().train.tensors[1]
    chance = 1 - int(torch.bincount(y).max()) / len(y)
    result = invoke("bounds", "mlp", "--data", "digits", "--no-compression")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert ("chance (the best constant classifier's training error, 1 - max class frequency "
            f"of the training labels, 10 classes): {chance:.4f}") in out
    assert f"valid if the n = {len(y)} samples are drawn i.i.d. (no exact duplicates)" in out
    assert out.count("not informative: ") == 1  # an untrained network: at or above chance


def test_bounds_command_on_an_untrained_network_stops_the_search_at_once():
    """Its training error keeps every compression bound above chance: one candidate, and
    the caption says why; --time-budget is taken."""
    result = invoke("bounds", "mlp", "--data", "digits", "--time-budget", "30")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "compression search stopped: no candidate can beat chance" in out
    assert out.count("not informative: ") == 2
