"""The client side of mc0 without I/O: what to send, what a received frame set means, when to heartbeat.

Both :class:`connector.Client` (blocking, an I/O thread) and :class:`connector.AsyncClient` (asyncio) drive
one :class:`ClientCore`; they own the DEALER socket and the waiting, this module owns the protocol. Time is an
argument everywhere, so the rules are testable without sleeping.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol import ProtocolError, mc0

#: The client asks for both extensions; a broker that does not echo one simply is not using it.
WANTED_EXTENSIONS = frozenset({mc0.EXT_BATCH, mc0.EXT_IDS})
#: Publishes packed into one PUTS frame at most (the broker's MESSAGES batches use the same bound).
BATCH_MAX_MESSAGES = 1024
BATCH_MAX_BYTES = 1 << 20


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

#: One queued publish: (topic, body, headers) as bytes, headers possibly empty.
Publish = tuple[bytes, bytes, dict[bytes, bytes]]


class ClientCore:
    """Protocol state of one client connection (rebuilt on reconnect, except the subscriptions)."""

    def __init__(self, ttl_ms: int | None = 30_000) -> None:
        if ttl_ms is not None and ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive (or None for no heartbeats)")
        self.ttl = None if ttl_ms is None else ttl_ms / 1000
        self.ttl_ms = ttl_ms
        self.subscriptions: dict[bytes, None] = {}  # ordered: re-SUB in the order the user subscribed
        self.extensions: frozenset[str] = frozenset()
        self._ids = itertools.count(1)
        self._topic_names: dict[bytes, str] = {}
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
        command_id = str(uuid.uuid4()).encode()
        event = mc0.Connect(mc0.PROTOCOL_VERSION, self.ttl_ms, command_id, WANTED_EXTENSIONS)
        return command_id, mc0.encode(event)

    def connected(self, reply: mc0.Ok) -> None:
        raw = reply.headers.get(mc0.EXTENSIONS, b"")
        self.extensions = frozenset(raw.decode("ascii", "replace").split()) & WANTED_EXTENSIONS

    def request(self, event: mc0.Sub | mc0.Unsub | mc0.Put | mc0.Puts | mc0.Noop | mc0.Stats
                | mc0.Disconnect) -> tuple[bytes, mc0.Frames]:
        """Give ``event`` a fresh ID and encode it; the caller waits for the reply with that ID."""
        event.id = self.next_id()
        return event.id, mc0.encode(event)

    def resubscribe(self) -> list[tuple[bytes, mc0.Frames]]:
        """The SUB commands that restore every subscription on a new connection."""
        if not self.subscriptions:
            return []
        return [self.request(mc0.Sub(list(self.subscriptions)))]

    def pack(self, publishes: list[Publish]) -> Iterable[mc0.Frames]:
        """Fire-and-forget publishes as frame sets: PUTS batches if the broker speaks ``batch``, else PUTs."""
        if mc0.EXT_BATCH not in self.extensions:
            for topic, body, headers in publishes:
                yield mc0.encode(mc0.Put(topic, body, None, headers))
            return
        start = 0
        total = len(publishes)
        while start < total:
            end = min(total, start + BATCH_MAX_MESSAGES)
            size = 0
            for index in range(start, end):
                # Bounded in bytes too: a frame over the broker's max_message_size would cost the connection.
                size += len(publishes[index][1])
                if size >= BATCH_MAX_BYTES:
                    end = index + 1
                    break
            yield [b"", b"PUTS", b"", mc0.pack_put_items(publishes[start:end])]
            start = end

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
                return [Message(topic_name, body, _text_headers(headers), message_id, timestamp)], None
            case mc0.Messages(items):  # a batch framed without the delimiter misses the fast path above
                return [
                    Message(self._topic(i.topic), i.body, _text_headers(i.headers), i.message_id, i.timestamp)
                    for i in items
                ], None
            case mc0.Ok() | mc0.Error():
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
        topic_name = self._topic
        out = []
        try:
            for entry in entries:
                if len(entry) == 4:
                    out.append(Message(topic_name(entry[0]), entry[3], {}, entry[1], entry[2]))
                else:
                    headers = _text_headers(entry[4])
                    out.append(Message(topic_name(entry[0]), entry[3], headers, entry[1], entry[2]))
        except (TypeError, AttributeError, IndexError, KeyError):
            pass  # a malformed entry from a broker bug: keep what parsed, never kill the client
        return out

    # --------------------------------------------------------------------------------------------- heartbeats

    def sent(self, now: float) -> None:
        self.last_sent = now

    def noop_due(self, now: float) -> bool:
        return self.ttl is not None and now - self.last_sent >= 0.95 * self.ttl

    def broker_silent(self, now: float) -> bool:
        return self.ttl is not None and now - self.last_heard > 1.05 * self.ttl

    def next_timer(self, now: float) -> float | None:
        """Seconds until a heartbeat decision is due (None: no TTL, no timers)."""
        if self.ttl is None:
            return None
        return max(0.0, min(self.last_sent + 0.95 * self.ttl, self.last_heard + 1.05 * self.ttl) - now)
