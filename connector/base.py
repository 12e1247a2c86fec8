"""What the blocking and the asyncio client share: their options, the protocol core, the inbox, and the step
that turns readable frame sets into deliveries and replies. Each client adds only how it waits and how a reply
reaches the caller that asked (:meth:`ClientBase._resolve`).

The checks and encodings behind ``subscribe``, ``ack`` and ``declare`` live in :mod:`connector.core`; the
keyword options of ``declare`` are :class:`TopicSettings`, written once here for both clients."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, TypedDict

import zmq

from connector.core import ClientCore, ConnectorError, Message, to_bytes
from connector.keys import Credentials
from protocol import mc0

DEFAULT_ENDPOINT = "tcp://127.0.0.1:61616"
#: Frame sets read per wake-up before the client looks at its other work (fairness, not a limit).
READ_BUDGET = 512


class _Signal(Protocol):
    def set(self) -> None: ...


def resolve_credentials(
    keys: str | Path | None, credentials: Credentials | None, curve: bool | None
) -> Credentials | None:
    """CURVE settings from explicit credentials or a keys folder; ``curve=False`` means plaintext."""
    if curve is False:
        return None
    if credentials is not None:
        return credentials
    if keys is not None:
        return Credentials.from_dir(Path(keys))
    if curve:
        raise ConnectorError("CURVE requested but neither keys nor credentials were given")
    return None


def make_socket(context: zmq.Context, endpoint: str, credentials: Credentials | None) -> zmq.Socket:
    """A DEALER connected to ``endpoint``, CURVE-pinned when ``credentials`` are given."""
    socket = context.socket(zmq.DEALER)
    try:
        socket.linger = 0
        socket.sndhwm = 100_000
        socket.rcvhwm = 100_000
        if credentials is not None:
            credentials.apply(socket)
        socket.connect(endpoint)
    except BaseException:
        socket.close(linger=0)  # an open socket would make Context.term() wait forever
        raise
    return socket


def reply_or_raise(reply: mc0.Ok | mc0.Error, what: str) -> mc0.Ok:
    if isinstance(reply, mc0.Error):
        raise ConnectorError(f"broker refused {what}: {reply.message.decode('utf-8', 'replace')}")
    return reply


class ClientOptions(TypedDict, total=False):
    """The keyword options both clients take (see :class:`ClientBase`)."""

    keys: str | Path | None
    credentials: Credentials | None
    curve: bool | None
    ttl: int | None
    timeout: float
    max_outbox: int
    max_inbox: int


class TopicSettings(TypedDict, total=False):
    """The settings ``declare()`` may give a topic (sent as DECLARE headers; None or absent = the broker's
    default). Values are checked by the broker: a string or a number each."""

    delivery: str | None  # "broadcast" | "round-robin"
    persistence: str | None  # "transient" | "persistent"
    sync: str | None  # "strong" | "weak" | "async" (persistent topics)
    max_backlog: int | None  # round-robin messages held while no consumer has room (transient)
    retention_bytes: int | None  # persistent: delete the oldest segments beyond this many bytes
    retention_seconds: float | None  # persistent: delete segments older than this
    segment_bytes: int | None  # persistent: seal a segment file once it reaches this size
    element_size: int | None  # every message exactly this many bytes (reactive streams pack them)


class TopicPage(TypedDict, total=False):
    """Which topics a STATS answer lists, a page at a time (the broker lists at most 1,000 at once)."""

    prefix: str | bytes  # only names starting with this
    after: str | bytes | None  # only names after this one: the previous answer's "topics_next"
    limit: int | None  # at most this many (None: the broker's default page, 1,000)


def stats_event(page: Mapping[str, Any]) -> mc0.Stats:
    after = page.get("after")
    return mc0.Stats(prefix=to_bytes(page.get("prefix") or b""),
                     after=None if after is None else _name_bytes(after), limit=page.get("limit"))


def _name_bytes(name: str | bytes) -> bytes:
    """A topic name as the broker sent it: names that are not UTF-8 come as surrogate escapes."""
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


def topics_of(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The per-topic part of a STATS answer (topic name -> counters and settings)."""
    return dict(stats.get("topics") or {})


class ClientBase:
    """Options and state common to :class:`connector.Client` and :class:`connector.AsyncClient`.

    ``keys`` (a folder with broker.key and client.key_secret) or ``credentials`` turn CURVE on;
    ``curve=False`` forces plaintext; ``ttl`` (ms, None = no heartbeats) drives NOOPs and reconnects;
    ``timeout`` (s) bounds every wait for the broker; ``max_outbox``/``max_inbox`` bound the two queues.
    """

    _arrived: _Signal  # set when deliveries reach the inbox (a threading or an asyncio Event)

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        keys: str | Path | None = None,
        credentials: Credentials | None = None,
        curve: bool | None = None,
        ttl: int | None = 30_000,
        timeout: float = 5.0,
        max_outbox: int = 100_000,
        max_inbox: int = 100_000,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.reconnects = 0
        self._credentials = resolve_credentials(keys, credentials, curve)
        self._core = ClientCore(ttl)
        self._max_outbox = max_outbox
        self._max_inbox = max_inbox
        self._inbox: deque[Message] = deque()
        self._unsent: deque[mc0.Frames] = deque()  # frame sets that met a full pipe, in order
        self._closed = False
        self._failure: BaseException | None = None  # what stopped the client's I/O, if anything did

    def _check(self) -> None:
        if self._failure is not None:
            raise ConnectorError(f"client stopped: {self._failure}") from self._failure
        if self._closed:
            raise ConnectorError("client is closed")

    @property
    def last_ids(self) -> Mapping[str, int]:
        """Topic -> id of the last message received from the broker (into the inbox, taken or not).

        A read-only snapshot, safe to read from any thread. It is where a reconnect resumes each topic, and
        it forgets a topic on unsubscribe and when a subscribe with ``replay`` starts it afresh."""
        return MappingProxyType(self._core.last_ids.copy())

    @property
    def pending(self) -> int:
        """Messages received but not yet taken with receive()."""
        return len(self._inbox)

    def _read(self, socket: zmq.Socket, now: float) -> int:
        """Take up to ``READ_BUDGET`` frame sets without blocking; returns how many were read."""
        core = self._core
        got = False
        count = 0
        for count in range(1, READ_BUDGET + 1):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                count -= 1
                break
            messages, reply = core.receive(frames, now)
            if messages:
                self._inbox.extend(messages)
                got = True
            elif reply is not None and reply.id is not None:
                self._resolve(reply)
        if got:
            self._arrived.set()
        return count

    def _resolve(self, reply: mc0.Ok | mc0.Error) -> None:
        """Hand the broker's answer to whoever sent the command with ``reply.id``."""
        raise NotImplementedError
