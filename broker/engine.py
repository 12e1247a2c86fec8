"""The topic engine: topics, subscriptions, message ids, delivery, replay, credit and acks. Pure: no I/O of
its own, no sockets, no clock (persistent topics write through the :class:`~broker.store.TopicLog` the store
gives them, and only when the shell says so).

Every door (the mc0 router, the TCP gateways, a Spark fetch) registers a :class:`Subscriber` and calls
:meth:`Engine.publish` / :meth:`Engine.subscribe`. The engine never sends anything: it appends deliveries to
each subscriber's bounded ``pending`` list and remembers which subscribers became ready. The shell drives one
turn of the loop as:

1. publish everything it read (persistent topics append to their log's buffer);
2. :meth:`Engine.commit`: one write, and for strong topics one fsync, covering every message of the turn
   (group commit) — nothing is delivered or acknowledged before this;
3. send its replies (an OK for a persistent PUT therefore promises what the topic's sync level promises);
4. :meth:`Engine.pump` (log catch-up and queue dispatch) and :meth:`Engine.take_ready`, then write the
   subscribers' pending deliveries, telling the engine what went out (:meth:`Engine.written`).

Delivery rules:

* broadcast: every subscriber of the topic gets every message, the publisher too if it is subscribed. A
  subscriber that has no room (full pending list or no credit) is never dropped on a persistent topic: it
  falls back to reading the log and rejoins live delivery when it has caught up. On a transient topic what
  does not fit is dropped and counted (``dropped``).
* round-robin: each message goes to exactly one subscriber, in strict rotation among the subscriptions that
  have room. On a transient topic messages wait in a bounded in-memory backlog (overflow counted); on a
  persistent topic the log is the queue and the queue position (acked watermark and acked ids above it) lives
  in the log's ack journal, so it survives a restart. Messages a consumer left unacked go to the others.

A subscription with explicit acks keeps each message in flight until :meth:`Engine.ack`; any other
subscription counts a message as delivered once the shell wrote it out (auto-ack). ``credit`` bounds a
subscription's messages in flight.

Topics are bounded: at most ``max_topics`` exist at once (creating another is refused), a transient topic
with nobody subscribed and nothing waiting is reclaimed by :meth:`Engine.sweep` once it has stayed so between
two sweeps (a topic created by DECLARE stays: its settings are worth keeping), and :meth:`Engine.delete`
removes a topic, its log and its files. Their names are kept in order (:mod:`broker.names`), so STATS can page
through a great many of them a bounded slice at a time (:meth:`Engine.topic_page`).

When the store fails one topic (a file that will not open or be written: StoreError), the request that needed
it fails with EngineError and the rest goes on. A commit that could not write a topic's messages takes them
back (:meth:`Engine.commit` rewinds the topic to what its log holds and withdraws their deliveries) and names
the topic in :attr:`Engine.failed`, so the shells answer ERROR instead of OK. Damaged stored messages fail
FETCH with an error naming them, and readers catching up or queues dispatching from the log skip them,
counting them as dropped. Only :class:`~broker.store.SyncFailed` goes through: the broker must stop.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, TypeVar

from broker.names import SortedNames
from broker.producers import ProducerWindow
from broker.store import DamagedRange, LogIdentity, Store, StoreError, SyncFailed, TopicLog
from broker.topics import MAX_TOPIC_ID, Delivery, Sync, TopicRules, TopicSpec
from protocol.bodies import entry_topics

#: Message ids start at 1 so that 0 can mean "nothing seen yet" in offsets and resume points.
FIRST_MESSAGE_ID = 1
#: In-flight limit of an explicit-ack subscription that named no CREDIT: unacked messages are held in memory.
DEFAULT_EXPLICIT_CREDIT = 1000
#: New persistent topics a door makes in one turn, at most, before it lets the loop go round: each costs a few
#: fsyncs (its directory, its meta file; about 3-5 ms on an ext4 disk), and a client that made 500 at once (a
#: burst of publishes to new topics) held every other client of the broker for 2.4 s. And seconds of making,
#: at most: on a busy disk (three brokers of a cluster on one) a topic took 7 ms on average, and eight at once
#: held a leader's loop for up to a second, longer than a client's heartbeat allows (see made_enough).
CREATES_PER_TURN = 8
CREATE_SECONDS_PER_TURN = 0.025
#: Messages moved from logs per :meth:`Engine.pump` call (catch-up and queue dispatch together), and per read.
#: A turn of live traffic takes up to 8192 messages; replay gets a budget of the same order so that it keeps
#: pace with live delivery without starving the loop.
PUMP_BUDGET = 16_384
READ_CHUNK = 2048
READ_CHUNK_BYTES = 1 << 20

#: The most one :meth:`Engine.fetch` returns, whatever it is asked: every door's range read stays bounded
#: (mc0's FETCH documents the same caps, docs/mc0.md).
FETCH_MAX_MESSAGES = 10_000
FETCH_MAX_BYTES = 16 << 20

REPLAY_BEGINNING = "beginning"
REPLAY_CURRENT = "current"

#: Topics that may exist at once unless the broker says otherwise (about a kilobyte each, with no subscriber).
DEFAULT_MAX_TOPICS = 1_000_000
#: Idle transient topics looked at per sweep: a sweep is a bounded slice of the loop, however many there are.
SWEEP_BUDGET = 10_000

#: What an acknowledgement can promise, by sync level: the DURABILITY an OK reports.
DURABILITY = {None: b"memory", Sync.STRONG: b"fsync", Sync.WEAK: b"written", Sync.ASYNC: b"written"}


def _message_id(message: Message) -> int:
    return message.id


class EngineError(Exception):
    """A request the engine refuses (replay on a transient topic, conflicting declare, ...); the shell reports
    it to the peer."""


@dataclass(slots=True)
class RangeRead:
    """What :meth:`Engine.read_range` found. ``incarnation`` is the log's identity (None for a topic whose log
    does not exist yet); ``start_id`` the id the read started from. Either ``messages`` (decoded) or
    ``records`` (``count`` stored records as they lie in the log) holds what was read."""

    first_id: int
    next_id: int
    start_id: int
    incarnation: str | None
    messages: list[Message]
    records: bytes | memoryview = b""  # a view of the log's read buffer: send it, don't keep it
    count: int = 0


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
    ``tracking`` counts subscriptions that need :meth:`Engine.written` to hear what went out.
    """

    __slots__ = ("delivered", "dropped", "limit", "owner", "pending", "ready", "topics", "tracking")

    def __init__(self, owner: Any = None, limit: int = 100_000) -> None:
        self.owner = owner
        self.limit = limit
        self.pending: list[Message] = []
        self.topics: dict[bytes, Subscription] = {}
        self.ready = False  # already in the engine's ready list
        self.delivered = 0
        self.dropped = 0
        self.tracking = 0

    def __repr__(self) -> str:
        return f"Subscriber({self.owner!r}, pending={len(self.pending)}, topics={len(self.topics)})"


class Subscription:
    """One subscriber on one topic: where it reads, how much it may have in flight, what it has not acked."""

    __slots__ = ("credit", "explicit", "outstanding", "position", "subscriber", "topic", "tracked", "unacked")

    def __init__(self, subscriber: Subscriber, topic: Topic, credit: int | None, explicit: bool) -> None:
        self.subscriber = subscriber
        self.topic = topic
        self.set_options(credit, explicit)
        self.outstanding = 0  # handed out and not yet written (auto-ack) or not yet acked (explicit)
        self.unacked: dict[int, Message] = {}  # explicit acks: in flight, by id
        self.position: int | None = None  # persistent broadcast: next id to read from the log; None = live

    def set_options(self, credit: int | None, explicit: bool) -> None:
        self.explicit = explicit
        self.credit = DEFAULT_EXPLICIT_CREDIT if explicit and credit is None else credit
        self.update_tracked()

    def update_tracked(self) -> None:
        # Counted only when tracked: plain subscriptions (the common case) cost nothing per message. A
        # persistent queue tracks even auto-ack consumers: what they were written is acked in its log.
        topic = self.topic
        persistent_queue = topic.round_robin and topic.log is not None
        self.tracked = self.credit is not None or self.explicit or persistent_queue

    @property
    def room(self) -> int:
        subscriber = self.subscriber
        room = subscriber.limit - len(subscriber.pending)
        if self.credit is not None:
            room = min(room, self.credit - self.outstanding)
        return room

    def lag(self) -> int:
        """Messages published but not yet written to this subscriber (log distance plus what it holds)."""
        name = self.topic.name
        subscriber = self.subscriber
        if len(subscriber.topics) == 1:
            held = len(subscriber.pending)  # all of them are this topic's: no need to look
        else:
            held = sum(1 for message in subscriber.pending if message.topic == name)
        behind = 0 if self.position is None else max(0, self.topic.next_id - self.position)
        return behind + held

    def stats(self) -> dict[str, Any]:
        return {"lag": self.lag(), "credit": self.credit, "unacked": len(self.unacked),
                "catching_up": self.position is not None}

    def __repr__(self) -> str:
        return f"Subscription({self.subscriber!r}, {self.topic.name!r}, position={self.position})"


@dataclass(slots=True, eq=False)
class Topic:
    name: bytes
    topic_id: int
    spec: TopicSpec
    next_id: int = FIRST_MESSAGE_ID
    log: TopicLog | None = None
    # In subscription order. A list, not a set: round-robin indexes it on every message, while membership is
    # only asked on subscribe and unsubscribe.
    subscriptions: list[Subscription] = field(default_factory=list)
    rotation: int = 0  # round-robin: index of the subscription that gets the next message
    backlog: deque[Message] = field(default_factory=deque)  # transient round-robin messages waiting for room
    # Persistent round-robin: the log is the queue. Ids below next_dispatch were handed out (or acked before a
    # restart); redeliver holds ids handed out whose consumer left without acking.
    next_dispatch: int = FIRST_MESSAGE_ID
    redeliver: list[int] = field(default_factory=list)
    dirty: bool = False  # appended or acked since the last commit
    committed_id: int = FIRST_MESSAGE_ID  # persistent: next_id at the last commit (a commit's size: the gap)
    producers: ProducerWindow | None = None  # idempotent publishers, transient topics (a log keeps its own)
    declared: bool = False  # created by DECLARE: kept when idle (its settings are not the rules')
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0
    duplicates: int = 0  # idempotent entries not stored again (their producer had stored them)
    # A cluster leader's replicated topic (broker.cluster): readers get ids below this only, the ones on a
    # majority of the cluster; None (a single broker) is no gate at all.
    visible_until: int | None = None
    round_robin: bool = field(init=False)  # derived from spec once: publish() asks on every message
    element_size: int = field(init=False)  # likewise; 0 = bodies of any size

    def __post_init__(self) -> None:
        self.round_robin = self.spec.delivery is Delivery.ROUND_ROBIN
        self.element_size = self.spec.element_size

    @property
    def subscribers(self) -> list[Subscriber]:
        return [subscription.subscriber for subscription in self.subscriptions]

    @property
    def durability(self) -> bytes:
        return DURABILITY[self.spec.sync if self.log is not None else None]

    def waiting(self) -> int:
        """Round-robin messages not yet handed to any consumer."""
        if self.log is None:
            return len(self.backlog)
        above = self.log.acked_above
        skipped = sum(1 for acked in above if acked >= self.next_dispatch) if above else 0
        unread = self.next_id - max(self.next_dispatch, self.log.first_id) - skipped
        return max(0, unread) + len(self.redeliver)

    def stats(self) -> dict[str, Any]:
        consumers = [subscription.stats() for subscription in self.subscriptions]
        out: dict[str, Any] = {
            "id": self.topic_id,
            **self.spec.describe(),
            "subscribers": len(self.subscriptions),
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "dropped": self.dropped,
            "duplicates": self.duplicates,
            "backlog": self.waiting() if self.round_robin else 0,
            "first_id": self.log.first_id if self.log is not None else None,
            "last_id": self.next_id - 1,
            "lag": max((consumer["lag"] for consumer in consumers), default=0),
            "consumers": consumers,
        }
        if self.log is not None:
            out.update(stored=self.next_id - self.log.first_id, bytes=self.log.bytes_on_disk,
                       segments=self.log.segment_count, fsyncs=self.log.fsyncs,
                       write_failures=self.log.write_failures)
            damaged = self.log.damaged
            if damaged:
                out["damaged"] = [damage.describe() for damage in damaged]
        return out


class Engine:
    """One instance per broker, driven by the single loop thread."""

    def __init__(self, rules: TopicRules | None = None, store: Store | None = None, *,
                 max_topics: int = DEFAULT_MAX_TOPICS) -> None:
        self.rules = rules or TopicRules()
        self.store = store
        self.max_topics = max_topics
        self.topics: dict[bytes, Topic] = {}
        self.names = SortedNames()
        # Transient topics that may be idle, with their messages_in at the last sweep (None: not swept yet).
        self._idle: dict[Topic, int | None] = {}
        self.reclaimed = 0  # idle transient topics reclaimed so far
        # Logs opened for new topics so far, and the seconds that took: a door ends its turn after a few
        # (made_enough).
        self.logs_created = 0
        self.create_seconds = 0.0
        # New persistent topics whose logs the store is making ahead, with the topic ids kept for them.
        self._logs_ahead: dict[bytes, int] = {}
        self._ready: list[Subscriber] = []
        self._dirty: list[Topic] = []
        #: Names of the topics the last :meth:`commit` wrote: what became readable (waiting reads watch it).
        self.committed: list[bytes] = []
        # Ordered sets (dicts): catch-up and dispatch go round in a stable order.
        self._catching_up: dict[Subscription, None] = {}
        self._dispatch: dict[Topic, None] = {}
        self._pump_exhausted = False
        self._next_topic_id = 1
        #: Messages the last :meth:`commit` wrote (the group commit's size, for the monitoring).
        self.last_commit_messages = 0
        #: Topics whose commit failed in the last :meth:`commit`, with why: their messages of that turn are
        #: not stored, and the shells must not confirm them.
        self.failed: dict[bytes, str] = {}
        #: Topics found in the store whose log could not be opened at start, with why (refused until then).
        self.unavailable: dict[bytes, str] = {}
        #: Called with each persistent topic once its log is open (a cluster registers and gates it).
        self.on_persistent: Callable[[Topic], None] | None = None
        #: The first id a persistent topic's retention must keep, or None for no bound (a cluster leader's
        #: messages not yet on a majority stay for the followers that have not copied them).
        self.retention_floor: Callable[[Topic], int | None] | None = None
        #: The lineage of a topic's log identity that no log of this broker recorded, if known elsewhere (a
        #: cluster's epochs), for readers that name it: where they go on (LogIdentity.resume_point_from).
        self.lineage_of: Callable[[bytes, str], tuple[tuple[str, int], ...] | None] | None = None
        # Gated topics whose gate moved since the last commit: readable as if the commit had written them.
        self._released: list[bytes] = []
        # Gated topics written ahead of this turn's commit (write_ahead), and the write failures it met.
        self._ahead: set[Topic] = set()
        self._ahead_failed: dict[Topic, StoreError] = {}
        if store is not None:
            # Persistent topics exist from the start: a queue holds its messages for consumers yet to come,
            # and ids continue where the log ends. Their topic ids are recorded with them, so they are stable
            # across restarts; new ids start above every recorded one.
            found = store.existing()
            self._next_topic_id = max((stored.topic_id or 0 for stored in found), default=0) + 1
            for name, stored_spec, topic_id in found:
                rule = self.rules.rule_for(name)
                spec = rule.spec if rule is not None and rule.spec.persistent else stored_spec
                try:
                    self._create(name, spec, topic_id)
                except EngineError as error:
                    self.unavailable[name] = str(error)

    # ------------------------------------------------------------------------------------------------ topics

    def topic(self, name: bytes) -> Topic:
        """The topic called ``name``, created with the settings its name matches on first use."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self._create(name, self.rules.spec_for(name))
        return topic

    def make_ahead(self, name: bytes, done: Callable[[], None], spec: TopicSpec | None = None,
                   identity: LogIdentity | None = None) -> None:
        """Have the store start making the log of ``name``, a persistent topic yet to be created with
        ``spec`` (the one its name matches if None) and ``identity`` (a fresh one if None), in its own
        threads, when it can (see :mod:`broker.store.making`); creating the topic takes that log. ``done()``
        is called from another thread once it is made: :meth:`ready` says so. Nothing happens for a topic that
        exists, or is transient, or when the store makes nothing ahead now (its bound): such a topic's log is
        made when the topic is created, as always."""
        store = self.store
        if store is None or not name or name in self.topics or name in self._logs_ahead:
            return
        spec = spec or self.rules.spec_for(name)
        if (not spec.persistent or len(self.topics) + len(self._logs_ahead) >= self.max_topics
                or self._next_topic_id > MAX_TOPIC_ID):
            return
        try:
            started = store.make_ahead(name, spec, self._next_topic_id, identity or LogIdentity.fresh(), done)
        except StoreError:
            return  # the data directory cannot be used: the creation says why
        if started:
            self._logs_ahead[name] = self._next_topic_id
            self._next_topic_id += 1

    def make_ahead_of(self, names: Iterable[bytes], done: Callable[[], None]) -> list[bytes]:
        """:meth:`make_ahead` for each of ``names`` that is no topic yet and would be a persistent one;
        returns those (:meth:`unmade_logs`)."""
        unmade = self.unmade_logs(names)
        for name in unmade:
            self.make_ahead(name, done)
        return unmade

    def made_ahead(self, name: bytes) -> bool:
        """Whether creating ``name`` now takes a log the store has made ahead (a rename, no build)."""
        return name in self._logs_ahead and self.store is not None and self.store.made(name)

    def ready(self, name: bytes) -> bool:
        """Whether creating ``name`` now would not wait for its log being made ahead (:meth:`make_ahead`)."""
        return name not in self._logs_ahead or self.store is None or self.store.made(name)

    def forget_ahead(self, names: Iterable[bytes]) -> None:
        """``names`` will not be created after all (their client went away): what is made ahead goes."""
        for name in names:
            if self._logs_ahead.pop(name, None) is not None and self.store is not None:
                self.store.forget_made(name)

    def creation_mark(self) -> tuple[int, float]:
        """Where a turn's making of new logs starts (see :meth:`made_enough`)."""
        return self.logs_created, self.create_seconds

    def made_enough(self, mark: tuple[int, float]) -> bool:
        """Whether the logs made since ``mark`` are as many as one turn should make: CREATES_PER_TURN, or
        CREATE_SECONDS_PER_TURN spent making them (one at least, however slow: the turns make progress)."""
        made, seconds = mark
        return self.logs_created - made >= CREATES_PER_TURN or (
            self.logs_created > made and self.create_seconds - seconds >= CREATE_SECONDS_PER_TURN)

    def room_to_make(self, mark: tuple[int, float], count: int) -> bool:
        """Whether the turn that began at ``mark`` may still make ``count`` new logs."""
        return not self.made_enough(mark) and self.logs_created - mark[0] + count <= CREATES_PER_TURN

    def unmade_logs(self, names: Iterable[bytes]) -> list[bytes]:
        """Those of ``names`` that are no topic yet and would be persistent ones (each costs fsyncs to make),
        once each, in the order named."""
        topics = self.topics
        new = dict.fromkeys(name for name in names if name not in topics)
        return [name for name in new if self.rules.spec_for(name).persistent]

    def declare(self, name: bytes, spec: TopicSpec, identity: LogIdentity | None = None) -> Topic:
        """Create ``name`` with ``spec``; the same settings again are fine, different ones are an error.

        A topic that a configuration rule already describes counts as existing with the rule's settings. A
        persistent topic's log made now takes ``identity`` if one is given (a cluster follower's copy).
        """
        topic = self.topics.get(name)
        current = topic.spec if topic is not None else None
        if current is None:
            rule = self.rules.rule_for(name)
            current = rule.spec if rule is not None else None
        if current is not None and current != spec:
            raise EngineError(f"topic {name.decode('utf-8', 'replace')!r} exists with other settings "
                              f"({_settings(current)}); declared {_settings(spec)}")
        if topic is None:
            topic = self._create(name, spec, identity=identity)
            topic.declared = True
            self._idle.pop(topic, None)
        return topic

    def _create(self, name: bytes, spec: TopicSpec, topic_id: int | None = None,
                identity: LogIdentity | None = None) -> Topic:
        ahead_id = self._logs_ahead.pop(name, None)
        try:
            return self._create_topic(name, spec, topic_id if topic_id is not None else ahead_id, identity)
        finally:
            if ahead_id is not None and self.store is not None:
                self.store.forget_made(name)  # made ahead with other settings, or refused (once taken: none)

    def _create_topic(self, name: bytes, spec: TopicSpec, topic_id: int | None,
                      identity: LogIdentity | None) -> Topic:
        if not name:
            raise EngineError("topic names must not be empty")
        if len(self.topics) >= self.max_topics:
            raise EngineError(f"topic {_shown(name)} refused: {len(self.topics)} topics exist, as many as "
                              "max_topics allows; idle transient ones are reclaimed, or DELETE some")
        if topic_id is None:
            if self._next_topic_id > MAX_TOPIC_ID:
                raise EngineError(f"no topic ids left (the largest is {MAX_TOPIC_ID})")
            topic_id = self._next_topic_id
            self._next_topic_id += 1
        log = None
        if spec.persistent:
            if self.store is None:
                raise EngineError(f"topic {name!r} is configured persistent but the broker has no store")
            started = perf_counter()
            try:
                self.logs_created += 1
                log = self.store.open(name, spec, topic_id, identity)
            except SyncFailed:
                raise
            except StoreError as error:
                raise EngineError(f"topic {_shown(name)} is unavailable: its log cannot be opened: "
                                  f"{error}") from None
            finally:
                self.create_seconds += perf_counter() - started
            self.unavailable.pop(name, None)
        topic = Topic(name, topic_id, spec, log=log)
        if log is not None:
            topic.next_id = topic.committed_id = log.next_id
            topic.next_dispatch = max(log.acked_watermark + 1, log.first_id)
        else:
            self._idle[topic] = None  # nobody subscribed yet: reclaimed if it stays so
        self.topics[name] = topic
        self.names.add(name)
        if log is not None and self.on_persistent is not None:
            self.on_persistent(topic)
        return topic

    # ------------------------------------------------------------------------------------------ subscriptions

    def subscribe(
        self,
        subscriber: Subscriber,
        name: bytes,
        *,
        replay: str | int | None = None,
        resume: int | None = None,
        credit: int | None = None,
        explicit_acks: bool = False,
    ) -> Topic:
        """Subscribe ``subscriber`` to ``name``.

        ``replay`` ("beginning", "current" or a first id) and ``resume`` (the next id wanted after a
        reconnect) choose where a broadcast subscription starts. Replay needs a persistent broadcast topic;
        ``resume`` falls back to live delivery where there is nothing to replay. Subscribing again replaces
        the subscription's options (and restarts it from ``replay`` if one is given).
        """
        topic = self.topic(name)
        start = self._start(topic, replay, resume)
        subscription = subscriber.topics.get(name)
        if subscription is None:
            subscription = Subscription(subscriber, topic, credit, explicit_acks)
            topic.subscriptions.append(subscription)
            subscriber.topics[name] = subscription
            if subscription.tracked:
                subscriber.tracking += 1
        elif credit is not None or explicit_acks != subscription.explicit:
            was_tracked = subscription.tracked
            if subscription.unacked and not explicit_acks:
                # Switching to auto-ack acks what is in flight.
                self.ack(subscriber, name, list(subscription.unacked))
            subscription.set_options(credit, explicit_acks)
            subscriber.tracking += subscription.tracked - was_tracked
            # Recount what is in flight under the new options: written() counts down every delivery of a
            # tracked auto-ack subscription, also those handed out before the change (untracked, or acked just
            # above), so the old count could go negative and let more than the credit out.
            held = {message.id: message for message in subscriber.pending if message.topic == name}
            if explicit_acks:
                # Deliveries handed out under auto-ack and not yet written are in flight now: written()
                # ignores explicit subscriptions, so nothing else would settle them (a queue would lose them).
                subscription.unacked = held | subscription.unacked
                subscription.outstanding = len(subscription.unacked)
            else:
                subscription.outstanding = len(held) if subscription.tracked else 0
        if start is None and topic.visible_until is not None and not topic.round_robin:
            start = topic.next_id  # gated: even live messages are read from the log, once on a majority
        if start is not None:
            subscription.position = start
            self._catching_up[subscription] = None
        if topic.round_robin:
            self._refill(topic)
        return topic

    def set_credit(self, subscriber: Subscriber, name: bytes, credit: int | None) -> None:
        """Give a subscription a new credit (None: unlimited), keeping what it has in flight: the way a door
        with demand (reactive streams) opens and closes the tap while the subscription runs. More room lets
        its queue hand it messages on the next pump."""
        subscription = subscriber.topics[name]
        was_tracked = subscription.tracked
        subscription.credit = credit
        subscription.update_tracked()
        subscriber.tracking += subscription.tracked - was_tracked
        if not subscription.tracked:
            subscription.outstanding = 0  # nothing counts it down any more
        self.room_available(subscriber)

    def check_subscribe(self, name: bytes, replay: str | int | None) -> None:
        """Raise what :meth:`subscribe` would raise, before anything changes: a SUB is refused whole, and a
        refused SUB creates no topic."""
        if not name:
            raise EngineError("topic names must not be empty")
        topic = self.topics.get(name)
        spec = topic.spec if topic is not None else self.rules.spec_for(name)
        _check_replay(name, spec, replay)

    def _start(self, topic: Topic, replay: str | int | None, resume: int | None) -> int | None:
        """The first id a new broadcast subscription reads from the log, or None for live delivery."""
        if replay is not None and replay != REPLAY_CURRENT:
            _check_replay(topic.name, topic.spec, replay)
            assert topic.log is not None  # a persistent topic always has its log
            first = topic.log.first_id if replay == REPLAY_BEGINNING else int(replay)
        elif resume is not None and topic.log is not None and not topic.round_robin:
            first = resume
        else:
            return None
        # Before the oldest stored message: from the oldest (retention removed the rest). Past the newest:
        # live, from the next message published.
        first = max(first, topic.log.first_id) if topic.log is not None else first
        return first if first < topic.next_id else None

    def unsubscribe(self, subscriber: Subscriber, name: bytes) -> bool:
        """Remove one subscription; False if there was none.

        Deliveries of that topic not yet written to the subscriber are withdrawn (an OK to UNSUB is not
        followed by messages of the topic), and a queue gets back what the consumer had not acked.
        """
        subscription = subscriber.topics.get(name)
        if subscription is None:
            return False
        pending = subscriber.pending
        withdrawn = [message for message in pending if message.topic == name]
        if withdrawn:
            subscriber.pending = [message for message in pending if message.topic != name]
        self._remove(subscription, withdrawn)
        return True

    def detach(self, subscriber: Subscriber) -> None:
        """Forget a subscriber entirely (disconnected, expired, gone): subscriptions and pending deliveries.

        Round-robin messages it had not yet been handed, or had not acked, go back to their queue, so a dying
        consumer does not take queued messages with it.
        """
        withdrawn: dict[bytes, list[Message]] = {}
        for message in subscriber.pending:
            withdrawn.setdefault(message.topic, []).append(message)
        subscriber.pending = []
        for name, subscription in list(subscriber.topics.items()):
            self._remove(subscription, withdrawn.pop(name, []))
        # Deliveries of topics it already left: the shell may hand back what it failed to write to a peer it
        # found gone mid-write, after that peer was first detached.
        for name, messages in withdrawn.items():
            topic = self.topics.get(name)
            if topic is not None and topic.round_robin:
                self._requeue(topic, messages)

    def _remove(self, subscription: Subscription, withdrawn: list[Message]) -> None:
        subscriber = subscription.subscriber
        topic = subscription.topic
        del subscriber.topics[topic.name]
        subscriptions = topic.subscriptions
        index = subscriptions.index(subscription)
        if index < topic.rotation:
            # Everyone after the leaver moves one place forward; so must the turn, or the next one is skipped.
            topic.rotation -= 1
        del subscriptions[index]
        if topic.rotation >= len(subscriptions):
            topic.rotation = 0
        self._catching_up.pop(subscription, None)
        if subscription.tracked:
            subscriber.tracking -= 1
        if topic.round_robin:
            # An explicit-ack subscription's in-flight set includes its unwritten deliveries; otherwise only
            # the unwritten ones are still the queue's.
            self._requeue(topic, list(subscription.unacked.values()) if subscription.explicit else withdrawn)
        subscription.unacked = {}
        if not subscriptions and topic.log is None and not topic.declared:
            self._idle[topic] = None

    def _requeue(self, topic: Topic, messages: list[Message]) -> None:
        if not messages:
            return
        topic.messages_out -= len(messages)
        if topic.log is not None:
            for message in messages:
                heapq.heappush(topic.redeliver, message.id)
        else:
            # Merged by id: a consumer may hold messages newer than some still waiting (redelivered ones), and
            # the backlog stays in publish order.
            messages.sort(key=_message_id)
            topic.backlog = deque(heapq.merge(messages, topic.backlog, key=_message_id))
        self._refill(topic)

    # ------------------------------------------------------------------------------------------------ acks

    def ack(self, subscriber: Subscriber, name: bytes, ids: Iterable[int]) -> list[int]:
        """The subscriber processed these messages of ``name``; returns the ids that were not in flight."""
        subscription = subscriber.topics.get(name)
        if subscription is None or not subscription.explicit:
            raise EngineError(f"not subscribed to {_shown(name)} with explicit acks")
        topic = subscription.topic
        unacked = subscription.unacked
        unknown: list[int] = []
        done: list[int] = []
        for message_id in ids:
            if unacked.pop(message_id, None) is None:
                unknown.append(message_id)
            else:
                done.append(message_id)
        subscription.outstanding -= len(done)
        if done:
            self._settled(topic, done)
            self._room_freed(subscription)
        return unknown

    def written(self, subscriber: Subscriber, messages: Sequence[Message]) -> None:
        """The shell wrote ``messages`` out to ``subscriber`` (only needed when ``subscriber.tracking``)."""
        topics = subscriber.topics
        settled: dict[Topic, list[int]] = {}
        for message in messages:
            subscription = topics.get(message.topic)
            if subscription is None or not subscription.tracked or subscription.explicit:
                continue
            subscription.outstanding -= 1
            topic = subscription.topic
            if topic.round_robin and topic.log is not None:
                settled.setdefault(topic, []).append(message.id)
        for topic, done in settled.items():
            self._settled(topic, done)

    def ack_through(self, name: bytes, last: int) -> int:
        """Every message of the persistent round-robin topic ``name`` up to id ``last`` left the queue for
        good (a cluster's new leader taking the queue's position the old one reported): the queue goes on
        after it. Returns how many ids that acked."""
        topic = self.topics.get(name)
        if topic is None or topic.log is None or not topic.round_robin:
            return 0
        log = topic.log
        last = min(last, topic.next_id - 1)
        before = log.acked_watermark
        if last <= before:
            return 0
        log.ack_through(last)
        topic.next_dispatch = max(topic.next_dispatch, last + 1)
        if topic.redeliver and topic.redeliver[0] <= last:
            topic.redeliver = [acked for acked in topic.redeliver if acked > last]
            heapq.heapify(topic.redeliver)
        self._mark_dirty(topic)
        return last - before

    def _settled(self, topic: Topic, ids: list[int]) -> None:
        """Round-robin messages that left the queue for good: the persistent queue position moves."""
        if topic.round_robin and topic.log is not None:
            topic.log.ack(ids)
            self._mark_dirty(topic)

    def _room_freed(self, subscription: Subscription) -> None:
        topic = subscription.topic
        if topic.round_robin:
            self._refill(topic)

    # --------------------------------------------------------------------------------------------- delivery

    def publish(self, name: bytes, body: bytes, headers: dict[bytes, bytes], timestamp: int) -> Message:
        """Accept one message: give it the topic's next id and hand it to the subscribers it is for."""
        topic = self.topics.get(name) or self.topic(name)
        if topic.element_size and len(body) != topic.element_size:
            raise EngineError(_wrong_size(topic, body))
        message = Message(name, topic.next_id, body, headers, timestamp)
        log = topic.log
        if log is not None:
            try:
                log.append(message)
            except SyncFailed:
                raise
            except StoreError as error:  # a broken log that cannot be opened again: refused, nothing changed
                if log.next_id <= message.id:
                    raise EngineError(f"topic {_shown(name)} is unavailable: {error}") from None
                message = self._realign(topic, message)
            if not topic.dirty:
                topic.dirty = True
                self._dirty.append(topic)
        topic.next_id += 1
        topic.messages_in += 1
        if topic.visible_until is not None:
            # Gated (a cluster's replicated topic): readers take it from the log once a majority holds it.
            if topic.round_robin:
                if topic.subscriptions:
                    self._dispatch[topic] = None
            else:
                for subscription in topic.subscriptions:
                    if subscription.position is None:
                        subscription.position = message.id
            return message
        if topic.round_robin:
            if log is not None:
                # The log is the queue: hand the message on directly only when nothing older is waiting.
                if (topic.next_dispatch == message.id and not topic.redeliver
                        and self._hand_to_next(topic, message)):
                    topic.next_dispatch += 1
                elif topic.subscriptions:
                    self._dispatch[topic] = None
            elif topic.backlog or not self._hand_to_next(topic, message):
                self._queue(topic, message)
            return message
        ready = self._ready
        for subscription in topic.subscriptions:
            if subscription.position is not None:
                continue  # reading the log; it meets this message there
            subscriber = subscription.subscriber
            pending = subscriber.pending
            if len(pending) >= subscriber.limit or (
                subscription.credit is not None and subscription.outstanding >= subscription.credit
            ):
                if log is not None:
                    # Never dropped on a persistent topic: read on from the log once there is room again.
                    subscription.position = message.id
                    self._catching_up[subscription] = None
                else:
                    subscriber.dropped += 1
                    topic.dropped += 1
                continue
            # _give(), inlined: this loop runs once per subscriber per message, the broker's hottest path.
            pending.append(message)
            topic.messages_out += 1
            if subscription.tracked:
                subscription.outstanding += 1
                if subscription.explicit:
                    subscription.unacked[message.id] = message
            if not subscriber.ready:
                subscriber.ready = True
                ready.append(subscriber)
        return message

    def publish_batch(
        self, items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]], timestamp: int
    ) -> Message | None:
        """Accept ``(topic, body, headers)`` entries in order, as :meth:`publish` does; returns the last.

        All or nothing: every topic the batch names is resolved, and every body of a fixed-size topic
        checked, first, so a refused topic or size (EngineError) refuses the whole batch before any of it is
        published.
        """
        topics = self.topics
        fixed = False
        names = entry_topics(items)
        for name in names:
            fixed = bool((topics.get(name) or self.topic(name)).element_size) or fixed
        if fixed:
            for name, body, _ in items:
                size = topics[name].element_size
                if size and len(body) != size:
                    raise EngineError(_wrong_size(topics[name], body))
        if len(names) == 1:
            return self._publish_run(topics[items[0][0]], items, timestamp)
        last = None
        publish = self.publish
        for name, body, headers in items:
            last = publish(name, body, headers, timestamp)
        return last

    def _publish_run(
        self, topic: Topic, items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]], timestamp: int
    ) -> Message | None:
        """``items``, all to ``topic``, published in order as :meth:`publish` does each; returns the last."""
        first_id, done = self.append_quietly(topic, items, timestamp)
        if done == len(items) and done:
            _, body, headers = items[-1]
            return Message(topic.name, first_id + done - 1, body, headers, timestamp)
        last = None
        publish = self.publish
        for name, body, headers in items[done:] if done else items:
            last = publish(name, body, headers, timestamp)  # the entry that failed meets its error here
        return last

    def append_quietly(
        self, topic: Topic, items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]], timestamp: int
    ) -> tuple[int, int]:
        """Store the leading entries of ``items`` (all to ``topic``, sizes already checked) in one call to
        its log, when only the log needs them: a persistent topic that nobody reads at the moment (a
        cluster's gate on it concerns its readers only). Returns ``(first_id, count)``: ids ``first_id`` ..
        ``first_id + count - 1`` were given, in order; the caller publishes the rest one by one (all of them
        when count is 0: the topic is read, or a store error stopped the batch, and :meth:`publish` says
        what it is).

        Why: a batch of 2,000 cost the broker 3.0 us a message through :meth:`publish` (measured), and the
        message object and the two calls per entry were about a third of it."""
        log = topic.log
        first = topic.next_id
        if log is None or topic.subscriptions or log.next_id != first or not items:
            return first, 0
        try:
            done = log.append_batch(first, timestamp, items)
        except SyncFailed:
            raise
        except StoreError:
            return first, 0  # one by one, then: publish() knows what each store error means
        topic.next_id += done
        topic.messages_in += done
        if not topic.dirty:
            topic.dirty = True
            self._dirty.append(topic)
        return first, done

    def publish_idempotent(
        self,
        name: bytes,
        items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]],
        producer: bytes,
        sequence: int,
        timestamp: int,
    ) -> tuple[Message | None, int]:
        """Publish ``items`` (all to ``name``, entry ``i`` numbered ``sequence + i`` by ``producer``),
        skipping the entries this producer already stored in this topic. Returns the last message published
        (None if every entry was a duplicate) and how many leading entries were skipped.

        The topic remembers the highest sequence each of its recent producers stored (a persistent topic in
        its log, so across restarts): see :mod:`broker.producers`. A batch that would leave a gap after it is
        refused (EngineError), and nothing of it is stored."""
        topic = self.topics.get(name) or self.topic(name)
        if topic.element_size:
            for _, body, _ in items:
                if len(body) != topic.element_size:
                    raise EngineError(_wrong_size(topic, body))
        window = topic.log.producers if topic.log is not None else topic.producers
        if window is None:
            window = topic.producers = ProducerWindow()
        expected = window.gap(producer, sequence)
        if expected is not None:
            raise EngineError(f"out of sequence: producer {_shown(producer)} stored numbers up to "
                              f"{expected - 1} in topic {_shown(name)}, and this batch begins at {sequence}; "
                              f"send the batch numbered from {expected} first (one was refused or lost)")
        skipped = window.duplicates(producer, sequence, len(items))
        topic.duplicates += skipped
        if skipped == len(items):
            return None, skipped
        first_id = topic.next_id
        last = self._publish_run(topic, items[skipped:] if skipped else items, timestamp)
        window.record(producer, sequence + len(items) - 1, first_id, len(items) - skipped)
        return last, skipped

    def _give(self, subscription: Subscription, message: Message) -> None:
        subscriber = subscription.subscriber
        subscriber.pending.append(message)
        subscription.topic.messages_out += 1
        if subscription.tracked:
            subscription.outstanding += 1
            if subscription.explicit:
                subscription.unacked[message.id] = message
        if not subscriber.ready:
            subscriber.ready = True
            self._ready.append(subscriber)

    def _hand_to_next(self, topic: Topic, message: Message) -> bool:
        """Strict rotation: the next subscription in order that has room gets it. False if none has room."""
        subscriptions = topic.subscriptions
        count = len(subscriptions)
        for step in range(count):
            index = (topic.rotation + step) % count
            subscription = subscriptions[index]
            subscriber = subscription.subscriber
            if len(subscriber.pending) < subscriber.limit and (
                subscription.credit is None or subscription.outstanding < subscription.credit
            ):
                topic.rotation = (index + 1) % count
                self._give(subscription, message)
                return True
        return False

    def _queue(self, topic: Topic, message: Message) -> None:
        backlog = topic.backlog
        limit = topic.spec.max_backlog
        if limit == 0:
            topic.dropped += 1
            return
        # Bounded memory: the oldest waiting messages make room and are counted as dropped. A loop, not one
        # pop: a requeue may have returned a gone consumer's messages on top of a full backlog.
        while len(backlog) >= limit:
            backlog.popleft()
            topic.dropped += 1
        backlog.append(message)

    def _refill(self, topic: Topic) -> None:
        """A round-robin topic may move: a consumer came, got room, or messages came back."""
        if topic.log is not None:
            self._dispatch[topic] = None
            return
        backlog = topic.backlog
        while backlog and self._hand_to_next(topic, backlog[0]):
            backlog.popleft()

    def room_available(self, subscriber: Subscriber) -> None:
        """The shell wrote out some of ``subscriber``'s pending deliveries: let waiting queues move."""
        for subscription in subscriber.topics.values():
            topic = subscription.topic
            if topic.round_robin and (topic.backlog or topic.log is not None):
                self._refill(topic)

    # ------------------------------------------------------------------------------------------ range reads

    def fetch(
        self, name: bytes, start: int | None, max_messages: int, max_bytes: int
    ) -> tuple[int, int, list[Message]]:
        """Stored messages of the persistent topic ``name`` from ``start`` on: ``(first_id, next_id,
        messages)`` (:meth:`read_range` without its extras)."""
        read = self.read_range(name, start, max_messages, max_bytes)
        return read.first_id, read.next_id, read.messages

    def read_range(
        self,
        name: bytes,
        start: int | None,
        max_messages: int,
        max_bytes: int,
        *,
        at_time: int | None = None,
        records: bool = False,
        known_incarnation: str | None = None,
        replica: bool = False,
    ) -> RangeRead:
        """Stored messages of the persistent topic ``name`` from ``start`` on.

        ``first_id`` is the oldest stored id, ``next_id`` one past the newest; what was read is in id order
        from ``max(start, first_id)`` (``start`` None: from ``first_id``; ``at_time`` instead: from the first
        message stored at or after that time), at most ``max_messages`` messages with bodies totalling at
        most ``max_bytes``, except that the first message there is always returned (a body larger than
        ``max_bytes`` is still readable). Both bounds are lowered to FETCH_MAX_MESSAGES and FETCH_MAX_BYTES;
        ``max_messages`` 0 asks for the ids only. With ``records`` the stored records come undecoded, as they
        lie in the log (``max_bytes`` then bounds record bytes, and a read stops at a segment's end). A read
        changes nothing: it takes no subscription, moves no queue position and acks nothing.
        ``known_incarnation`` is the log the reader read before: if the topic's log is another one now, the
        read starts where that reader goes on in this log (:meth:`LogIdentity.resume_point`: the first id
        the two logs do not share, or the beginning of a log created anew) — ``start_id`` says where.

        Call it after :meth:`commit`, never between a publish and the commit of its turn: the log serves only
        what was written, and ``next_id`` must not promise more. A topic that does not exist yet but that its
        configuration rule makes persistent is an empty log (it is not created by reading it); a transient
        topic, or a name that would be one, has no log: EngineError.
        """
        if not name:
            raise EngineError("topic names must not be empty")
        topic = self.topics.get(name)
        if topic is None:
            if name in self.unavailable:
                raise EngineError(self.unavailable[name])
            if not self.rules.spec_for(name).persistent:
                raise EngineError(f"topic {_shown(name)} does not exist and would be transient: there is no "
                                  "log to fetch from")
            if self.store is None:
                raise EngineError(f"topic {_shown(name)} is configured persistent but the broker has no "
                                  "store")
            return RangeRead(FIRST_MESSAGE_ID, FIRST_MESSAGE_ID, FIRST_MESSAGE_ID, None, [])
        log = topic.log
        if log is None:
            raise EngineError(f"topic {_shown(name)} is transient: there is no log to fetch from (fetch "
                              "reads persistent topics)")
        if topic.dirty and not (replica and topic in self._ahead):
            # A shell bug, refused rather than answered: messages appended but not yet committed are not
            # readable, so next_id would run ahead of what a reader can fetch. (A cluster's replica reads
            # what was written ahead of the fsync: write_ahead.)
            raise EngineError(f"topic {_shown(name)} has uncommitted messages: fetch runs after the commit")
        first_id = log.first_id
        next_id = topic.next_id
        if topic.visible_until is not None and not replica:
            next_id = min(next_id, topic.visible_until)  # a cluster's reader sees what a majority holds
        if at_time is not None:
            start = _reading(log.find_time, at_time)
        identity = log.identity
        if known_incarnation is not None and known_incarnation != identity.incarnation:
            point = self._resume_in(name, identity, known_incarnation, first_id if start is None else start)
            start = first_id if point is None else point
        if start is None or start < first_id:
            start = first_id
        read = RangeRead(first_id, next_id, start, identity.incarnation, [])
        max_messages = min(max_messages, FETCH_MAX_MESSAGES)
        if max_messages <= 0 or start >= next_id:
            return read
        max_bytes = max(0, min(max_bytes, FETCH_MAX_BYTES))
        max_messages = min(max_messages, next_id - start)  # a gated topic's readers stop at the gate
        if records:
            read.start_id, read.count, read.records = _reading(
                log.read_records, start, max_messages, max_bytes)
        else:
            read.messages = _reading(log.read, start, max_messages, max_bytes)
            read.count = len(read.messages)
        return read

    def resume_point(self, name: bytes, resume: int, incarnation: bytes) -> int:
        """Where a subscriber that wants ``resume`` next, in the log it knows as ``incarnation``, resumes now.

        The same id while the topic's log is that one (or a transient topic: nothing to compare). If the log
        changed, the first id the two do not share when its lineage remembers the old one (a reader past it
        saw messages that are gone), or the beginning of the log when it does not (a log created anew)."""
        log = self.topic(name).log  # created as subscribing would: a new log is a log the client never read
        if log is None:
            return resume
        point = self._resume_in(name, log.identity, incarnation.decode("ascii", "replace"), resume)
        return log.first_id if point is None else point

    def _resume_in(self, name: bytes, identity: LogIdentity, incarnation: str, position: int) -> int | None:
        """Where a reader of ``incarnation`` at ``position`` goes on in a log of ``identity``: by its lineage,
        or else by the lineage :attr:`lineage_of` knows for ``incarnation`` (None: nothing shared known)."""
        point = identity.resume_point(incarnation, position)
        if point is None and self.lineage_of is not None:
            lineage = self.lineage_of(name, incarnation)
            if lineage is not None:
                point = identity.resume_point_from(LogIdentity(incarnation, lineage), position)
        return point

    def incarnation(self, name: bytes) -> bytes | None:
        """The identity of ``name``'s log (None for a transient topic or one that does not exist)."""
        topic = self.topics.get(name)
        if topic is None or topic.log is None:
            return None
        return topic.log.identity.incarnation.encode()

    # ------------------------------------------------------------------------------------- logs: the turn

    def commit(self) -> int:
        """Group commit: make every message and ack of this turn as durable as its topic promises.

        One write per dirty topic, and one fsync per strong topic, however many messages the turn took.
        Returns the number of topics committed; :attr:`last_commit_messages` says how many messages."""
        if self.failed:
            self.failed = {}
        if self._ahead:
            self._ahead.clear()
        if self.store is not None:
            self.store.sync_created()  # the new topics exist for good before anything in them is confirmed
        dirty = self._dirty
        released, self._released = self._released, []
        if not dirty:
            if self.committed or released:
                self.committed = released
            return 0
        self._dirty = []
        messages = 0
        self.committed = [topic.name for topic in dirty] + released
        failures: dict[Topic, StoreError] = {}
        committing: list[Topic] = []
        for topic in dirty:
            topic.dirty = False
            failed = self._ahead_failed.pop(topic, None) if self._ahead_failed else None
            if failed is not None:
                failures[topic] = failed
            else:
                committing.append(topic)
        assert self.store is not None  # only topics with a log are marked dirty, and logs come from the store
        logs = [topic.log for topic in committing]
        for position, error in self.store.commit_many(logs).items():  # type: ignore[arg-type] - logs, not None
            failures[committing[position]] = error
        for topic in dirty:
            error = failures.get(topic)
            if error is not None:
                self._take_back(topic, error)
                topic.committed_id = topic.next_id  # taken back: nothing of the turn was stored
                continue
            messages += topic.next_id - topic.committed_id
            topic.committed_id = topic.next_id
        self.last_commit_messages = messages
        return len(dirty)

    # ------------------------------------------------------------------------------ a cluster's hooks

    def write_ahead(self) -> list[bytes]:
        """Write (without the fsync) what the turn appended to gated topics, so that a cluster's followers can
        read it while the leader's own fsync runs; :meth:`commit` then fsyncs. Nothing is confirmed or
        delivered from it before the commit (readers other than replicas stop at the gate). Returns the
        topics written."""
        written = []
        for topic in self._dirty:
            if topic.visible_until is None or topic.log is None:
                continue
            try:
                topic.log.write_ahead()
            except SyncFailed:
                raise
            except StoreError as error:
                self._ahead_failed[topic] = error  # commit() takes the turn's messages back
                continue
            self._ahead.add(topic)
            written.append(topic.name)
        return written

    def gate(self, topic: Topic, until: int) -> None:
        """Make ``topic`` a replicated topic: from now on its readers (subscribers, queues, FETCH) get only
        ids below the gate, which :meth:`release` moves as the cluster's majority takes messages."""
        if topic.visible_until is not None:
            return
        topic.visible_until = until
        for subscription in topic.subscriptions:
            if subscription.position is None and not topic.round_robin:
                subscription.position = topic.next_id

    def release(self, name: bytes, until: int) -> bool:
        """Move a gated topic's gate up to ``until`` (never down): readers waiting there read on, and FETCHes
        waiting for it are answered after the next commit. False if nothing moved."""
        topic = self.topics.get(name)
        if topic is None or topic.visible_until is None or until <= topic.visible_until:
            return False
        topic.visible_until = min(until, topic.next_id)
        for subscription in topic.subscriptions:
            if subscription.position is not None and subscription.position < until:
                self._catching_up[subscription] = None
        if topic.round_robin and topic.subscriptions:
            self._dispatch[topic] = None
        self._released.append(name)
        return True

    def append_replicated(self, name: bytes, records: bytes, start_id: int, count: int) -> Topic:
        """Append records another broker numbered (a cluster follower copying its leader): checked by the
        log, durable at the next commit. Nobody subscribes on a follower, so nothing is delivered."""
        topic = self.topics.get(name) or self.topic(name)
        log = topic.log
        if log is None:
            raise EngineError(f"topic {_shown(name)} is transient here: it has no log to copy into")
        try:
            log.append_records(records, start_id, count)
        except SyncFailed:
            raise
        except StoreError as error:
            raise EngineError(str(error)) from error  # the cause: the store failed (a take-over)
        topic.next_id = log.next_id
        topic.messages_in += count
        self._mark_dirty(topic)
        return topic

    def truncate(self, name: bytes, from_id: int) -> int:
        """Cut a persistent topic's log from ``from_id`` on (durably); returns how many messages went."""
        topic = self.topics.get(name)
        if topic is None or topic.log is None or from_id >= topic.next_id:
            return 0
        return self._recut(topic, lambda log: log.truncate(from_id))

    def restart_log(self, name: bytes, first_id: int) -> int:
        """Drop every message of a persistent topic's log (durably) and go on at ``first_id``, past its next
        id: a cluster follower whose leader no longer holds what it lacks. Returns how many messages went."""
        topic = self.topics.get(name)
        if topic is None or topic.log is None:
            return 0
        return self._recut(topic, lambda log: log.restart_at(first_id))

    def _recut(self, topic: Topic, change: Callable[[TopicLog], int]) -> int:
        """Apply a change that cuts ``topic``'s log, after committing its turn, and follow its new end."""
        assert topic.log is not None
        if topic.dirty:
            self.commit()
        try:
            cut = change(topic.log)
        except SyncFailed:
            raise
        except StoreError as error:
            raise EngineError(str(error)) from error
        topic.next_id = topic.committed_id = topic.log.next_id
        topic.next_dispatch = min(max(topic.next_dispatch, topic.log.first_id), topic.next_id)
        return cut

    def _realign(self, topic: Topic, message: Message) -> Message:
        """A broken log came back from its files holding more than the engine thought stored (a commit that
        failed after its records were written): its ids go on from there, and ``message`` takes the next one.
        Those records were refused to their publishers but are in the log: readers of the log see them."""
        log = topic.log
        assert log is not None
        topic.messages_in += log.next_id - topic.next_id
        topic.next_id = log.next_id
        message.id = topic.next_id
        try:
            log.append(message)
        except SyncFailed:
            raise
        except StoreError as error:
            raise EngineError(f"topic {_shown(topic.name)} is unavailable: {error}") from None
        return message

    def _take_back(self, topic: Topic, error: StoreError) -> None:
        """A commit of ``topic`` failed: its log is back to what its files hold. Messages past that were never
        stored (nor confirmed, nor delivered: deliveries leave after the commit): forget them."""
        self.failed[topic.name] = str(error)
        log = topic.log
        assert log is not None
        stored = log.next_id
        lost = topic.next_id - stored
        if lost <= 0:
            return
        topic.next_id = stored
        topic.messages_in -= lost
        name = topic.name
        for subscription in topic.subscriptions:
            subscriber = subscription.subscriber
            pending = subscriber.pending
            if pending:
                kept = [message for message in pending if message.topic != name or message.id < stored]
                withdrawn = len(pending) - len(kept)
                if withdrawn:
                    subscriber.pending = kept
                    topic.messages_out -= withdrawn
                    if subscription.tracked:
                        subscription.outstanding -= withdrawn
                    for message_id in [key for key in subscription.unacked if key >= stored]:
                        del subscription.unacked[message_id]
            if subscription.position is not None and subscription.position >= stored:
                subscription.position = None  # caught up: the next message arrives live
                self._catching_up.pop(subscription, None)
        if topic.round_robin:
            topic.next_dispatch = min(topic.next_dispatch, stored)
            if any(message_id >= stored for message_id in topic.redeliver):
                topic.redeliver = [message_id for message_id in topic.redeliver if message_id < stored]
                heapq.heapify(topic.redeliver)

    def _mark_dirty(self, topic: Topic) -> None:
        if not topic.dirty:
            topic.dirty = True
            self._dirty.append(topic)

    def pump(self, budget: int = PUMP_BUDGET) -> int:
        """Move messages from logs into pending lists: subscribers catching up, and persistent queues.

        Call after :meth:`commit` (only written data is read). Returns how many messages moved."""
        moved = 0
        for topic in list(self._dispatch):
            if moved >= budget:
                break
            moved += self._dispatch_from_log(topic, budget - moved)
        for subscription in list(self._catching_up):
            if moved >= budget:
                break
            moved += self._catch_up(subscription, budget - moved)
        self._pump_exhausted = moved >= budget
        return moved

    def _catch_up(self, subscription: Subscription, budget: int) -> int:
        topic = subscription.topic
        log = topic.log
        position = subscription.position
        if log is None or position is None:
            self._catching_up.pop(subscription, None)
            return 0
        gate = topic.visible_until
        if gate is not None and position >= gate:
            # Gated: nothing more on a majority yet. Waits here until release() moves the gate.
            del self._catching_up[subscription]
            return 0
        room = min(subscription.room, budget, READ_CHUNK)
        if gate is not None:
            room = min(room, gate - position)
        if room <= 0:
            return 0
        try:
            messages = log.read(position, room, READ_CHUNK_BYTES)
            # Retention may have removed what it was about to read (or repair): the reader skips ahead.
            going_on = messages[0].id if messages else log.first_id
        except DamagedRange as damage:
            messages = []
            going_on = min(damage.resume_id, topic.next_id)  # unreadable ids: skipped the same way
        except SyncFailed:
            raise
        except StoreError:
            return 0  # the log cannot be read now (a file that will not open): tried again next turn
        for message in messages:
            self._give(subscription, message)
        # What was skipped counts as dropped, and the log said why, once.
        skipped = going_on - position
        if skipped > 0:
            subscription.subscriber.dropped += skipped
            topic.dropped += skipped
        if messages:
            position = messages[-1].id + 1
        elif skipped > 0:
            position = going_on
        if gate is not None:
            subscription.position = position  # a gated reader never goes live: it reads up to the gate
        elif position >= topic.next_id:
            # Caught up: every message so far came from the log, the next one arrives live. The switch happens
            # between two publishes on the one loop thread, so there is no gap and no duplicate at the seam.
            subscription.position = None
            del self._catching_up[subscription]
        else:
            subscription.position = position
        return len(messages)

    def _dispatch_from_log(self, topic: Topic, budget: int) -> int:
        """Hand queued messages of a persistent round-robin topic to consumers with room, oldest first."""
        log = topic.log
        assert log is not None
        if topic.next_dispatch < log.first_id:
            # Retention removed messages nobody was handed. Counted here, before the room check: with no
            # consumer (or none with room) the loop below never runs, and enforce_retention() queued the topic
            # for exactly this count.
            topic.dropped += log.first_id - topic.next_dispatch
            topic.next_dispatch = log.first_id
        room = sum(max(0, subscription.room) for subscription in topic.subscriptions)
        # A gated topic's queue hands out what is on a majority of the cluster only.
        end = topic.next_id if topic.visible_until is None else min(topic.next_id, topic.visible_until)
        moved = 0
        while moved < budget and room > 0:
            if topic.redeliver:
                message_id = topic.redeliver[0]
                if message_id < log.first_id:
                    heapq.heappop(topic.redeliver)
                    topic.dropped += 1  # retention removed it before anyone acked it
                    continue
                try:
                    messages = log.read(message_id, 1, 1)
                except DamagedRange:
                    heapq.heappop(topic.redeliver)
                    topic.dropped += 1  # unreadable: it cannot be handed to anyone
                    continue
                except SyncFailed:
                    raise
                except StoreError:
                    break  # cannot be read now: tried again next turn
                if not messages or messages[0].id != message_id or not self._hand_to_next(topic, messages[0]):
                    break
                heapq.heappop(topic.redeliver)
            else:
                if topic.next_dispatch >= end:
                    break
                try:
                    messages = log.read(topic.next_dispatch, min(room, budget - moved, READ_CHUNK,
                                                                 end - topic.next_dispatch), READ_CHUNK_BYTES)
                except DamagedRange as damage:
                    resume = min(damage.resume_id, topic.next_id)
                    topic.dropped += resume - topic.next_dispatch  # unreadable, as retention's: dropped
                    topic.next_dispatch = resume
                    continue
                except SyncFailed:
                    raise
                except StoreError:
                    break  # cannot be read now: tried again next turn
                if not messages:
                    break
                if messages[0].id > topic.next_dispatch:  # ids repaired out of the log: gone, as retention's
                    topic.dropped += messages[0].id - topic.next_dispatch
                    topic.next_dispatch = messages[0].id
                acked = log.acked_above
                handed = 0
                for message in messages:
                    if message.id in acked:  # acked out of order before a restart
                        topic.next_dispatch = message.id + 1
                        continue
                    if not self._hand_to_next(topic, message):
                        break
                    topic.next_dispatch = message.id + 1
                    handed += 1
                moved += handed
                room -= handed
                if handed < len(messages) and topic.next_dispatch <= messages[-1].id:
                    break  # nobody had room for the rest
                continue
            moved += 1
            room -= 1
        if (not topic.redeliver and topic.next_dispatch >= end) or room <= 0:
            self._dispatch.pop(topic, None)
        return moved

    @property
    def has_log_work(self) -> bool:
        """The last :meth:`pump` spent its whole budget: more waits in the logs for subscribers with room.

        Not merely "someone is catching up": a reader without room (full pipe, no credit) makes no progress,
        and the shell would spin on it. Room comes back with a write or an ACK, and either runs a flush that
        pumps again."""
        return self._pump_exhausted

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

    # ------------------------------------------------------------------------------------------ housekeeping

    def sync(self, level: Sync | None = None) -> int:
        """fsync what was written to the logs (of one sync level, or all): the weak topics' periodic flush
        and the shutdown flush. Returns the number of logs synced."""
        count = 0
        for topic in self.topics.values():
            if topic.log is not None and (level is None or topic.spec.sync is level):
                try:
                    topic.log.sync()
                except SyncFailed:
                    raise
                except StoreError as error:  # buffered messages that could not be written: taken back
                    self._take_back(topic, error)
                    continue
                count += 1
        return count

    def enforce_retention(self, now_ms: int) -> int:
        """Delete whole sealed segments past their topic's retention, none holding :attr:`retention_floor`
        or a later id; returns how many went."""
        removed = 0
        floor = self.retention_floor
        for topic in self.topics.values():
            spec = topic.spec
            if topic.log is None or (spec.retention_bytes is None and spec.retention_seconds is None):
                continue
            try:
                removed += topic.log.enforce_retention(now_ms, None if floor is None else floor(topic))
            except SyncFailed:
                raise
            except StoreError:
                continue  # the store said why; retention tries again next time
            if topic.round_robin and topic.next_dispatch < topic.log.first_id:
                self._dispatch[topic] = None  # it counts what retention took from the queue
        return removed

    def sweep(self, budget: int = SWEEP_BUDGET) -> int:
        """Reclaim transient topics that nobody subscribes to, that hold nothing and took no message since the
        previous sweep; at most ``budget`` of them looked at. Returns how many went. A topic's id is never
        given again: used again, it is a new topic."""
        idle = self._idle
        reclaimed = 0
        for topic in list(itertools.islice(idle, budget)):
            seen = idle.pop(topic)
            if topic.subscriptions or topic.backlog or self.topics.get(topic.name) is not topic:
                continue  # in use (it comes back here when its last subscriber leaves), or gone already
            if seen == topic.messages_in:
                del self.topics[topic.name]
                self.names.discard(topic.name)
                reclaimed += 1
            else:
                idle[topic] = topic.messages_in  # at the back: looked at again next sweep
        self.reclaimed += reclaimed
        return reclaimed

    def delete(self, name: bytes) -> bool:
        """Remove topic ``name`` with its log and files; False if there is no such topic anywhere.

        Refused (EngineError) while anybody subscribes to it: subscribers would go on waiting on nothing.
        Used again later, the name is a new topic (new id, message ids from 1)."""
        topic = self.topics.get(name)
        if topic is not None and topic.subscriptions:
            count = len(topic.subscriptions)
            raise EngineError(f"topic {_shown(name)} has {count} subscriber{'s' * (count > 1)}: it can be "
                              "deleted once nobody subscribes to it")
        on_disk = False
        if self.store is not None and (topic is None or topic.log is not None):
            try:
                on_disk = self.store.delete(name)
            except SyncFailed:
                raise
            except StoreError as error:
                raise EngineError(f"topic {_shown(name)} cannot be deleted: {error}") from None
        self.unavailable.pop(name, None)
        if topic is None:
            return on_disk
        del self.topics[name]
        self.names.discard(name)
        self._idle.pop(topic, None)
        self._dispatch.pop(topic, None)
        if topic.dirty:
            topic.dirty = False
            self._dirty.remove(topic)
        return True

    def topic_page(self, prefix: bytes = b"", after: bytes | None = None,
                   limit: int = 1000) -> tuple[list[Topic], bytes | None]:
        """Up to ``limit`` topics whose names start with ``prefix``, after ``after``, in name order; and the
        name to ask after for the next page (None: this is the last)."""
        page: list[Topic] = []
        topics = self.topics
        for name in self.names.after(after, prefix):
            if len(page) == limit:
                return page, page[-1].name
            page.append(topics[name])
        return page, None

    def close(self) -> None:
        """Commit and close every log (the shutdown path: written and fsynced)."""
        self.commit()
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        return {name.decode("utf-8", "replace"): topic.stats() for name, topic in self.topics.items()}


T = TypeVar("T")


def _reading(read: Callable[..., T], *arguments: Any) -> T:
    """A read of one topic's log for a reader: a damaged range (named) or a file that will not open now fails
    that read with the reason (EngineError); only a failed fsync (SyncFailed) is the broker's failure."""
    try:
        return read(*arguments)
    except SyncFailed:
        raise
    except StoreError as error:
        raise EngineError(str(error)) from None


def _check_replay(name: bytes, spec: TopicSpec, replay: str | int | None) -> None:
    """Refuse a replay the topic's settings cannot honour (or a malformed one from a careless door)."""
    if replay is None or replay == REPLAY_CURRENT:
        return
    if replay != REPLAY_BEGINNING and (type(replay) is not int or replay < 0):
        raise EngineError(f"replay must be {REPLAY_BEGINNING!r}, {REPLAY_CURRENT!r} or a message id, "
                          f"not {replay!r}")
    if spec.delivery is Delivery.ROUND_ROBIN:
        raise EngineError(f"topic {_shown(name)} is round-robin: a queue is consumed from its own position, "
                          "replay applies to broadcast topics")
    if not spec.persistent:
        raise EngineError(f"topic {_shown(name)} is transient: there is no log to replay")


def _wrong_size(topic: Topic, body: bytes) -> str:
    return f"topic {_shown(topic.name)} takes bodies of exactly {topic.element_size} bytes, not {len(body)}"


def _shown(name: bytes) -> str:
    return repr(name.decode("utf-8", "replace"))


def _settings(spec: TopicSpec) -> str:
    return ", ".join(f"{key} {value}" for key, value in spec.describe().items())
