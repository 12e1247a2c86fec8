"""The TCP shell every byte-stream dialect shares: a listening server, its connections, flow control and a
liveness tick. It knows asyncio and the hub; it knows no dialect.

A :class:`Gateway` is one door of the broker (``sexp``, ``msgq``, ...): it listens on one address (plain TCP,
or TLS when given an ``ssl.SSLContext``) and makes one :class:`Connection` per peer. A dialect subclasses
:class:`Connection`: it sets ``codec`` (its sans-IO codec from :mod:`protocol`), acts on each event in
:meth:`~Connection.handle`, turns an engine message into bytes in :meth:`~Connection.encode_delivery`, and
runs its liveness rules, if it has any, in :meth:`~Connection.tick`.

Every connection registers one engine :class:`~broker.engine.Subscriber` and is that subscriber's outlet: the
hub calls :meth:`Connection.deliver` after each commit. Flow control is asyncio's: once the transport holds
``WRITE_HIGH_WATER`` bytes it calls ``pause_writing``; the connection then stops taking deliveries (they wait
in the engine, bounded there: a persistent topic reads them from the log later, a transient one counts what it
drops) and stops reading the peer, so a peer that does not read cannot make us buffer its answers either.
``resume_writing`` wakes the subscriber through the hub. Memory per connection is therefore bounded by the
codec's own limits plus about one write chunk over the high-water mark.

One connection holds the loop for a bounded slice at a time: it handles at most ``SLICE_EVENTS`` events in
a go (a compressed Lumberjack frame may hold thousands), and a codec with long work of its own (a long sexp
line, a large inflation) does it in steps and says so with ``busy``. Either way the connection stops reading
its peer, and goes on from a loop callback after the other connections and the hub have had their turn.

An event that would create a persistent topic (a dialect says which topics an event names:
:meth:`Connection.names_topics`) does not make its log on the loop: the store's threads make it ahead
(:meth:`~broker.engine.Engine.make_ahead`) while the connection waits, not reading its peer, and the loop
serves everyone else; the maker's call brings the event back, and creating the topic then only renames the
directory made for it. Meanwhile the connection decodes the events after it (at most ``LOOK_AHEAD`` of them
and ``LOOK_AHEAD_BYTES``, counted as the connection's input), so that their new topics are made too, by the
store's threads together; they are handled in order after it. A log shipper routing a window to hundreds of
new topics used to hold every other client for the fsyncs of a few of them at each of its slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from broker.engine import Message, Subscriber
from broker.hub import Hub
from protocol import ProtocolError

log = logging.getLogger("mc0.gateway")

#: Bytes a transport may hold before the connection pauses (asyncio's own default is 64 KiB; a little more
#: keeps a fast reader's pipe full between two turns).
WRITE_HIGH_WATER = 256 << 10
#: Deliveries are encoded and handed to the transport in chunks of about this size: one write per chunk, and
#: a paused transport is noticed after at most one chunk too many.
WRITE_CHUNK = 64 << 10
#: Linux only. A writer that splits a frame over two sends without TCP_NODELAY (a Lumberjack window, then its
#: data) holds the second send back (Nagle) until the first is acknowledged, and a delayed ACK makes that
#: about 40 ms a batch. TCP_QUICKACK acknowledges at once, but the kernel drops back to delayed ACKs on its
#: own, so it is set again after every read (one setsockopt per read: microseconds, not milliseconds).
TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)

#: Events one connection handles before it lets the loop go round (a few milliseconds of work at most: the
#: slowest event, a publish into a strong topic, costs a few microseconds before the commit). A slice also
#: ends after a few new persistent topics (Engine.made_enough): each costs fsyncs, milliseconds (a Lumberjack
#: window routed by a field to hundreds of new topics).
SLICE_EVENTS = 512
#: An event waiting for the logs of its new topics has the connection decode at most this many events after
#: it, and at most this many bytes of them, to have their new topics made at the same time (the store makes
#: up to 64 ahead, in two threads: broker.store.making).
LOOK_AHEAD = 64
LOOK_AHEAD_BYTES = 1 << 20


class Replication(Protocol):
    """What a cluster (:mod:`broker.cluster`) says about acknowledgements; absent on a single broker."""

    commit_timeout: float  # seconds an acknowledgement may wait for a majority

    def confirm(self, needs: dict[bytes, int], now: float, deadline: float) -> bool | str:
        """Whether an acknowledgement of messages up to ``needs`` (topic -> last id) may go: True, False
        (wait), or why it cannot (the text of the refusal)."""
        ...


class Gateway:
    """One listening door: its server socket, its connections and their periodic tick."""

    def __init__(
        self,
        name: str,
        hub: Hub,
        connection: Callable[[Gateway], Connection],
        *,
        host: str,
        port: int,
        tick: float,
        pending_limit: int = 100_000,
        ssl_context: ssl.SSLContext | None = None,
        options: Any = None,
        input_budget: InputBudget | None = None,
        handshake_timeout: float = 5.0,
    ) -> None:
        self.name = name
        self.hub = hub
        self.connection = connection
        self.host = host
        self.port = port
        self.tick_interval = tick
        self.pending_limit = pending_limit
        self.ssl_context = ssl_context
        self.options = options  # the dialect's own settings, read by its connections
        self.connections: set[Connection] = set()
        self.committing: set[Connection] = set()  # want committed() after the next commit
        self.servers: list[asyncio.Server] = []  # accepting now (none while paused)
        # The listening sockets, kept open by us while the servers come and go, so a pause keeps the port.
        self.listening: list[socket.socket] = []
        self.address: tuple[str, int] | None = None  # where it really listens (port 0 resolved)
        self.input_budget = input_budget if input_budget is not None else InputBudget(DEFAULT_INPUT_BUDGET)
        self.handshake_timeout = handshake_timeout
        # paused: times a connection's transport was full (the peer reads slower than we write). A dialect
        # adds its own counters by naming them in its connection class's ``counters``.
        # messages_*: published through this door and deliveries written to it; bytes_*: read and written.
        # parked: events that waited for the logs of their new topics to be made ahead.
        self.counters = {"accepted": 0, "errors": 0, "closed": 0, "expired": 0, "paused": 0,
                         "over_budget": 0, "silent": 0, "parked": 0, "messages_in": 0, "messages_out": 0,
                         "bytes_in": 0, "bytes_out": 0}
        self.counters.update(dict.fromkeys(getattr(connection, "counters", ()), 0))
        #: Why this door takes no connection now (a cluster member that does not lead), or None to take them.
        self.refusing: Callable[[], str | None] | None = None
        #: A cluster leader's: whether what a connection stored is held by a majority yet (its acks wait).
        self.replication: Replication | None = None
        self.replicating: set[Connection] = set()  # acks waiting for a majority: committed() again each turn

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: self.connection(self), self.host, self.port, ssl=self.ssl_context, reuse_address=True
            )
        except OSError as error:
            where = f"{self.name} gateway on {self.host}:{self.port}"
            raise OSError(error.errno, f"{where}: {error.strerror}") from None
        self.servers = [server]
        self.listening = [socket.socket(fileno=os.dup(listener.fileno())) for listener in server.sockets]
        host, port = server.sockets[0].getsockname()[:2]
        self.address = (host, port)

    def pause(self) -> None:
        """Stop accepting: the servers close, our copy of each listening socket keeps the port (connections
        that arrive meanwhile wait in the kernel's backlog). Connections already made are not touched."""
        servers, self.servers = self.servers, []
        for server in servers:
            server.close()

    def shed(self) -> None:
        """Out of descriptors: close at once the connections that have sent nothing yet, which the handshake
        timeout would close later, so that their descriptors come back now."""
        silent = [connection for connection in self.connections
                  if not connection.heard and not connection.closing]
        for connection in silent:
            connection.abort()
        if silent:
            self.counters["silent"] += len(silent)
            log.warning("%s door: closed %d connections that had sent nothing, for want of descriptors",
                        self.name, len(silent))

    async def resume(self) -> None:
        if self.servers:
            return
        loop = asyncio.get_running_loop()
        for listener in self.listening:
            self.servers.append(await loop.create_server(lambda: self.connection(self), sock=listener.dup(),
                                                         ssl=self.ssl_context))

    async def run(self) -> None:
        """Tick every connection until cancelled (pings, expiry, whatever the dialect's liveness needs, and
        the handshake timeout: a peer that sends nothing at all is not kept)."""
        monotonic = self.hub.monotonic
        due = monotonic() + self.tick_interval
        while True:
            await asyncio.sleep(self.tick_interval)
            now = monotonic()
            held_up, due = now - due > self.tick_interval, now + self.tick_interval
            if held_up:
                # The loop was held up longer than a tick (a long turn, a slow disk): what peers sent
                # meanwhile may not have been read yet. Nobody is judged silent now; the next tick judges.
                continue
            cutoff = now - self.handshake_timeout
            for connection in list(self.connections):
                if connection.closing:
                    continue  # gone as soon as the transport says so
                if not connection.heard and connection.opened < cutoff:
                    self.counters["silent"] += 1
                    connection.close(f"nothing received within {self.handshake_timeout:g} s of connecting")
                    continue
                connection.tick(now)
            self.hub.schedule()

    def close_all(self, why: str) -> None:
        """Close every connection (after what was written has gone out), saying why in the log."""
        for connection in list(self.connections):
            connection.close(why)

    def close(self) -> None:
        self.pause()
        for listener in self.listening:
            listener.close()
        self.listening = []
        for connection in list(self.connections):
            connection.abort()

    # ---------------------------------------------------------------------------------- the hub's Door side

    def answer(self, now: float) -> bool:
        """After the commit: the connections that asked to hear of it (an ack that promises durability, more
        demand for a producer once what it sent is stored)."""
        if self.committing or self.replicating:
            # Those waiting for a cluster's majority are asked again too (and wait on if need be).
            waiting = self.committing | self.replicating
            self.committing, self.replicating = set(), set()
            for connection in waiting:
                if not connection.closing:
                    connection.committed(now)
        return bool(self.replicating)  # the hub comes back on its retry timer as well as on every turn

    def stats(self) -> dict[str, Any]:
        where = f"{self.address[0]}:{self.address[1]}" if self.address else None
        return {"connections": len(self.connections), "address": where, **self.counters}


#: Bytes of unfinished input all gateway connections may hold together when nothing else is said.
DEFAULT_INPUT_BUDGET = 256 << 20


class InputBudget:
    """The input all connections of all gateways hold together (partial lines and frames, inflated payloads,
    elements being reassembled), bounded: the connection holding the most is refused when the sum passes the
    limit, so a few slow or malicious peers cannot take the broker's memory between them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.held: dict[Connection, int] = {}

    def update(self, connection: Connection, held: int) -> None:
        before = self.held.pop(connection, 0)
        if held:
            self.held[connection] = held
        self.total += held - before
        while self.total > self.limit and self.held:
            largest = max(self.held, key=self.held.__getitem__)
            size = self.held[largest]
            self.forget(largest)
            largest.gateway.counters["over_budget"] += 1
            largest.refuse(f"{size} bytes of unfinished input: all connections together may hold "
                           f"{self.limit} (input_budget)")

    def forget(self, connection: Connection) -> None:
        self.total -= self.held.pop(connection, 0)


class _Gone:
    """The codec of a connection that has ended: it holds nothing and reads nothing."""

    buffered = 0
    busy = False

    def receive_data(self, data: bytes) -> None:
        pass

    def next_event(self) -> None:
        return None

    def send(self, event: Any) -> bytes:
        return b""


_GONE: Any = _Gone()


class _Refused:
    """In a connection's decoded-ahead events: the codec's error, in the place where it came."""

    __slots__ = ("error",)

    def __init__(self, error: ProtocolError) -> None:
        self.error = error


class _Codec(Protocol):
    """The byte-stream codec shape every dialect module in ``protocol/`` has. A codec whose work on buffered
    input comes in steps also has ``busy``: True when ``next_event`` returned None with work left to do."""

    def receive_data(self, data: bytes) -> None: ...

    def next_event(self) -> Any: ...


class Connection(asyncio.Protocol):
    """One peer of a gateway; subclasses speak the dialect through ``codec``."""

    codec: _Codec

    #: The transport says when it drained (``resume_writing``): no retry timer needed.
    polled = False

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.hub = gateway.hub
        self.engine = gateway.hub.engine
        self.subscriber = Subscriber(self, gateway.pending_limit)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.writable = True
        self.closing = False
        self.draining = False  # buffered input left for a later slice (reading the peer waits for it)
        self.reading = True  # the transport reads the peer (see _update_reading)
        self.last_heard = self.opened = self.hub.monotonic()
        self.heard = False  # anything at all received (see Gateway.handshake_timeout)
        self.quickack: Any = None  # the connection's socket, while TCP_QUICKACK is to be re-armed on it
        self.parked: Any = None  # an event waiting for its new topics' logs to be made (see _park)
        # The events decoded after it (see _look_ahead), each with the bytes it holds, and their sum.
        self.upcoming: deque[tuple[Any, int]] = deque()
        self.upcoming_bytes = 0
        # The topics made ahead for the parked and upcoming events: let go if the connection is lost before
        # they are handled (a refusal that closes it, a peer gone while an event waits).
        self.asked: set[bytes] = set()

    # ------------------------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a stream server's transports are Transports
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.gateway.connections.add(self)
        self.gateway.counters["accepted"] += 1
        sock = transport.get_extra_info("socket")
        if TCP_QUICKACK is not None and sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
                self.quickack = sock
            except OSError:
                pass  # not a TCP socket (a test's pipe): nothing to re-arm
        refusing = self.gateway.refusing
        why = refusing() if refusing is not None else None
        if why is not None:
            self.close(why)  # a cluster's follower: these doors are the leader's (docs/cluster.md)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.quickack is not None:
            try:
                self.quickack.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)  # see TCP_QUICKACK
            except OSError:
                self.quickack = None  # a socket going away: its peer's ACK timing no longer matters
        self.last_heard = self.hub.monotonic()
        self.gateway.counters["bytes_in"] += len(data)
        self.heard = True
        self._guarded(self.received, data)

    def _guarded(self, step: Callable[..., None], *args: Any) -> None:
        """Run one step of input handling: the peer's ProtocolError closes the peer, any other error is ours
        (a store that cannot keep its promise) and stops the broker."""
        try:
            step(*args)
        except ProtocolError as error:
            self.gateway.counters["errors"] += 1
            self.close(f"protocol error: {error}")
        except Exception as error:  # our failure, not the peer's (a store error): the broker stops
            self.abort()
            self.hub.fail(error)
            return
        if not self.closing:
            self.gateway.input_budget.update(self, self.input_held())
        # Not a flush now: every readable connection of this loop iteration is read first, then one commit
        # covers them all.
        self.hub.schedule()

    def input_held(self) -> int:
        """Bytes of input this connection holds unfinished (what the input budget counts): its codec's, and
        the events decoded ahead of their turn."""
        return getattr(getattr(self, "codec", None), "buffered", 0) + self.upcoming_bytes

    def refuse(self, why: str) -> None:
        """Close for a reason of the broker's (a limit reached), saying so the dialect's way if it can."""
        self.close(why)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.gateway.input_budget.forget(self)
        if self.asked:  # its events will not create them: what was made ahead for them goes
            self.engine.forget_ahead(self.asked)
            self.asked = set()
        self.parked = None
        self.upcoming.clear()
        self.upcoming_bytes = 0
        # What the peer sent and we had not read goes now, not whenever the garbage collector breaks this
        # connection's reference cycles (its subscribers point back at it): megabytes, for a long line.
        self.codec = _GONE
        self.gateway.connections.discard(self)
        self.gateway.counters["closed"] += 1
        self.gateway.committing.discard(self)
        try:
            for subscriber in self.subscribers():
                self.engine.detach(subscriber)  # its round-robin messages go to the others
        except Exception as error:
            self.hub.fail(error)
        self.hub.schedule()

    def pause_writing(self) -> None:
        self.writable = False
        self.gateway.counters["paused"] += 1
        self._update_reading()

    def resume_writing(self) -> None:
        self.writable = True
        if self.transport is not None and not self.closing:
            self._update_reading()
            for subscriber in self.subscribers():
                self.hub.wake(subscriber)

    def _update_reading(self) -> None:
        """Read the peer only while the transport takes our answers and no input waits for a later slice."""
        transport = self.transport
        if transport is None or self.closing:
            return
        if self.writable and not self.draining:
            if not self.reading:
                self.reading = True
                transport.resume_reading()
                # We were not reading: the peer's silence in that time is ours, not its.
                self.last_heard = self.hub.monotonic()
        elif self.reading:
            self.reading = False
            transport.pause_reading()

    # ---------------------------------------------------------------------------------- the hub's Outlet side

    @property
    def attached(self) -> bool:
        return not self.closing

    def deliver(self, messages: list[Message], now: float) -> int:
        if not self.writable or self.closing or self.transport is None:
            return 0
        encode = self.encode_delivery
        write = self.transport.write
        counters = self.gateway.counters
        chunk: list[bytes] = []
        size = 0
        sent = 0
        for message in messages:
            data = encode(message)
            chunk.append(data)
            size += len(data)
            sent += 1
            if size >= WRITE_CHUNK:
                write(b"".join(chunk))
                counters["bytes_out"] += size
                chunk = []
                size = 0
                if not self.writable:  # pause_writing ran inside write(): the rest waits for resume_writing
                    break
        else:
            if chunk:
                write(b"".join(chunk))
                counters["bytes_out"] += size
        counters["messages_out"] += sent
        return sent

    # ------------------------------------------------------------------------------------- for the dialects

    @property
    def who(self) -> tuple[str, str]:
        """The door and the peer, as the monitoring names a subscriber."""
        return self.gateway.name, self.peer

    def write(self, data: bytes) -> None:
        if not self.closing and self.transport is not None:
            self.transport.write(data)
            self.gateway.counters["bytes_out"] += len(data)

    def publish_message(self, topic: bytes, body: bytes, headers: dict[bytes, bytes],
                        wall: int | None = None) -> Message:
        """Publish one message the peer sent into the engine (``wall``: its timestamp, now if not given)."""
        message = self.engine.publish(topic, body, headers, self.hub.wall_ms() if wall is None else wall)
        self.gateway.counters["messages_in"] += 1
        return message

    def close(self, why: str) -> None:
        """Close after what was written so far has gone out."""
        if self.closing:
            return
        self.closing = True
        self.gateway.input_budget.forget(self)
        log.info("%s client %s closed: %s", self.gateway.name, self.peer, why)
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def received(self, data: bytes) -> None:
        """Feed ``data`` to the dialect's ``codec`` and :meth:`handle` its events, until the codec needs more,
        the connection is closing or the slice is spent (see the module docstring). A ProtocolError closes
        the peer."""
        self.codec.receive_data(data)
        self._drain()

    def _drain(self) -> None:
        codec = self.codec
        budget = SLICE_EVENTS
        loop = self.hub.loop
        engine = self.engine
        mark = engine.creation_mark()
        while not self.closing:
            event = self.parked
            if event is None:
                event = self._next_upcoming() if self.upcoming else codec.next_event()
            if event is None:
                if not getattr(codec, "busy", False):
                    if self.draining:
                        self.draining = False
                        self._update_reading()
                    return
                budget = 0  # the codec spent its own slice
            else:
                if loop is not None and self._park(event):
                    return  # the maker's call comes back here
                made = engine.logs_created
                self.handle(event)
                if self.asked and not self.upcoming:
                    self.asked = set()  # every event they were asked for is handled: created (or failed)
                budget -= 1
                if engine.logs_created != made and engine.made_enough(mark):
                    budget = 0
            if budget <= 0:
                if loop is None:  # driven by hand (tests): no loop to come back from, go on at once
                    budget = SLICE_EVENTS
                    mark = engine.creation_mark()
                    continue
                if not self.draining:
                    self.draining = True
                    self._update_reading()
                loop.call_soon(self._guarded, self._drain)
                return

    def handle(self, event: Any) -> None:
        """Act on one event of the dialect's codec."""
        raise NotImplementedError

    def names_topics(self, event: Any) -> Sequence[bytes]:
        """The topics handling ``event`` would create if they did not exist (what it publishes or subscribes
        to), as far as the dialect can tell cheaply before handling it; empty when none."""
        return ()

    def event_size(self, event: Any) -> int | None:
        """About the bytes ``event`` holds once decoded (its body, mostly), or None when the dialect cannot
        say: no events are then decoded ahead past it."""
        return None

    def _park(self, event: Any) -> bool:
        """Whether ``event`` must wait for the logs of new persistent topics it names, which the store's
        threads are making ahead (asked here): it is then kept in :attr:`parked`, the peer is not read, and
        :meth:`_made_ahead` brings it back once one is made. A topic the store makes nothing ahead for (a
        transient one, the maker's bound reached, no store) is created on the loop as before."""
        names = self.names_topics(event)
        topics = self.engine.topics
        for name in names:
            if name not in topics:
                break
        else:
            self.parked = None
            return False
        engine = self.engine
        waiting = False
        for name in self._make_ahead(names):
            waiting = waiting or not engine.ready(name)
        if not waiting:
            self.parked = None
            return False
        if self.parked is None:
            self.parked = event
            self.gateway.counters["parked"] += 1
            if not self.draining:
                self.draining = True
                self._update_reading()
            self._look_ahead()
        return True

    def _make_ahead(self, names: Sequence[bytes]) -> list[bytes]:
        """Have the store make the logs of those of ``names`` that would be new persistent topics; returns
        them."""
        unmade = self.engine.make_ahead_of(names, self._made_ahead)
        self.asked.update(unmade)
        return unmade

    def _look_ahead(self) -> None:
        """Decode the events after a parked one (within LOOK_AHEAD and LOOK_AHEAD_BYTES) and have the logs of
        their new topics made too, while the parked one waits. A malformed one is kept in its place, as its
        error, so that the events before it are still handled."""
        upcoming, codec = self.upcoming, self.codec
        while len(upcoming) < LOOK_AHEAD and self.upcoming_bytes < LOOK_AHEAD_BYTES:
            try:
                event = codec.next_event()
            except ProtocolError as error:
                upcoming.append((_Refused(error), 0))
                return
            if event is None:
                return
            size = self.event_size(event)
            upcoming.append((event, size or 0))
            if size is None:
                return
            self.upcoming_bytes += size
            self._make_ahead(self.names_topics(event))

    def _next_upcoming(self) -> Any:
        event, size = self.upcoming.popleft()
        self.upcoming_bytes -= size
        if type(event) is _Refused:
            raise event.error
        return event

    def _made_ahead(self) -> None:
        """From a maker thread: a log is made; a parked event goes on from the loop."""
        loop = self.hub.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the broker is stopping
                loop.call_soon_threadsafe(self._unpark)

    def _unpark(self) -> None:
        if self.parked is not None and not self.closing:
            self._guarded(self._drain)

    def subscribers(self) -> list[Subscriber]:
        """The engine subscribers this connection owns: one, or (a dialect with streams) one per stream."""
        return [self.subscriber]

    def after_commit(self) -> None:
        """Have :meth:`committed` called after the hub's next commit."""
        self.gateway.committing.add(self)
        self.hub.schedule()

    def committed(self, now: float) -> None:
        """Called after a commit once :meth:`after_commit` asked: what this connection handed to the engine
        before asking is now as durable as its topic promises."""

    def encode_delivery(self, message: Message) -> bytes:
        raise NotImplementedError

    def tick(self, now: float) -> None:
        """Called every gateway tick: pings, keepalives, expiry."""
