"""A batch to one persistent topic that nobody reads (a cluster leader's gated topic too) is appended to its
log in one call (``Engine.append_quietly`` over ``SegmentLog.append_batch``): the log holds exactly what
publishing each entry would have stored (same files, across segment rolls, read back after a restart),
idempotent batches skip their duplicates the same way, a subscriber still gets every message, a gated topic's
readers still wait for the majority, a store error part-way keeps what was appended and refuses the rest, and
the log appends a batch only at its own next id."""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_log import MemoryLog, MemoryStore

from broker.engine import Engine, EngineError, Message, Subscriber
from broker.store import LogIdentity, StoreError
from broker.store.files import FileStore, directory_name
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec

NOW = 1_700_000_000_000
TOPIC = b"log.batch"
SMALL = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024)
RULES = TopicRules([TopicRule("log.*", SMALL)])


def entries(count: int, first: int = 0) -> list[tuple[bytes, bytes, dict[bytes, bytes]]]:
    return [(TOPIC, b"body %d " % n + bytes([n % 256]) * (n % 37), {b"N": b"%d" % n} if n % 5 == 0 else {})
            for n in range(first, first + count)]


def stored(root: Path) -> list[Message]:
    engine = Engine(RULES, FileStore(root))
    try:
        log = engine.topics[TOPIC].log
        assert log is not None
        return log.read(1, 1 << 30, 1 << 40)
    finally:
        engine.close()


def test_a_batch_stores_the_same_files_as_one_publish_each(tmp_path: Path) -> None:
    batched, single = tmp_path / "batched", tmp_path / "single"
    engine = Engine(RULES, FileStore(batched))
    last = engine.publish_batch(entries(300), NOW)
    assert last is not None
    assert last.id == 300
    assert engine.topics[TOPIC].next_id == 301
    assert engine.topics[TOPIC].messages_in == 300
    engine.commit()
    engine.close()
    engine = Engine(RULES, FileStore(single))
    for topic, body, headers in entries(300):
        engine.publish(topic, body, headers, NOW)
    engine.commit()
    engine.close()
    files = sorted(path.name for path in (batched / directory_name(TOPIC)).iterdir())
    assert len([name for name in files if name.endswith(".log")]) > 10, "the batch crossed many segments"
    for name in files:
        if name.endswith((".log", ".index")):
            assert (batched / directory_name(TOPIC) / name).read_bytes() == \
                (single / directory_name(TOPIC) / name).read_bytes(), name
    assert [(m.id, m.body, m.headers, m.timestamp) for m in stored(batched)] == \
        [(n + 1, body, headers, NOW) for n, (_, body, headers) in enumerate(entries(300))]


def test_an_idempotent_batch_appends_only_what_is_new(tmp_path: Path) -> None:
    engine = Engine(RULES, FileStore(tmp_path))
    assert engine.publish_idempotent(TOPIC, entries(10), b"p", 0, NOW)[1] == 0
    last, skipped = engine.publish_idempotent(TOPIC, entries(15), b"p", 0, NOW)  # a retry that carries 5 more
    assert skipped == 10
    assert last is not None
    assert last.id == 15
    engine.commit()
    engine.close()
    assert [m.body for m in stored(tmp_path)] == [body for _, body, _ in entries(15)]


def test_a_subscriber_still_gets_every_message() -> None:
    engine = Engine(RULES, MemoryStore())
    subscriber = Subscriber(owner=None, limit=1000)
    engine.subscribe(subscriber, TOPIC)
    engine.publish_batch(entries(20), NOW)
    engine.commit()
    engine.pump(1000)
    assert [m.id for m in subscriber.pending] == list(range(1, 21))


def test_a_gated_topic_takes_a_batch_in_one_call_and_its_readers_still_wait_for_the_majority() -> None:
    engine = Engine(RULES, MemoryStore())
    topic = engine.topic(TOPIC)
    engine.gate(topic, 1)  # a cluster leader's replicated topic
    first, done = engine.append_quietly(topic, entries(20), NOW)
    assert (first, done) == (1, 20), "nobody reads it: the log alone takes the batch"
    assert engine.write_ahead() == [TOPIC]  # the followers can read it while the leader fsyncs
    engine.commit()
    assert engine.read_range(TOPIC, 1, 100, 1 << 20).count == 0, "a reader sees what a majority holds"
    assert engine.read_range(TOPIC, 1, 100, 1 << 20, replica=True).count == 20
    subscriber = Subscriber(owner=None, limit=1000)
    engine.subscribe(subscriber, TOPIC)
    assert engine.append_quietly(topic, entries(5, 20), NOW) == (21, 0), "read now: one by one"
    engine.publish_batch(entries(5, 20), NOW)
    engine.commit()
    engine.pump(1000)
    assert subscriber.pending == []
    engine.release(TOPIC, 26)
    engine.commit()
    engine.pump(1000)
    assert [m.id for m in subscriber.pending] == list(range(21, 26)), "a live subscriber starts at its SUB"


class FailingLog(MemoryLog):
    """A log whose append of one id fails (a segment that cannot be rolled, say)."""

    fail_at = 7

    def append(self, message: Message) -> None:
        if message.id == self.fail_at:
            raise StoreError("cannot roll the segment: disk full")
        super().append(message)


class FailingStore(MemoryStore):
    def open(self, topic: bytes, spec: TopicSpec, topic_id: int | None = None,
             identity: LogIdentity | None = None) -> MemoryLog:
        log = self.logs.get(topic)
        if log is None:
            log = self.logs[topic] = FailingLog(spec, self.next_id)
        return log


def test_a_store_error_part_way_keeps_what_was_appended_and_refuses_the_rest() -> None:
    store = FailingStore()
    engine = Engine(RULES, store)
    with pytest.raises(EngineError, match="disk full"):
        engine.publish_batch(entries(20), NOW)
    topic = engine.topics[TOPIC]
    assert topic.next_id == 7, "ids 1-6 were appended and are the engine's"
    assert [m.id for m in store.logs[TOPIC].messages] == list(range(1, 7))
    FailingLog.fail_at = 0
    try:
        assert engine.publish_batch(entries(3), NOW).id == 9  # type: ignore[union-attr]
    finally:
        FailingLog.fail_at = 7


def test_the_log_appends_a_batch_only_at_its_next_id(tmp_path: Path) -> None:
    log = FileStore(tmp_path).open(TOPIC, SMALL)
    with pytest.raises(StoreError, match="append of id 5, the log expects 1"):
        log.append_batch(5, NOW, entries(3))
    assert log.next_id == 1, "nothing appended"
    assert log.append_batch(1, NOW, entries(40)) == 40
    assert log.next_id == 41
    log.commit()
    assert [m.id for m in log.read(1, 100, 1 << 20)] == list(range(1, 41))
    log.close()
