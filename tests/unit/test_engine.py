"""The topic engine (broker/engine.py): message and topic ids, broadcast fan-out, round-robin strict rotation
and room, the bounded backlog and pending limits with their drop counters, detach() requeueing, the ready
list, unsubscribe idempotence, persistent topics and the store contract, stats(), and a hypothesis state
machine proving that a round-robin topic (auto-ack and explicit-ack consumers) never loses or duplicates a
message. The engine over logs (replay, catch-up, credit, persistent queues) is in test_engine_durable.py.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from memory_log import MemoryStore

from broker.engine import FIRST_MESSAGE_ID, Engine, EngineError, Message, Subscriber, Subscription
from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicRules, TopicSpec

NOW = 1_700_000_000_000


def queue_engine(max_backlog: int = 10_000) -> Engine:
    """An engine where topics named ``q.*`` are round-robin queues and everything else is broadcast."""
    spec = TopicSpec(delivery=Delivery.ROUND_ROBIN, max_backlog=max_backlog)
    return Engine(TopicRules([TopicRule("q.*", spec)]))


def publish(engine: Engine, topic: bytes, count: int) -> list[Message]:
    return [engine.publish(topic, b"body %d" % n, {}, NOW) for n in range(count)]


def ids(subscriber: Subscriber) -> list[int]:
    return [message.id for message in subscriber.pending]


def backlog_ids(engine: Engine, topic: bytes) -> list[int]:
    return [message.id for message in engine.topics[topic].backlog]


def write_out(engine: Engine, subscriber: Subscriber) -> list[int]:
    """What the shell does after a turn: write every pending delivery and tell the engine; returns the ids."""
    sent, subscriber.pending = subscriber.pending, []
    if sent:
        if subscriber.tracking:
            engine.written(subscriber, sent)
        engine.room_available(subscriber)
    return [message.id for message in sent]


# ------------------------------------------------------------------------------------------------- ids


def test_message_ids_start_at_one_and_increase_per_topic() -> None:
    engine = Engine()
    first = [m.id for m in publish(engine, b"a", 3)]
    second = [m.id for m in publish(engine, b"b", 2)]
    third = [m.id for m in publish(engine, b"a", 2)]
    assert FIRST_MESSAGE_ID == 1
    assert first == [1, 2, 3]
    assert second == [1, 2]
    assert third == [4, 5]


def test_published_message_carries_what_was_given() -> None:
    engine = Engine()
    message = engine.publish(b"t", b"payload", {b"X-a": b"1"}, NOW)
    assert message == Message(b"t", 1, b"payload", {b"X-a": b"1"}, NOW)


def test_topic_ids_are_small_and_stable() -> None:
    engine = Engine()
    subscriber = Subscriber()
    assert engine.topic(b"first").topic_id == 1
    engine.subscribe(subscriber, b"second")
    publish(engine, b"third", 1)
    engine.unsubscribe(subscriber, b"second")
    assert [engine.topic(name).topic_id for name in (b"first", b"second", b"third")] == [1, 2, 3]
    assert engine.topic(b"first") is engine.topic(b"first")
    assert engine.topic(b"fourth").topic_id == 4


def test_empty_topic_name_is_refused() -> None:
    engine = Engine()
    with pytest.raises(EngineError, match="empty"):
        engine.publish(b"", b"x", {}, NOW)
    with pytest.raises(EngineError, match="empty"):
        engine.subscribe(Subscriber(), b"")
    assert engine.topics == {}


def test_topics_take_the_first_matching_rule() -> None:
    engine = queue_engine()
    assert engine.topic(b"q.jobs").round_robin
    assert not engine.topic(b"news").round_robin
    assert engine.topic(b"news").spec == TopicSpec()


# ------------------------------------------------------------------------------------------- broadcast


def test_broadcast_reaches_every_subscriber_including_the_publisher() -> None:
    engine = Engine()
    publisher, other, third = Subscriber("publisher"), Subscriber("other"), Subscriber("third")
    for subscriber in (publisher, other, third):
        engine.subscribe(subscriber, b"news")
    outsider = Subscriber("outsider")
    engine.subscribe(outsider, b"sport")
    message = engine.publish(b"news", b"hello", {}, NOW)
    for subscriber in (publisher, other, third):
        assert subscriber.pending == [message]
    assert outsider.pending == []
    assert engine.topics[b"news"].messages_out == 3


def test_broadcast_keeps_publish_order() -> None:
    engine = Engine()
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"t")
    publish(engine, b"t", 5)
    assert ids(subscriber) == [1, 2, 3, 4, 5]


def test_broadcast_without_subscribers_keeps_nothing() -> None:
    engine = Engine()
    publish(engine, b"t", 3)
    late = Subscriber()
    engine.subscribe(late, b"t")
    assert late.pending == []
    assert len(engine.topics[b"t"].backlog) == 0
    assert engine.topics[b"t"].dropped == 0


def test_subscribing_twice_delivers_once() -> None:
    engine = Engine()
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"t")
    engine.subscribe(subscriber, b"t")
    publish(engine, b"t", 1)
    assert ids(subscriber) == [1]
    assert len(engine.topics[b"t"].subscribers) == 1


def test_pending_limit_bounds_broadcast_and_counts_drops() -> None:
    engine = Engine()
    slow, fast = Subscriber("slow", limit=2), Subscriber("fast", limit=100)
    engine.subscribe(slow, b"t")
    engine.subscribe(fast, b"t")
    publish(engine, b"t", 5)
    assert ids(slow) == [1, 2]
    assert slow.dropped == 3
    assert ids(fast) == [1, 2, 3, 4, 5]
    assert fast.dropped == 0
    topic = engine.topics[b"t"]
    assert topic.dropped == 3
    assert topic.messages_out == 7


# ----------------------------------------------------------------------------------------- round-robin


def test_round_robin_strict_rotation() -> None:
    engine = queue_engine()
    a, b, c = Subscriber("a"), Subscriber("b"), Subscriber("c")
    for subscriber in (a, b, c):
        engine.subscribe(subscriber, b"q.jobs")
    publish(engine, b"q.jobs", 9)
    assert ids(a) == [1, 4, 7]
    assert ids(b) == [2, 5, 8]
    assert ids(c) == [3, 6, 9]
    assert engine.topics[b"q.jobs"].messages_out == 9


def test_round_robin_includes_the_publishers_own_subscriber() -> None:
    engine = queue_engine()
    publisher = Subscriber("publisher")
    engine.subscribe(publisher, b"q.jobs")
    publish(engine, b"q.jobs", 2)
    assert ids(publisher) == [1, 2]


def test_round_robin_skips_subscribers_without_room() -> None:
    engine = queue_engine()
    a, full, c = Subscriber("a"), Subscriber("full", limit=1), Subscriber("c")
    for subscriber in (a, full, c):
        engine.subscribe(subscriber, b"q.jobs")
    publish(engine, b"q.jobs", 6)
    assert ids(a) == [1, 4, 6]
    assert ids(full) == [2]  # got one, then never again while it has no room
    assert ids(c) == [3, 5]
    assert len(full.pending) <= full.limit


def test_round_robin_never_hands_to_a_subscriber_without_room() -> None:
    engine = queue_engine()
    closed = Subscriber("closed", limit=0)
    engine.subscribe(closed, b"q.jobs")
    publish(engine, b"q.jobs", 3)
    assert closed.pending == []
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3]


def test_rotation_survives_a_subscriber_leaving() -> None:
    engine = queue_engine()
    a, b, c = Subscriber("a"), Subscriber("b"), Subscriber("c")
    for subscriber in (a, b, c):
        engine.subscribe(subscriber, b"q.jobs")
    publish(engine, b"q.jobs", 2)  # a gets 1, b gets 2: c is next
    # The shell wrote 1 and 2 out: unsubscribe has nothing of a's left to give back (see the next test).
    assert [write_out(engine, s) for s in (a, b, c)] == [[1], [2], []]
    engine.unsubscribe(a, b"q.jobs")
    publish(engine, b"q.jobs", 3)
    assert ids(c) == [3, 5]
    assert ids(b) == [4]
    assert a.pending == []


def test_unsubscribe_gives_unwritten_round_robin_messages_to_the_next_consumer() -> None:
    engine = queue_engine()
    a, b, c = Subscriber("a"), Subscriber("b"), Subscriber("c")
    for subscriber in (a, b, c):
        engine.subscribe(subscriber, b"q.jobs")
    publish(engine, b"q.jobs", 2)  # a gets 1, b gets 2: c is next
    engine.unsubscribe(a, b"q.jobs")  # 1 was never written to a: withdrawn, and c (next in turn) gets it
    assert a.pending == []
    assert ids(c) == [1]
    assert ids(b) == [2]
    publish(engine, b"q.jobs", 2)  # the rotation goes on after c: b, then c
    assert ids(b) == [2, 3]
    assert ids(c) == [1, 4]
    assert engine.topics[b"q.jobs"].messages_out == 4
    assert backlog_ids(engine, b"q.jobs") == []


def test_unsubscribe_withdraws_unwritten_broadcast_deliveries_of_that_topic_only() -> None:
    engine = Engine()
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"t")
    engine.subscribe(subscriber, b"other")
    publish(engine, b"t", 2)
    publish(engine, b"other", 1)
    publish(engine, b"t", 1)
    engine.unsubscribe(subscriber, b"t")
    assert [(m.topic, m.id) for m in subscriber.pending] == [(b"other", 1)]


def test_rotation_when_the_next_in_line_leaves() -> None:
    engine = queue_engine()
    a, b, c = Subscriber("a"), Subscriber("b"), Subscriber("c")
    for subscriber in (a, b, c):
        engine.subscribe(subscriber, b"q.jobs")
    publish(engine, b"q.jobs", 1)  # a gets 1: b is next
    engine.unsubscribe(b, b"q.jobs")
    publish(engine, b"q.jobs", 3)
    assert ids(c) == [2, 4]
    assert ids(a) == [1, 3]


def test_backlog_holds_messages_until_someone_subscribes() -> None:
    engine = queue_engine()
    publish(engine, b"q.jobs", 4)
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3, 4]
    consumer = Subscriber("consumer", limit=3)
    engine.subscribe(consumer, b"q.jobs")
    assert ids(consumer) == [1, 2, 3]
    assert backlog_ids(engine, b"q.jobs") == [4]


def test_backlog_keeps_order_behind_waiting_messages() -> None:
    engine = queue_engine()
    consumer = Subscriber("consumer", limit=1)
    engine.subscribe(consumer, b"q.jobs")
    publish(engine, b"q.jobs", 3)
    assert ids(consumer) == [1]
    consumer.pending.clear()
    publish(engine, b"q.jobs", 1)  # 4 must wait behind 2 and 3, although the consumer now has room
    assert ids(consumer) == []
    assert backlog_ids(engine, b"q.jobs") == [2, 3, 4]


def test_room_available_drains_the_backlog() -> None:
    engine = queue_engine()
    consumer = Subscriber("consumer", limit=2)
    engine.subscribe(consumer, b"q.jobs")
    engine.subscribe(consumer, b"news")
    publish(engine, b"q.jobs", 5)
    assert ids(consumer) == [1, 2]
    consumer.pending.clear()  # the shell wrote them out
    engine.room_available(consumer)
    assert ids(consumer) == [3, 4]
    consumer.pending.clear()
    engine.room_available(consumer)
    assert ids(consumer) == [5]
    assert backlog_ids(engine, b"q.jobs") == []


def test_room_available_ignores_topics_the_subscriber_left() -> None:
    engine = queue_engine()
    consumer = Subscriber("consumer", limit=1)
    engine.subscribe(consumer, b"q.jobs")
    publish(engine, b"q.jobs", 3)
    engine.unsubscribe(consumer, b"q.jobs")
    # Unsubscribe withdrew 1 (not yet written) and gave it back to the queue, in front of 2 and 3.
    assert consumer.pending == []
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3]
    engine.room_available(consumer)
    assert consumer.pending == []
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3]
    assert engine.topics[b"q.jobs"].messages_out == 0


def test_bounded_backlog_drops_the_oldest_and_counts() -> None:
    engine = queue_engine(max_backlog=3)
    publish(engine, b"q.jobs", 5)
    topic = engine.topics[b"q.jobs"]
    assert backlog_ids(engine, b"q.jobs") == [3, 4, 5]
    assert topic.dropped == 2
    assert topic.messages_in == 5
    assert engine.stats()["q.jobs"]["dropped"] == 2


def test_zero_backlog_drops_everything_nobody_takes() -> None:
    engine = queue_engine(max_backlog=0)
    publish(engine, b"q.jobs", 3)
    assert backlog_ids(engine, b"q.jobs") == []
    assert engine.topics[b"q.jobs"].dropped == 3


# --------------------------------------------------------------------------------------------- detach


def test_detach_removes_every_subscription() -> None:
    engine = queue_engine()
    subscriber = Subscriber()
    for name in (b"a", b"b", b"q.jobs"):
        engine.subscribe(subscriber, name)
    engine.detach(subscriber)
    assert subscriber.topics == {}
    assert subscriber.pending == []
    for name in (b"a", b"b", b"q.jobs"):
        assert subscriber not in engine.topics[name].subscribers
    publish(engine, b"a", 1)
    assert subscriber.pending == []


def test_detach_returns_queued_messages_to_the_front_of_the_backlog() -> None:
    engine = queue_engine()
    dying = Subscriber("dying", limit=3)
    engine.subscribe(dying, b"q.jobs")
    engine.subscribe(dying, b"news")
    publish(engine, b"news", 1)
    publish(engine, b"q.jobs", 4)  # 1, 2 to the consumer (news 1 takes the third place); 3, 4 wait
    assert [(m.topic, m.id) for m in dying.pending] == [(b"news", 1), (b"q.jobs", 1), (b"q.jobs", 2)]
    topic = engine.topics[b"q.jobs"]
    assert topic.messages_out == 2
    engine.detach(dying)
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3, 4]
    assert topic.messages_out == 0
    assert topic.dropped == 0
    # The broadcast delivery is simply gone with the subscriber, never queued.
    assert backlog_ids(engine, b"news") == []
    heir = Subscriber("heir")
    engine.subscribe(heir, b"q.jobs")
    assert ids(heir) == [1, 2, 3, 4]


def test_detach_hands_requeued_messages_to_a_consumer_with_room() -> None:
    engine = queue_engine()
    a, b = Subscriber("a"), Subscriber("b")
    engine.subscribe(a, b"q.jobs")
    engine.subscribe(b, b"q.jobs")
    publish(engine, b"q.jobs", 4)
    assert ids(a) == [1, 3]
    engine.detach(a)
    assert ids(b) == [2, 4, 1, 3]
    assert backlog_ids(engine, b"q.jobs") == []
    assert engine.topics[b"q.jobs"].messages_out == 4


def test_detach_keeps_the_backlog_in_publish_order() -> None:
    engine = queue_engine()
    a, b = Subscriber("a", limit=1), Subscriber("b", limit=1)
    engine.subscribe(a, b"q.jobs")
    engine.subscribe(b, b"q.jobs")
    publish(engine, b"q.jobs", 4)  # a: 1, b: 2, backlog: 3, 4
    engine.detach(a)  # 1 goes back; b is full, so it waits
    engine.detach(b)
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------- ready list


def test_take_ready_lists_each_subscriber_once() -> None:
    engine = Engine()
    a, b, idle = Subscriber("a"), Subscriber("b"), Subscriber("idle")
    engine.subscribe(a, b"t")
    engine.subscribe(b, b"t")
    engine.subscribe(idle, b"other")
    publish(engine, b"t", 3)
    ready = engine.take_ready()
    assert ready == [a, b]
    assert not a.ready
    assert not b.ready
    assert engine.take_ready() == []
    publish(engine, b"t", 1)
    assert engine.take_ready() == [a, b]


def test_requeue_ready_only_when_something_is_pending() -> None:
    engine = Engine()
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"t")
    publish(engine, b"t", 2)
    assert engine.take_ready() == [subscriber]
    engine.requeue_ready(subscriber)
    engine.requeue_ready(subscriber)  # already on the list: not twice
    assert engine.take_ready() == [subscriber]
    subscriber.pending.clear()
    engine.requeue_ready(subscriber)
    assert engine.take_ready() == []


# ------------------------------------------------------------------------------------------ unsubscribe


def test_unsubscribe_is_idempotent() -> None:
    engine = Engine()
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"t")
    assert engine.unsubscribe(subscriber, b"t") is True
    assert engine.unsubscribe(subscriber, b"t") is False
    assert engine.unsubscribe(subscriber, b"never-created") is False
    assert b"never-created" not in engine.topics
    assert subscriber.topics == {}
    publish(engine, b"t", 1)
    assert subscriber.pending == []


# ------------------------------------------------------------------------------------------ persistence


PERSISTENT_RULES = TopicRules([TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT))])


def test_persistent_topic_without_a_store_is_refused() -> None:
    engine = Engine(PERSISTENT_RULES)
    with pytest.raises(EngineError, match="no store"):
        engine.publish(b"log.audit", b"x", {}, NOW)
    with pytest.raises(EngineError, match="no store"):
        engine.subscribe(Subscriber(), b"log.audit")
    assert b"log.audit" not in engine.topics
    engine.publish(b"plain", b"x", {}, NOW)  # transient topics still work
    assert b"plain" in engine.topics


def test_persistent_topic_appends_and_resumes_ids_from_its_log() -> None:
    store = MemoryStore(next_id=41)  # older messages are gone: the log's ids start at 41
    engine = Engine(PERSISTENT_RULES, store)
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"log.audit")
    message = engine.publish(b"log.audit", b"x", {}, NOW)
    log = store.logs[b"log.audit"]
    assert store.specs[b"log.audit"].sync is Sync.STRONG
    assert message.id == 41
    assert log.appended == [message]
    assert subscriber.pending == [message]
    assert engine.commit() == 1
    assert log.committed_ids == [41]
    stats = engine.stats()["log.audit"]
    assert stats["sync"] == "strong"
    assert (stats["first_id"], stats["last_id"], stats["stored"]) == (41, 41, 1)


def test_persistent_topics_exist_from_the_start_and_ids_continue_where_the_log_ends() -> None:
    store = MemoryStore()
    first = Engine(PERSISTENT_RULES, store)
    publish(first, b"log.audit", 3)
    first.close()
    assert store.closed
    again = Engine(PERSISTENT_RULES, store)  # a restart: the store lists the topic, the engine opens it
    assert list(again.topics) == [b"log.audit"]
    assert again.publish(b"log.audit", b"x", {}, NOW).id == 4


def test_subscriber_topics_map_names_to_subscriptions() -> None:
    engine = Engine()
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"a", credit=5)
    engine.subscribe(subscriber, b"b", explicit_acks=True)
    assert list(subscriber.topics) == [b"a", b"b"]
    a, b = subscriber.topics[b"a"], subscriber.topics[b"b"]
    assert isinstance(a, Subscription)
    assert (a.topic.name, a.credit, a.explicit) == (b"a", 5, False)
    assert (b.topic.name, b.credit, b.explicit) == (b"b", 1000, True)  # DEFAULT_EXPLICIT_CREDIT
    assert a.subscriber is subscriber
    assert subscriber.tracking == 2  # both need written()/ack() to count what is in flight


# ------------------------------------------------------------------------------------------------ stats


def test_stats_describe_every_topic() -> None:
    engine = queue_engine(max_backlog=1)
    subscriber = Subscriber()
    engine.subscribe(subscriber, b"news")
    publish(engine, b"news", 2)
    publish(engine, b"q.jobs", 3)
    not_caught_up = {"lag": 2, "credit": None, "unacked": 0, "catching_up": False}  # 2 pending, unwritten
    assert engine.stats() == {
        "news": {
            "id": 1, "delivery": "broadcast", "persistence": "transient", "subscribers": 1,
            "messages_in": 2, "messages_out": 2, "dropped": 0, "duplicates": 0, "backlog": 0,
            "first_id": None, "last_id": 2, "lag": 2, "consumers": [not_caught_up],
        },
        "q.jobs": {
            "id": 2, "delivery": "round-robin", "persistence": "transient", "max_backlog": 1,
            "subscribers": 0, "messages_in": 3, "messages_out": 0, "dropped": 2, "duplicates": 0,
            "backlog": 1, "first_id": None, "last_id": 3, "lag": 0, "consumers": [],
        },
    }
    write_out(engine, subscriber)
    assert engine.stats()["news"]["lag"] == 0


def test_stats_of_a_persistent_topic_report_its_log() -> None:
    store = MemoryStore()
    engine = Engine(PERSISTENT_RULES, store)
    reader = Subscriber("reader")
    engine.subscribe(reader, b"log.audit", credit=10)
    engine.publish(b"log.audit", b"abc", {}, NOW)
    engine.publish(b"log.audit", b"de", {}, NOW)
    engine.commit()
    engine.sync()
    assert engine.stats()["log.audit"] == {
        "id": 1, "delivery": "broadcast", "persistence": "persistent", "sync": "strong",
        "segment_bytes": 64 << 20, "subscribers": 1, "messages_in": 2, "messages_out": 2, "dropped": 0,
        "duplicates": 0, "backlog": 0, "first_id": 1, "last_id": 2, "lag": 2,
        "consumers": [{"lag": 2, "credit": 10, "unacked": 0, "catching_up": False}],
        "stored": 2, "bytes": 5, "segments": 1, "fsyncs": 2,  # one for the strong commit, one for sync()
        "write_failures": 0,
    }


# ------------------------------------------------------------------------- round-robin conservation


class RoundRobinConservation(RuleBasedStateMachine):
    """Random subscribe/unsubscribe/publish/drain/ack/detach on one queue: every message accounted for once.

    Subscribers 0 and 1 auto-ack (a message is done once written); subscriber 2 acks explicitly with a credit
    of two, so what it was written stays in flight until acked and goes back to the queue if it leaves first.
    """

    TOPIC = b"q.work"
    LIMITS = (1, 2, 3)  # small, so that "no room" and the backlog happen often
    EXPLICIT = 2
    CREDIT = 2

    def __init__(self) -> None:
        super().__init__()
        self.max_backlog = 6
        self.engine = queue_engine(max_backlog=self.max_backlog)
        self.subscribers = [Subscriber(n, limit=limit) for n, limit in enumerate(self.LIMITS)]
        self.done: list[int] = []  # ids written to an auto-ack consumer, or acked by the explicit one
        self.published = 0

    @rule(n=st.integers(0, 2))
    def subscribe(self, n: int) -> None:
        if n == self.EXPLICIT:
            self.engine.subscribe(self.subscribers[n], self.TOPIC, credit=self.CREDIT, explicit_acks=True)
        else:
            self.engine.subscribe(self.subscribers[n], self.TOPIC)

    @rule(n=st.integers(0, 2))
    def unsubscribe(self, n: int) -> None:
        self.engine.unsubscribe(self.subscribers[n], self.TOPIC)

    @rule(count=st.integers(1, 4))
    def publish(self, count: int) -> None:
        for _ in range(count):
            self.engine.publish(self.TOPIC, b"", {}, NOW)
            self.published += 1

    @rule(n=st.integers(0, 2), keep=st.integers(0, 2))
    def write_out(self, n: int, keep: int) -> None:
        """The shell writes out all but ``keep`` of one subscriber's pending deliveries."""
        subscriber = self.subscribers[n]
        sent = max(0, len(subscriber.pending) - keep)
        if n != self.EXPLICIT:
            self.done += [m.id for m in subscriber.pending[:sent]]
        subscriber.pending = subscriber.pending[sent:]
        if sent:
            self.engine.room_available(subscriber)

    @precondition(lambda self: self.TOPIC in self.subscribers[self.EXPLICIT].topics)
    @rule(count=st.integers(1, 2), unknown=st.booleans())
    def ack(self, count: int, unknown: bool) -> None:
        """The explicit consumer acks some of what it was written (and maybe an id it never had)."""
        subscriber = self.subscribers[self.EXPLICIT]
        pending = {m.id for m in subscriber.pending}
        received = [i for i in subscriber.topics[self.TOPIC].unacked if i not in pending][:count]
        stray = [self.published + 100] if unknown else []
        assert self.engine.ack(subscriber, self.TOPIC, received + stray) == stray
        self.done += received

    @rule()
    def take_ready(self) -> None:
        ready = self.engine.take_ready()
        assert len({id(s) for s in ready}) == len(ready)
        assert not any(s.ready for s in ready)

    @precondition(lambda self: any(s.topics for s in self.subscribers))
    @rule(n=st.integers(0, 2))
    def detach(self, n: int) -> None:
        self.engine.detach(self.subscribers[n])

    @invariant()
    def every_message_once(self) -> None:
        topic = self.engine.topic(self.TOPIC)
        explicit = self.subscribers[self.EXPLICIT]
        subscription = explicit.topics.get(self.TOPIC)
        in_flight = list(subscription.unacked) if subscription is not None else []
        # The explicit consumer's pending deliveries are part of what it has in flight.
        assert {m.id for m in explicit.pending} <= set(in_flight)
        pending = [m.id for s in self.subscribers if s is not explicit for m in s.pending]
        backlog = [m.id for m in topic.backlog]
        held = self.done + pending + in_flight + backlog
        assert len(held) == len(set(held)), "a message was duplicated"
        assert len(held) + topic.dropped == self.published, "a message was lost"
        assert set(held) <= set(range(1, self.published + 1))

    @invariant()
    def never_over_the_limits(self) -> None:
        for subscriber in self.subscribers:
            assert len(subscriber.pending) <= subscriber.limit
        subscription = self.subscribers[self.EXPLICIT].topics.get(self.TOPIC)
        if subscription is not None:
            assert len(subscription.unacked) == subscription.outstanding <= self.CREDIT

    @invariant()
    def backlog_in_publish_order(self) -> None:
        backlog = [m.id for m in self.engine.topic(self.TOPIC).backlog]
        assert backlog == sorted(backlog)

    @invariant()
    def backlog_waits_only_while_nobody_has_room(self) -> None:
        topic = self.engine.topic(self.TOPIC)
        if topic.backlog:
            assert not any(subscription.room > 0 for subscription in topic.subscriptions)


RoundRobinConservation.TestCase.settings = settings(
    max_examples=120, stateful_step_count=30, deadline=None
)
TestRoundRobinConservation = RoundRobinConservation.TestCase


def test_a_backlog_overfilled_by_detach_shrinks_back_to_its_bound_on_the_next_publish() -> None:
    engine = queue_engine(max_backlog=3)
    dying = Subscriber("dying", limit=3)
    engine.subscribe(dying, b"q.jobs")
    publish(engine, b"q.jobs", 6)  # 1-3 handed out, 4-6 wait: the backlog is full
    engine.detach(dying)  # 1-3 come back: six waiting, over the bound of three
    assert backlog_ids(engine, b"q.jobs") == [1, 2, 3, 4, 5, 6]
    publish(engine, b"q.jobs", 1)
    assert backlog_ids(engine, b"q.jobs") == [5, 6, 7]
    assert engine.topics[b"q.jobs"].dropped == 4


def test_a_batch_naming_a_refused_topic_publishes_nothing() -> None:
    spec = TopicSpec(persistence=Persistence.PERSISTENT)
    engine = Engine(TopicRules([TopicRule("p.*", spec)]))
    listener = Subscriber("listener")
    engine.subscribe(listener, b"plain")
    with pytest.raises(EngineError):
        engine.publish_batch([(b"plain", b"first", {}), (b"p.refused", b"second", {})], NOW)
    assert listener.pending == []
    assert engine.topics[b"plain"].messages_in == 0


def test_set_credit_opens_and_closes_a_queue_consumer_while_it_runs() -> None:
    engine = Engine(TopicRules([TopicRule("q", TopicSpec(delivery=Delivery.ROUND_ROBIN))]))
    subscriber = Subscriber("demand", limit=1000)
    engine.subscribe(subscriber, b"q", credit=0)
    for n in range(5):
        engine.publish(b"q", b"%d" % n, {}, 0)
    assert subscriber.pending == [], "no credit, nothing handed out: the queue keeps them"
    engine.set_credit(subscriber, b"q", 2)
    engine.take_ready()
    assert [m.body for m in subscriber.pending] == [b"0", b"1"]
    written, subscriber.pending = subscriber.pending, []
    engine.set_credit(subscriber, b"q", 0)  # the two written used the demand up
    engine.written(subscriber, written)
    engine.room_available(subscriber)
    assert subscriber.pending == []
    engine.set_credit(subscriber, b"q", None)
    assert [m.body for m in subscriber.pending] == [b"2", b"3", b"4"]


def test_a_fixed_size_topic_refuses_other_sizes_and_a_batch_is_refused_whole() -> None:
    engine = Engine(TopicRules([TopicRule("ticks", TopicSpec(element_size=8))]))
    subscriber = Subscriber("s")
    engine.subscribe(subscriber, b"ticks")
    engine.publish(b"ticks", b"12345678", {}, 0)
    with pytest.raises(EngineError, match="exactly 8 bytes, not 3"):
        engine.publish(b"ticks", b"123", {}, 0)
    with pytest.raises(EngineError, match="exactly 8 bytes"):
        engine.publish_batch([(b"other", b"x", {}), (b"ticks", b"87654321", {}), (b"ticks", b"9", {})], 0)
    assert [m.body for m in subscriber.pending] == [b"12345678"], "nothing of the refused batch went out"
    assert engine.topics[b"ticks"].next_id == 2
