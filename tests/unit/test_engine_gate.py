"""A cluster leader's gate on a topic (Engine.gate / Engine.release): subscribers, queues and FETCH see only
what a majority holds; a replica's read sees everything the leader committed. Pure engine, a memory store."""

from __future__ import annotations

from memory_log import MemoryStore

from broker.engine import Engine, Subscriber
from broker.topics import Delivery, Persistence, TopicRule, TopicRules, TopicSpec

NOW = 1_700_000_000_000
RULES = TopicRules([TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT)),
                    TopicRule("q.*", TopicSpec(delivery=Delivery.ROUND_ROBIN,
                                               persistence=Persistence.PERSISTENT))])


def turn(engine: Engine) -> None:
    engine.commit()
    engine.pump()
    engine.take_ready()


def gated(name: bytes) -> Engine:
    engine = Engine(RULES, MemoryStore())
    engine.gate(engine.topic(name), 1)
    return engine


def test_subscribers_get_only_what_the_gate_lets_through() -> None:
    engine = gated(b"log.a")
    live, replaying = Subscriber(), Subscriber()
    engine.subscribe(live, b"log.a")
    for n in range(5):
        engine.publish(b"log.a", b"%d" % n, {}, NOW)
    turn(engine)
    assert live.pending == []  # on the leader only: nobody sees it
    assert engine.release(b"log.a", 4)
    turn(engine)
    assert [message.id for message in live.pending] == [1, 2, 3]
    engine.subscribe(replaying, b"log.a", replay="beginning")
    assert not engine.release(b"log.a", 3)  # never down
    engine.release(b"log.a", 6)
    turn(engine)
    assert [message.id for message in live.pending] == [1, 2, 3, 4, 5]
    assert [message.id for message in replaying.pending] == [1, 2, 3, 4, 5]
    assert engine.committed == [b"log.a"]  # a waiting FETCH on it is answered after this commit


def test_a_queue_hands_out_only_what_the_gate_lets_through() -> None:
    engine = gated(b"q.jobs")
    consumer = Subscriber()
    engine.subscribe(consumer, b"q.jobs")
    for n in range(4):
        engine.publish(b"q.jobs", b"%d" % n, {}, NOW)
    turn(engine)
    assert consumer.pending == []
    engine.release(b"q.jobs", 3)
    turn(engine)
    assert [message.id for message in consumer.pending] == [1, 2]


def test_fetch_stops_at_the_gate_but_a_replica_reads_on() -> None:
    engine = gated(b"log.f")
    for n in range(3):
        engine.publish(b"log.f", b"%d" % n, {}, NOW)
    engine.commit()
    read = engine.read_range(b"log.f", 1, 100, 1 << 20)
    assert (read.next_id, read.messages) == (1, [])
    engine.release(b"log.f", 3)
    assert [message.id for message in engine.read_range(b"log.f", 1, 100, 1 << 20).messages] == [1, 2]
    replica = engine.read_range(b"log.f", 1, 100, 1 << 20, replica=True)
    assert (replica.next_id, [message.id for message in replica.messages]) == (4, [1, 2, 3])


def test_an_ungated_topic_is_untouched() -> None:
    engine = Engine(RULES, MemoryStore())
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"log.plain")
    engine.publish(b"log.plain", b"x", {}, NOW)
    turn(engine)
    assert [message.id for message in subscriber.pending] == [1]
    assert not engine.release(b"log.plain", 5)


def test_write_ahead_lets_a_replica_read_before_the_fsync() -> None:
    engine = gated(b"log.w")
    engine.publish(b"log.w", b"one", {}, NOW)
    assert engine.write_ahead() == [b"log.w"]
    replica = engine.read_range(b"log.w", 1, 100, 1 << 20, replica=True)
    assert [message.id for message in replica.messages] == [1]
    engine.commit()
    assert engine.topics[b"log.w"].committed_id == 2


def test_retention_keeps_what_its_floor_says() -> None:
    """A cluster leader's retention never deletes messages not yet on a majority (its floor is the gate): a
    follower must still find them."""
    engine = Engine(TopicRules([TopicRule("kept.*", TopicSpec(persistence=Persistence.PERSISTENT,
                                                               retention_bytes=1))]), MemoryStore())
    engine.gate(engine.topic(b"kept.a"), 1)
    engine.retention_floor = lambda topic: topic.visible_until  # a cluster's leader's
    for n in range(10):
        engine.publish(b"kept.a", b"m%d" % n, {}, NOW)
    turn(engine)
    log = engine.topics[b"kept.a"].log
    log.retain_from = 9  # type: ignore[union-attr]
    engine.release(b"kept.a", 4)
    assert engine.enforce_retention(NOW) == 1
    assert log.first_id == 4  # type: ignore[union-attr]
    engine.release(b"kept.a", 6)
    engine.retention_floor = None  # no floor (a follower's copy): the gate does not bound it
    assert engine.enforce_retention(NOW) == 1
    assert log.first_id == 9  # type: ignore[union-attr]
