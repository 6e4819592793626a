"""Intervals against published values: Newcombe (1998), "Interval estimation for the difference
between independent proportions", Statistics in Medicine 17, table II (method 10)."""

from __future__ import annotations

import pytest

from tracefix.daemon.promotion.canary import Rate, judge
from tracefix.daemon.core.intervals import difference, mcnemar_p, paired_difference, wilson


@pytest.mark.parametrize(
    ("a", "m", "b", "n", "low", "high"),
    [(56, 70, 48, 80, 0.0524, 0.3339), (9, 10, 3, 10, 0.1705, 0.8090)],
)
def test_newcombe_difference_matches_the_published_intervals(a: int, m: int, b: int, n: int, low: float, high: float) -> None:
    delta, found_low, found_high = difference(a, m, b, n)
    assert delta == pytest.approx(a / m - b / n)
    assert (found_low, found_high) == pytest.approx((low, high), abs=1e-4)


def test_wilson_matches_the_published_interval() -> None:
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)  # Newcombe (1998), one proportion


def test_only_a_difference_whose_whole_interval_is_above_zero_counts_as_worse() -> None:
    assert judge(Rate(9, 10), Rate(3, 10), 0.95, "canary", "control").worse
    noisy = judge(Rate(4, 10), Rate(2, 10), 0.95, "canary", "control")
    assert not noisy.worse and "not worse than control" in noisy.reason
    assert not judge(Rate(10, 10), Rate(0, 0), 0.95, "canary", "control").worse  # nothing to compare with


def test_the_paired_difference_interval_uses_the_pairing() -> None:
    # 24 seeds: 12 solved before and after, 9 only after, 2 only before, 1 by neither.
    delta, low, high = paired_difference(9, 2, 12, 1)
    assert delta == pytest.approx(7 / 24) and low < delta < high
    # Swapping before and after mirrors the interval.
    assert paired_difference(2, 9, 12, 1) == pytest.approx((-delta, -high, -low))
    # Positively correlated pairs make the interval narrower than two independent samples of the same
    # rates would, negatively correlated ones (as above: 12·1 < 9·2) wider.
    _, paired_low, paired_high = paired_difference(4, 0, 12, 8)
    _, independent_low, independent_high = difference(16, 24, 12, 24)
    assert paired_high - paired_low < independent_high - independent_low
    _, independent_low, independent_high = difference(21, 24, 14, 24)
    assert high - low > independent_high - independent_low
    # No change on any seed: the difference is exactly zero; no seeds: nothing is known.
    assert paired_difference(0, 0, 10, 10) == (0.0, 0.0, 0.0)
    assert paired_difference(0, 0, 0, 0) == (0.0, -1.0, 1.0)


def test_mcnemar_exact_p_by_hand() -> None:
    assert mcnemar_p(9, 2) == pytest.approx(2 * (1 + 11 + 55) / 2**11)  # 2 · P(X ≤ 2), X ~ Bin(11, 1/2)
    assert mcnemar_p(5, 0) == pytest.approx(2 / 2**5)
    assert mcnemar_p(3, 3) == 1.0 and mcnemar_p(0, 0) == 1.0
