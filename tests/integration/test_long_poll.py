"""Long-poll FETCH (docs/mc0.md, "WAIT"): a FETCH with nothing to read past FROM waits for the commit that
brings something, or for its WAIT, against a real in-process broker.

Covered: answered as soon as a publish is committed (well before the wait ends), answered empty when the wait
ends, later commands of the same client answered while a FETCH waits, the broker-wide bound (a FETCH beyond it
answered at once), a gone client's waits freed, a FETCH naming another log than the topic's answered at once,
AT-TIME waiting for a message at or after its time, and an idle reader's command rate.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest

from broker.topics import Persistence, TopicRule, TopicSpec
from connector import Client
from protocol import mc0

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory

    from broker.server import Broker

pytestmark = pytest.mark.timeout(30)

RULES = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),)


@pytest.fixture
def broker(start_broker: BrokerFactory) -> Broker:
    return start_broker(topics=RULES, max_waiting_fetches=3)


def waiting(broker: Broker) -> int:
    with Client(broker.endpoint, curve=False) as client:
        return client.stats()["doors"]["mc0"]["waiting_fetches"]


def test_a_waiting_fetch_is_answered_by_the_commit_that_brings_a_message(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as reader, Client(broker.endpoint, curve=False) as writer:
        writer.publish("lp.a", "one", confirm=True)
        timer = threading.Timer(0.3, lambda: writer.publish("lp.a", "two", confirm=True))
        started = time.monotonic()
        timer.start()
        result = reader.fetch("lp.a", 2, wait=10)
        elapsed = time.monotonic() - started
        timer.join()
    assert [m.body for m in result.messages] == [b"two"]
    assert 0.25 < elapsed < 3, "answered by the publish, not by the end of the wait"
    assert result.start_id == 2
    assert len(result.incarnation) == 32


def test_a_waiting_fetch_with_nothing_new_is_answered_empty_when_its_wait_ends(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as client:
        client.publish("lp.b", "one", confirm=True)
        started = time.monotonic()
        result = client.fetch("lp.b", 2, wait=0.4)
        elapsed = time.monotonic() - started
    assert result.messages == []
    assert result.next_id == 2
    assert 0.35 < elapsed < 2.5


def test_later_commands_are_answered_while_a_fetch_waits(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as client:
        client.publish("lp.c", "one", confirm=True)
        answers: list[object] = []
        poll = threading.Thread(target=lambda: answers.append(client.fetch("lp.c", 2, wait=3)))
        poll.start()
        time.sleep(0.1)
        started = time.monotonic()
        client.flush()
        client.publish("lp.other", "x", confirm=True)
        assert time.monotonic() - started < 1, "the waiting FETCH holds no later reply back"
        poll.join(10)
    assert len(answers) == 1


def test_waits_beyond_the_bound_are_answered_at_once_and_a_gone_client_frees_its_waits(
    broker: Broker, dealer: DealerFactory
) -> None:
    peer = dealer(broker.endpoint)
    for n in range(4):
        peer.send("FETCH", "TOPIC", f"lp.d{n}", "WAIT", 20_000, "ID", f"f{n}")
    reply = peer.recv()  # the fourth: beyond the bound of 3, answered at once
    assert reply.verb == b"OK"
    assert reply.headers[b"ID"] == b"f3"
    assert reply.headers[b"COUNT"] == b"0"
    assert waiting(broker) == 3
    peer.send("DISCONNECT", "ID", "bye")
    assert peer.recv().headers[b"ID"] == b"bye"
    assert waiting(broker) == 0


def test_a_fetch_that_names_another_log_is_answered_at_once(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as client:
        client.publish("lp.e", "one", confirm=True)
        current = client.fetch("lp.e", max_messages=0).incarnation
        started = time.monotonic()
        result = client.fetch("lp.e", 2, wait=5, incarnation="0" * 32)
        assert time.monotonic() - started < 2
        assert result.incarnation == current != "0" * 32
        started = time.monotonic()
        client.fetch("lp.e", 2, wait=0.3, incarnation=current)
        assert time.monotonic() - started > 0.25, "the log it knows: it waits"


def test_at_time_waits_for_a_message_at_or_after_its_time(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as reader, Client(broker.endpoint, curve=False) as writer:
        writer.publish("lp.f", "old", confirm=True)
        time.sleep(0.05)
        now_ms = time.time_ns() // 1_000_000
        assert reader.fetch("lp.f", at_time=now_ms, wait=0.2).messages == []
        timer = threading.Timer(0.2, lambda: writer.publish("lp.f", "new", confirm=True))
        timer.start()
        result = reader.fetch("lp.f", at_time=now_ms, wait=10)
        timer.join()
    assert [m.body for m in result.messages] == [b"new"]
    assert result.start_id == 2


def test_an_idle_long_polling_reader_costs_a_few_commands_a_second(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as writer:
        writer.publish("lp.g", "one", confirm=True)
    with Client(broker.endpoint, curve=False) as client:
        before = client.stats()["doors"]["mc0"]["commands"]
        deadline = time.monotonic() + 2.0
        polls = 0
        while time.monotonic() < deadline:
            client.fetch("lp.g", 2, wait=0.5)
            polls += 1
        after = client.stats()["doors"]["mc0"]["commands"]
    assert polls <= 5
    assert after - before <= polls + 1, "one command per half second of idling (and the STATS)"


def test_the_wait_header_is_checked(dealer: DealerFactory, broker: Broker) -> None:
    peer = dealer(broker.endpoint)
    peer.send("FETCH", "TOPIC", "lp.h", "WAIT", "soon", "ID", "w")
    reply = peer.recv()
    assert reply.verb == b"ERROR"
    assert b"WAIT" in reply.headers[b"MESSAGE"]
    peer.send("FETCH", "TOPIC", "lp.h", "FROM", 1, "AT-TIME", 5, "ID", "t")
    assert b"not both" in peer.recv().headers[b"MESSAGE"]
    assert mc0.FETCH_MAX_WAIT_MS == 60_000
