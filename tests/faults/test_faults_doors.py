"""Every door of one broker process, worked the way a crowd of careless or hostile clients would: 10,000
clients that come and go on each door (mc0 ones leaving without DISCONNECT and without a TTL), then
thousands of random and mutated inputs on each. The broker's descriptors come back to where they were and its
memory stays flat, and after each door a normal client still publishes and receives through it.

The scenarios are ``bench/faults.py``'s (``python -m bench faults --soak N`` runs them longer); the figures
are recorded as test properties (junit) and printed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import faults

#: What the broker's resident memory may grow by over 9,000 cycles once warm: the Python allocator keeps some
#: of what it freed, but nothing may grow with the number of clients (a leak of 100 bytes a cycle is 0.9 MB).
RSS_SLACK = 12 << 20


@pytest.fixture(scope="module")
def running() -> Iterator[faults.BrokerProcess]:
    # Sessions without TTL are probed after a second of silence: the churned ones go within seconds.
    with faults.broker("session_idle = 1.0\n") as broker:
        yield broker
        faults.stopped_cleanly(broker)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("door", faults.DOORS)
def test_clients_that_come_and_go_leave_nothing_behind(running: faults.BrokerProcess, door: str,
                                                       record_property: pytest.RecordProperty) -> None:
    figures = faults.churn(running, door, faults.CHURN_CYCLES)
    for name, value in figures.items():
        record_property(name, value)
    print(door, figures)
    assert figures["fds_end"] <= figures["fds_warm"] + 2, "descriptors held for clients that left"
    assert figures["rss_end"] - figures["rss_warm"] < RSS_SLACK, "memory grows with clients that left"
    faults.answers(running)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("door", faults.DOORS)
def test_random_and_mutated_input_gets_answers_not_a_dead_broker(
    running: faults.BrokerProcess, door: str, record_property: pytest.RecordProperty
) -> None:
    figures = faults.fuzz(running, door, faults.FUZZ_INPUTS)
    for name, value in figures.items():
        record_property(name, value)
    print(door, figures)
    assert running.alive()
    faults.answers(running)
