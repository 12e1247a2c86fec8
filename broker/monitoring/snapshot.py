"""A copy of the broker's counters, taken on the loop in short slices, read anywhere afterwards.

:func:`take` runs on the broker's loop (the HTTP threads ask for it with
``asyncio.run_coroutine_threadsafe``). It walks the topics and copies what the monitoring shows into
immutable records, yielding to the loop whenever a slice has run for ``SLICE_SECONDS``: with 10,000 topics a
snapshot costs a few milliseconds of loop time in all, and never holds the loop for much longer than one
slice (``docs/monitoring.md`` has the measurement). The records are plain values, so rendering them (the
Prometheus text, the JSON) happens in the HTTP threads without touching broker state.

Topics change between slices (published to, created, even removed): a snapshot is a consistent copy of each
topic, not of the whole broker at one instant, which is all a monitoring view needs.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.histogram import HistogramCopy
from broker.topics import TopicSpec

if TYPE_CHECKING:
    from broker.engine import Subscriber, Topic
    from broker.server import Broker

#: Loop time one slice may take before the snapshot yields to the loop: a hundredth of a 100 ms heartbeat
#: tick, and below the latency a client notices.
SLICE_SECONDS = 0.002


class SubscriptionRecord(NamedTuple):
    """One subscriber on one topic. (Named tuples, not frozen dataclasses: one is made per topic per
    snapshot, on the loop, and a tuple is made several times faster.)"""

    door: str  # the door it came through ("mc0", "sexp", ...)
    who: str  # the client: an mc0 identity (hex) or a TCP peer
    lag: int  # messages published and not yet written to it (log distance plus what it holds)
    pending: int  # deliveries held for the subscriber, over all its topics
    credit: int | None
    unacked: int
    catching_up: bool  # reading the log, not live
    delivered: int  # messages written to the subscriber so far, over all its topics
    dropped: int


class TopicRecord(NamedTuple):
    """One topic's settings and counters."""

    name: str
    topic_id: int
    spec: TopicSpec  # frozen: safe to read in any thread
    messages_in: int
    messages_out: int
    dropped: int
    backlog: int  # round-robin messages no consumer was handed yet
    first_id: int | None  # oldest stored id (persistent topics)
    last_id: int
    lag: int  # the largest lag among its subscriptions
    subscriptions: tuple[SubscriptionRecord, ...]
    stored: int | None = None  # persistent topics: messages, bytes and segments on disk, fsyncs
    bytes: int | None = None
    segments: int | None = None
    fsyncs: int | None = None
    duplicates: int = 0  # entries of idempotent batches stored before, not stored again
    write_failures: int | None = None  # commits of its log whose write failed (a full disk)

    @property
    def traffic(self) -> int:
        """What ranks topics for labels and the dashboard: messages in and out so far."""
        return self.messages_in + self.messages_out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The broker at (about) one moment."""

    wall: float  # seconds since the epoch when it was finished
    monotonic: float  # the hub's clock then
    uptime_seconds: float
    doors: dict[str, dict[str, Any]]  # each door's stats(), the mc0 door's socket events included
    topics: tuple[TopicRecord, ...]
    sessions: int  # mc0 sessions
    histograms: dict[str, HistogramCopy]
    refused_handshakes: dict[str, int]  # by reason
    limits: dict[str, dict[str, Any]]  # what STATS shows under "limits" (a cluster member's view included)
    failure: str | None  # why the broker is failing (a store error), or None
    loop_seconds: float  # loop time spent taking this snapshot
    slices: int  # in how many slices

    def slowest(self, count: int) -> list[tuple[TopicRecord, SubscriptionRecord]]:
        """The ``count`` subscriptions with the largest lag (above 0), largest first, with their topics."""
        lagging = [(topic, subscription) for topic in self.topics if topic.lag
                   for subscription in topic.subscriptions if subscription.lag]
        lagging.sort(key=lambda pair: -pair[1].lag)
        return lagging[:count]


def name_of(raw: bytes) -> str:
    """A topic name as text: UTF-8, with undecodable bytes escaped so that two names never read the same."""
    return raw.decode("utf-8", "backslashreplace")


def who_of(owner: Any) -> tuple[str, str]:
    """(door, client) of a subscriber's owner; an owner without ``who`` (a test's) is shown as itself."""
    who = getattr(owner, "who", None)
    return who if who is not None else ("-", repr(owner)[:80])


class _Held:
    """Deliveries each subscriber holds, by topic: counted once per snapshot for a subscriber on several
    topics (one on a single topic holds only that topic's: its pending length)."""

    def __init__(self) -> None:
        self.counts: dict[int, Counter[bytes]] = {}

    def of(self, subscriber: Subscriber, topic: bytes) -> int:
        if len(subscriber.topics) <= 1:
            return len(subscriber.pending)
        counts = self.counts.get(id(subscriber))
        if counts is None:
            counts = self.counts[id(subscriber)] = Counter(message.topic for message in subscriber.pending)
        return counts[topic]


def topic_record(topic: Topic, held: _Held) -> TopicRecord:
    """Copy one topic's counters (on the loop: this runs once per topic per snapshot, so it is kept lean)."""
    next_id = topic.next_id
    subscriptions: tuple[SubscriptionRecord, ...] = ()
    lag = 0
    if topic.subscriptions:
        records = []
        for subscription in topic.subscriptions:
            subscriber = subscription.subscriber
            position = subscription.position
            behind = 0 if position is None else max(0, next_id - position)
            door, who = who_of(subscriber.owner)
            record = SubscriptionRecord(
                door, who, behind + held.of(subscriber, topic.name), len(subscriber.pending),
                subscription.credit, len(subscription.unacked), position is not None, subscriber.delivered,
                subscriber.dropped,
            )
            lag = max(lag, record.lag)
            records.append(record)
        subscriptions = tuple(records)
    backlog = topic.waiting() if topic.round_robin else 0
    name = topic.name.decode("utf-8", "backslashreplace")  # name_of(), inlined
    log = topic.log
    if log is None:
        return TopicRecord(name, topic.topic_id, topic.spec, topic.messages_in, topic.messages_out,
                           topic.dropped, backlog, None, next_id - 1, lag, subscriptions,
                           duplicates=topic.duplicates)
    first_id = log.first_id
    return TopicRecord(name, topic.topic_id, topic.spec, topic.messages_in, topic.messages_out, topic.dropped,
                       backlog, first_id, next_id - 1, lag, subscriptions, next_id - first_id,
                       log.bytes_on_disk, log.segment_count, log.fsyncs, topic.duplicates, log.write_failures)


def _doors(broker: Broker) -> dict[str, dict[str, Any]]:
    doors = {door.name: dict(door.stats()) for door in broker.hub.doors}
    if broker.handshakes is not None and "mc0" in doors:
        doors["mc0"].update(broker.handshakes.counters)
    return doors


def _histograms(broker: Broker) -> dict[str, HistogramCopy]:
    hub = broker.hub
    out = {"turn_seconds": hub.turn_seconds.copy(), "commit_messages": hub.commit_messages.copy()}
    fsyncs = getattr(broker.engine.store, "fsync_seconds", None)  # a store without files has none
    if fsyncs is not None:
        out["fsync_seconds"] = fsyncs.copy()
    return out


async def take(broker: Broker, names: list[bytes] | None = None) -> Snapshot:
    """The broker's counters, every topic's or those in ``names``; run it on the broker's loop."""
    clock = perf_counter
    started = clock()
    spent = 0.0
    slices = 1
    topics = broker.engine.topics
    chosen = list(topics.values()) if names is None else [topics[name] for name in names if name in topics]
    held = _Held()
    records = []
    for topic in chosen:
        records.append(topic_record(topic, held))
        if clock() - started > SLICE_SECONDS:
            spent += clock() - started
            await asyncio.sleep(0)  # let the doors have their turn
            held = _Held()  # pending lists moved meanwhile
            slices += 1
            started = clock()
    hub = broker.hub
    failure = hub.failure
    snapshot = Snapshot(
        wall=time.time(),
        monotonic=hub.monotonic(),
        uptime_seconds=hub.monotonic() - hub.started,
        doors=_doors(broker),
        topics=tuple(records),
        sessions=len(broker.router.sessions),
        histograms=_histograms(broker),
        refused_handshakes=broker.handshakes.refused if broker.handshakes is not None else {},
        limits=hub.limit_figures(),
        failure=None if failure is None else f"{type(failure).__name__}: {failure}",
        loop_seconds=spent + clock() - started,
        slices=slices,
    )
    return snapshot
