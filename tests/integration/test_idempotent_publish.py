"""Idempotent publishing (docs/mc0.md, "Idempotent PUTS"): a batch with PRODUCER and SEQUENCE lands once,
however often it is sent — sent twice, sent overlapping, sent again after the broker was restarted, and sent
again after the broker was killed (SIGKILL) between storing it and answering.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import failing_writes
from test_crash_safety import BrokerProcess, broker_process  # noqa: F401 - the fixture, shared

from broker.store.files import directory_name
from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from connector import Client, ConnectorError
from protocol import mc0

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory

pytestmark = pytest.mark.timeout(60)

RULES = (
    TopicRule("weak.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)),
    TopicRule("mem.*", TopicSpec()),
    TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),
)


def batch(topic: str, first: int, count: int) -> list[tuple[str, bytes, None]]:
    return [(topic, b"m%d" % n, None) for n in range(first, first + count)]


def bodies(client: Client, topic: str) -> list[bytes]:
    out: list[bytes] = []
    position = 1
    while True:
        result = client.fetch(topic, position, max_messages=10_000)
        if not result.messages:
            return out
        out += [m.body for m in result.messages]
        position = result.messages[-1].id + 1


@pytest.mark.parametrize("topic", ["idem.strong", "weak.idem", "mem.idem"])
def test_a_batch_sent_again_is_stored_once(start_broker: BrokerFactory, topic: str) -> None:
    broker = start_broker(topics=RULES)
    with Client(broker.endpoint, curve=False) as client:
        client.subscribe(topic)
        first = client.publish_batch(batch(topic, 0, 10), producer="p", sequence=0)
        again = client.publish_batch(batch(topic, 0, 10), producer="p", sequence=0)
        overlapping = client.publish_batch(batch(topic, 5, 10), producer="p", sequence=5)
        other = client.publish_batch(batch(topic, 0, 3), producer="q", sequence=0)
        received = [client.receive(timeout=2) for _ in range(18)]
        assert client.receive(timeout=0.2) is None
        stored = bodies(client, topic) if not topic.startswith("mem.") else None
    assert (first["COUNT"], first["DUPLICATES"]) == ("10", "0")
    assert (again["COUNT"], again["DUPLICATES"]) == ("0", "10")
    assert "MESSAGE-ID" not in again, "nothing stored: no id to name"
    assert (overlapping["COUNT"], overlapping["DUPLICATES"]) == ("5", "5")
    assert overlapping["MESSAGE-ID"] == "15"
    assert (other["COUNT"], other["DUPLICATES"]) == ("3", "0"), "sequences are per producer"
    expected = [b"m%d" % n for n in range(15)] + [b"m0", b"m1", b"m2"]
    assert [m.body for m in received if m is not None] == expected, "subscribers see each entry once"
    if stored is not None:
        assert stored == expected


def test_a_batch_that_would_leave_a_gap_is_refused_whole(dealer: DealerFactory,
                                                         start_broker: BrokerFactory) -> None:
    broker = start_broker(topics=RULES)
    peer = dealer(broker.endpoint)
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch(batch("idem.gap", 0, 10), producer="p", sequence=0)
        with pytest.raises(ConnectorError, match=r"out of sequence.*up to 9.*begins at 11.*numbered from 10"):
            client.publish_batch(batch("idem.gap", 11, 5), producer="p", sequence=11)
        assert bodies(client, "idem.gap") == [b"m%d" % n for n in range(10)], "nothing of it stored"
        follows = client.publish_batch(batch("idem.gap", 10, 6), producer="p", sequence=10)
        assert (follows["COUNT"], follows["DUPLICATES"]) == ("6", "0")
        stranger = client.publish_batch(batch("idem.gap", 500, 2), producer="q", sequence=500)
        assert stranger["COUNT"] == "2", "a producer the topic does not know begins anywhere"
    import msgpack

    peer.send("PUTS", "PRODUCER", "p", "SEQUENCE", 40, "ID", "raw", "",
              msgpack.packb([(b"idem.gap", b"x")], use_bin_type=True))
    reply = peer.recv()
    assert (reply.verb, reply.header("ID")) == (b"ERROR", b"raw")
    assert b"send the batch numbered from 16 first" in (reply.header("MESSAGE") or b"")


@pytest.mark.timeout(30)
def test_a_batch_refused_by_a_full_disk_is_stored_when_sent_again_though_the_next_one_came_first(
    start_broker: BrokerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Batch 2 is refused (its write fails: a full disk), batch 3 arrives after the disk has room. Were batch
    3 stored, the producer's highest number would be past batch 2's, and batch 2 sent again would be skipped
    as stored: lost. Batch 3 is refused instead, and both sent again land once, in order."""
    broker = start_broker(topics=RULES, data_dir=tmp_path / "data")
    topic = "idem.full"
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch(batch(topic, 0, 10), producer="spark", sequence=0)
        with failing_writes(monkeypatch, "/" + directory_name(topic.encode()) + "/"), \
                pytest.raises(ConnectorError, match="not stored"):
            client.publish_batch(batch(topic, 10, 10), producer="spark", sequence=10)
        with pytest.raises(ConnectorError, match="out of sequence"):
            client.publish_batch(batch(topic, 20, 10), producer="spark", sequence=20)
        again = client.publish_batch(batch(topic, 10, 10), producer="spark", sequence=10)
        after = client.publish_batch(batch(topic, 20, 10), producer="spark", sequence=20)
        assert (again["COUNT"], again["DUPLICATES"], after["COUNT"]) == ("10", "0", "10")
        assert bodies(client, topic) == [b"m%d" % n for n in range(30)], "every entry once, in order"


def test_the_window_survives_a_restart(start_broker: BrokerFactory, tmp_path: Path) -> None:
    broker = start_broker(topics=RULES, data_dir=tmp_path / "data")
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch(batch("idem.r", 0, 50), producer="p", sequence=100)
    broker.stop()
    time.sleep(0.5)
    again = start_broker(topics=RULES, data_dir=tmp_path / "data")
    with Client(again.endpoint, curve=False) as client:
        reply = client.publish_batch(batch("idem.r", 0, 60), producer="p", sequence=100)
        assert (reply["COUNT"], reply["DUPLICATES"]) == ("10", "50")
        assert bodies(client, "idem.r") == [b"m%d" % n for n in range(60)]


def test_an_idempotent_batch_is_refused_when_it_is_malformed(dealer: DealerFactory,
                                                             start_broker: BrokerFactory) -> None:
    broker = start_broker(topics=RULES)
    peer = dealer(broker.endpoint)
    import msgpack

    payload = msgpack.packb([(b"a", b"1"), (b"b", b"2")], use_bin_type=True)
    peer.send("PUTS", "PRODUCER", "p", "SEQUENCE", 0, "ID", "x", "", payload)
    assert b"one topic" in peer.recv().headers[b"MESSAGE"]
    peer.send("PUTS", "PRODUCER", "p", "ID", "y", "", payload)
    assert b"together" in peer.recv().headers[b"MESSAGE"]
    peer.send("PUTS", "PRODUCER", "p" * 256, "SEQUENCE", 1, "ID", "z", "", payload)
    assert b"255" in peer.recv().headers[b"MESSAGE"]
    with Client(broker.endpoint, curve=False) as client, pytest.raises(ValueError, match="one topic"):
        client.publish_batch(batch("a", 0, 1) + batch("b", 0, 1), producer="p", sequence=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", ["strong", "weak"])
def test_a_batch_stored_by_a_broker_killed_before_its_answer_arrived_is_not_stored_again(
    broker_process: Callable[[str], BrokerProcess], sync: str  # noqa: F811 - the imported fixture
) -> None:
    """The publisher sends a batch and never hears the answer: the broker stored it (another client sees
    it) and is killed (SIGKILL) before the publisher read its OK. Restarted, the same batch again: all of it
    duplicates, nothing stored twice, and the next batch goes on from there."""
    broker = broker_process(sync)
    broker.start()
    endpoint = f"tcp://127.0.0.1:{broker.port}"
    topic = "crash.idem"
    publisher = broker.connected()  # a raw DEALER: it sends, and leaves the OK unread
    publisher.send_multipart(mc0.encode(mc0.Puts(
        [(topic.encode(), b"m%d" % n, {}) for n in range(300)], b"lost", producer=b"spark", sequence=0)))
    with Client(endpoint, curve=False, timeout=5) as observer:
        deadline = time.monotonic() + 10
        while observer.fetch(topic, max_messages=0).next_id < 301 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert broker.process is not None
    broker.process.send_signal(signal.SIGKILL)
    broker.process.wait(10)
    publisher.close()
    broker.start()
    with Client(endpoint, curve=False, timeout=10) as client:
        retry = client.publish_batch(batch(topic, 0, 300), producer="spark", sequence=0)
        after = client.publish_batch(batch(topic, 300, 10), producer="spark", sequence=300)
        assert (retry["COUNT"], retry["DUPLICATES"]) == ("0", "300")
        assert (after["COUNT"], after["DUPLICATES"]) == ("10", "0")
        assert bodies(client, topic) == [b"m%d" % n for n in range(310)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", ["strong", "weak"])
def test_batches_retried_after_random_kills_land_exactly_once_in_order(
    broker_process: Callable[[str], BrokerProcess], sync: str  # noqa: F811 - the imported fixture
) -> None:
    """SIGKILL at random moments while batches are in flight, restart, send every unanswered batch again:
    every entry exactly once, in order."""
    broker = broker_process(sync)
    broker.start()
    endpoint = f"tcp://127.0.0.1:{broker.port}"
    topic, size, rounds = "crash.idem", 500, 5
    rng = random.Random(18)
    sequence = 0
    for _ in range(rounds):
        outcome: list[object] = []
        client = Client(endpoint, curve=False, timeout=1.5, ttl=None)
        try:
            def publish(client: Client = client, first: int = sequence, out: list[object] = outcome) -> None:
                try:
                    for offset in range(0, 4 * size, size):
                        out.append(client.publish_batch(batch(topic, first + offset, size), producer="spark",
                                                        sequence=first + offset))
                except ConnectorError as error:
                    out.append(error)

            sender = threading.Thread(target=publish)
            sender.start()
            time.sleep(rng.uniform(0.0, 0.05))
            assert broker.process is not None
            broker.process.send_signal(signal.SIGKILL)
            broker.process.wait(10)
            sender.join(30)
        finally:
            client.close(timeout=0.1)  # the broker that would answer DISCONNECT is dead
        confirmed = sum(1 for item in outcome if isinstance(item, dict))
        broker.start()
        with Client(endpoint, curve=False, timeout=10) as client:
            for offset in range(confirmed * size, 4 * size, size):  # the unconfirmed ones, again
                client.publish_batch(batch(topic, sequence + offset, size), producer="spark",
                                     sequence=sequence + offset)
        sequence += 4 * size
    with Client(endpoint, curve=False, timeout=10) as client:
        assert bodies(client, topic) == [b"m%d" % n for n in range(sequence)], "each entry once, in order"
