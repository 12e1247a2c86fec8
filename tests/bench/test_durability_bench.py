"""A smoke test of ``python -m bench durability`` with tiny counts: every figure positive, every check passed.

It measures nothing (the counts are far too small for the ratios to mean anything); it proves that the
benchmark still runs against the current broker, connector and codec, and that its checks hold.
"""

from __future__ import annotations

from bench import durability


def test_durability_benchmark_runs_and_its_checks_pass(tmp_path):
    report = durability.run(messages=300, replay_messages=2000, window=100, batch=0, base_dir=tmp_path)

    assert report.problems() == []
    assert report.durability_ok
    for kind, result in report.confirmed[1].items():
        assert result.rate > 0, kind
        assert result.durabilities == {durability.EXPECTED_DURABILITY[kind]: 300}
    assert report.confirmed[1]["strong"].fsyncs > 0
    assert report.confirmed[1]["strong"].per_fsync > 0
    for delivery in (report.replay, report.live):
        assert delivery.rate > 0, delivery.name
        assert delivery.received == 2000, delivery.name
    assert list(tmp_path.iterdir()) == []  # the data directory is removed afterwards


def test_a_strong_topic_with_too_few_fsyncs_is_reported():
    # 1,000 messages confirmed as fsync with at most 100 in flight need at least 10 fsyncs.
    result = durability.ConfirmedResult("strong", 1, 1000, 100, confirmed=1000, seconds=1.0,
                                        durabilities={"fsync": 1000}, fsyncs=9, stored=1000)
    assert any("fsyncs" in problem for problem in result.problems())
    result.fsyncs = 10
    assert result.problems() == []
