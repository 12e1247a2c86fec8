"""A broker process under a descriptor limit of 256: far more persistent topics than it could keep open at
once, and floods of bare TCP connections held open on every door (a client needs no key for that: the CURVE
handshake is the broker's to wait for). The store keeps its open files under its share, the doors stop
accepting while descriptors run short and start again when they are free, a client already connected is
served meanwhile and can still create a persistent topic (the reserve), an mc0 client dropped when the store
found no descriptor left comes back by itself, and afterwards a new client gets in and is answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import faults

LIMIT = faults.DESCRIPTOR_LIMIT


@pytest.fixture(scope="module")
def running() -> Iterator[faults.BrokerProcess]:
    with faults.descriptor_broker() as broker:
        yield broker
        faults.stopped_cleanly(broker)


@pytest.mark.timeout(60)
def test_curve_handshakes_of_a_crowd_finish_well_within_the_handshake_timeout(
    running: faults.BrokerProcess, record_property: pytest.RecordProperty
) -> None:
    figures = faults.curve_handshakes(running, 100)
    for name, value in figures.items():
        record_property(name, value)
    print(figures)
    assert figures["max"] < 5.0  # handshake_timeout: a bare connection holds a descriptor this long at most


@pytest.mark.timeout(120)
def test_persistent_topics_beyond_the_limit_are_all_served(running: faults.BrokerProcess,
                                                           record_property: pytest.RecordProperty) -> None:
    figures = faults.persistent_topics(running, 3 * LIMIT // 2)
    for name, value in figures.items():
        record_property(name, value)
    assert figures["stored"] == figures["checked"]
    assert figures["limit"] == LIMIT
    assert figures["descriptors"] < LIMIT
    faults.answers(running)


@pytest.mark.timeout(120)
def test_bare_connections_held_on_every_door_do_not_stop_the_broker(
    running: faults.BrokerProcess, record_property: pytest.RecordProperty
) -> None:
    figures = faults.flood(running, 2 * LIMIT)
    for name, value in figures.items():
        record_property(name, value)
    print(figures)
    assert figures["stored_during"] == 1, "a persistent topic could not be made during the flood"
    assert figures["pauses"] >= 1, "the doors never stopped accepting"
    assert figures["confirmed_after"], "the mc0 client connected before did not come back"
    assert running.alive()
    faults.answers(running)  # a new client, once the flood is gone


@pytest.mark.timeout(120)
def test_a_pause_keeps_the_mc0_connections_it_has_and_lets_no_new_one_in(
    record_property: pytest.RecordProperty,
) -> None:
    with faults.descriptor_broker() as running:
        figures = faults.creeping(running)
        for name, value in figures.items():
            record_property(name, value)
        print(figures)
        assert figures["mc0_reconnects"] == 0, "the pause dropped the mc0 client connected before"
        assert figures["paused"], "the doors took connections again while they were held"
        assert figures["confirmed"], "the mc0 client connected before was not served during the pause"
        assert figures["stored"] == 1, "a persistent topic could not be made while descriptors were short"
        assert not figures["new_mc0_connection_let_in"], "the mc0 port took a new connection while paused"
        faults.answers(running)  # a new client, once the doors take connections again
        faults.stopped_cleanly(running)


@pytest.mark.timeout(120)
def test_a_restart_under_the_same_limit_opens_every_topic_and_answers(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with faults.descriptor_broker(data_dir) as running:
        faults.persistent_topics(running, 3 * LIMIT // 2)
        faults.stopped_cleanly(running)
    with faults.descriptor_broker(data_dir) as running:
        faults.answers(running)
        with running.client() as client:
            for number in range(0, 3 * LIMIT // 2, 37):
                stored = client.fetch(f"p.topic-{number}", 1).messages
                assert [message.body for message in stored] == [f"message {number}".encode()]
            assert client.stats(limit=1)["limits"]["topics"]["unavailable"] == 0
        faults.stopped_cleanly(running)
