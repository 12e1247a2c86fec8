"""100,000 topics in one broker process: STATS answers a page at a time, fast, and never holds the loop for
long; a prefix filters. The latency and stall figures are recorded (junit properties, printed).
"""

from __future__ import annotations

import pytest

from bench import faults


@pytest.mark.timeout(180)
def test_stats_stays_fast_with_100k_topics(record_property: pytest.RecordProperty) -> None:
    with faults.broker("topic_idle = 3600.0\n") as running:
        figures = faults.stats_pages(running, faults.STATS_TOPICS)
        for name, value in figures.items():
            record_property(name, value)
        print(figures)
        assert figures["topics"] >= faults.STATS_TOPICS
        # A page of 1,000 of 100,000 takes milliseconds; seconds would mean a scan of every topic.
        assert figures["page_max"] < 2.0
        assert figures["longest_stall"] < 2.0
        faults.answers(running)
        faults.stopped_cleanly(running)
