"""The topic engine: topics, subscriptions, message ids and delivery. Pure: no I/O, no sockets, no clock.

Every door (the mc0 router, the TCP gateways, a Spark fetch) registers a :class:`Subscriber` and calls
:meth:`Engine.publish` / :meth:`Engine.subscribe`. The engine never sends anything: it appends deliveries to
each subscriber's bounded ``pending`` list and remembers which subscribers became ready; the shell takes
:meth:`Engine.take_ready` once per loop wake-up and writes the batches out in its own dialect. That turn of
the loop is the unit of batching for the whole broker.

Delivery rules:

* broadcast: every subscriber of the topic gets every message, the publisher too if it is subscribed;
* round-robin: each message goes to exactly one subscriber, in strict rotation among the subscribers that have
  room; while none has room (or none exists) messages wait in a bounded backlog and overflow is counted.

A subscriber's ``pending`` list is bounded by its ``limit``; what would overflow it on a broadcast topic is
dropped and counted in ``dropped`` (transient topics promise no more than that).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.store import Store, TopicLog
from broker.topics import Delivery, Persistence, TopicRules, TopicSpec

#: Message ids start at 1 so that 0 can mean "nothing seen yet" in offsets and resume points.
FIRST_MESSAGE_ID = 1


def _message_id(message: Message) -> int:
    return message.id


class EngineError(Exception):
    """A request the engine refuses (e.g. a persistent topic without a store); the shell reports it."""


@dataclass(slots=True)
class Message:
    topic: bytes
    id: int
    body: bytes
    headers: dict[bytes, bytes]
    timestamp: int  # milliseconds since the epoch, given by the shell


class Subscriber:
    """Whatever a shell registered: a ZeroMQ identity, a TCP connection, a fetch. The engine sees only this.

    ``owner`` is the shell's own object (the engine never looks at it); ``limit`` bounds ``pending``.
    """

    __slots__ = ("delivered", "dropped", "limit", "owner", "pending", "ready", "topics")

    def __init__(self, owner: Any = None, limit: int = 100_000) -> None:
        self.owner = owner
        self.limit = limit
        self.pending: list[Message] = []
        self.topics: set[bytes] = set()
        self.ready = False  # already in the engine's ready list
        self.delivered = 0
        self.dropped = 0

    @property
    def has_room(self) -> bool:
        return len(self.pending) < self.limit

    def __repr__(self) -> str:
        return f"Subscriber({self.owner!r}, pending={len(self.pending)}, topics={len(self.topics)})"


@dataclass(slots=True)
class Topic:
    name: bytes
    topic_id: int
    spec: TopicSpec
    next_id: int = FIRST_MESSAGE_ID
    log: TopicLog | None = None
    # In subscription order. A list, not a set: round-robin indexes it on every message, while membership is
    # only asked on subscribe and unsubscribe.
    subscribers: list[Subscriber] = field(default_factory=list)
    rotation: int = 0  # round-robin: index of the subscriber that gets the next message
    backlog: deque[Message] = field(default_factory=deque)  # round-robin messages waiting for room
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0
    round_robin: bool = field(init=False)  # derived from spec once: publish() asks on every message

    def __post_init__(self) -> None:
        self.round_robin = self.spec.delivery is Delivery.ROUND_ROBIN

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.topic_id,
            **self.spec.describe(),
            "subscribers": len(self.subscribers),
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "dropped": self.dropped,
            "backlog": len(self.backlog),
            "last_id": self.next_id - 1,
        }


class Engine:
    """One instance per broker, driven by the single loop thread."""

    def __init__(self, rules: TopicRules | None = None, store: Store | None = None) -> None:
        self.rules = rules or TopicRules()
        self.store = store
        self.topics: dict[bytes, Topic] = {}
        self._ready: list[Subscriber] = []

    # ------------------------------------------------------------------------------------------------ topics

    def topic(self, name: bytes) -> Topic:
        """The topic called ``name``, created with the settings its name matches on first use."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self._create(name, self.rules.spec_for(name))
        return topic

    def _create(self, name: bytes, spec: TopicSpec) -> Topic:
        if not name:
            raise EngineError("topic names must not be empty")
        log = None
        if spec.persistence is Persistence.PERSISTENT:
            if self.store is None:
                raise EngineError(f"topic {name!r} is configured persistent but the broker has no store")
            log = self.store.open(name, spec)
        topic = Topic(name, len(self.topics) + 1, spec, log=log)
        if log is not None:
            topic.next_id = log.next_id
        self.topics[name] = topic
        return topic

    # ------------------------------------------------------------------------------------------ subscriptions

    def subscribe(self, subscriber: Subscriber, name: bytes) -> Topic:
        topic = self.topic(name)
        if subscriber not in topic.subscribers:
            topic.subscribers.append(subscriber)
            subscriber.topics.add(name)
            if topic.round_robin and topic.backlog:
                self._drain_backlog(topic)
        return topic

    def unsubscribe(self, subscriber: Subscriber, name: bytes) -> bool:
        """Remove one subscription; False if there was none."""
        topic = self.topics.get(name)
        if topic is None or subscriber not in topic.subscribers:
            return False
        index = topic.subscribers.index(subscriber)
        if index < topic.rotation:
            # Everyone after the leaver moves one place forward; so must the turn, or the next one is skipped.
            topic.rotation -= 1
        del topic.subscribers[index]
        subscriber.topics.discard(name)
        return True

    def detach(self, subscriber: Subscriber) -> None:
        """Forget a subscriber entirely (disconnected, expired, gone): subscriptions and pending deliveries.

        Round-robin messages it had not yet been handed go back to the front of their topic's backlog, so a
        dying consumer does not take queued messages with it. They are merged by id: a consumer may hold
        messages newer than some still waiting (redelivered ones), and the backlog stays in publish order.
        """
        requeue: dict[bytes, list[Message]] = {}
        for message in subscriber.pending:
            topic = self.topics.get(message.topic)
            if topic is not None and topic.round_robin:
                requeue.setdefault(message.topic, []).append(message)
        subscriber.pending = []
        for name in list(subscriber.topics):
            self.unsubscribe(subscriber, name)
        for name, messages in requeue.items():
            topic = self.topics[name]
            topic.messages_out -= len(messages)
            messages.sort(key=_message_id)
            topic.backlog = deque(heapq.merge(messages, topic.backlog, key=_message_id))
            self._drain_backlog(topic)

    # --------------------------------------------------------------------------------------------- delivery

    def publish(self, name: bytes, body: bytes, headers: dict[bytes, bytes], timestamp: int) -> Message:
        """Accept one message: give it the topic's next id and hand it to the subscribers it is for."""
        topic = self.topics.get(name) or self.topic(name)
        message = Message(name, topic.next_id, body, headers, timestamp)
        topic.next_id += 1
        topic.messages_in += 1
        if topic.log is not None:
            topic.log.append(message)
        if topic.round_robin:
            if topic.backlog or not self._hand_to_next(topic, message):
                self._queue(topic, message)
        else:
            ready = self._ready
            for subscriber in topic.subscribers:
                pending = subscriber.pending
                if len(pending) >= subscriber.limit:
                    subscriber.dropped += 1
                    topic.dropped += 1
                    continue
                pending.append(message)
                topic.messages_out += 1
                if not subscriber.ready:
                    subscriber.ready = True
                    ready.append(subscriber)
        return message

    def publish_batch(
        self, items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]], timestamp: int
    ) -> Message | None:
        """Accept ``(topic, body, headers)`` entries in order, as :meth:`publish` does; returns the last.

        All or nothing: every topic the batch names is resolved first, so a refused topic (EngineError)
        refuses the whole batch before any of it is published.
        """
        for name in {item[0] for item in items}:
            if name not in self.topics:
                self.topic(name)
        last = None
        publish = self.publish
        for name, body, headers in items:
            last = publish(name, body, headers, timestamp)
        return last

    def _hand_to_next(self, topic: Topic, message: Message) -> bool:
        """Strict rotation: the next subscriber in order that has room gets it. False if nobody has room."""
        subscribers = topic.subscribers
        count = len(subscribers)
        for step in range(count):
            index = (topic.rotation + step) % count
            subscriber = subscribers[index]
            pending = subscriber.pending
            if len(pending) < subscriber.limit:
                topic.rotation = (index + 1) % count
                pending.append(message)
                topic.messages_out += 1
                if not subscriber.ready:
                    subscriber.ready = True
                    self._ready.append(subscriber)
                return True
        return False

    def _queue(self, topic: Topic, message: Message) -> None:
        backlog = topic.backlog
        limit = topic.spec.max_backlog
        if limit == 0:
            topic.dropped += 1
            return
        # Bounded memory: the oldest waiting messages make room and are counted as dropped. A loop, not one
        # pop: detach() may have returned a dead consumer's messages on top of a full backlog.
        while len(backlog) >= limit:
            backlog.popleft()
            topic.dropped += 1
        backlog.append(message)

    def _drain_backlog(self, topic: Topic) -> None:
        backlog = topic.backlog
        while backlog and self._hand_to_next(topic, backlog[0]):
            backlog.popleft()

    def room_available(self, subscriber: Subscriber) -> None:
        """The shell wrote out some of ``subscriber``'s pending deliveries: let waiting queues move."""
        for name in subscriber.topics:
            topic = self.topics[name]
            if topic.round_robin and topic.backlog:
                self._drain_backlog(topic)

    def take_ready(self) -> list[Subscriber]:
        """Subscribers that got deliveries since the last call; the shell empties their ``pending`` lists."""
        ready = self._ready
        if not ready:
            return ready
        self._ready = []
        for subscriber in ready:
            subscriber.ready = False
        return ready

    def requeue_ready(self, subscriber: Subscriber) -> None:
        """The shell could not write everything out: keep the subscriber on the ready list for next turn."""
        if subscriber.pending and not subscriber.ready:
            subscriber.ready = True
            self._ready.append(subscriber)

    # ------------------------------------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        return {name.decode("utf-8", "replace"): topic.stats() for name, topic in self.topics.items()}
