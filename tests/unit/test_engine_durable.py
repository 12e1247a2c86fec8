"""The engine over logs (broker/engine.py over the in-memory store of tests/unit/memory_log.py): replay and
resume, the seam between log catch-up and live delivery (hypothesis), slow subscribers (log fallback on
persistent topics, drops on transient ones), nothing read from a log before commit, credit and explicit acks,
persistent round-robin queues (waiting, rotation, redelivery, auto-ack on write, position across a restart,
hypothesis), transient queues with explicit acks, group commit, durability labels, declare, and retention of
queued messages.

Every test drives the engine as a shell does (publish, commit, pump, write out) and asserts exact ids.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memory_log import MemoryLog, MemoryStore

from broker.engine import Engine, EngineError, Subscriber, Subscription
from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicRules, TopicSpec

NOW = 1_700_000_000_000

LOG = TopicSpec(persistence=Persistence.PERSISTENT)  # broadcast, strong
QUEUE = TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT)
MEMORY_QUEUE = TopicSpec(delivery=Delivery.ROUND_ROBIN)
#: log.* persistent broadcast, q.* persistent round-robin, mq.* transient round-robin, the rest transient.
RULES = TopicRules([TopicRule("log.*", LOG), TopicRule("q.*", QUEUE), TopicRule("mq.*", MEMORY_QUEUE)])


def durable_engine(store: MemoryStore | None = None) -> tuple[Engine, MemoryStore]:
    store = store if store is not None else MemoryStore()
    return Engine(RULES, store), store


def publish(engine: Engine, topic: bytes, count: int) -> list[int]:
    return [engine.publish(topic, b"body %d" % n, {}, NOW).id for n in range(count)]


def ids(subscriber: Subscriber) -> list[int]:
    return [message.id for message in subscriber.pending]


def write_out(engine: Engine, subscriber: Subscriber, count: int | None = None) -> list[int]:
    """The shell writes the first ``count`` (default: all) pending deliveries and tells the engine."""
    pending = subscriber.pending
    sent = pending if count is None else pending[:count]
    subscriber.pending = pending[len(sent):]
    if sent:
        if subscriber.tracking:
            engine.written(subscriber, sent)
        engine.room_available(subscriber)
    return [message.id for message in sent]


def subscription(subscriber: Subscriber, name: bytes) -> Subscription:
    return subscriber.topics[name]


def log_of(store: MemoryStore, name: bytes) -> MemoryLog:
    return store.logs[name]


# ------------------------------------------------------------------------------------------------ replay


@pytest.fixture
def five_committed() -> tuple[Engine, MemoryStore]:
    engine, store = durable_engine()
    assert publish(engine, b"log.t", 5) == [1, 2, 3, 4, 5]
    assert engine.commit() == 1
    return engine, store


def test_replay_from_the_beginning(five_committed: tuple[Engine, MemoryStore]) -> None:
    engine, _ = five_committed
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", replay="beginning")
    assert reader.pending == []  # the log is read by pump(), not by subscribe()
    assert subscription(reader, b"log.t").stats()["catching_up"] is True
    assert engine.pump() == 5
    assert ids(reader) == [1, 2, 3, 4, 5]
    assert subscription(reader, b"log.t").position is None  # caught up: live from now on
    publish(engine, b"log.t", 1)
    assert ids(reader) == [1, 2, 3, 4, 5, 6]


def test_replay_from_an_id_in_the_middle(five_committed: tuple[Engine, MemoryStore]) -> None:
    engine, _ = five_committed
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", replay=3)
    engine.pump()
    assert ids(reader) == [3, 4, 5]


def test_replay_below_the_oldest_stored_id_starts_at_the_oldest(
    five_committed: tuple[Engine, MemoryStore],
) -> None:
    engine, store = five_committed
    log_of(store, b"log.t").drop_before(3)  # retention took 1 and 2
    early, beginning = Subscriber("early"), Subscriber("beginning")
    engine.subscribe(early, b"log.t", replay=1)
    engine.subscribe(beginning, b"log.t", replay="beginning")
    assert subscription(early, b"log.t").position == 3  # clamped on subscribe, not on read
    engine.pump()
    assert ids(early) == [3, 4, 5]
    assert ids(beginning) == [3, 4, 5]


@pytest.mark.parametrize("replay", [6, 99, "current"])
def test_replay_past_the_end_or_current_is_live(
    five_committed: tuple[Engine, MemoryStore], replay: int | str
) -> None:
    engine, _ = five_committed
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", replay=replay)
    assert subscription(reader, b"log.t").position is None
    assert engine.pump() == 0
    assert reader.pending == []
    publish(engine, b"log.t", 2)
    assert ids(reader) == [6, 7]


def test_resume_on_a_persistent_topic_continues_from_the_id_asked(
    five_committed: tuple[Engine, MemoryStore],
) -> None:
    engine, _ = five_committed
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", resume=4)
    engine.pump()
    assert ids(reader) == [4, 5]


def test_replay_on_a_transient_topic_is_refused() -> None:
    engine, _ = durable_engine()
    publish(engine, b"plain", 2)
    reader = Subscriber("reader")
    with pytest.raises(EngineError, match="transient"):
        engine.check_subscribe(b"plain", "beginning")
    with pytest.raises(EngineError, match="transient"):
        engine.subscribe(reader, b"plain", replay=1)
    assert reader.topics == {}  # refused whole: no subscription was made
    assert engine.topics[b"plain"].subscriptions == []


def test_replay_on_a_round_robin_topic_is_refused() -> None:
    engine, _ = durable_engine()
    publish(engine, b"q.jobs", 2)
    engine.commit()
    consumer = Subscriber("consumer")
    with pytest.raises(EngineError, match="round-robin"):
        engine.subscribe(consumer, b"q.jobs", replay="beginning")
    with pytest.raises(EngineError, match="round-robin"):
        engine.subscribe(consumer, b"mq.jobs", replay=1)
    assert consumer.topics == {}
    assert engine.pump() == 0
    assert consumer.pending == []


def test_resume_on_a_transient_topic_is_live_without_error() -> None:
    engine, _ = durable_engine()
    publish(engine, b"plain", 3)
    reader = Subscriber("reader")
    engine.subscribe(reader, b"plain", resume=2)
    assert subscription(reader, b"plain").position is None
    assert engine.pump() == 0
    assert reader.pending == []
    publish(engine, b"plain", 1)
    assert ids(reader) == [4]


# ------------------------------------------------------------------------------------ the seam (catch-up)


def test_replay_while_publishing_continues_has_no_gap_and_no_duplicate() -> None:
    engine, _ = durable_engine()
    publish(engine, b"log.t", 20)
    engine.commit()
    reader = Subscriber("reader", limit=4)
    engine.subscribe(reader, b"log.t", replay="beginning")
    delivered: list[int] = []
    for _ in range(40):  # two messages in, at most four out per turn: it catches up after about 20 turns
        publish(engine, b"log.t", 2)
        engine.commit()
        engine.pump()
        delivered += write_out(engine, reader)
    for _ in range(10):  # publishing stopped: the rest drains
        engine.commit()
        engine.pump()
        delivered += write_out(engine, reader)
    assert delivered == list(range(1, 101))
    assert subscription(reader, b"log.t").position is None  # it went live at some point
    assert reader.dropped == 0
    assert engine.topics[b"log.t"].dropped == 0


class _Seam:
    """Drives one persistent broadcast topic through a random interleaving of what a shell does."""

    TOPIC = b"log.seam"

    def __init__(self) -> None:
        self.engine, self.store = durable_engine()
        live = Subscriber("live", limit=3)
        credited = Subscriber("credited", limit=4)
        late = Subscriber("late", limit=2)  # joins later, replaying from the beginning
        self.engine.subscribe(live, self.TOPIC)
        self.engine.subscribe(credited, self.TOPIC, credit=2)
        self.subscribers = [live, credited, late]
        self.joined = [True, True, False]
        self.written: list[list[int]] = [[], [], []]
        self.published = 0

    def apply(self, operation: tuple[str, int, int]) -> None:
        kind, n, count = operation
        engine = self.engine
        if kind == "publish":
            for _ in range(count):
                engine.publish(self.TOPIC, b"m", {}, NOW)
                self.published += 1
        elif kind == "commit":
            engine.commit()
        elif kind == "pump":
            engine.pump(budget=count)
        elif kind == "write":
            self.written[n] += write_out(engine, self.subscribers[n], count)
        elif kind == "join" and not self.joined[2]:
            engine.subscribe(self.subscribers[2], self.TOPIC, replay="beginning")
            self.joined[2] = True
        self.check()

    def check(self) -> None:
        for subscriber, written in zip(self.subscribers, self.written, strict=True):
            assert len(subscriber.pending) <= subscriber.limit
            seen = written + ids(subscriber)
            # In order, no gap, no duplicate, at every moment, not just at the end.
            assert seen == list(range(1, len(seen) + 1)), f"{subscriber!r}: {seen}"
        credited = self.subscribers[1]
        assert len(credited.pending) <= 2
        assert subscription(credited, self.TOPIC).outstanding == len(credited.pending)

    def drain(self) -> None:
        if not self.joined[2]:
            self.apply(("join", 2, 0))
        for _ in range(self.published + 10):
            self.apply(("commit", 0, 0))
            self.apply(("pump", 0, 1000))
            for n in range(3):
                self.apply(("write", n, 1000))


_operations = st.one_of(
    st.tuples(st.just("publish"), st.just(0), st.integers(1, 6)),
    st.tuples(st.just("commit"), st.just(0), st.just(0)),
    st.tuples(st.just("pump"), st.just(0), st.integers(1, 8)),
    st.tuples(st.just("write"), st.integers(0, 2), st.integers(0, 4)),
    st.tuples(st.just("join"), st.just(2), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_operations, max_size=40))
def test_every_subscriber_of_a_persistent_topic_gets_every_id_once_in_order(
    operations: list[tuple[str, int, int]],
) -> None:
    seam = _Seam()
    for operation in operations:
        seam.apply(operation)
    seam.drain()
    everything = list(range(1, seam.published + 1))
    assert seam.written == [everything, everything, everything]
    for subscriber in seam.subscribers:
        assert subscriber.dropped == 0
    assert seam.engine.topics[seam.TOPIC].dropped == 0


# ------------------------------------------------------------------------------------- slow subscribers


def test_a_slow_subscriber_of_a_persistent_topic_falls_back_to_the_log_and_catches_up() -> None:
    engine, _ = durable_engine()
    slow, fast = Subscriber("slow", limit=5), Subscriber("fast")
    engine.subscribe(slow, b"log.t")
    engine.subscribe(fast, b"log.t")
    publish(engine, b"log.t", 12)
    engine.commit()
    assert ids(slow) == [1, 2, 3, 4, 5]
    assert ids(fast) == list(range(1, 13))
    stats = engine.stats()["log.t"]
    assert stats["consumers"][0] == {"lag": 12, "credit": None, "unacked": 0, "catching_up": True}
    assert stats["lag"] == 12
    assert engine.pump() == 0  # no room yet
    assert write_out(engine, slow) == [1, 2, 3, 4, 5]
    assert engine.pump() == 5
    assert write_out(engine, slow) == [6, 7, 8, 9, 10]
    assert engine.pump() == 2
    assert ids(slow) == [11, 12]
    assert subscription(slow, b"log.t").position is None  # live again
    publish(engine, b"log.t", 1)
    assert ids(slow) == [11, 12, 13]
    assert slow.dropped == 0
    assert engine.stats()["log.t"]["dropped"] == 0


def test_a_slow_subscriber_of_a_transient_topic_loses_the_overflow_and_it_is_counted() -> None:
    engine, _ = durable_engine()
    slow = Subscriber("slow", limit=5)
    engine.subscribe(slow, b"plain")
    publish(engine, b"plain", 12)
    assert ids(slow) == [1, 2, 3, 4, 5]
    assert slow.dropped == 7
    assert engine.topics[b"plain"].dropped == 7
    assert engine.stats()["plain"]["dropped"] == 7
    write_out(engine, slow)
    assert engine.pump() == 0
    assert slow.pending == []  # nothing comes back: it is gone
    publish(engine, b"plain", 1)
    assert ids(slow) == [13]


# -------------------------------------------------------------------------------- nothing before commit


def test_a_log_reader_gets_nothing_before_the_commit() -> None:
    engine, store = durable_engine()
    slow = Subscriber("slow", limit=2)
    engine.subscribe(slow, b"log.t")
    publish(engine, b"log.t", 5)  # 1, 2 live; 3-5 only in the log's buffer
    write_out(engine, slow)
    assert engine.pump() == 0
    assert slow.pending == []
    late = Subscriber("late")
    engine.subscribe(late, b"log.t", replay="beginning")
    assert engine.pump() == 0
    assert late.pending == []
    assert log_of(store, b"log.t").committed_ids == []
    engine.commit()
    assert engine.pump() == 7
    assert ids(slow) == [3, 4]
    assert ids(late) == [1, 2, 3, 4, 5]


def test_a_queue_gets_nothing_from_its_log_before_the_commit() -> None:
    engine, _ = durable_engine()
    publish(engine, b"q.jobs", 3)  # nobody consumes: the messages wait in the (uncommitted) log
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs")
    assert engine.pump() == 0
    assert consumer.pending == []
    engine.commit()
    assert engine.pump() == 3
    assert ids(consumer) == [1, 2, 3]


# ------------------------------------------------------------------------------------------ credit, acks


def test_credit_bounds_what_is_outstanding() -> None:
    engine, _ = durable_engine()
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", credit=3)
    publish(engine, b"log.t", 10)
    engine.commit()
    assert ids(reader) == [1, 2, 3]
    delivered: list[int] = []
    for _ in range(10):
        delivered += write_out(engine, reader, 2)
        engine.pump()
        assert len(reader.pending) <= 3
        assert subscription(reader, b"log.t").outstanding <= 3
    delivered += write_out(engine, reader)
    assert delivered == list(range(1, 11))


def test_explicit_acks_free_credit() -> None:
    engine, _ = durable_engine()
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", credit=3, explicit_acks=True)
    publish(engine, b"log.t", 6)
    engine.commit()
    assert write_out(engine, reader) == [1, 2, 3]
    assert engine.pump() == 0  # written is not acked: the credit is still taken
    assert reader.pending == []
    assert sorted(subscription(reader, b"log.t").unacked) == [1, 2, 3]
    assert engine.ack(reader, b"log.t", [1, 2]) == []
    assert engine.pump() == 2
    assert ids(reader) == [4, 5]
    assert engine.ack(reader, b"log.t", [3, 99, 1]) == [99, 1]  # 99 never sent, 1 already acked
    assert engine.pump() == 1
    assert ids(reader) == [4, 5, 6]
    assert subscription(reader, b"log.t").stats()["unacked"] == 3


def test_ack_needs_a_subscription_with_explicit_acks() -> None:
    engine, _ = durable_engine()
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t", credit=3)
    publish(engine, b"log.t", 1)
    with pytest.raises(EngineError, match="explicit acks"):
        engine.ack(reader, b"log.t", [1])
    with pytest.raises(EngineError, match="explicit acks"):
        engine.ack(reader, b"never", [1])
    assert ids(reader) == [1]


def test_adding_credit_to_a_subscription_counts_what_it_already_holds() -> None:
    engine, _ = durable_engine()
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.t")
    publish(engine, b"log.t", 3)
    engine.subscribe(reader, b"log.t", credit=2)  # three are already pending: over the new credit
    assert subscription(reader, b"log.t").outstanding == 3
    assert write_out(engine, reader) == [1, 2, 3]
    assert subscription(reader, b"log.t").outstanding == 0  # never below zero: that would be extra credit
    publish(engine, b"log.t", 5)
    engine.commit()
    engine.pump()
    assert ids(reader) == [4, 5]


def test_switching_a_queue_consumer_to_explicit_acks_keeps_its_unwritten_messages_in_flight() -> None:
    engine, store = durable_engine()
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs", credit=5)
    publish(engine, b"q.jobs", 2)
    engine.commit()
    engine.subscribe(consumer, b"q.jobs", credit=5, explicit_acks=True)
    assert write_out(engine, consumer) == [1, 2]
    assert sorted(subscription(consumer, b"q.jobs").unacked) == [1, 2]
    assert log_of(store, b"q.jobs").acked == set()  # written under explicit acks: not acked yet
    engine.unsubscribe(consumer, b"q.jobs")
    heir = Subscriber("heir")
    engine.subscribe(heir, b"q.jobs")
    engine.pump()
    assert ids(heir) == [1, 2]  # not lost with the consumer that never acked them


def test_switching_to_auto_ack_acks_what_was_in_flight() -> None:
    engine, store = durable_engine()
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs", credit=2, explicit_acks=True)
    publish(engine, b"q.jobs", 3)
    engine.commit()
    assert write_out(engine, consumer) == [1, 2]
    engine.subscribe(consumer, b"q.jobs", credit=2)
    assert log_of(store, b"q.jobs").acked == {1, 2}
    assert subscription(consumer, b"q.jobs").unacked == {}
    engine.pump()
    assert ids(consumer) == [3]
    write_out(engine, consumer)
    assert log_of(store, b"q.jobs").acked == {1, 2, 3}
    assert subscription(consumer, b"q.jobs").outstanding == 0


# ------------------------------------------------------------------------------- persistent round-robin


def test_a_persistent_queue_keeps_messages_until_a_consumer_comes() -> None:
    engine, store = durable_engine()
    publish(engine, b"q.jobs", 3)
    engine.commit()
    assert engine.stats()["q.jobs"]["backlog"] == 3
    assert engine.pump() == 0
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs")
    assert engine.pump() == 3
    assert ids(consumer) == [1, 2, 3]
    assert engine.stats()["q.jobs"]["backlog"] == 0
    publish(engine, b"q.jobs", 1)  # nothing older waits: straight to the consumer
    assert ids(consumer) == [1, 2, 3, 4]
    assert log_of(store, b"q.jobs").acked == set()  # nothing written yet


def test_a_persistent_queue_rotates_strictly_among_consumers_with_credit() -> None:
    engine, _ = durable_engine()
    a, b, c = Subscriber("a"), Subscriber("b"), Subscriber("c")
    for consumer in (a, b, c):
        engine.subscribe(consumer, b"q.jobs", credit=2)
    publish(engine, b"q.jobs", 9)
    engine.commit()
    assert (ids(a), ids(b), ids(c)) == ([1, 4], [2, 5], [3, 6])
    assert engine.stats()["q.jobs"]["backlog"] == 3
    assert write_out(engine, b) == [2, 5]
    engine.pump()  # a is next in turn but has no credit, nor has c: b gets both it has room for
    assert (ids(a), ids(b), ids(c)) == ([1, 4], [7, 8], [3, 6])
    write_out(engine, a)
    write_out(engine, c)
    engine.pump()  # after b came c: 9 is c's
    assert (ids(a), ids(b), ids(c)) == ([], [7, 8], [9])


def test_an_explicit_consumer_that_leaves_hands_its_unacked_messages_to_the_next() -> None:
    engine, store = durable_engine()
    a, b = Subscriber("a"), Subscriber("b")
    engine.subscribe(a, b"q.jobs", credit=2, explicit_acks=True)
    engine.subscribe(b, b"q.jobs", credit=2, explicit_acks=True)
    publish(engine, b"q.jobs", 4)
    engine.commit()
    assert (write_out(engine, a), write_out(engine, b)) == ([1, 3], [2, 4])
    assert engine.ack(a, b"q.jobs", [1]) == []
    engine.detach(a)  # 3 was written but never acked
    assert engine.pump() == 0  # b has no credit left
    assert engine.ack(b, b"q.jobs", [2]) == []
    assert engine.pump() == 1
    assert ids(b) == [3]
    assert engine.ack(b, b"q.jobs", [3, 4]) == []
    log = log_of(store, b"q.jobs")
    assert log.acked == {1, 2, 3, 4}
    assert log.acked_watermark == 4
    assert engine.stats()["q.jobs"]["backlog"] == 0


def test_a_consumer_unsubscribing_before_its_messages_were_written_gives_each_back_once() -> None:
    engine, _ = durable_engine()
    a, b = Subscriber("a"), Subscriber("b", limit=0)
    engine.subscribe(a, b"q.jobs", explicit_acks=True)
    engine.subscribe(b, b"q.jobs")
    publish(engine, b"q.jobs", 3)
    engine.commit()
    assert ids(a) == [1, 2, 3]
    engine.unsubscribe(a, b"q.jobs")
    assert a.pending == []
    b.limit = 10
    engine.room_available(b)
    engine.pump()
    assert ids(b) == [1, 2, 3]  # each once, although a had them both pending and unacked
    assert engine.pump() == 0


def test_auto_ack_consumers_ack_when_their_messages_are_written() -> None:
    engine, store = durable_engine()
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs")
    assert consumer.tracking == 1  # a persistent queue needs to hear what was written
    publish(engine, b"q.jobs", 3)
    assert engine.commit() == 1
    log = log_of(store, b"q.jobs")
    assert log.acked == set()
    assert write_out(engine, consumer, 2) == [1, 2]
    assert log.acked == {1, 2}
    assert log.dirty
    assert engine.commit() == 1  # the acks are the topic's to commit
    assert (log.commits, log.acks_committed, log.dirty) == (2, 2, False)
    write_out(engine, consumer)
    assert log.acked == {1, 2, 3}
    assert log.acked_watermark == 3


def test_a_persistent_queue_position_survives_a_restart() -> None:
    engine, store = durable_engine()
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs", explicit_acks=True)
    publish(engine, b"q.jobs", 5)
    engine.commit()
    assert write_out(engine, consumer) == [1, 2, 3, 4, 5]
    assert engine.ack(consumer, b"q.jobs", [1, 3]) == []
    engine.close()
    log = log_of(store, b"q.jobs")
    assert (log.acked_watermark, log.acked_above) == (1, {3})
    assert not log.dirty  # close() committed the acks with the messages

    restarted = Engine(RULES, store)
    topic = restarted.topics[b"q.jobs"]
    assert topic.next_dispatch == 2
    assert restarted.stats()["q.jobs"]["backlog"] == 3  # 2, 4, 5
    heir = Subscriber("heir")
    restarted.subscribe(heir, b"q.jobs")
    restarted.pump()
    assert ids(heir) == [2, 4, 5]  # 1 and 3 were acked: not again
    assert restarted.publish(b"q.jobs", b"new", {}, NOW).id == 6
    restarted.commit()
    restarted.pump()
    assert ids(heir) == [2, 4, 5, 6]


_queue_operations = st.one_of(  # (what, consumer, how many)
    st.tuples(st.just("publish"), st.just(0), st.integers(1, 4)),
    st.tuples(st.just("commit"), st.just(0), st.just(0)),
    st.tuples(st.just("pump"), st.just(0), st.integers(1, 6)),
    st.tuples(st.sampled_from(["subscribe", "unsubscribe", "detach"]), st.integers(0, 2), st.just(0)),
    st.tuples(st.sampled_from(["write", "ack"]), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_queue_operations, max_size=40))
def test_a_persistent_queue_hands_out_every_message_until_it_is_done_once(
    operations: list[tuple[str, int, int]],
) -> None:
    """Consumers come, go, die, write and ack, the broker restarts: every message ends up done exactly once,
    and the log's acks are exactly what was done (written to an auto-ack consumer, or acked)."""
    store = MemoryStore()
    engine = Engine(RULES, store)
    consumers = [Subscriber(0, limit=2), Subscriber(1, limit=3), Subscriber(2, limit=2)]
    options = [{}, {"credit": 2, "explicit_acks": True}, {"explicit_acks": True}]
    done: list[int] = []
    published = 0
    for kind, n, count in operations:
        consumer = consumers[n]
        if kind == "publish":
            published += len(publish(engine, b"q.jobs", count))
        elif kind == "commit":
            engine.commit()
        elif kind == "pump":
            engine.pump(budget=count)
        elif kind == "subscribe":
            engine.subscribe(consumer, b"q.jobs", **options[n])
        elif kind == "unsubscribe":
            engine.unsubscribe(consumer, b"q.jobs")
        elif kind == "detach":
            engine.detach(consumer)
        elif kind == "write":
            sent = write_out(engine, consumer, count)
            if not options[n]:
                done += sent
        elif kind == "ack" and b"q.jobs" in consumer.topics and options[n]:
            held = {message.id for message in consumer.pending}
            received = [i for i in consumer.topics[b"q.jobs"].unacked if i not in held][:count]
            assert engine.ack(consumer, b"q.jobs", received) == []
            done += received
        elif kind == "restart":  # committed, then every connection is gone with the old broker
            engine.close()
            engine = Engine(RULES, store)
            consumers = [Subscriber(c.owner, limit=c.limit) for c in consumers]
        for c in consumers:
            assert len(c.pending) <= c.limit
        assert len(done) == len(set(done)), "a message was done twice"
        if b"q.jobs" in store.logs:
            assert log_of(store, b"q.jobs").acked == set(done)
    for consumer in consumers:
        engine.detach(consumer)
    engine.commit()
    heir = Subscriber("heir")
    engine.subscribe(heir, b"q.jobs")
    engine.pump()
    rest = ids(heir)
    assert sorted(done + rest) == list(range(1, published + 1)), "a message was lost or duplicated"
    assert engine.topic(b"q.jobs").dropped == 0


# -------------------------------------------------------------------------------- transient round-robin


def test_a_transient_queue_with_explicit_acks_requeues_unacked_in_id_order_on_detach() -> None:
    engine, _ = durable_engine()
    a = Subscriber("a")
    engine.subscribe(a, b"mq.jobs", credit=3, explicit_acks=True)
    publish(engine, b"mq.jobs", 5)
    topic = engine.topics[b"mq.jobs"]
    assert [m.id for m in topic.backlog] == [4, 5]
    assert write_out(engine, a) == [1, 2, 3]
    assert engine.ack(a, b"mq.jobs", [2]) == []
    assert ids(a) == [4]  # the freed credit took the next
    engine.detach(a)  # 1 and 3 written, unacked; 4 pending, unacked
    assert [m.id for m in topic.backlog] == [1, 3, 4, 5]
    heir = Subscriber("heir")
    engine.subscribe(heir, b"mq.jobs")
    assert ids(heir) == [1, 3, 4, 5]


def test_a_transient_explicit_consumer_detached_with_everything_pending_returns_each_once() -> None:
    engine, _ = durable_engine()
    a = Subscriber("a")
    engine.subscribe(a, b"mq.jobs", explicit_acks=True)
    publish(engine, b"mq.jobs", 3)
    engine.detach(a)
    topic = engine.topics[b"mq.jobs"]
    assert [m.id for m in topic.backlog] == [1, 2, 3]
    assert topic.messages_out == 0


# -------------------------------------------------------------------------------------- commit, sync


def test_commit_commits_each_dirty_log_once() -> None:
    rules = TopicRules([TopicRule("weak.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)),
                        *RULES.rules])
    store = MemoryStore()
    engine = Engine(rules, store)
    publish(engine, b"log.a", 3)
    publish(engine, b"weak.b", 2)
    publish(engine, b"log.a", 1)
    publish(engine, b"plain", 4)
    engine.topic(b"log.idle")  # opened, never written to
    assert engine.commit() == 2
    assert (store.logs[b"log.a"].commits, store.logs[b"weak.b"].commits) == (1, 1)
    assert store.logs[b"log.a"].committed_ids == [1, 2, 3, 4]
    assert store.logs[b"log.a"].fsyncs == 1  # strong: one fsync for four messages
    assert store.logs[b"weak.b"].fsyncs == 0
    assert store.logs[b"log.idle"].commits == 0
    assert engine.commit() == 0
    assert store.logs[b"log.a"].commits == 1
    publish(engine, b"plain", 1)
    assert engine.commit() == 0  # transient topics have nothing to commit
    assert engine.sync(Sync.WEAK) == 1
    assert (store.logs[b"weak.b"].syncs, store.logs[b"log.a"].syncs) == (1, 0)
    assert engine.sync() == 3  # every log, the idle one too
    assert engine.stats()["weak.b"]["fsyncs"] == 2


@pytest.mark.parametrize(
    ("spec", "label"),
    [
        (TopicSpec(), b"memory"),
        (TopicSpec(delivery=Delivery.ROUND_ROBIN), b"memory"),
        (TopicSpec(persistence=Persistence.PERSISTENT), b"fsync"),
        (TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG), b"fsync"),
        (TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK), b"written"),
        (TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.ASYNC), b"written"),
    ],
)
def test_durability_label_follows_the_sync_level(spec: TopicSpec, label: bytes) -> None:
    engine = Engine(store=MemoryStore())
    assert engine.declare(b"t", spec).durability == label


# ---------------------------------------------------------------------------------------------- declare


def test_declare_creates_a_topic_and_accepts_the_same_settings_again() -> None:
    engine, store = durable_engine()
    spec = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)
    topic = engine.declare(b"orders", spec)
    assert engine.topics[b"orders"] is topic
    assert topic.spec == spec
    assert store.specs[b"orders"] == spec  # persistent: its log was opened
    assert engine.declare(b"orders", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)) is topic
    with pytest.raises(EngineError, match="other settings"):
        engine.declare(b"orders", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))
    assert engine.topics[b"orders"].spec == spec


def test_declare_against_a_topic_created_by_use_compares_with_its_defaults() -> None:
    engine, _ = durable_engine()
    publish(engine, b"plain", 1)
    assert engine.declare(b"plain", TopicSpec()) is engine.topics[b"plain"]
    with pytest.raises(EngineError, match="other settings"):
        engine.declare(b"plain", TopicSpec(delivery=Delivery.ROUND_ROBIN))


def test_declare_must_agree_with_a_matching_configuration_rule() -> None:
    engine, store = durable_engine()
    with pytest.raises(EngineError, match="other settings"):
        engine.declare(b"q.jobs", TopicSpec(delivery=Delivery.ROUND_ROBIN))  # the rule says persistent
    assert b"q.jobs" not in engine.topics
    assert b"q.jobs" not in store.logs
    assert engine.declare(b"q.jobs", QUEUE).spec == QUEUE


# -------------------------------------------------------------------------------------------- retention


def test_retention_past_a_queues_position_counts_the_lost_messages_as_dropped() -> None:
    spec = TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT, retention_bytes=4096)
    store = MemoryStore()
    engine = Engine(TopicRules([TopicRule("q.*", spec)]), store)
    publish(engine, b"q.jobs", 5)
    engine.commit()
    log = log_of(store, b"q.jobs")
    log.retain_from = 4  # a segment holding 1-3 is past its retention
    assert engine.enforce_retention(NOW) == 1
    assert log.first_id == 4
    engine.pump()
    assert engine.topics[b"q.jobs"].dropped == 3
    assert engine.stats()["q.jobs"]["backlog"] == 2
    consumer = Subscriber("consumer")
    engine.subscribe(consumer, b"q.jobs")
    engine.pump()
    assert ids(consumer) == [4, 5]
    assert engine.stats()["q.jobs"]["dropped"] == 3


def test_topic_ids_of_persistent_topics_survive_a_restart_and_new_ones_never_collide() -> None:
    engine, store = durable_engine()
    engine.topic(b"scratch")  # transient: its id lasts as long as the broker runs
    first = engine.topic(b"log.orders").topic_id
    second = engine.topic(b"log.events").topic_id
    assert len({engine.topic(name).topic_id for name in (b"scratch", b"log.orders", b"log.events")}) == 3
    engine.close()
    restarted, _ = durable_engine(store)
    assert restarted.topics[b"log.orders"].topic_id == first
    assert restarted.topics[b"log.events"].topic_id == second
    newcomer = restarted.topic(b"scratch").topic_id
    assert newcomer > max(first, second), "a new topic takes an id above every recorded one"


def test_a_reader_of_an_identity_no_log_recorded_goes_on_where_the_cluster_says() -> None:
    """A subscriber's RESUME and a FETCH name the log identity they read; one that no log here remembers
    (a cluster epoch whose leader died before writing) is looked up with ``lineage_of``: the reader goes on
    from where the logs part after their shared ancestor instead of from the beginning."""
    engine, _ = durable_engine()
    publish(engine, b"log.a", 20)
    engine.commit()
    log = engine.topics[b"log.a"].log
    assert log is not None
    ancestor = log.identity
    log.identity = ancestor.successor(10)  # this log went on from id 10 in another epoch
    lost = ancestor.successor(15)  # an epoch that began at id 15 and that no log here recorded
    incarnation = lost.incarnation.encode()
    assert engine.resume_point(b"log.a", 18, incarnation) == 1  # unknown: from the beginning
    assert engine.read_range(b"log.a", 18, 5, 1 << 20, known_incarnation=lost.incarnation).start_id == 1
    known = {(b"log.a", lost.incarnation): lost.lineage}
    engine.lineage_of = lambda name, incarnation: known.get((name, incarnation))
    assert engine.resume_point(b"log.a", 18, incarnation) == 10  # epoch 1's messages below 10 are shared
    assert engine.read_range(b"log.a", 18, 5, 1 << 20, known_incarnation=lost.incarnation).start_id == 10
