"""A smoke test of ``python -m bench monitoring`` with tiny counts: every figure there, every request done.

It measures nothing (a few hundred topics and half-second runs); it proves that the benchmark still runs
against the current broker and its monitoring endpoint.
"""

from __future__ import annotations

import pytest

from bench import monitoring


@pytest.mark.timeout(120)
def test_monitoring_benchmark_runs() -> None:
    report = monitoring.run(topics=300, persistent=5, repeat=1, seconds=0.5)

    assert [scrape.path for scrape in report.scrapes] == ["/metrics", "/api/overview", "/api/stats"]
    for scrape in report.scrapes:
        assert scrape.size > 0, scrape.path
        assert scrape.median_ms > 0, scrape.path
    assert report.snapshot_ms[0] > 0
    assert report.slices[0] >= 1
    baseline, *watched = report.trips
    assert baseline.scrapes == 0
    assert all(trips.scrapes > 0 for trips in watched)
    assert all(trips.seconds for trips in report.trips)
    assert len(report.lines()) == 12  # a heading, three pages and the snapshot, three runs
