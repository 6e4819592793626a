"""Intervals against published values: Newcombe (1998), "Interval estimation for the difference
between independent proportions", Statistics in Medicine 17, table II (method 10)."""

from __future__ import annotations

import pytest

from daemon.promotion.canary import Rate, judge
from daemon.core.intervals import difference, wilson


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
