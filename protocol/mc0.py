"""The mc0 dialect (version 0.3 plus our extensions) as a sans-IO frame codec.

A command is a list of ZeroMQ frames: ``VERB, key1, value1, ..., b"", positional...``. A DEALER puts an
empty delimiter frame in front (``b"", VERB, ...``); some clients omit it, and both shapes decode.
:func:`decode` turns frames into one typed event and :func:`encode` does the reverse; neither knows about
sockets or identities (the router shell strips and adds the ROUTER identity frame).

Plain 0.3 verbs: CONNECT, DISCONNECT, SUB, UNSUB, PUT, NOOP, MESSAGE, OK, ERROR. Our extensions, reserved by
the spec for the protocol and documented in ``docs/mc0.md``: the ``EXTENSIONS`` header on CONNECT/OK,
``MESSAGE-ID`` and ``TIMESTAMP`` on MESSAGE, the batch verbs PUTS and MESSAGES (msgpack payloads), STATS
(paged with PREFIX, AFTER and LIMIT), the replay/resume/credit/acks headers on SUB, the verbs ACK, DECLARE and
DELETE, and FETCH (range reads of a persistent topic's log, answered by an OK with a msgpack payload:
:func:`decode_fetch_reply`).

Every malformed input raises :class:`ProtocolError` with a message fit for an ERROR reply and, when the
decoder got that far, the command's ID so the reply can carry it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

import msgpack

from protocol.bodies import NO_HEADERS, TopicBodies, entry_topics
from protocol.errors import ProtocolError

Frames: TypeAlias = list[bytes]
Headers: TypeAlias = dict[bytes, bytes]

#: Versions a client may announce; the reference connector 0.3 still says "0.2".
SUPPORTED_VERSIONS = (b"0.1", b"0.2", b"0.3")
PROTOCOL_VERSION = b"0.3"

# Reserved header names (the spec reserves everything not prefixed ``X-``).
ID = b"ID"
TOPIC = b"TOPIC"
VERSION = b"VERSION"
TTL = b"TTL"
MESSAGE_KEY = b"MESSAGE"
EXTENSIONS = b"EXTENSIONS"
MESSAGE_ID = b"MESSAGE-ID"
TIMESTAMP = b"TIMESTAMP"
DURABILITY = b"DURABILITY"
# SUB extensions.
REPLAY = b"REPLAY"  # beginning | current | <message id>: where a subscription starts on a persistent topic
RESUME = b"RESUME"  # <message id>: replay from it on a persistent topic, live on a transient one (reconnects)
CREDIT = b"CREDIT"  # <n>: at most n messages in flight to this subscription
ACKS = b"ACKS"  # explicit | auto: whether the subscriber confirms each message with ACK
NEXT_IDS = b"NEXT-IDS"  # on the OK to a SUB ("ids"): each topic's next message id, in the SUB's order
# FETCH and its OK.
FROM = b"FROM"  # <message id>: the first id wanted (default: the oldest stored)
MAX_MESSAGES = b"MAX-MESSAGES"  # <n>: at most n messages in the reply (0: only the ids)
MAX_BYTES = b"MAX-BYTES"  # <n>: bodies up to n bytes in the reply (but always at least one message)
FIRST_ID = b"FIRST-ID"  # on the OK to a FETCH: the oldest stored id
NEXT_ID = b"NEXT-ID"  # on the OK to a FETCH: one past the newest stored id
COUNT = b"COUNT"  # on the OK to a FETCH (and a PUTS): how many messages
# PUTS: "CONFIRM each" (extension "confirms") asks for one result per entry instead of one for the batch.
CONFIRM = b"CONFIRM"
CONFIRM_EACH = b"each"
CONTENT_TYPE = b"CONTENT-TYPE"
MSGPACK_CONTENT_TYPE = b"application/msgpack"  # the payload of a FETCH or a CONFIRM reply
WAIT = b"WAIT"  # <ms>: a FETCH with nothing to read from FROM on may wait this long for a commit
AT_TIME = b"AT-TIME"  # <ms since the epoch>: a FETCH starts at the first message stored at or after this time
FORMAT = b"FORMAT"  # records: the reply carries the stored records as they lie in the log (protocol.records)
FORMAT_RECORDS = b"records"
RECORDS_CONTENT_TYPE = b"application/x-mc0-records"
INCARNATION = b"INCARNATION"  # the log's identity: on the OK to a FETCH; on FETCH and SUB RESUME, the known
INCARNATIONS = b"INCARNATIONS"  # on the OK to a SUB ("ids"): each topic's log identity ("-" for none)
START_IDS = b"START-IDS"  # on the OK to a SUB with RESUME ("ids"): where each topic's subscription starts
START_ID = b"START-ID"  # on the OK to a FETCH: where the reply starts (FROM raised to FIRST-ID, or AT-TIME's)
# Idempotent PUTS.
PRODUCER = b"PRODUCER"  # <opaque bytes>: who publishes; with SEQUENCE, the broker stores each entry once
SEQUENCE = b"SEQUENCE"  # <n>: the first entry's sequence number (entry i has n + i), per producer and topic
DUPLICATES = b"DUPLICATES"  # on the OK to an idempotent PUTS: how many leading entries were stored before
# A cluster (docs/cluster.md).
LEADER = b"LEADER"  # on an ERROR from a broker that does not lead its cluster: the leader's mc0 endpoint
RETRY_AFTER = b"RETRY-AFTER"  # on that ERROR when no leader serves yet (an election): ms before asking again
REPLICA = b"REPLICA"  # on FETCH: the fetcher is this cluster member (its Raft address), copying the log
EPOCH = b"EPOCH"  # on a replica's FETCH: the leader epoch it follows (from a new leader: the one it takes)
LINEAGE = b"LINEAGE"  # on the OK to a replica's FETCH: the log identity's lineage, "incarnation:until ..."
PRODUCERS = b"PRODUCERS"  # on the OK to a replica's FETCH: msgpack of the idempotent batches in its range
#: On a FETCH, and on the OK answering a FETCH that had it: every header but ID as one msgpack map (a
#: cluster member's FETCH and its answer come to 22 and 18 frames otherwise, and each frame costs both ends).
PACKED = b"PACKED"
# STATS paging.
PREFIX = b"PREFIX"  # <bytes>: only topics whose names start with these bytes
AFTER = b"AFTER"  # <topic name>: only topics after this one in byte order (the previous page's "topics_next")
LIMIT = b"LIMIT"  # <n>: at most n topics in the reply

REPLAY_BEGINNING = "beginning"
REPLAY_CURRENT = "current"
ACKS_EXPLICIT = b"explicit"
ACKS_AUTO = b"auto"

#: DECLARE headers and the topic setting each one names (values are checked by the broker's configuration).
DECLARE_SETTINGS = {
    b"DELIVERY": "delivery",
    b"PERSISTENCE": "persistence",
    b"SYNC": "sync",
    b"MAX-BACKLOG": "max_backlog",
    b"RETENTION-BYTES": "retention_bytes",
    b"RETENTION-SECONDS": "retention_seconds",
    b"SEGMENT-BYTES": "segment_bytes",
    b"ELEMENT-SIZE": "element_size",
}

#: Headers the broker writes on a delivered MESSAGE; publishers may not set them.
DELIVERY_HEADERS = frozenset({TOPIC, ID, MESSAGE_ID, TIMESTAMP})
#: Extension tokens a client may ask for in ``CONNECT EXTENSIONS``.
EXT_BATCH = "batch"  # the broker may deliver MESSAGES batches instead of one MESSAGE per frame set
EXT_IDS = "ids"  # MESSAGE carries MESSAGE-ID and TIMESTAMP
#: PUTS may carry CONFIRM each: entries stored or refused one by one, one result each.
EXT_CONFIRMS = "confirms"
#: PUTS may carry one topic's bodies as two frames (TOPIC, lengths, bodies): :mod:`protocol.bodies`.
EXT_COLUMNS = "columns"
KNOWN_EXTENSIONS = frozenset({EXT_BATCH, EXT_IDS, EXT_CONFIRMS, EXT_COLUMNS})

#: FETCH limits (docs/mc0.md): what a FETCH without MAX-MESSAGES / MAX-BYTES gets, and the most any FETCH
#: gets whatever it asks (larger values are lowered to these, not refused). The byte cap is the broker's
#: default max_message_size, the largest body a publisher can send; the message cap keeps one reply's decode
#: (about a microsecond a message on each side) in the milliseconds.
FETCH_DEFAULT_MAX_MESSAGES = 1000
FETCH_DEFAULT_MAX_BYTES = 1 << 20
FETCH_MAX_MESSAGES = 10_000
FETCH_MAX_BYTES = 16 << 20
#: The longest a FETCH may wait (a larger WAIT is lowered to it): a waiting FETCH holds a place in the broker,
#: and a client's request timeout must outlast it. Kafka's fetch.max.wait.ms defaults to 500.
FETCH_MAX_WAIT_MS = 60_000
#: The most entries one PUTS may carry (more is an ERROR, and nothing of it is published). The broker takes a
#: PUTS in one turn, which every other client waits behind: a frame of max_message_size (16 MiB by default)
#: could otherwise hold millions of tiny entries, seconds of one turn and an object each. Measured: 100,000
#: entries to a topic with a reader online took the broker 0.54-0.58 s; this bound keeps such a turn near
#: 55 ms, and near the router's budget of 8,192 messages a turn.
PUTS_MAX_ENTRIES = 10_000
#: The longest PRODUCER a PUTS may name: an id, not a payload (it is kept per topic in memory and on disk).
MAX_PRODUCER_BYTES = 255
#: "No log identity": a transient topic in INCARNATIONS.
NO_INCARNATION = b"-"

#: Topics in one STATS reply: the default, and the most (a larger LIMIT is lowered to it). Building one
#: topic's figures takes tens of microseconds: a page of 1,000 keeps a STATS to milliseconds of the loop.
STATS_DEFAULT_TOPICS = 1000
STATS_MAX_TOPICS = 1000

#: Largest TTL we accept (about 24.8 days, the largest millisecond count a signed 32-bit timer holds).
MAX_TTL_MS = 2**31 - 1


@dataclass(slots=True)
class Connect:
    version: bytes = PROTOCOL_VERSION
    ttl: int | None = None  # milliseconds; None = the client never expires
    id: bytes | None = None
    extensions: frozenset[str] = frozenset()
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Disconnect:
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


#: Where a subscription starts: "beginning", "current" or the first message id wanted.
Replay: TypeAlias = str | int


@dataclass(slots=True)
class Sub:
    topics: list[bytes]
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)
    replay: Replay | None = None  # extension REPLAY; None = live (the 0.3 behaviour)
    resume: int | None = None  # extension RESUME: the next id wanted after a reconnect
    credit: int | None = None  # extension CREDIT: in-flight limit, None = the broker's per-client bound
    explicit_acks: bool = False  # extension ACKS explicit: messages count as in flight until ACKed
    incarnation: bytes | None = None  # extension INCARNATION (with RESUME): the log the resume point is from


@dataclass(slots=True)
class Unsub:
    topics: list[bytes]
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Put:
    topic: bytes
    body: bytes
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)  # X- headers and reserved extension headers, not TOPIC/ID


class PutItem(NamedTuple):
    """One message inside a PUTS batch.

    The decoder yields plain ``(topic, body, headers)`` tuples, which compare equal to these: at a thousand
    entries per batch, a named object per entry would double the decode cost."""

    topic: bytes
    body: bytes
    headers: Headers = {}


@dataclass(slots=True)
class Puts:
    """Extension: many PUTs in one frame set; an ID confirms the whole batch.

    With ``producer`` and ``sequence`` (idempotent publishing) every entry names the same topic and entry
    ``i`` carries sequence ``sequence + i``: the broker stores an entry only if that producer has not stored
    that sequence (or a higher one) in that topic already.

    With ``confirm_each`` (extension "confirms", header ``CONFIRM each``, needs an ID) the entries are
    separate publishes that travel together: each is stored or refused on its own, and the OK carries one
    result per entry (:func:`confirms_ok`). This is how a client pipelines confirmed publishes."""

    # PutItem or plain tuples of the same shape, or one topic's bodies as columns (extension columns)
    items: list[tuple[bytes, bytes, Headers]] | TopicBodies
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)
    producer: bytes | None = None
    sequence: int | None = None
    confirm_each: bool = False


@dataclass(slots=True)
class Ack:
    """Extension: the subscriber has processed these messages of ``topic`` (explicit-ack subscriptions)."""

    topic: bytes
    message_ids: list[int]
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Declare:
    """Extension: create ``topic`` with these settings (setting name -> text value, see DECLARE_SETTINGS)."""

    topic: bytes
    settings: dict[str, str]
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Noop:
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Message:
    topic: bytes
    body: bytes
    headers: Headers = field(default_factory=dict)  # the PUT's headers except TOPIC and ID
    message_id: int | None = None  # extension "ids"
    timestamp: int | None = None  # extension "ids": milliseconds since the epoch, set by the broker


@dataclass(slots=True)
class MessageItem:
    """One message inside a MESSAGES batch."""

    topic: bytes
    message_id: int
    timestamp: int
    body: bytes
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Messages:
    """Extension "batch": many deliveries in one frame set."""

    items: list[MessageItem]


@dataclass(slots=True)
class Ok:
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)
    # Extension replies (STATS, a FETCH's records) carry a positional body; a broker's records may be a
    # read-only view of its read buffer (broker.store.buffers).
    body: bytes | memoryview | None = None


@dataclass(slots=True)
class Error:
    message: bytes
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Stats:
    """Extension: ask for the broker's counters; answered by OK with a JSON body. The topics come a page at a
    time: those starting with ``prefix``, after ``after``, at most ``limit`` (None: STATS_DEFAULT_TOPICS)."""

    id: bytes | None = None
    headers: Headers = field(default_factory=dict)
    prefix: bytes = b""
    after: bytes | None = None
    limit: int | None = None


@dataclass(slots=True)
class Delete:
    """Extension: remove ``topic``, its stored messages and their files."""

    topic: bytes
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class Fetch:
    """Extension: read stored messages of a persistent topic, from ``start`` on; answered by an OK with
    FIRST-ID, NEXT-ID, COUNT and a msgpack payload of :class:`FetchItem` entries. Needs an ID.

    ``None`` means "not given": the oldest stored id, and the FETCH_DEFAULT_* bounds."""

    topic: bytes
    start: int | None = None
    max_messages: int | None = None
    max_bytes: int | None = None
    id: bytes | None = None
    headers: Headers = field(default_factory=dict)
    wait: int | None = None  # WAIT ms: wait for a commit when there is nothing to read (capped, see above)
    at_time: int | None = None  # AT-TIME ms: start at the first message stored at or after it (not with FROM)
    records: bool = False  # FORMAT records: the stored records as they lie in the log
    incarnation: bytes | None = None  # INCARNATION: the log the reader knows; another one is answered at once
    replica: bytes | None = None  # REPLICA: a cluster member copying the log (sees past the majority gate)
    epoch: int | None = None  # EPOCH: with REPLICA, the leader epoch the member follows
    packed: bool = False  # its headers came PACKED (and the OK answering it goes so)


class FetchItem(NamedTuple):
    """One stored message in the OK to a FETCH."""

    id: int
    timestamp: int
    body: bytes
    headers: Headers


class FetchReply(NamedTuple):
    """The OK to a FETCH, decoded (:func:`decode_fetch_reply`). ``incarnation`` is b"" and ``start_id`` None
    from a broker that does not send them."""

    first_id: int
    next_id: int
    items: list[FetchItem]
    incarnation: bytes = b""
    start_id: int | None = None


class RecordsReply(NamedTuple):
    """The OK to a ``FORMAT records`` FETCH (:func:`decode_records_reply`): ``count`` stored records, ids
    ``start_id`` to ``start_id + count - 1``, as the log holds them (``protocol.records`` reads them)."""

    first_id: int
    next_id: int
    start_id: int
    count: int
    incarnation: bytes
    payload: bytes


Event: TypeAlias = (
    Connect | Disconnect | Sub | Unsub | Put | Puts | Noop | Message | Messages | Ok | Error | Stats | Ack
    | Declare | Fetch | Delete
)

VERBS = frozenset(
    {b"CONNECT", b"DISCONNECT", b"SUB", b"UNSUB", b"PUT", b"PUTS", b"NOOP", b"MESSAGE", b"MESSAGES", b"OK",
     b"ERROR", b"STATS", b"ACK", b"DECLARE", b"FETCH", b"DELETE"}
)


# --------------------------------------------------------------------------------------------------- decoding


def _text(raw: bytes) -> str:
    """Bytes from the wire shown inside an error message: printable, short, never raising."""
    shown = raw[:64].decode("utf-8", "replace")
    return shown + ("..." if len(raw) > 64 else "")


def _split(frames: Frames) -> tuple[bytes, Headers, list[bytes] | None, bytes | None]:
    """Split a command into verb, headers, positional frames (None without an empty key frame) and ID."""
    if not frames:
        raise ProtocolError("empty message")
    start = 1 if frames[0] == b"" else 0
    if start >= len(frames):
        raise ProtocolError("no verb after the empty delimiter frame")
    verb = frames[start]
    headers: Headers = {}
    index = start + 1
    count = len(frames)
    positional: list[bytes] | None = None
    duplicate: bytes | None = None
    while index < count:
        key = frames[index]
        if key == b"":
            positional = frames[index + 1 :]
            break
        if index + 1 >= count:
            raise ProtocolError(f"header {_text(key)!r} has no value", command_id=headers.get(ID))
        if key in headers:
            # Refused once every pair is read, so that an ID after the duplicate still reaches the reply.
            duplicate = key if duplicate is None else duplicate
        else:
            headers[key] = frames[index + 1]
        index += 2
    command_id = headers.get(ID)
    if duplicate is not None:
        raise ProtocolError(f"header {_text(duplicate)!r} given twice", command_id=command_id)
    if verb not in VERBS:
        raise ProtocolError(f"unknown verb {_text(verb)!r}", command_id=command_id)
    return verb, headers, positional, command_id


def _no_positional(verb: bytes, positional: list[bytes] | None, command_id: bytes | None) -> None:
    if positional:
        raise ProtocolError(f"{verb.decode()} takes no positional frames", command_id=command_id)


def _topics(verb: bytes, positional: list[bytes] | None, command_id: bytes | None) -> list[bytes]:
    if not positional:
        raise ProtocolError(f"{verb.decode()} needs at least one topic", command_id=command_id)
    if b"" in positional:
        raise ProtocolError("topic names must not be empty", command_id=command_id)
    return positional


def _body(verb: bytes, positional: list[bytes] | None, command_id: bytes | None) -> bytes:
    if positional is None or not positional:
        raise ProtocolError(f"{verb.decode()} needs a body frame after the empty key", command_id=command_id)
    if len(positional) == 1:
        return positional[0]
    # Several body frames are joined: mc0 messages carry one opaque body (docs/mc0.md).
    return b"".join(positional)


#: Digits a number below 2^64 may have and still be converted without a closer look: every 19-digit number is.
_PLAIN_DIGITS = 19


def _unsigned(name: bytes, raw: bytes, command_id: bytes | None, limit: int = 2**64 - 1) -> int:
    # Nearly every header number is short and in range: one test each (``bytes.isdigit`` is ASCII digits only,
    # and false for b""). A FETCH carries five; at 1 confirmation in flight a cluster leader decodes two a
    # message.
    if len(raw) <= _PLAIN_DIGITS and raw.isdigit():
        value = int(raw)
        if value <= limit:
            return value
    if not raw.isdigit() or not raw.isascii():
        raise ProtocolError(f"{name.decode()} must be a non-negative integer, not {_text(raw)!r}",
                            command_id=command_id)
    # Compare digit counts before converting: int() refuses strings over 4300 digits with a ValueError.
    digits = raw.lstrip(b"0")
    if len(digits) > len(str(limit)):
        raise ProtocolError(f"{name.decode()} is too large (at most {limit})", command_id=command_id)
    value = int(digits or b"0")
    if value > limit:
        raise ProtocolError(f"{name.decode()} {value} is too large (at most {limit})", command_id=command_id)
    return value


def _decode_sub(topics: list[bytes], headers: Headers, command_id: bytes | None) -> Sub:
    sub = Sub(topics, command_id, headers)
    raw = headers.pop(REPLAY, None)
    if raw is not None:
        if raw in (b"beginning", b"current"):
            sub.replay = raw.decode()
        else:
            sub.replay = _unsigned(REPLAY, raw, command_id)
    raw = headers.pop(RESUME, None)
    if raw is not None:
        if sub.replay is not None:
            raise ProtocolError("SUB takes REPLAY or RESUME, not both", command_id=command_id)
        sub.resume = _unsigned(RESUME, raw, command_id)
    raw = headers.pop(INCARNATION, None)
    if raw is not None:
        if sub.resume is None:
            raise ProtocolError("SUB takes INCARNATION only with RESUME", command_id=command_id)
        sub.incarnation = raw
    raw = headers.pop(CREDIT, None)
    if raw is not None:
        sub.credit = _unsigned(CREDIT, raw, command_id, 2**31 - 1)
        if sub.credit == 0:
            raise ProtocolError("CREDIT must be at least 1", command_id=command_id)
    raw = headers.pop(ACKS, None)
    if raw is not None:
        if raw not in (ACKS_EXPLICIT, ACKS_AUTO):
            raise ProtocolError(f"ACKS must be explicit or auto, not {_text(raw)!r}", command_id=command_id)
        sub.explicit_acks = raw == ACKS_EXPLICIT
    return sub


def _decode_ack(headers: Headers, positional: list[bytes] | None, command_id: bytes | None) -> Ack:
    topic = headers.pop(TOPIC, None)
    if not topic:
        raise ProtocolError("ACK needs a non-empty TOPIC", command_id=command_id)
    if not positional:
        raise ProtocolError("ACK needs at least one message id after the empty key", command_id=command_id)
    ids = [_unsigned(MESSAGE_ID, raw, command_id) for raw in positional]
    return Ack(topic, ids, command_id, headers)


def _decode_declare(headers: Headers, positional: list[bytes] | None, command_id: bytes | None) -> Declare:
    if not positional or len(positional) != 1 or not positional[0]:
        raise ProtocolError("DECLARE needs exactly one non-empty topic after the empty key",
                            command_id=command_id)
    settings: dict[str, str] = {}
    for key in list(headers):
        name = DECLARE_SETTINGS.get(key)
        if name is None:
            if key.startswith(b"X-"):
                continue
            known = ", ".join(k.decode() for k in DECLARE_SETTINGS)
            raise ProtocolError(f"DECLARE has no setting {_text(key)!r} (known: {known})",
                                command_id=command_id)
        try:
            settings[name] = headers.pop(key).decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError(f"DECLARE {key.decode()} must be ASCII", command_id=command_id) from None
    return Declare(positional[0], settings, command_id, headers)


def _unpacked(headers: Headers, raw: bytes, command_id: bytes | None) -> None:
    """Merge the headers of a PACKED frame (a msgpack map of bytes to bytes) into ``headers``."""
    try:
        packed = msgpack.unpackb(raw, raw=True, use_list=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"PACKED is not valid msgpack: {exc}", command_id=command_id) from None
    _check_bytes_map(packed, "PACKED", command_id)
    if PACKED in packed or not headers.keys().isdisjoint(packed):
        twice = next(key for key in packed if key in headers or key == PACKED)
        raise ProtocolError(f"header {_text(twice)!r} given twice", command_id=command_id)
    headers.update(packed)


def _decode_fetch(headers: Headers, command_id: bytes | None) -> Fetch:
    if command_id is None:
        raise ProtocolError("FETCH needs an ID to answer to")
    packed = headers.pop(PACKED, None)
    if packed is not None:
        _unpacked(headers, packed, command_id)
    topic = headers.pop(TOPIC, None)
    if not topic:
        raise ProtocolError("FETCH needs a non-empty TOPIC", command_id=command_id)
    fetch = Fetch(topic, id=command_id, headers=headers, packed=packed is not None)
    raw = headers.pop(FROM, None)
    if raw is not None:
        fetch.start = _unsigned(FROM, raw, command_id)
    raw = headers.pop(MAX_MESSAGES, None)
    if raw is not None:
        fetch.max_messages = _unsigned(MAX_MESSAGES, raw, command_id)
    raw = headers.pop(MAX_BYTES, None)
    if raw is not None:
        fetch.max_bytes = _unsigned(MAX_BYTES, raw, command_id)
    raw = headers.pop(WAIT, None)
    if raw is not None:
        fetch.wait = _unsigned(WAIT, raw, command_id)
    raw = headers.pop(AT_TIME, None)
    if raw is not None:
        if fetch.start is not None:
            raise ProtocolError("FETCH takes FROM or AT-TIME, not both", command_id=command_id)
        fetch.at_time = _unsigned(AT_TIME, raw, command_id)
    raw = headers.pop(FORMAT, None)
    if raw is not None:
        if raw != FORMAT_RECORDS:
            raise ProtocolError(f"FETCH FORMAT must be records, not {_text(raw)!r}", command_id=command_id)
        fetch.records = True
    fetch.incarnation = headers.pop(INCARNATION, None)
    fetch.replica = headers.pop(REPLICA, None)
    raw = headers.pop(EPOCH, None)
    if raw is not None:
        if fetch.replica is None:
            raise ProtocolError("FETCH takes EPOCH only with REPLICA", command_id=command_id)
        fetch.epoch = _unsigned(EPOCH, raw, command_id)
    return fetch


def _decode_producer(puts: Puts, headers: Headers, command_id: bytes | None) -> Puts:
    """PRODUCER and SEQUENCE, both or neither; an idempotent batch names one topic."""
    producer = headers.pop(PRODUCER, None)
    raw = headers.pop(SEQUENCE, None)
    if producer is None and raw is None:
        return puts
    if producer is None or raw is None:
        raise ProtocolError("PUTS takes PRODUCER and SEQUENCE together", command_id=command_id)
    if not producer or len(producer) > MAX_PRODUCER_BYTES:
        raise ProtocolError(f"PRODUCER must be 1 to {MAX_PRODUCER_BYTES} bytes", command_id=command_id)
    puts.producer = producer
    puts.sequence = _unsigned(SEQUENCE, raw, command_id)
    if puts.items:
        if len(entry_topics(puts.items)) > 1:
            raise ProtocolError("an idempotent PUTS (PRODUCER) writes one topic: every entry must name it",
                                command_id=command_id)
        if puts.sequence + len(puts.items) - 1 > 2**64 - 1:
            raise ProtocolError("SEQUENCE runs past 2^64 - 1 in this batch", command_id=command_id)
    return puts


def _decode_stats(headers: Headers, command_id: bytes | None) -> Stats:
    stats = Stats(command_id, headers, headers.pop(PREFIX, b""), headers.pop(AFTER, None))
    raw = headers.pop(LIMIT, None)
    if raw is not None:
        stats.limit = _unsigned(LIMIT, raw, command_id, 2**31 - 1)
    return stats


def _decode_connect(headers: Headers, command_id: bytes | None) -> Connect:
    version = headers.pop(VERSION, None)
    if version is None:
        raise ProtocolError("CONNECT needs VERSION", command_id=command_id)
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(f"unsupported VERSION {_text(version)!r} (supported: 0.1, 0.2, 0.3)",
                            command_id=command_id)
    raw_ttl = headers.pop(TTL, None)
    ttl = None if raw_ttl is None else _unsigned(TTL, raw_ttl, command_id, MAX_TTL_MS)
    raw_ext = headers.pop(EXTENSIONS, b"")
    try:
        requested = raw_ext.decode("ascii").split()
    except UnicodeDecodeError:
        raise ProtocolError("EXTENSIONS must be ASCII tokens", command_id=command_id) from None
    # Unknown extension tokens are ignored, not refused: a newer client may ask for more than we know.
    extensions = frozenset(requested) & KNOWN_EXTENSIONS
    return Connect(version=version, ttl=ttl or None, id=command_id, extensions=extensions, headers=headers)


#: What a header map's keys and values may be.
_BYTES_ONLY = frozenset({bytes})


def _check_bytes_map(value: object, what: str, command_id: bytes | None) -> Headers:
    if value is None:
        return {}
    # The types of every key and value gathered by C loops (map, set): a generator over the pairs cost a
    # tenth of a FETCH's decoding.
    if not isinstance(value, dict) or (value and (
        b"" in value or not _BYTES_ONLY.issuperset(map(type, value))
        or not _BYTES_ONLY.issuperset(map(type, value.values()))
    )):
        raise ProtocolError(f"{what} headers must be a map of non-empty bytes to bytes",
                            command_id=command_id)
    return value


def _unpack_array(blob: bytes, what: str, command_id: bytes | None, use_list: bool = True) -> list:
    try:
        items = msgpack.unpackb(blob, raw=False, use_list=use_list, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"{what} payload is not valid msgpack: {exc}", command_id=command_id) from None
    if not isinstance(items, list | tuple):
        raise ProtocolError(f"{what} payload must be a msgpack array", command_id=command_id)
    return items


def publisher_headers(headers: Headers, command_id: bytes | None) -> Headers:
    """Refuse the headers the broker writes on delivery: a publisher setting one would have it doubled on the
    wire (a frame set no decoder accepts) or would forge it (a fake MESSAGE-ID)."""
    if headers and not DELIVERY_HEADERS.isdisjoint(headers):
        names = ", ".join(sorted(name.decode() for name in DELIVERY_HEADERS.intersection(headers)))
        raise ProtocolError(f"{names}: set by the broker on delivery, not by publishers",
                            command_id=command_id)
    return headers


def _decode_puts(
    positional: list[bytes] | None, command_id: bytes | None
) -> list[tuple[bytes, bytes, Headers]]:
    """The hot path of the whole broker: keep it to type checks and tuples (about 0.3 us an entry)."""
    if positional is None or len(positional) != 1:
        raise ProtocolError("PUTS needs exactly one payload frame after the empty key", command_id=command_id)
    _check_entries(_array_length(positional[0]), command_id)
    items: list[tuple[bytes, bytes, Headers]] = []
    append = items.append
    for entry in _unpack_array(positional[0], "PUTS", command_id, use_list=False):
        if type(entry) is not tuple:
            raise ProtocolError("each PUTS entry must be [topic, body] or [topic, body, headers]",
                                command_id=command_id)
        size = len(entry)
        if size == 2:
            topic, body = entry
            entry = (topic, body, NO_HEADERS)
        elif size == 3:
            topic, body, headers = entry
            if headers is None:
                entry = (topic, body, NO_HEADERS)
            else:
                publisher_headers(_check_bytes_map(headers, "PUTS", command_id), command_id)
        else:
            raise ProtocolError("each PUTS entry must be [topic, body] or [topic, body, headers]",
                                command_id=command_id)
        if type(topic) is not bytes or not topic or type(body) is not bytes:
            raise ProtocolError("PUTS topic must be non-empty bytes and body bytes", command_id=command_id)
        append(entry)
    return items


def _array_length(blob: bytes) -> int:
    """How many elements the msgpack array ``blob`` says it has (0 if it does not start like an array: the
    decoder then says what is wrong with it)."""
    if not blob:
        return 0
    head = blob[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F
    if head == 0xDC:
        return int.from_bytes(blob[1:3], "big")
    if head == 0xDD:
        return int.from_bytes(blob[1:5], "big")
    return 0


def _check_entries(count: int, command_id: bytes | None) -> None:
    if count > PUTS_MAX_ENTRIES:
        raise ProtocolError(f"PUTS carries {count:,} entries, more than the {PUTS_MAX_ENTRIES:,} a batch may "
                            "hold: send smaller batches", command_id=command_id)


def _decode_columns(topic: bytes, positional: list[bytes] | None, command_id: bytes | None) -> TopicBodies:
    """A PUTS with TOPIC (extension columns): the lengths frame and the bodies frame."""
    if not topic:
        raise ProtocolError("PUTS TOPIC must be non-empty", command_id=command_id)
    if positional is None or len(positional) != 2:
        raise ProtocolError("PUTS with TOPIC needs two frames after the empty key: lengths and bodies",
                            command_id=command_id)
    _check_entries(len(positional[0]) // 4, command_id)
    try:
        return TopicBodies.decode(topic, positional[0], positional[1])
    except ValueError as error:
        raise ProtocolError(f"PUTS with TOPIC: {error}", command_id=command_id) from None


def _decode_messages(positional: list[bytes] | None, command_id: bytes | None) -> list[MessageItem]:
    if positional is None or len(positional) != 1:
        raise ProtocolError("MESSAGES needs exactly one payload frame after the empty key",
                            command_id=command_id)
    items: list[MessageItem] = []
    for entry in _unpack_array(positional[0], "MESSAGES", command_id):
        if type(entry) is not list or not 4 <= len(entry) <= 5:
            raise ProtocolError("each MESSAGES entry must be [topic, id, timestamp, body, headers?]",
                                command_id=command_id)
        topic, message_id, timestamp, body = entry[0], entry[1], entry[2], entry[3]
        if (type(topic) is not bytes or not topic or type(body) is not bytes or type(message_id) is not int
                or type(timestamp) is not int or message_id < 0):
            raise ProtocolError("MESSAGES entry has fields of the wrong type (or an empty topic)",
                                command_id=command_id)
        headers = _check_bytes_map(entry[4], "MESSAGES", command_id) if len(entry) == 5 else {}
        items.append(MessageItem(topic, message_id, timestamp, body, headers))
    return items


def decode(frames: Frames) -> Event:
    """Decode one command (the frames after the ROUTER identity, with or without the empty delimiter)."""
    verb, headers, positional, command_id = _split(frames)
    if verb == b"PUT":
        topic = headers.pop(TOPIC, None)
        if not topic:
            raise ProtocolError("PUT needs a non-empty TOPIC", command_id=command_id)
        headers.pop(ID, None)
        body = _body(verb, positional, command_id)
        return Put(topic, body, command_id, publisher_headers(headers, command_id))
    if verb == b"PUTS":
        headers.pop(ID, None)
        topic = headers.pop(TOPIC, None)
        entries = _decode_puts(positional, command_id) if topic is None else _decode_columns(
            topic, positional, command_id)
        puts = Puts(entries, command_id, headers)
        confirm = headers.pop(CONFIRM, None)
        if confirm is not None:
            if confirm != CONFIRM_EACH:
                raise ProtocolError(f"CONFIRM must be 'each', not {_text(confirm)!r}", command_id=command_id)
            if command_id is None:
                raise ProtocolError("PUTS with CONFIRM each needs an ID to answer to")
            puts.confirm_each = True
        puts = _decode_producer(puts, headers, command_id) if headers else puts
        if puts.confirm_each and puts.producer is not None:
            raise ProtocolError("a PUTS takes CONFIRM each or PRODUCER, not both", command_id=command_id)
        return puts
    if verb == b"MESSAGE":
        topic = headers.pop(TOPIC, None)
        if not topic:
            raise ProtocolError("MESSAGE needs a non-empty TOPIC", command_id=command_id)
        raw_id = headers.pop(MESSAGE_ID, None)
        raw_ts = headers.pop(TIMESTAMP, None)
        return Message(
            topic,
            _body(verb, positional, command_id),
            headers,
            None if raw_id is None else _unsigned(MESSAGE_ID, raw_id, command_id),
            None if raw_ts is None else _unsigned(TIMESTAMP, raw_ts, command_id),
        )
    if verb == b"MESSAGES":
        return Messages(_decode_messages(positional, command_id))
    if verb in (b"SUB", b"UNSUB"):
        headers.pop(ID, None)
        topics = _topics(verb, positional, command_id)
        if verb == b"SUB":
            return _decode_sub(topics, headers, command_id)
        return Unsub(topics, command_id, headers)
    if verb == b"ACK":
        headers.pop(ID, None)
        return _decode_ack(headers, positional, command_id)
    if verb == b"DECLARE":
        headers.pop(ID, None)
        return _decode_declare(headers, positional, command_id)
    if verb == b"FETCH":
        _no_positional(verb, positional, command_id)
        headers.pop(ID, None)
        return _decode_fetch(headers, command_id)
    if verb == b"DELETE":
        if not positional or len(positional) != 1 or not positional[0]:
            raise ProtocolError("DELETE needs exactly one non-empty topic after the empty key",
                                command_id=command_id)
        headers.pop(ID, None)
        return Delete(positional[0], command_id, headers)
    if verb == b"OK":
        headers.pop(ID, None)
        packed = headers.pop(PACKED, None)
        if packed is not None:
            _unpacked(headers, packed, command_id)
        if positional is not None and len(positional) > 1:
            raise ProtocolError("OK carries at most one positional frame", command_id=command_id)
        return Ok(command_id, headers, positional[0] if positional else None)
    _no_positional(verb, positional, command_id)
    if verb == b"CONNECT":
        headers.pop(ID, None)
        return _decode_connect(headers, command_id)
    if verb == b"ERROR":
        message = headers.pop(MESSAGE_KEY, None)
        if message is None:
            raise ProtocolError("ERROR needs MESSAGE", command_id=command_id)
        headers.pop(ID, None)
        return Error(message, command_id, headers)
    headers.pop(ID, None)
    if verb == b"NOOP":
        return Noop(command_id, headers)
    if verb == b"DISCONNECT":
        return Disconnect(command_id, headers)
    return _decode_stats(headers, command_id)  # the only verb left in VERBS


# --------------------------------------------------------------------------------------------------- encoding


def _headers(out: Frames, headers: Headers) -> None:
    for key, value in headers.items():
        out.append(key)
        out.append(value)


def _pack_pairs(fields: Frames) -> bytes:
    """Header frames (key, value, key, value...) as the one PACKED frame."""
    return msgpack.packb(dict(zip(fields[::2], fields[1::2], strict=True)), use_bin_type=True)


def encode_packed_ok(ok: Ok, *, delimiter: bool = True) -> Frames:
    """The OK answering a PACKED FETCH: its headers in one PACKED frame after the ID."""
    out: Frames = [b""] if delimiter else []
    out.append(b"OK")
    _with_id(out, ok.id)
    if ok.headers:
        out += (PACKED, msgpack.packb(ok.headers, use_bin_type=True))
    if ok.body is not None:
        out += (b"", ok.body)
    return out


class FetchTemplate:
    """The frames of a FETCH asked again and again with only FROM and the ID moving (a cluster follower's
    long poll of one topic): encoded once by :func:`encode`, then each ask puts its FROM in (one small msgpack
    pack when PACKED) instead of encoding every field again. :meth:`frames` gives what :func:`encode` would
    for the same FETCH with that FROM and ID (a test holds them equal)."""

    def __init__(self, fetch: Fetch) -> None:
        if fetch.start is None or fetch.id is not None:
            raise ValueError("a FETCH template has a FROM (what moves) and no ID (each ask has its own)")
        frames = encode(fetch)
        self.packed = fetch.packed
        self._at = frames.index(PACKED if fetch.packed else FROM) + 1
        self._frames = frames
        if fetch.packed:
            # The PACKED map as encode() packs it (a map header, then the pairs in order: TOPIC, FROM, the
            # rest), cut around FROM's value.
            pairs = list(msgpack.unpackb(frames[self._at], raw=True).items())
            if [key for key, _ in pairs[:2]] != [TOPIC, FROM]:
                raise ValueError("a PACKED FETCH packs TOPIC, then FROM")
            packer = msgpack.Packer(use_bin_type=True)
            self._head = packer.pack_map_header(len(pairs)) + packer.pack(TOPIC) + packer.pack(pairs[0][1]) \
                + packer.pack(FROM)
            self._tail = b"".join(packer.pack(key) + packer.pack(value) for key, value in pairs[2:])

    def frames(self, start: int, command_id: bytes) -> Frames:
        """The FETCH's frames from ``start``, with ``command_id``."""
        out = self._frames.copy()
        if self.packed:
            out[self._at] = self._head + msgpack.packb(b"%d" % start, use_bin_type=True) + self._tail
        else:
            out[self._at] = b"%d" % start
        out += (ID, command_id)
        return out


def _with_id(out: Frames, command_id: bytes | None) -> None:
    if command_id is not None:
        out.append(ID)
        out.append(command_id)


def pack_put_items(items: list[tuple[bytes, bytes, Headers]]) -> bytes:
    return msgpack.packb([(t, b, h) if h else (t, b) for t, b, h in items], use_bin_type=True)


def pack_message_items(items: list[MessageItem]) -> bytes:
    return msgpack.packb(
        [
            (i.topic, i.message_id, i.timestamp, i.body, i.headers)
            if i.headers
            else (i.topic, i.message_id, i.timestamp, i.body)
            for i in items
        ],
        use_bin_type=True,
    )


def fetch_ok(
    command_id: bytes,
    first_id: int,
    next_id: int,
    items: Sequence[tuple[int, int, bytes, Headers]],
    incarnation: bytes | None = None,
    start_id: int | None = None,
) -> Ok:
    """The OK answering a FETCH. ``items`` are FetchItems or plain tuples of the same shape; the payload is
    ``[id, timestamp-ms, body, headers]`` per message, headers always there (an empty map for none)."""
    headers = {
        FIRST_ID: b"%d" % first_id,
        NEXT_ID: b"%d" % next_id,
        COUNT: b"%d" % len(items),
        CONTENT_TYPE: MSGPACK_CONTENT_TYPE,
    }
    if incarnation is not None:
        headers[INCARNATION] = incarnation
    if start_id is not None:
        headers[START_ID] = b"%d" % start_id
    return Ok(command_id, headers, msgpack.packb(items, use_bin_type=True))


def records_ok(
    command_id: bytes, first_id: int, next_id: int, start_id: int, count: int, incarnation: bytes,
    payload: bytes | memoryview,
) -> Ok:
    """The OK answering a ``FORMAT records`` FETCH: ``count`` records from ``start_id`` on, as stored."""
    headers = {
        FIRST_ID: b"%d" % first_id,
        NEXT_ID: b"%d" % next_id,
        COUNT: b"%d" % count,
        CONTENT_TYPE: RECORDS_CONTENT_TYPE,
        INCARNATION: incarnation,
        START_ID: b"%d" % start_id,
    }
    return Ok(command_id, headers, payload)


def _reply_number(ok: Ok, name: bytes) -> int:
    raw = ok.headers.get(name)
    if raw is None:
        raise ProtocolError(f"the OK to a FETCH has no {name.decode()}", command_id=ok.id)
    return _unsigned(name, raw, ok.id)


def decode_fetch_reply(ok: Ok) -> FetchReply:
    """What the OK to a FETCH says (the client side); ProtocolError if it is not a well-formed one."""
    first_id = _reply_number(ok, FIRST_ID)
    next_id = _reply_number(ok, NEXT_ID)
    count = _reply_number(ok, COUNT)
    if ok.body is None:
        raise ProtocolError("the OK to a FETCH has no payload", command_id=ok.id)
    items: list[FetchItem] = []
    for entry in _unpack_array(ok.body, "FETCH reply", ok.id):
        if type(entry) is not list or len(entry) != 4:
            raise ProtocolError("each FETCH reply entry must be [id, timestamp, body, headers]",
                                command_id=ok.id)
        message_id, timestamp, body, headers = entry
        if (type(message_id) is not int or message_id < 0 or type(timestamp) is not int
                or type(body) is not bytes):
            raise ProtocolError("FETCH reply entry has fields of the wrong type", command_id=ok.id)
        items.append(FetchItem(message_id, timestamp, body, _check_bytes_map(headers, "FETCH reply", ok.id)))
    if len(items) != count:
        raise ProtocolError(f"the OK to a FETCH says COUNT {count} but carries {len(items)} messages",
                            command_id=ok.id)
    start = ok.headers.get(START_ID)
    start_id = None if start is None else _unsigned(START_ID, start, ok.id)
    return FetchReply(first_id, next_id, items, ok.headers.get(INCARNATION, b""), start_id)


def decode_records_reply(ok: Ok) -> RecordsReply:
    """What the OK to a ``FORMAT records`` FETCH says; the records themselves are read by
    :mod:`protocol.records`. ProtocolError if the OK is not a well-formed one."""
    if ok.headers.get(CONTENT_TYPE) != RECORDS_CONTENT_TYPE:
        raise ProtocolError("the OK to a FETCH FORMAT records does not carry records (an older broker?)",
                            command_id=ok.id)
    return RecordsReply(
        _reply_number(ok, FIRST_ID), _reply_number(ok, NEXT_ID), _reply_number(ok, START_ID),
        _reply_number(ok, COUNT), ok.headers.get(INCARNATION, b""), ok.body or b"",
    )


#: One entry of the OK to a ``PUTS CONFIRM each``: ``(message id, durability)`` for a stored entry, ``(None,
#: error text)`` for a refused one. Durability is "fsync", "written" or "memory", as in DURABILITY.
Confirmation: TypeAlias = tuple[int | None, str]


def confirms_ok(command_id: bytes, results: Sequence[Confirmation], retry_ms: int | None = None) -> Ok:
    """The OK answering a ``PUTS CONFIRM each``: a msgpack payload of one ``[id, durability]`` or ``[nil,
    error]`` per entry, in entry order, and no headers but the ID. It answers every pipelined publish, so it
    is kept to the fewest frames (the number of results is the number of entries the client sent).
    ``retry_ms``: a cluster leader that could not store the refused entries and hands the cluster over says
    with ``RETRY-AFTER`` when to send them again (to the next leader)."""
    headers = {} if retry_ms is None else {RETRY_AFTER: b"%d" % retry_ms}
    return Ok(command_id, headers, msgpack.packb(results, use_bin_type=True))


def decode_confirms(ok: Ok, count: int) -> list[Confirmation]:
    """The per-entry results of the OK to a ``PUTS CONFIRM each`` of ``count`` entries (the client side): the
    tuples as msgpack decoded them, checked in one pass."""
    if ok.body is None:
        raise ProtocolError("the OK to a PUTS with CONFIRM each has no payload", command_id=ok.id)
    results = _unpack_array(ok.body, "CONFIRM reply", ok.id, use_list=False)
    for entry in results:
        if type(entry) is not tuple or len(entry) != 2 or type(entry[1]) is not str or not (
            entry[0] is None or (type(entry[0]) is int and entry[0] >= 0)
        ):
            raise ProtocolError("each CONFIRM reply entry must be [id, durability] or [nil, error]",
                                command_id=ok.id)
    if len(results) != count:
        raise ProtocolError(f"the OK to a PUTS of {count} entries carries {len(results)} results",
                            command_id=ok.id)
    return list(results)


def message_frames(
    out: Frames,
    topic: bytes,
    body: bytes,
    headers: Headers,
    message_id: int | None = None,
    timestamp: int | None = None,
) -> Frames:
    """Append one MESSAGE's frames to ``out`` (the broker's hot path for plain clients: no event object)."""
    out += (b"MESSAGE", TOPIC, topic)
    if headers:
        _headers(out, headers)
    if message_id is not None:
        out += (MESSAGE_ID, b"%d" % message_id)
    if timestamp is not None:
        out += (TIMESTAMP, b"%d" % timestamp)
    out += (b"", body)
    return out


def encode(event: Event, *, delimiter: bool = True) -> Frames:
    """Encode one event as frames, with the empty delimiter frame in front unless ``delimiter`` is false."""
    out: Frames = [b""] if delimiter else []
    match event:
        case Put(topic, body, command_id, headers):
            out += (b"PUT", TOPIC, topic)
            _headers(out, headers)
            _with_id(out, command_id)
            out += (b"", body)
        case Message(topic, body, headers, message_id, timestamp):
            message_frames(out, topic, body, headers, message_id, timestamp)
        case Puts(items, command_id, headers, producer, sequence, confirm_each):
            out.append(b"PUTS")
            if type(items) is TopicBodies:
                out += (TOPIC, items.topic)
            if producer is not None:
                out += (PRODUCER, producer, SEQUENCE, b"%d" % (sequence or 0))
            if confirm_each:
                out += (CONFIRM, CONFIRM_EACH)
            _headers(out, headers)
            _with_id(out, command_id)
            if type(items) is TopicBodies:
                out += (b"", items.lengths(), items.payload())
            else:
                out += (b"", pack_put_items(items))
        case Messages(items):
            out += (b"MESSAGES", b"", pack_message_items(items))
        case Sub(topics, command_id, headers, replay, resume, credit, explicit_acks, incarnation):
            out.append(b"SUB")
            if replay is not None:
                out += (REPLAY, replay.encode() if isinstance(replay, str) else b"%d" % replay)
            if resume is not None:
                out += (RESUME, b"%d" % resume)
                if incarnation is not None:
                    out += (INCARNATION, incarnation)
            if credit is not None:
                out += (CREDIT, b"%d" % credit)
            if explicit_acks:
                out += (ACKS, ACKS_EXPLICIT)
            _headers(out, headers)
            _with_id(out, command_id)
            out.append(b"")
            out += topics
        case Unsub(topics, command_id, headers):
            out.append(b"UNSUB")
            _headers(out, headers)
            _with_id(out, command_id)
            out.append(b"")
            out += topics
        case Ack(topic, message_ids, command_id, headers):
            out += (b"ACK", TOPIC, topic)
            _headers(out, headers)
            _with_id(out, command_id)
            out.append(b"")
            out += [b"%d" % message_id for message_id in message_ids]
        case Declare(topic, settings, command_id, headers):
            out.append(b"DECLARE")
            for key, name in DECLARE_SETTINGS.items():
                if name in settings:
                    out += (key, settings[name].encode("ascii"))
            _headers(out, headers)
            _with_id(out, command_id)
            out += (b"", topic)
        case Fetch(topic, start, max_messages, max_bytes, command_id, headers, wait, at_time, records,
                   incarnation, replica, epoch):
            out.append(b"FETCH")
            fields: Frames = [TOPIC, topic]
            if start is not None:
                fields += (FROM, b"%d" % start)
            if max_messages is not None:
                fields += (MAX_MESSAGES, b"%d" % max_messages)
            if max_bytes is not None:
                fields += (MAX_BYTES, b"%d" % max_bytes)
            if wait is not None:
                fields += (WAIT, b"%d" % wait)
            if at_time is not None:
                fields += (AT_TIME, b"%d" % at_time)
            if records:
                fields += (FORMAT, FORMAT_RECORDS)
            if incarnation is not None:
                fields += (INCARNATION, incarnation)
            if replica is not None:
                fields += (REPLICA, replica)
                if epoch is not None:
                    fields += (EPOCH, b"%d" % epoch)
            _headers(fields, headers)
            if event.packed:
                out += (PACKED, _pack_pairs(fields))
            else:
                out += fields
            _with_id(out, command_id)
        case Connect(version, ttl, command_id, extensions, headers):
            out += (b"CONNECT", VERSION, version)
            if ttl is not None:
                out += (TTL, b"%d" % ttl)
            if extensions:
                out += (EXTENSIONS, " ".join(sorted(extensions)).encode())
            _headers(out, headers)
            _with_id(out, command_id)
        case Ok(command_id, headers, body):
            out.append(b"OK")
            _with_id(out, command_id)
            _headers(out, headers)
            if body is not None:
                out += (b"", body)
        case Error(message, command_id, headers):
            out += (b"ERROR", MESSAGE_KEY, message)
            _with_id(out, command_id)
            _headers(out, headers)
        case Stats(command_id, headers, prefix, after, limit):
            out.append(b"STATS")
            if prefix:
                out += (PREFIX, prefix)
            if after is not None:
                out += (AFTER, after)
            if limit is not None:
                out += (LIMIT, b"%d" % limit)
            _headers(out, headers)
            _with_id(out, command_id)
        case Delete(topic, command_id, headers):
            out.append(b"DELETE")
            _headers(out, headers)
            _with_id(out, command_id)
            out += (b"", topic)
        case Noop(command_id, headers) | Disconnect(command_id, headers):
            out.append({Noop: b"NOOP", Disconnect: b"DISCONNECT"}[type(event)])
            _headers(out, headers)
            _with_id(out, command_id)
        case _:
            raise TypeError(f"not an mc0 event: {event!r}")
    return out


def encode_lineage(lineage: Sequence[tuple[str, int]]) -> bytes:
    """A log identity's lineage as the LINEAGE header says it: ``incarnation:until`` pairs, oldest first."""
    return " ".join(f"{incarnation}:{until}" for incarnation, until in lineage).encode("ascii")


def decode_lineage(raw: bytes) -> tuple[tuple[str, int], ...]:
    """The inverse of :func:`encode_lineage`; ProtocolError for anything it would not write."""
    out = []
    for pair in raw.decode("ascii", "replace").split():
        incarnation, colon, until = pair.partition(":")
        if not colon or not until.isdigit() or not incarnation:
            raise ProtocolError(f"LINEAGE entry {pair!r} is not incarnation:until")
        out.append((incarnation, int(until)))
    return tuple(out)


def leader_error(message: str, leader: bytes | None, command_id: bytes | None,
                 retry_ms: int | None = None) -> Error:
    """The ERROR a broker that does not lead its cluster answers with: what happened, and ``LEADER`` (the
    leader's mc0 endpoint) when it knows one, so a client can go there; else ``RETRY-AFTER`` when a leader is
    being chosen, so a client can send the command again after that many ms (nothing of it was stored)."""
    headers = {LEADER: leader} if leader else {}
    if retry_ms is not None and not leader:
        headers[RETRY_AFTER] = b"%d" % retry_ms
    return Error(message.encode(), command_id, headers)


def error_reply(error: ProtocolError) -> Error:
    """The ERROR event answering a command that failed to decode."""
    return Error(str(error).encode("utf-8", "replace"), error.command_id)
