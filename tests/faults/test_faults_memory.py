"""One request holds the loop for a bounded slice and every per-client buffer is bounded: a 2 MiB binary body
over sexp (six megabytes of escapes on one line) is decoded in steps by C code, within three times its size
in memory, and arrives intact; unterminated lines past the shared input budget are refused, largest first,
and the memory comes back; nested zip bombs on the Lumberjack door cost the loop milliseconds, not hundreds.

The time figures are recorded (junit properties, printed), not asserted tightly: they depend on the machine
(``python -m bench faults`` prints them with a baseline from the same run). Memory figures are asserted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import faults


def record(record_property: pytest.RecordProperty, figures: dict[str, float]) -> None:
    for name, value in figures.items():
        record_property(name, value)
    print(figures)


@pytest.fixture(scope="module")
def running() -> Iterator[faults.BrokerProcess]:
    with faults.broker("input_budget = 33554432\n") as broker:  # 32 MiB
        yield broker
        faults.stopped_cleanly(broker)


@pytest.mark.timeout(60)
def test_the_sexp_codec_reads_a_2_mib_binary_body_in_steps_within_three_times_its_size(
    record_property: pytest.RecordProperty,
) -> None:
    figures = faults.sexp_decode(2 << 20)
    record(record_property, figures)
    assert figures["peak_per_body"] <= faults.SEXP_PEAK_PER_BODY
    assert figures["steps"] >= figures["line"] // (128 << 10), "the line was not read in steps"


@pytest.mark.timeout(60)
def test_a_2_mib_binary_body_over_sexp_arrives_intact(running: faults.BrokerProcess,
                                                     record_property: pytest.RecordProperty) -> None:
    record(record_property, faults.sexp_body(running, 2 << 20))
    faults.answers(running)


@pytest.mark.timeout(60)
def test_unterminated_lines_past_the_input_budget_are_refused_and_the_memory_comes_back(
    running: faults.BrokerProcess, record_property: pytest.RecordProperty
) -> None:
    figures = faults.input_budget(running, 3, 24 << 20)
    record(record_property, figures)
    assert figures["refused"] >= 2, "72 MiB of unfinished lines under a budget of 32 MiB"
    assert figures["rss_peak"] - figures["rss_before"] < 96 << 20
    assert figures["rss_after"] - figures["rss_before"] < 16 << 20, "the memory did not come back"
    faults.answers(running)


@pytest.mark.timeout(60)
def test_nested_zip_bombs_close_the_connection_and_hold_the_loop_briefly(
    running: faults.BrokerProcess, record_property: pytest.RecordProperty
) -> None:
    figures = faults.zip_bombs(running, 5)
    record(record_property, figures)
    assert figures["closed"] == figures["bombs"]
    assert figures["longest_stall"] < 1.0  # a regression to inflating whole bombs at once shows here
    faults.answers(running)
