"""The cheap histograms the loop fills: buckets as Prometheus reads them, the sum, coarse quantiles."""

from __future__ import annotations

import pytest

from broker.histogram import COMMIT_MESSAGES, FSYNC_SECONDS, TURN_SECONDS, Histogram


def test_values_fall_in_the_first_bucket_whose_bound_they_do_not_exceed() -> None:
    histogram = Histogram((1.0, 2.0, 5.0))
    for value in (0.5, 1.0, 1.5, 2.0, 4.0, 9.0):
        histogram.observe(value)
    copy = histogram.copy()
    assert copy.counts == (2, 2, 1, 1)  # le 1, le 2, le 5, +Inf
    assert copy.cumulative() == [(1.0, 2), (2.0, 4), (5.0, 5), (float("inf"), 6)]
    assert copy.count == 6
    assert copy.total == pytest.approx(18.0)


def test_a_copy_does_not_change_with_the_histogram() -> None:
    histogram = Histogram((1.0,))
    copy = histogram.copy()
    histogram.observe(0.1)
    assert copy.count == 0
    assert histogram.copy().count == 1


def test_quantiles_are_bucket_bounds() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    assert histogram.copy().quantile(0.5) is None
    for _ in range(98):
        histogram.observe(0.0005)
    histogram.observe(0.05)
    histogram.observe(3.0)
    copy = histogram.copy()
    assert copy.quantile(0.5) == 0.001
    assert copy.quantile(0.99) == 0.1
    assert copy.quantile(1.0) == float("inf")


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((2.0, 1.0))
    for bounds in (FSYNC_SECONDS, TURN_SECONDS, COMMIT_MESSAGES):
        Histogram(bounds)
