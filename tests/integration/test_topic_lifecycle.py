"""Topics do not pile up: idle transient topics are reclaimed, DELETE removes a topic with its files,
max_topics refuses the one too many in one clear line, and STATS answers a page at a time (PREFIX, AFTER,
LIMIT) with an exact cursor, through the wire and through the connector (delete(), paged topics()).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import BrokerFactory, DealerFactory

from broker.store.files import directory_name
from broker.topics import Delivery, Persistence, TopicRule, TopicSpec
from connector import AsyncClient, Client, ConnectorError

PERSISTENT = (TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT)),
              TopicRule("q.*", TopicSpec(delivery=Delivery.ROUND_ROBIN)))


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


@pytest.mark.timeout(30)
def test_idle_transient_topics_are_reclaimed_and_busy_ones_kept(start_broker: BrokerFactory) -> None:
    broker = start_broker(topic_idle=0.4, topics=PERSISTENT)
    engine = broker.engine
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([(f"gone.{n}", "x", None) for n in range(300)])
        client.subscribe("watched")
        client.publish("p.kept", "stored", confirm=True)
        client.declare("declared", delivery="round-robin")
        client.publish("q.waiting", "for a consumer")  # a transient queue holds it: not idle
        client.flush()
        assert len(engine.topics) >= 303
        wait_until(lambda: not any(name.startswith(b"gone.") for name in engine.topics))
        assert {b"watched", b"p.kept", b"declared", b"q.waiting"} <= set(engine.topics)
        assert engine.reclaimed >= 300
        # Used again, a reclaimed topic is a new one (a new id); messages flow as before.
        client.subscribe("gone.1")
        client.publish("gone.1", "again")
        message = client.receive(timeout=5)
        assert message is not None
        assert message.body == b"again"
        stats = client.stats(limit=1)
        assert stats["limits"]["topics"]["reclaimed"] >= 300


@pytest.mark.timeout(30)
def test_delete_removes_a_persistent_topic_and_its_files(start_broker: BrokerFactory, tmp_path: Path) -> None:
    broker = start_broker(topics=PERSISTENT, data_dir=tmp_path / "data")
    directory = tmp_path / "data" / directory_name(b"p.orders")
    with Client(broker.endpoint, curve=False) as client:
        for n in range(5):
            client.publish("p.orders", f"order {n}", confirm=True)
        assert directory.is_dir()
        client.subscribe("p.orders")
        with pytest.raises(ConnectorError, match="has 1 subscriber: it can be deleted once nobody"):
            client.delete("p.orders")
        client.unsubscribe("p.orders")
        client.delete("p.orders")
        assert not directory.exists()
        assert "p.orders" not in client.topics()
        with pytest.raises(ConnectorError, match=r"no topic 'p\.orders' to delete"):
            client.delete("p.orders")
        # Used again: a new, empty log whose ids start at 1.
        assert client.publish("p.orders", "afresh", confirm=True) is not None
        assert client.offsets("p.orders") == (1, 2)


@pytest.mark.timeout(30)
def test_delete_over_the_wire_answers_ok_or_error_with_the_id(start_broker: BrokerFactory,
                                                             dealer: DealerFactory) -> None:
    broker = start_broker()
    peer = dealer(broker.endpoint)
    peer.put("plain", "x")
    peer.ok("NOOP")
    peer.ok("DELETE", "", "plain")
    reply = peer.request("DELETE", "ID", "d2", "", "plain")
    assert reply.verb == b"ERROR"
    assert reply.header("ID") == b"d2"
    assert reply.header("MESSAGE") == b"no topic 'plain' to delete"


@pytest.mark.timeout(30)
def test_max_topics_refuses_the_one_too_many(start_broker: BrokerFactory, dealer: DealerFactory) -> None:
    broker = start_broker(max_topics=10, topic_idle=3600.0)
    peer = dealer(broker.endpoint)
    for n in range(10):
        peer.ok("PUT", "TOPIC", f"t.{n}", "", "x")
    reply = peer.request("PUT", "TOPIC", "t.10", "ID", "p11", "", "x")
    assert reply.verb == b"ERROR"
    assert reply.header("MESSAGE") == (b"topic 't.10' refused: 10 topics exist, as many as max_topics "
                                       b"allows; idle transient ones are reclaimed, or DELETE some")
    peer.ok("PUT", "TOPIC", "t.3", "", "an existing topic is fine")


@pytest.mark.timeout(30)
def test_stats_pages_through_the_topics_with_an_exact_cursor(start_broker: BrokerFactory) -> None:
    broker = start_broker(topic_idle=3600.0)
    names = [f"page.{n:04d}" for n in range(2500)] + ["other.a", "other.b"]
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([(name, "x", None) for name in names])
        client.publish(b"page.\xff\xfe", "a name that is not UTF-8")
        client.flush()
        seen: list[str] = []
        after = None
        while True:
            stats = client.stats(prefix="page.", after=after, limit=700)
            assert len(stats["topics"]) <= 700
            seen += sorted(stats["topics"])
            after = stats["topics_next"]
            if after is None:
                break
        assert seen[:2500] == sorted(names[:2500])
        assert len(seen) == 2501  # and the one that is not UTF-8, last in byte order
        assert stats["topics_total"] == 2503
        default = client.stats()
        assert len(default["topics"]) == 1000  # the broker's page
        assert default["topics_next"] is not None
        assert sorted(client.topics(prefix="other.")) == ["other.a", "other.b"]


@pytest.mark.timeout(30)
def test_the_asyncio_client_deletes_and_pages_too(start_broker: BrokerFactory) -> None:
    broker = start_broker(topic_idle=3600.0)

    async def main() -> None:
        async with asyncio.timeout(15), AsyncClient(broker.endpoint, curve=False) as client:
            await client.publish("aio.one", "x")
            await client.publish("aio.two", "x")
            await client.flush()
            assert sorted(await client.topics(prefix="aio.")) == ["aio.one", "aio.two"]
            assert list(await client.topics(prefix="aio.", after="aio.one")) == ["aio.two"]
            await client.delete("aio.one")
            assert list(await client.topics(prefix="aio.")) == ["aio.two"]

    asyncio.run(main())
