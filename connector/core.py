"""The client side of mc0 without I/O: what to send, what a received frame set means, when to heartbeat.

Both :class:`connector.Client` (blocking, an I/O thread) and :class:`connector.AsyncClient` (asyncio) drive
one :class:`ClientCore`; they own the DEALER socket and the waiting, this module owns the protocol. Time is an
argument everywhere, so the rules are testable without sleeping.

The core also owns what must survive a reconnect: the subscriptions with the options they were asked with, and
the id of the last message received per topic, so that the SUBs on a new connection resume each topic right
after it (no loss, no duplicate on persistent broadcast topics). It checks the arguments of SUB, ACK, DECLARE
and FETCH before anything is queued, because a bad value found later, on a client's I/O thread, would stop it.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter

from protocol import ProtocolError, mc0
from protocol.bodies import TopicBodies

log = logging.getLogger("mc0.connector")

#: The client asks for every extension it speaks; a broker that does not echo one simply is not using it.
WANTED_EXTENSIONS = frozenset({mc0.EXT_BATCH, mc0.EXT_IDS, mc0.EXT_CONFIRMS, mc0.EXT_COLUMNS})
#: Publishes packed into one PUTS frame at most (the broker's MESSAGES batches use the same bound).
BATCH_MAX_MESSAGES = 1024
BATCH_MAX_BYTES = 1 << 20
#: A publish_batch of at least this many entries, all to one topic and without headers, goes as columns
#: (:class:`~protocol.bodies.TopicBodies`) where the broker grants them: the size from which the broker's
#: store lays a batch out in bulk (below it, columns save the broker nothing and cost numpy's fixed price).
COLUMNS_MIN = 256
#: Message ids per ACK frame set at most: one frame per id, and a consumer acking a huge backlog at once
#: should not build a single frame set of a million frames.
ACK_MAX_IDS = 1024
#: Heartbeats, as fractions of the TTL: a NOOP after half of it without sending (the reference connector waits
#: 0.95 x TTL, a tenth of a TTL short of the broker's patience: a client whose process is busy elsewhere, its
#: I/O thread waiting for the interpreter, would be dropped), and the broker taken for gone after 1.05 x TTL
#: without a frame from it (the reference rule).
NOOP_AFTER = 0.5
SILENT_AFTER = 1.05
#: Where a subscription may start (see mc0.Sub.replay).
REPLAY_WORDS = (mc0.REPLAY_BEGINNING, mc0.REPLAY_CURRENT)


class ConnectorError(Exception):
    """The broker refused a command, did not answer in time, or the client was used after close()."""


@dataclass(slots=True)
class Message:
    """A delivered message. ``id`` and ``timestamp`` (ms since the epoch) are set by brokers that speak
    ``ids``.

    Not frozen on purpose: a frozen dataclass costs several times more to build, and one is built per
    delivery.
    """

    topic: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    id: int | None = None
    timestamp: int | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def to_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def _text_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
            for k, v in headers.items()}


def encode_headers(headers: dict[str, str] | dict[bytes, bytes] | None) -> dict[bytes, bytes]:
    if not headers:
        return {}
    return {to_bytes(k): to_bytes(v) for k, v in headers.items()}


#: Shared by every header-less publish; treated as read-only everywhere.
NO_HEADERS: dict[bytes, bytes] = {}


@dataclass(frozen=True, slots=True)
class Subscription:
    """How one topic was subscribed, kept to ask the same way again on a new connection.

    Frozen and hashable: topics with equal options share one SUB when they are restored."""

    replay: mc0.Replay | None = None  # None: live (the 0.3 behaviour)
    credit: int | None = None
    explicit_acks: bool = False


def _count(value: object, what: str, minimum: int) -> int:
    # bool is an int to Python, but credit=True is a mistake, not the number 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, not {value}")
    return value


def sub_event(
    topics: Iterable[str | bytes],
    replay: mc0.Replay | None = None,
    credit: int | None = None,
    explicit_acks: bool = False,
) -> mc0.Sub:
    """The SUB for ``Client.subscribe``; raises TypeError or ValueError for options the codec cannot send."""
    raw = [to_bytes(topic) for topic in topics]
    if not raw:
        raise ValueError("subscribe() needs at least one topic")
    if replay is not None and replay not in REPLAY_WORDS:
        if isinstance(replay, str):
            raise ValueError(f"replay must be 'beginning', 'current' or a message id, not {replay!r}")
        replay = _count(replay, "replay (a message id)", 0)
    if credit is not None:
        credit = _count(credit, "credit", 1)
    return mc0.Sub(raw, replay=replay, credit=credit, explicit_acks=bool(explicit_acks))


def ack_target(message_or_topic: Message | str | bytes, ids: tuple[int, ...]) -> tuple[bytes, list[int]]:
    """The topic and ids an ``ack(message)`` or ``ack(topic, *ids)`` call confirms."""
    if isinstance(message_or_topic, Message):
        if ids:
            raise TypeError("ack(message) takes no ids; use ack(topic, *ids) for several")
        if message_or_topic.id is None:
            raise ConnectorError("this message has no id to ack (the broker did not negotiate 'ids')")
        return to_bytes(message_or_topic.topic), [message_or_topic.id]
    if not ids:
        raise TypeError("ack(topic, *ids) needs at least one message id")
    return to_bytes(message_or_topic), [_count(i, "a message id", 0) for i in ids]


#: The topic settings DECLARE can carry (the keyword names of ``Client.declare``).
SETTING_NAMES = frozenset(mc0.DECLARE_SETTINGS.values())


def _setting_text(name: str, value: object) -> str:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a string or a number, not {value!r}")
    if isinstance(value, float) and value.is_integer():
        text = str(int(value))  # "3600", not "3600.0": the broker may parse whole numbers only
    elif isinstance(value, str | int | float):
        text = str(value)  # a StrEnum (Delivery.ROUND_ROBIN) gives its value
    else:
        raise TypeError(f"{name} must be a string or a number, not {value!r}")
    if not text.isascii() or not text:
        raise ValueError(f"{name} must be non-empty ASCII, not {text!r}")
    return text


def declare_event(topic: str | bytes, settings: Mapping[str, object]) -> mc0.Declare:
    """The DECLARE for ``Client.declare``: settings left at None are not sent (the broker's default)."""
    unknown = set(settings) - SETTING_NAMES
    if unknown:
        raise TypeError(f"declare() got unknown settings {sorted(unknown)} (known: {sorted(SETTING_NAMES)})")
    raw = to_bytes(topic)
    if not raw:
        raise ValueError("declare() needs a non-empty topic")
    texts = {name: _setting_text(name, value) for name, value in settings.items() if value is not None}
    return mc0.Declare(raw, texts)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What ``Client.fetch`` read: the topic's oldest stored id, one past its newest (what a reader may fetch
    up to now), and the stored messages from the id asked for on, in id order (``id``, ``timestamp`` set).

    ``messages`` starting above the id asked for means retention removed the ones between (``first_id`` says
    where the log begins now); an empty list with ``start >= next_id`` means there is nothing newer yet.
    ``incarnation`` names the log the ids belong to (docs/storage.md, "Log identity"; "" from an older broker,
    "-" for a topic with no log yet) and ``start_id`` is where the read started (None from an older
    broker)."""

    topic: str
    first_id: int
    next_id: int
    messages: list[Message]
    incarnation: str = ""
    start_id: int | None = None


@dataclass(frozen=True, slots=True)
class RecordsResult:
    """What ``Client.fetch_records`` read: ``count`` stored records, ids ``start_id`` on, undecoded in
    ``payload`` (:mod:`protocol.records` reads them), and the topic's ``first_id``, ``next_id`` and
    ``incarnation`` as in :class:`FetchResult`."""

    topic: str
    first_id: int
    next_id: int
    start_id: int
    count: int
    incarnation: str
    payload: bytes


def fetch_event(
    topic: str | bytes,
    start: int | None,
    max_messages: int,
    max_bytes: int,
    *,
    wait: float | None = None,
    at_time: int | None = None,
    incarnation: str | None = None,
    records: bool = False,
) -> mc0.Fetch:
    """The FETCH for ``Client.fetch``; raises TypeError or ValueError for arguments the codec cannot send.

    Bounds above the broker's caps are sent as asked: the broker lowers them (mc0.FETCH_MAX_*). ``wait`` is
    in seconds, ``at_time`` in milliseconds since the epoch."""
    raw = to_bytes(topic)
    if not raw:
        raise ValueError("fetch() needs a non-empty topic")
    if start is not None:
        start = _count(start, "start (a message id)", 0)
        if at_time is not None:
            raise ValueError("fetch() takes start or at_time, not both")
    event = mc0.Fetch(raw, start, _count(max_messages, "max_messages", 0), _count(max_bytes, "max_bytes", 0))
    if wait is not None:
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
            raise ValueError(f"wait must be a number of seconds >= 0, not {wait!r}")
        event.wait = round(wait * 1000)
    if at_time is not None:
        event.at_time = _count(at_time, "at_time (milliseconds since the epoch)", 0)
    if incarnation:
        event.incarnation = incarnation.encode("ascii")
    event.records = records
    return event


def fetch_result(topic: str | bytes, reply: mc0.Ok) -> FetchResult:
    """The broker's OK to a FETCH as a :class:`FetchResult`; ConnectorError if it is not a well-formed one."""
    try:
        first_id, next_id, items, incarnation, start_id = mc0.decode_fetch_reply(reply)
    except ProtocolError as error:
        raise ConnectorError(f"malformed reply to FETCH: {error}") from None
    name = _topic_name(topic)
    messages = [
        Message(name, item.body, _text_headers(item.headers) if item.headers else {}, item.id, item.timestamp)
        for item in items
    ]
    return FetchResult(name, first_id, next_id, messages, incarnation.decode("ascii", "replace"), start_id)


def records_result(topic: str | bytes, reply: mc0.Ok) -> RecordsResult:
    """The broker's OK to a ``FORMAT records`` FETCH; ConnectorError if it is not a well-formed one."""
    try:
        first_id, next_id, start_id, count, incarnation, payload = mc0.decode_records_reply(reply)
    except ProtocolError as error:
        raise ConnectorError(f"malformed reply to FETCH: {error}") from None
    return RecordsResult(_topic_name(topic), first_id, next_id, start_id, count,
                         incarnation.decode("ascii", "replace"), payload)


def _topic_name(topic: str | bytes) -> str:
    return topic if isinstance(topic, str) else topic.decode("utf-8", "surrogateescape")


def puts_event(
    items: Iterable[tuple[str | bytes, str | bytes, Mapping[str, str] | None]] | TopicBodies,
    producer: str | bytes | None = None,
    sequence: int | None = None,
) -> mc0.Puts:
    """The PUTS of ``publish_batch``: every entry checked and encoded before anything is sent (one topic's
    bodies as columns, :class:`~protocol.bodies.TopicBodies`, are checked by the broker). A large batch of one
    topic without headers becomes such columns (:data:`COLUMNS_MIN`). With ``producer`` and ``sequence`` an
    idempotent batch: one topic, entry ``i`` numbered ``sequence + i``."""
    raw_topics: dict[str | bytes, bytes] = {}  # a batch names few topics: each converted and checked once
    if type(items) is TopicBodies:
        if not items.topic:
            raise ValueError("publish_batch() needs a non-empty topic for every message")
        puts = mc0.Puts(items)
    else:
        batch: list[tuple[bytes, bytes, dict[bytes, bytes]]] = []
        append = batch.append
        headed = False
        for topic, body, headers in items:
            raw_topic = raw_topics.get(topic)
            if raw_topic is None:
                raw_topic = raw_topics[topic] = to_bytes(topic)
                if not raw_topic:
                    raise ValueError("publish_batch() needs a non-empty topic for every message")
            if headers:
                headed = True
            append((raw_topic, body if type(body) is bytes else to_bytes(body),
                    encode_headers(dict(headers)) if headers else mc0.NO_HEADERS))
        if len(batch) >= COLUMNS_MIN and not headed and len(set(raw_topics.values())) == 1:
            puts = mc0.Puts(TopicBodies.of(batch[0][0], [body for _, body, _ in batch]))
        else:
            puts = mc0.Puts(batch)
    if len(puts.items) > mc0.PUTS_MAX_ENTRIES:
        raise ValueError(f"publish_batch() takes at most {mc0.PUTS_MAX_ENTRIES:,} entries, not "
                         f"{len(puts.items):,}: split the batch (an idempotent one's parts go on numbering "
                         "where the previous part ended)")
    if producer is None and sequence is None:
        return puts
    if producer is None or sequence is None:
        raise ValueError("publish_batch() takes producer and sequence together")
    puts.producer = to_bytes(producer)
    if not 1 <= len(puts.producer) <= mc0.MAX_PRODUCER_BYTES:
        raise ValueError(f"producer must be 1 to {mc0.MAX_PRODUCER_BYTES} bytes")
    puts.sequence = _count(sequence, "sequence", 0)
    if len(set(raw_topics.values())) > 1:
        raise ValueError("an idempotent publish_batch() (producer) writes one topic")
    return puts


def ok_headers(reply: mc0.Ok) -> dict[str, str]:
    """An OK's headers as text (MESSAGE-ID, DURABILITY, COUNT...)."""
    return {k.decode(): v.decode("utf-8", "replace") for k, v in reply.headers.items()}


#: What the broker said of one confirmed publish: ``(message id, durability)`` of a stored entry of a
#: ``PUTS CONFIRM each`` (the tuple the reply decoded to; :func:`confirm_headers` makes the headers when they
#: are asked for), the OK's headers of a single PUT, or the ConnectorError its refusal raises.
Outcome = tuple[int, str] | dict[str, str] | ConnectorError


def confirm_results(reply: mc0.Ok | mc0.Error, count: int) -> list[Outcome]:
    """What the broker said of ``count`` confirmed publishes that left in one command, one outcome each.

    The reply to a ``PUTS CONFIRM each`` carries one result per entry; the reply to a single PUT is its OK
    or its ERROR."""
    # One exception object per publish: each is raised on its own, perhaps in its own thread.
    if isinstance(reply, mc0.Error):
        text = reply.message.decode("utf-8", "replace")
        return [ConnectorError(f"broker refused PUT: {text}") for _ in range(count)]
    if reply.body is None:  # the OK to one PUT with an ID
        if count == 1:
            return [ok_headers(reply)]
        return [_malformed("an OK without results") for _ in range(count)]
    try:
        entries = mc0.decode_confirms(reply, count)
    except ProtocolError as error:
        return [_malformed(str(error)) for _ in range(count)]
    return [entry if entry[0] is not None else ConnectorError(f"broker refused PUT: {entry[1]}")
            for entry in entries]


def confirm_headers(outcome: tuple[int, str] | dict[str, str]) -> dict[str, str]:
    """The headers a confirmed publish resolves to (``MESSAGE-ID``, ``DURABILITY``) from its outcome."""
    if type(outcome) is tuple:
        return {"MESSAGE-ID": str(outcome[0]), "DURABILITY": outcome[1]}
    return outcome  # type: ignore[return-value] - the OK's headers already


def _malformed(what: str) -> ConnectorError:
    return ConnectorError(f"malformed reply to confirmed publishes ({what}): whether they were stored is "
                          "unknown")


#: One queued publish: (topic, body, headers) as bytes, headers possibly empty.
Publish = tuple[bytes, bytes, dict[bytes, bytes]]
_body_of = itemgetter(1)


class ClientCore:
    """Protocol state of one client connection (rebuilt on reconnect, except the subscriptions and the last
    message ids, which say how to restore them)."""

    def __init__(self, ttl_ms: int | None = 30_000) -> None:
        if ttl_ms is not None and ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive (or None for no heartbeats)")
        self.ttl = None if ttl_ms is None else ttl_ms / 1000
        self.ttl_ms = ttl_ms
        # Ordered: restored in the order the user subscribed.
        self.subscriptions: dict[bytes, Subscription] = {}
        # Topic name -> id of the last message received; written once per delivery, so kept cheap: str keys
        # because the fast path has the decoded name at hand, and no check that ids grow (resume asks for
        # "after the last one received", which is right even if a redelivery went backwards).
        self.last_ids: dict[str, int] = {}
        # Topic name -> identity of its log, from the OK to the SUB (persistent topics): sent with RESUME, so
        # that the broker resumes where the logs agree if the topic's log changed while we were away.
        self.incarnations: dict[str, str] = {}
        #: (topic, incarnation before, incarnation now) for each log found changed on a reconnect: ids of the
        #: topic may repeat ones received before (logged as a warning too).
        self.log_changes: list[tuple[str, str, str]] = []
        self.extensions: frozenset[str] = frozenset()
        self._ids = itertools.count(1)
        self._topic_names: dict[bytes, str] = {}
        # SUB command id -> what its topics were before it (options, last id), restored if the broker refuses.
        self._before_sub: dict[bytes, dict[bytes, tuple[Subscription | None, int | None]]] = {}
        self.last_heard = 0.0
        self.last_sent = 0.0

    # ----------------------------------------------------------------------------------------------- commands

    def next_id(self) -> bytes:
        return b"%d" % next(self._ids)

    def connect(self, now: float) -> tuple[bytes, mc0.Frames]:
        """A fresh CONNECT (with an ID like the reference connector's uuid) for a new socket."""
        self.extensions = frozenset()
        self.last_heard = now
        self.last_sent = now
        self._before_sub.clear()  # replies on the old connection will never come
        command_id = str(uuid.uuid4()).encode()
        event = mc0.Connect(mc0.PROTOCOL_VERSION, self.ttl_ms, command_id, WANTED_EXTENSIONS)
        return command_id, mc0.encode(event)

    def connected(self, reply: mc0.Ok) -> None:
        raw = reply.headers.get(mc0.EXTENSIONS, b"")
        self.extensions = frozenset(raw.decode("ascii", "replace").split()) & WANTED_EXTENSIONS

    def request(self, event: mc0.Sub | mc0.Unsub | mc0.Put | mc0.Puts | mc0.Noop | mc0.Stats
                | mc0.Disconnect | mc0.Declare | mc0.Fetch) -> tuple[bytes, mc0.Frames]:
        """Give ``event`` a fresh ID and encode it; the caller waits for the reply with that ID."""
        event.id = self.next_id()
        if (type(event) is mc0.Puts and type(event.items) is TopicBodies
                and mc0.EXT_COLUMNS not in self.extensions):
            event.items = list(event.items)  # a broker without "columns" takes them as msgpack entries
        return event.id, mc0.encode(event)

    def command(self, event: mc0.Sub | mc0.Unsub | mc0.Put | mc0.Puts | mc0.Noop | mc0.Stats
                | mc0.Disconnect | mc0.Declare | mc0.Fetch) -> tuple[bytes, mc0.Frames]:
        """:meth:`request`, recording a SUB or UNSUB in :attr:`subscriptions` as it leaves.

        Recorded when sent, not when answered: a reconnect between the two must restore the subscription, and
        messages may follow the SUB before its OK. A refused SUB is undone when its ERROR is received."""
        if isinstance(event, mc0.Sub):
            return self._subscribe(event)
        if isinstance(event, mc0.Unsub):
            for topic in event.topics:
                self.subscriptions.pop(topic, None)
                self.last_ids.pop(self._topic(topic), None)  # a later subscribe starts afresh
        return self.request(event)

    def _subscribe(self, sub: mc0.Sub) -> tuple[bytes, mc0.Frames]:
        before: dict[bytes, tuple[Subscription | None, int | None]] = {}
        for topic in sub.topics:
            name = self._topic(topic)
            previous = self.subscriptions.get(topic)
            before[topic] = (previous, self.last_ids.get(name))
            replay = sub.replay
            if replay is None and previous is not None:
                replay = previous.replay  # the broker keeps its position when a SUB changes only options
            else:
                self.last_ids.pop(name, None)  # a new start: the ids seen before say nothing about it
            self.subscriptions[topic] = Subscription(replay, sub.credit, sub.explicit_acks)
        command_id, frames = self.request(sub)
        self._before_sub[command_id] = before
        return command_id, frames

    def _answered(self, reply: mc0.Ok | mc0.Error) -> None:
        before = self._before_sub.pop(reply.id, None) if reply.id is not None else None
        if before is None:
            return
        if isinstance(reply, mc0.Ok):
            self._subscribed_at(list(before), reply.headers.get(mc0.NEXT_IDS))
            self._logs_of(list(before), reply.headers.get(mc0.INCARNATIONS), reply.headers.get(mc0.START_IDS))
            return
        # The broker refuses a SUB whole and keeps what each topic had: so does the client.
        for topic, (previous, last_id) in before.items():
            if previous is None:
                self.subscriptions.pop(topic, None)
            else:
                self.subscriptions[topic] = previous
            if last_id is not None:  # unless newer messages of the topic arrived in the meantime
                self.last_ids.setdefault(self._topic(topic), last_id)

    def _subscribed_at(self, topics: list[bytes], raw: bytes | None) -> None:
        """A live subscription starts where the broker's OK says each topic stood: a reconnect before the
        first message then resumes from there instead of missing what was published while the client was
        away."""
        if raw is None:
            return
        next_ids = raw.split()
        if len(next_ids) != len(topics) or not all(next_id.isdigit() for next_id in next_ids):
            return  # not what this client understands: keep the plain behaviour
        for topic, next_id in zip(topics, next_ids, strict=True):
            subscription = self.subscriptions.get(topic)
            if subscription is not None and subscription.replay in (None, mc0.REPLAY_CURRENT):
                # setdefault: a message of the topic may already have arrived and set a newer position.
                self.last_ids.setdefault(self._topic(topic), int(next_id) - 1)

    def _logs_of(self, topics: list[bytes], raw: bytes | None, starts: bytes | None) -> None:
        """Which log each topic is (INCARNATIONS on the OK to a SUB). A topic whose log is another one than
        the one this client read (recreated, or cut back after a crash) says so: a warning,
        :attr:`log_changes`, and the resume point moves to where the broker restarted the subscription
        (START-IDS)."""
        if raw is None:
            return
        names = raw.decode("ascii", "replace").split()
        first = starts.split() if starts is not None else []
        if len(names) != len(topics):
            return
        for index, (topic, incarnation) in enumerate(zip(topics, names, strict=True)):
            if incarnation == mc0.NO_INCARNATION.decode():
                continue
            name = self._topic(topic)
            before = self.incarnations.get(name)
            self.incarnations[name] = incarnation
            if before is None or before == incarnation:
                continue
            start = first[index] if index < len(first) else b""
            last = self.last_ids.get(name)
            if start.isdigit() and last is not None and int(start) - 1 >= last:
                # A successor that holds everything read (a cluster's new leader epoch): nothing repeats.
                log.debug("topic %s: the log's identity is %s now, a successor of %s holding every id read",
                          name, incarnation, before)
                continue
            self.log_changes.append((name, before, incarnation))
            if start.isdigit():
                self.last_ids[name] = int(start) - 1
            log.warning("topic %s: the broker's log is another one than the one read before (incarnation %s, "
                        "was %s): reading on from id %s; ids may repeat ones received before", name,
                        incarnation, before, start.decode() if start.isdigit() else "its start")

    def resubscribe(self) -> list[tuple[bytes, mc0.Frames]]:
        """The SUB commands that restore every subscription on a new connection.

        A topic with a received message resumes right after it (one SUB each: RESUME is per topic); the others
        are asked again with their original options, topics with equal options sharing one SUB."""
        subs: list[mc0.Sub] = []
        shared: dict[Subscription, mc0.Sub] = {}
        last_ids = self.last_ids
        for topic, options in self.subscriptions.items():
            name = self._topic(topic)
            last = last_ids.get(name)
            if type(last) is int and last >= 0:  # a broker bug could have put anything there
                incarnation = self.incarnations.get(name)
                subs.append(mc0.Sub([topic], resume=last + 1, credit=options.credit,
                                    explicit_acks=options.explicit_acks,
                                    incarnation=incarnation.encode("ascii") if incarnation else None))
                continue
            sub = shared.get(options)
            if sub is None:
                sub = shared[options] = mc0.Sub([], replay=options.replay, credit=options.credit,
                                                explicit_acks=options.explicit_acks)
                subs.append(sub)
            sub.topics.append(topic)
        out = []
        for sub in subs:
            command_id, frames = self.request(sub)
            # Answered like a SUB of the user's: where live topics stand, and which log each topic is now.
            self._before_sub[command_id] = {
                topic: (self.subscriptions.get(topic), last_ids.get(self._topic(topic)))
                for topic in sub.topics
            }
            out.append((command_id, frames))
        return out

    def pack(self, publishes: list[Publish]) -> Iterable[mc0.Frames]:
        """Fire-and-forget publishes as frame sets: PUTS batches if the broker speaks ``batch``, else PUTs."""
        if mc0.EXT_BATCH not in self.extensions:
            for topic, body, headers in publishes:
                yield mc0.encode(mc0.Put(topic, body, None, headers))
            return
        for start, end in self._chunks(publishes):
            yield [b"", b"PUTS", b"", mc0.pack_put_items(publishes[start:end])]

    def pack_confirms(self, publishes: list[Publish]) -> Iterator[tuple[bytes, mc0.Frames, int]]:
        """Confirmed publishes as ``(command id, frames, entries)``: PUTS with ``CONFIRM each`` if the broker
        speaks ``confirms`` (publishes in flight travel together and are confirmed one by one), else one PUT
        with an ID each (still pipelined: nobody waits for one OK before sending the next)."""
        if mc0.EXT_CONFIRMS not in self.extensions:
            for topic, body, headers in publishes:
                command_id = self.next_id()
                yield command_id, mc0.encode(mc0.Put(topic, body, command_id, headers)), 1
            return
        for start, end in self._chunks(publishes):
            command_id = self.next_id()
            head = [b"", b"PUTS", mc0.CONFIRM, mc0.CONFIRM_EACH, mc0.ID, command_id, b""]
            yield command_id, [*head, mc0.pack_put_items(publishes[start:end])], end - start

    @staticmethod
    def _chunks(publishes: list[Publish]) -> Iterator[tuple[int, int]]:
        """``[start, end)`` ranges of at most BATCH_MAX_MESSAGES publishes and about BATCH_MAX_BYTES of
        bodies: a frame over the broker's max_message_size would cost the connection."""
        start = 0
        total = len(publishes)
        if 0 < total <= BATCH_MAX_MESSAGES and sum(map(len, map(_body_of, publishes))) < BATCH_MAX_BYTES:
            yield 0, total  # the common case, summed without a Python step per publish
            return
        while start < total:
            end = min(total, start + BATCH_MAX_MESSAGES)
            size = 0
            for index in range(start, end):
                size += len(publishes[index][1])
                if size >= BATCH_MAX_BYTES:
                    end = index + 1
                    break
            yield start, end
            start = end

    @staticmethod
    def pack_acks(acks: Mapping[bytes, list[int]]) -> Iterator[mc0.Frames]:
        """Fire-and-forget ACKs (no ID: the broker answers nothing), one per topic and ACK_MAX_IDS ids."""
        for topic, ids in acks.items():
            for start in range(0, len(ids), ACK_MAX_IDS):
                yield mc0.encode(mc0.Ack(topic, ids[start : start + ACK_MAX_IDS]))

    # ------------------------------------------------------------------------------------------------ replies

    def receive(self, frames: mc0.Frames, now: float) -> tuple[list[Message], mc0.Ok | mc0.Error | None]:
        """What one frame set from the broker means: deliveries, or a reply to one of our commands."""
        self.last_heard = now
        if len(frames) >= 3 and frames[1] == b"MESSAGES" and frames[2] == b"":
            return self._batch(frames), None  # fast path: no event objects for batches
        try:
            event = mc0.decode(frames)
        except ProtocolError:
            return [], None  # a broker bug must not kill the client; nothing to act on
        match event:
            case mc0.Message(topic, body, headers, message_id, timestamp):
                topic_name = self._topic(topic)
                message = Message(topic_name, body, _text_headers(headers), message_id, timestamp)
                if message_id is not None:
                    self.last_ids[topic_name] = message_id
                return [message], None
            case mc0.Messages(items):  # a batch framed without the delimiter misses the fast path above
                out = []
                for i in items:
                    topic_name = self._topic(i.topic)
                    headers = _text_headers(i.headers)
                    out.append(Message(topic_name, i.body, headers, i.message_id, i.timestamp))
                    self.last_ids[topic_name] = i.message_id
                return out, None
            case mc0.Ok() | mc0.Error():
                self._answered(event)
                return [], event
        return [], None  # NOOP (liveness already recorded) or anything a client need not act on

    def _topic(self, raw: bytes) -> str:
        name = self._topic_names.get(raw)
        if name is None:
            name = self._topic_names[raw] = raw.decode("utf-8", "surrogateescape")
        return name

    def _batch(self, frames: mc0.Frames) -> list[Message]:
        try:
            entries = mc0.msgpack.unpackb(frames[3], raw=False) if len(frames) == 4 else None
        except Exception:  # msgpack raises several unrelated types for bad input
            entries = None
        if not isinstance(entries, list):
            return []
        # Locals, and the name cache read inline rather than through _topic(): a method call per message would
        # cost about as much as the last-id store the loop pays for resuming after a reconnect.
        names = self._topic_names
        topic_name = self._topic
        last_ids = self.last_ids
        out: list[Message] = []
        append = out.append
        try:
            for entry in entries:
                # Indexed, never unpacked: a 4-key map would unpack into its keys, while indexing it raises.
                topic = entry[0]
                name = names.get(topic) or topic_name(topic)
                if len(entry) == 4:
                    append(Message(name, entry[3], {}, entry[1], entry[2]))
                else:
                    append(Message(name, entry[3], _text_headers(entry[4]), entry[1], entry[2]))
                # After the append: an entry that failed to parse was not received, so it is not "seen".
                last_ids[name] = entry[1]
        except (TypeError, AttributeError, IndexError, KeyError):
            pass  # a malformed entry from a broker bug: keep what parsed, never kill the client
        return out

    # --------------------------------------------------------------------------------------------- heartbeats

    def sent(self, now: float) -> None:
        self.last_sent = now

    def noop_due(self, now: float) -> bool:
        return self.ttl is not None and now - self.last_sent >= NOOP_AFTER * self.ttl

    def broker_silent(self, now: float) -> bool:
        return self.ttl is not None and now - self.last_heard > SILENT_AFTER * self.ttl

    def next_timer(self, now: float) -> float | None:
        """Seconds until a heartbeat decision is due (None: no TTL, no timers)."""
        if self.ttl is None:
            return None
        due = min(self.last_sent + NOOP_AFTER * self.ttl, self.last_heard + SILENT_AFTER * self.ttl)
        return max(0.0, due - now)
