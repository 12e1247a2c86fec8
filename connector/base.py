"""What the blocking and the asyncio client share: their options, the protocol core, the inbox, and the step
that turns readable frame sets into deliveries and replies. Each client adds only how it waits and how a reply
reaches the caller that asked (:meth:`ClientBase._resolve`).

The checks and encodings behind ``subscribe``, ``ack`` and ``declare`` live in :mod:`connector.core`; the
keyword options of ``declare`` are :class:`TopicSettings`, written once here for both clients."""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from socket import create_connection
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypedDict

import zmq
from zmq.utils.monitor import parse_monitor_message

from connector import addresses, connection
from connector.core import (
    ClientCore,
    ConnectorError,
    Message,
    Outcome,
    Publish,
    confirm_headers,
    confirm_results,
    to_bytes,
)
from connector.keys import Credentials
from connector.zsock import readable, recv_frames
from protocol import ProtocolError, mc0

DEFAULT_ENDPOINT = "tcp://127.0.0.1:61616"
#: Frame sets read per wake-up before the client looks at its other work (fairness, not a limit).
READ_BUDGET = 512
#: Reconnect attempts while the broker is away: the first after this many ms, doubling up to the second.
RECONNECT_FIRST_MS = 20
RECONNECT_MAX_MS = 200
#: Moves from broker to broker in a row (LEADER answers, endpoints that cannot be reached) before a command a
#: follower refused fails instead of following once more: a cluster electing a leader takes a few of them.
MAX_REDIRECTS = 50
#: Seconds before asking again when a member names, as its leader, one whose port just refused this client
#: (it has not noticed yet): the first time, then twice as long each time, up to LEADER_GONE_WAIT. The members
#: elect a new leader about ten milliseconds after a killed leader's connections close.
LEADER_GONE_FIRST = 0.02
LEADER_GONE_WAIT = 0.1
#: A leader whose port refused this client within this many seconds is taken for gone when a member names it:
#: long enough for the members to notice a killed leader (tens of milliseconds), short enough that a member
#: restarted since and elected is followed at once.
LEADER_GONE_FOR = 0.3

#: The heartbeat TTL (ms) when a client is not given one (``ttl="auto"``): a broker that falls silent is left
#: after 1.05 x it. One broker: 30 s. A cluster's members: 3 s, so that a leader whose machine died, froze or
#: was cut off (its connections never close, as a killed process's do) is left for the new leader within
#: seconds of the election (0.5-1 s), not half a minute later; the NOOPs it costs, one each way every 1.5 s
#: on an idle connection, are nothing to either side.
TTL_MS = 30_000
CLUSTER_TTL_MS = 3_000

#: Confirmed publishes in flight per client by default (NATS JetStream's publish_async bounds 4,000; ours is
#: the broker's batch size, so a full window is one PUTS CONFIRM each and one fsync on a strong topic).
DEFAULT_MAX_CONFIRMS = 1024


class _Signal(Protocol):
    def set(self) -> None: ...


class _Future(Protocol):
    """A concurrent.futures.Future (the blocking client) or an asyncio.Future (the asyncio client)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class Confirms:
    """The futures of confirmed publishes that left in one command (a ``PUTS CONFIRM each``, or one PUT with
    an ID): settled together by its reply, or failed together when no reply can come. Never dropped: every
    path that forgets a command fails its futures. ``release(n)`` gives the client back n slots of its
    ``max_confirms`` once they are settled: once per command, not once per message."""

    __slots__ = ("futures", "items", "release")

    def __init__(self, futures: list[_Future], release: Callable[[int], None],
                 items: list[Publish] | None = None) -> None:
        self.futures = futures
        self.release = release
        self.items = items  # what was sent: sent again to a cluster's leader when a follower refused it

    def settle(self, reply: mc0.Ok | mc0.Error) -> None:
        self._settle(self.futures, confirm_results(reply, len(self.futures)))
        self.release(len(self.futures))

    def settle_stored(self, reply: mc0.Ok) -> Confirms | None:
        """The OK to a PUTS CONFIRM each from a cluster leader that stored only some of its entries and hands
        the cluster over (it carries RETRY-AFTER): settle the entries it stored, and return the ones it
        refused, which were not stored, as Confirms of their own (their slots with them) to send again. None
        when it refused none, or the reply does not decode: every entry is then settled by it, as by
        :meth:`settle`."""
        try:
            entries = mc0.decode_confirms(reply, len(self.futures))
        except ProtocolError:
            entries = []
        refused = [index for index, entry in enumerate(entries) if entry[0] is None]
        if not refused or self.items is None:
            self.settle(reply)
            return None
        stored = [index for index, entry in enumerate(entries) if entry[0] is not None]
        self._settle([self.futures[index] for index in stored], [entries[index] for index in stored])
        self.release(len(stored))
        items = self.items
        return type(self)([self.futures[index] for index in refused], self.release,
                          [items[index] for index in refused])

    def _settle(self, futures: list[_Future], outcomes: list[Outcome]) -> None:
        for future, outcome in zip(futures, outcomes, strict=True):
            if future.done():
                continue  # cancelled by its owner (an asyncio future)
            if isinstance(outcome, ConnectorError):
                future.set_exception(outcome)
            else:
                future.set_result(confirm_headers(outcome))

    def fail(self, why: str) -> None:
        fail_confirms(self.futures, why)
        self.release(len(self.futures))


def fail_confirms(futures: Iterable[_Future], why: str) -> None:
    """Fail confirmed publishes that will never hear from the broker, saying what that means."""
    for future in futures:
        if not future.done():
            future.set_exception(ConnectorError(
                f"{why} before the broker confirmed this publish: it may or may not have been stored"))


class QueuedConfirm:
    """A confirmed publish waiting in a client's outbox: what to send, and the future its result goes to."""

    __slots__ = ("future", "item")

    def __init__(self, item: Publish, future: _Future) -> None:
        self.item = item
        self.future = future


def group_outbox(items: Iterable[Any]) -> Iterator[tuple[type, list[Any]]]:
    """Runs of one kind from an outbox, in order, as ``(kind, items)``: ``tuple`` for fire-and-forget
    publishes, :class:`QueuedConfirm` for confirmed ones, and any other item (a command) alone. A run leaves
    as one batch, so order is kept between the kinds while each still travels in batches."""
    kind: type | None = None
    run: list[Any] = []
    append = run.append
    for item in items:
        this = type(item)
        if this is kind:  # the common case under load: one more of the same
            append(item)
            continue
        if run:
            yield kind, run  # type: ignore[misc] - kind is set whenever run is not empty
            run = []
            append = run.append
        if this is tuple or this is QueuedConfirm:
            kind = this
            append(item)
        else:
            kind = None
            yield this, [item]
    if run:
        yield kind, run  # type: ignore[misc]


def parse_endpoints(endpoint: str | Sequence[str]) -> list[str]:
    """The brokers a client may connect to: one address, several separated by commas (a cluster's members),
    or a list of them; each in the forms of :mod:`connector.addresses`."""
    parts = endpoint.split(",") if isinstance(endpoint, str) else list(endpoint)
    out: list[str] = []
    try:
        for part in parts:
            if part.strip():
                address = addresses.zmq_endpoint(part, what="broker endpoint")
                if address not in out:
                    out.append(address)
    except addresses.AddressError as error:
        raise ConnectorError(str(error)) from None
    if not out:
        raise ConnectorError("no broker endpoint given")
    return out


def retry_after(reply: mc0.Ok | mc0.Error) -> float | None:
    """Seconds a cluster member that knows no leader yet asks a client to wait before sending again, if any
    (RETRY-AFTER, at most a second)."""
    raw = reply.headers.get(mc0.RETRY_AFTER)
    if not raw or not raw.isdigit():
        return None
    return min(int(raw), 1000) / 1000


def leader_of(reply: mc0.Ok | mc0.Error) -> str | None:
    """The cluster leader's endpoint a broker that does not lead names in its answer (LEADER), if any."""
    raw = reply.headers.get(mc0.LEADER)
    if not raw:
        return None
    try:
        return addresses.zmq_endpoint(raw.decode("utf-8", "replace"), what="LEADER")
    except addresses.AddressError:
        return None


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


def make_socket(
    context: zmq.Context, endpoint: str, credentials: Credentials | None
) -> tuple[zmq.Socket, zmq.Socket]:
    """A DEALER connected to ``endpoint``, CURVE-pinned when ``credentials`` are given, and the PAIR socket on
    which libzmq reports its connection events (watched from before the connect, so none is missed)."""
    socket = context.socket(zmq.DEALER)
    monitor: zmq.Socket | None = None
    try:
        socket.linger = 0
        socket.sndhwm = 100_000
        socket.rcvhwm = 100_000
        # Back within RECONNECT_MAX_MS of a restarted broker (libzmq's default retries every 100 ms forever;
        # starting lower and backing off keeps a long outage quiet and a short one short).
        socket.reconnect_ivl = RECONNECT_FIRST_MS
        socket.reconnect_ivl_max = RECONNECT_MAX_MS
        if addresses.is_ipv6(endpoint):
            socket.ipv6 = True
        if credentials is not None:
            credentials.apply(socket)
        monitor = socket.get_monitor_socket(connection.EVENTS)
        socket.connect(endpoint)
    except BaseException:
        close_socket(socket, monitor)  # an open socket would make Context.term() wait forever
        raise
    return socket, monitor


def broker_mechanism(endpoint: str, timeout: float = 1.0) -> str | None:
    """The security mechanism the ZMTP peer at ``endpoint`` (``tcp://HOST:PORT``) names in its greeting, read
    over a plain TCP connection closed at once; None if it cannot be read."""
    host, colon, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not colon or not port.isdigit():
        return None
    try:
        with create_connection((host.strip("[]"), int(port)), timeout=timeout) as probe:
            probe.sendall(connection.GREETING_OPENING)
            greeting = b""
            while len(greeting) < connection.GREETING_SIZE:
                chunk = probe.recv(connection.GREETING_SIZE - len(greeting))
                if not chunk:
                    break
                greeting += chunk
    except OSError:
        return None
    return connection.greeting_mechanism(greeting)


def close_socket(socket: zmq.Socket, monitor: zmq.Socket | None) -> None:
    """Close a client socket and its monitor."""
    if monitor is not None:
        with contextlib.suppress(zmq.ZMQError):
            socket.disable_monitor()
        monitor.close(linger=0)
    socket.close(linger=0)


def reply_or_raise(reply: mc0.Ok | mc0.Error, what: str) -> mc0.Ok:
    if isinstance(reply, mc0.Error):
        raise ConnectorError(f"broker refused {what}: {reply.message.decode('utf-8', 'replace')}")
    return reply


class ClientOptions(TypedDict, total=False):
    """The keyword options both clients take (see :class:`ClientBase`)."""

    keys: str | Path | None
    credentials: Credentials | None
    curve: bool | None
    ttl: int | Literal["auto"] | None
    timeout: float
    max_outbox: int
    max_inbox: int
    max_confirms: int


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
    ``curve=False`` forces plaintext; ``ttl`` (ms, None = no heartbeats) drives NOOPs and reconnects
    (``auto``: :data:`TTL_MS` to one broker, :data:`CLUSTER_TTL_MS` to a cluster's members);
    ``timeout`` (s) bounds every wait for the broker; ``max_outbox``/``max_inbox`` bound the two queues;
    ``max_confirms`` bounds the confirmed publishes in flight (``publish_async`` waits for room beyond it).
    """

    _arrived: _Signal  # set when deliveries reach the inbox (a threading or an asyncio Event)
    _waiting: dict[int, Any]  # commands waiting for the broker's answer, by command id

    def __init__(
        self,
        endpoint: str | Sequence[str] = DEFAULT_ENDPOINT,
        *,
        keys: str | Path | None = None,
        credentials: Credentials | None = None,
        curve: bool | None = None,
        ttl: int | Literal["auto"] | None = "auto",
        timeout: float = 5.0,
        max_outbox: int = 100_000,
        max_inbox: int = 100_000,
        max_confirms: int = DEFAULT_MAX_CONFIRMS,
    ) -> None:
        if max_confirms < 1:
            raise ValueError("max_confirms must be at least 1")
        #: The brokers this client may use (a cluster's members), and the one it uses now.
        self.endpoints = parse_endpoints(endpoint)
        self.endpoint = self.endpoints[0]
        self.timeout = timeout
        #: Times the client moved to another broker (a LEADER answer, or one it could not reach).
        self.moves = 0
        self._moving = False  # a move is due: the I/O side opens a connection to self.endpoint
        self._move_at = 0.0  # ... not before this monotonic time (a cluster electing a leader asked to wait)
        self._moves_in_row = 0
        self._gone_waits = 0  # waits in a row for members that still name a leader that is gone
        self._refused: dict[str, float] = {}  # endpoint -> when nothing listened there (moves go elsewhere)
        self._resend: list[Any] = []  # commands a follower refused, sent again once connected to the leader
        # A broker named the leader (answering our CONNECT, refusing a command, or sending us away; _move sets
        # it): it answered, in order, everything it took before and stores nothing more from this connection,
        # so what it left unanswered goes to the leader like what it refused (instead of failing as "may or
        # may not have been stored").
        self._sent_away = False
        self.reconnects = 0
        self._credentials = resolve_credentials(keys, credentials, curve)
        if ttl == "auto":
            ttl = CLUSTER_TTL_MS if len(self.endpoints) > 1 else TTL_MS
        self._core = ClientCore(ttl)
        self._max_outbox = max_outbox
        self._max_inbox = max_inbox
        self._max_confirms = max_confirms
        self._inbox: deque[Message] = deque()
        self._unsent: deque[mc0.Frames] = deque()  # frame sets that met a full pipe, in order
        self._closed = False
        self._failure: BaseException | None = None  # what stopped the client's I/O, if anything did
        self._established = False  # the broker answered the first CONNECT with OK
        #: Why the broker cannot be reached, while it cannot (one line); None while connected.
        self.connection_problem: str | None = None
        self._watch = self._new_watch()

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

    def _read(self, socket: Any, now: float, ready: Callable[[Any], bool] = readable,
              take: Callable[[Any], list[bytes]] = recv_frames) -> int:
        """Take up to ``READ_BUDGET`` frame sets without blocking; returns how many were read. ``ready`` and
        ``take`` are :mod:`connector.zsock`'s calls on a libzmq socket, or the native wire's
        (:class:`connector.native.NativeSocket`)."""
        core = self._core
        got = False
        count = 0
        while count < READ_BUDGET and ready(socket):  # asking is cheaper than a zmq.Again at the end
            count += 1
            messages, reply = core.receive(take(socket), now)
            if messages:
                self._inbox.extend(messages)
                got = True
            elif reply is not None and reply.id is not None:
                self._resolve(reply)
            elif isinstance(reply, mc0.Error) and (leader := leader_of(reply)) is not None:
                # A cluster member that stopped leading sends its clients away; one that leads again, in a
                # new epoch, names itself: its subscribers subscribe again, on a new connection, learning
                # the new epoch's log identities.
                self._move(leader)
        if got:
            self._arrived.set()
        return count

    def _resolve(self, reply: mc0.Ok | mc0.Error) -> None:
        """Hand the broker's answer to whoever sent the command with ``reply.id``."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------- connection events

    def _new_watch(self) -> connection.ConnectionWatch:
        """A fresh watch, for a fresh socket."""
        curve = self._credentials.public if self._credentials is not None else None
        return connection.ConnectionWatch(self.endpoint, curve_public=curve)

    def _check_watch(self, now: float) -> None:
        """On the I/O side's timer while not connected: act on what the watch says by now."""
        self._verdict(self._patient_watch(now).check(now), now)

    def _patient_watch(self, now: float) -> connection.ConnectionWatch:
        """The watch, told how long refused connects must last before the client gives up on this broker,
        and how long a connection may wait for its handshake (decided now, not when the socket was made: a
        member of a cluster is left at its first refusal, or after STALLED_FOR without a handshake, while
        another has not refused lately, and the others' refusals age while the client is connected)."""
        watch = self._watch
        elsewhere = bool(self._elsewhere(now))
        watch.refused_for = connection.REFUSED_FOR_MOVING if elsewhere else connection.REFUSED_FOR
        watch.stalled_for = connection.STALLED_FOR if elsewhere else None
        return watch

    def _after(self) -> list[str]:
        """The other endpoints, in order after this one (all of them when this one is not in the list)."""
        index = self.endpoints.index(self.endpoint) if self.endpoint in self.endpoints else -1
        return self.endpoints[index + 1:] + self.endpoints[:max(index, 0)]

    def _elsewhere(self, now: float) -> list[str]:
        """The other endpoints, in order after this one, that have not refused a connect lately."""
        if len(self.endpoints) < 2:
            return []
        return [endpoint for endpoint in self._after() if not self._refused_lately(endpoint, now)]

    def _refused_lately(self, endpoint: str, now: float, within: float = connection.REFUSED_FOR) -> bool:
        """Whether nothing listened at ``endpoint`` within the last ``within`` seconds."""
        return now - self._refused.get(endpoint, -math.inf) < within

    def _least_refused(self) -> list[str]:
        """Every endpoint, the one whose last refusal is oldest first: one that never refused (the member that
        just answered) before one restarted a second ago, and that before one that refused just now."""
        return sorted(self.endpoints, key=lambda endpoint: self._refused.get(endpoint, -math.inf))

    def _read_events(self, monitor: zmq.Socket, now: float) -> None:
        """Take the socket's connection events without blocking and act on what they say."""
        while readable(monitor):
            event = parse_monitor_message(recv_frames(monitor))
            self._on_event(event["event"], event["value"], now)

    def _on_event(self, kind: int, value: int, now: float) -> None:
        """One connection event of the current socket, and what it means."""
        self._verdict(self._patient_watch(now).event(kind, value, now), now)
        if self._watch.connected:
            self._refused.pop(self._watch.endpoint, None)  # it listens again

    def _verdict(self, verdict: connection.Verdict, now: float) -> None:
        if verdict is None:
            return
        if type(verdict) is connection.Unreachable and (self._watch.refused_since is not None
                                                         or self._watch.stalled):
            self._refused[self._watch.endpoint] = now  # nothing answered there lately: others first
        if self._moving:
            return  # about the socket being left for another broker: what it says changes nothing now
        if type(verdict) is connection.AskMechanism:
            self._ask_mechanism(now)
            return
        if type(verdict) is connection.Reconnected:
            self.connection_problem = None
            self.reconnects += 1
            self._handshake(now)
            return
        self.connection_problem = verdict.reason  # type: ignore[union-attr] - an Unreachable
        if len(self.endpoints) > 1 and self._moves_in_row < MAX_REDIRECTS * len(self.endpoints):
            self._move(None)  # a cluster: another member may lead now
            return
        if not self._established:
            self._unreachable(verdict.reason)  # type: ignore[union-attr]

    def _ask_mechanism(self, now: float) -> None:
        """Read the broker's mechanism from its greeting (a plain TCP probe, a second at most) and act on the
        verdict. The blocking client does it on its I/O thread; the asyncio client in a worker thread."""
        self._verdict(self._watch.mechanism(broker_mechanism(self.endpoint)), now)

    def _move(self, leader: str | None, after: float = 0.0) -> bool:
        """Connect to another broker next: ``leader`` (a LEADER answer named it), or the next endpoint of the
        list, ``after`` seconds from now. The I/O side does it (``_moving``) once it is done reading. False
        when moves in a row are used up (the caller then fails what it was doing)."""
        if self._moving and leader is None:
            return True  # a move is due already (what the old connection still says changes nothing)
        if self._moves_in_row >= MAX_REDIRECTS * len(self.endpoints):
            return False
        if leader is not None:
            self._sent_away = True  # a broker named the leader: see _sent_away
        now = time.monotonic()
        if leader is not None and self._refused_lately(leader, now, LEADER_GONE_FOR):
            # A member still names the leader whose port just refused us (it has not noticed yet): ask the
            # others again shortly, while they elect a new one.
            if self._moving:
                return True  # the old connection's next answer with the same news: the move due stands
            wait = min(LEADER_GONE_WAIT, LEADER_GONE_FIRST * 2**self._gone_waits)
            self._gone_waits += 1
            leader, after = None, max(after, wait)
        if leader is not None:
            if leader not in self.endpoints:
                self.endpoints.append(leader)
            self.endpoint = leader
        else:  # if every other member refused lately too: the one whose refusal is oldest, paced there
            self.endpoint = (self._elsewhere(now) or self._least_refused())[0]
        self._moves_in_row += 1
        self.moves += 1
        self._moving = True
        self._move_at = now + after
        return True

    def _moves_done(self) -> None:
        """A broker that serves this client answered its CONNECT: moves in a row count from none again."""
        self._moves_in_row = 0
        self._gone_waits = 0

    def _move_due(self, now: float) -> float | None:
        """None when no move is due; else the seconds until it may be made (0: now)."""
        if not self._moving:
            return None
        return max(0.0, self._move_at - now)

    def _partly_refused(self, reply: mc0.Ok | mc0.Error) -> bool:
        """A cluster leader that cannot write stored only some entries of a PUTS CONFIRM each and hands the
        cluster over: its OK says RETRY-AFTER. Move after that wait (True: the refused entries, not stored,
        are to be sent again there; :meth:`Confirms.settle_stored`)."""
        if type(reply) is not mc0.Ok:
            return False
        wait = retry_after(reply)
        return wait is not None and self._move(None, after=wait)

    def _redirected(self, reply: mc0.Ok | mc0.Error) -> bool:
        """A broker that does not lead its cluster refused a command, naming the leader: move there (True: the
        command is to be sent again there, nothing of it was stored)."""
        if not isinstance(reply, mc0.Error):
            return False
        leader = leader_of(reply)
        if leader is None:
            # No leader to name yet (an election, or a take-over): ask again after the wait the broker asked
            # for, at the next member of the list (the same broker when there is one).
            wait = retry_after(reply)
            return wait is not None and self._move(None, after=wait)
        return self._move(leader if leader != self.endpoint else None)

    def _handshake(self, now: float) -> None:
        """The connection came back (the broker restarted, or dropped us): CONNECT and subscribe again on this
        socket at once, resuming each topic after its last id.

        Commands waiting for an answer are not failed yet: those the socket queued while the connection was
        down go out on the new one ahead of the CONNECT, and the broker answers a client in order, so their
        answers come before the CONNECT's. Whatever is still unanswered once the CONNECT's answer is in went
        with the old connection, and fails then (:meth:`_orphaned`)."""
        raise NotImplementedError

    def _orphaned(self, orphans: Iterable[int], fail: Callable[[Any, str], None]) -> None:
        """The CONNECT after a reconnection was answered: the commands of ``orphans`` still waiting were lost
        with the old connection (their answer, or they themselves): ``fail`` each."""
        for command_id in orphans:
            waiting = self._waiting.pop(command_id, None)
            if waiting is not None:
                fail(waiting, "connection to the broker was lost")

    def _unreachable(self, reason: str) -> None:
        """The broker cannot be reached, before the first CONNECT was answered: the constructor (or
        ``connect()``) raises ``reason`` now instead of waiting out its timeout."""
        raise NotImplementedError
