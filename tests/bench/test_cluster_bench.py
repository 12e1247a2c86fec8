"""A smoke test of ``python -m bench cluster`` with tiny counts: every figure positive, every confirmation
fsync, failovers, handovers and a frozen leader timed, no publish failed during a handover, a stopped
follower's catching up timed, new topics made while another client publishes, each member's idle CPU
taken, failovers timed again with those topics. It
measures nothing (the counts are far too small for the ratios to mean anything); it proves that the
benchmark still runs against the current brokers and connector."""

from __future__ import annotations

import pytest

from bench import cluster


@pytest.mark.timeout(180)
def test_cluster_benchmark_runs(tmp_path):
    report = cluster.run(confirms=30, pipelined=300, trials=2, repeat=1, base=tmp_path, catch_up=2_000,
                         freezes=1, idle_topics=5)
    assert report.durable
    assert set(report.rates) == {"single 1", "single 100", "cluster 1", "cluster 100"}
    assert all(rate > 0 for rate in report.rates.values())
    assert len(report.failovers) == 2
    assert all(0 < seconds < 60 for seconds in report.failovers)
    assert len(report.handovers) == 2
    assert all(0 < seconds < 60 for seconds in report.handovers)
    assert report.handover_failures == 0
    assert len(report.freezes) == 1
    assert 0 < report.freezes[0] < 60
    assert report.catch_up is not None
    assert report.catch_up > 0
    assert set(report.making) == {"single", "cluster"}
    assert all(0 < seconds < 60 for seconds, _ in report.making.values())
    assert all(0 < wait < 60 for _, waits in report.making.values() for wait in waits)
    assert set(report.idle) == {"leader", "follower"}
    assert all(0 <= share < 2 for share in report.idle.values())  # a share of one core (two at most here)
    assert len(report.crowded_failovers) == 2
    assert all(0 < seconds < 60 for seconds in report.crowded_failovers)
    assert report.ratio(1) > 0
    assert report.ratio(100) > 0
    assert list(tmp_path.iterdir()) == []  # the brokers' folders are removed afterwards
