"""The mc0 port without libzmq: a ROUTER on the event loop's own TCP transports, speaking ZMTP 3 (NULL, or
CURVE with the broker's key pair and allow-list) to the clients' libzmq DEALERs (:mod:`protocol.zmtp`,
:mod:`protocol.curvezmq`). It serves the port by default (``mc0_engine``, docs/configuration.md).

Why it exists: libzmq reads and writes in an I/O thread of its own, so every command crosses two threads
each way (a mailbox write to wake the other side, a read to drain it) and every send or readiness check
makes libzmq process its command queue (a ``poll`` and a ``getpid`` each). At one message at a time that
costs more than the broker's own Python: a ROUTER that only answers OK cost 118-200 µs of CPU a request
through libzmq and 30 µs on these transports (docs/benchmarks.md). Here a command is one ``read`` in the
loop's wake-up, and a reply one ``writev``.

Owns: the accepted connections, the identity each goes by, the messages read and not yet taken by the
router, and what each connection has yet to write. The messages read are taken from each connection in turn,
a short run at a time (:data:`RUN`), as libzmq's ROUTER fair-queues its peers' pipes: one client's burst (a
thousand publishes to new topics, each costing fsyncs) does not hold another client's command behind it. It
gives the router what libzmq's ROUTER gave it (:class:`broker.router.RouterShell` calls :meth:`readable`,
:meth:`receive` and :meth:`send`):

* ROUTER_MANDATORY: a send to an identity with no connection raises ``EHOSTUNREACH``;
* ROUTER_HANDOVER: a connection presenting an identity already in use takes it over (the old one closes);
* the high-water marks: a connection with ``send_hwm`` messages or :data:`SEND_BUFFER` bytes unsent makes a
  send raise ``zmq.Again`` (the router keeps the reply and retries, as for a full libzmq pipe; once the
  transport has room again, :attr:`ZmtpDoor.writable` says so at once, where libzmq leaves the retry to the
  hub's timer), and with ``recv_hwm`` messages waiting for the router, connections stop being read until it
  has taken them;
* MAXMSGSIZE: a frame longer than ``max_message_size`` closes its connection;
* the handshake timeout: a connection that has not finished its greeting and READY in time is closed;
* the ZAP handler's decision, with CURVE: a client whose long-term key the allow-list does not hold
  (:class:`broker.auth.AllowList`, logged as there) is sent an ERROR with ZAP's status 400 and closed;
* the socket monitor's counters (:class:`broker.auth.HandshakeWatch`'s names).

Beyond libzmq, what a connection holds of a frame or message not yet complete counts toward the TCP doors'
``input_budget`` (:class:`broker.gateways.tcp.InputBudget`): past it, the connection holding the most is
closed, as theirs are (libzmq bounds each connection by ``max_message_size`` only).

A peer that breaks the protocol is closed, without an ERROR (as libzmq's server: see :meth:`refuse`); the
broker carries on.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import cast

import zmq
from zmq.utils import z85

from broker.auth import refused_by_reason
from broker.gateways.tcp import InputBudget
from broker.listener import Listener
from protocol import ProtocolError, curvezmq, zmtp

log = logging.getLogger("mc0.router")

#: Unsent bytes a connection may hold before sends to it wait, besides ``send_hwm`` messages (libzmq's
#: ``sndhwm`` counts frame sets only, each up to ``max_message_size``). 16 MiB: a few full records replies, or
#: 100,000 deliveries of 100 bytes.
SEND_BUFFER = 16 << 20

#: The status a ZAP handler's refusal carries (RFC 27), which libzmq clients report in their monitor.
ZAP_DENIED = "400"

_GENERATED = struct.Struct(">BI")  # libzmq's shape for identities it makes up: a zero octet, then 4 octets


class PeerMetadata:
    """What the router may ask of the connection a command came on, as it asks a libzmq frame's metadata:
    ``get("User-Id")``, the client's CURVE key in Z85 (what a ZAP handler names the user); empty without
    CURVE."""

    __slots__ = ("user_id",)

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id

    def get(self, name: str) -> str:
        if name != "User-Id":
            raise KeyError(name)
        return self.user_id


_NO_METADATA = PeerMetadata("")


#: Messages taken from one connection before the next one's turn (fewer when it has no more). One at a time,
#: as libzmq's ROUTER takes them, cost the round-robin benchmark a tenth of its rate (0.82 x the C proxy
#: against 0.92 before the rotation, seven runs each; 0.98 with runs of 16, three runs). A burst holds
#: another client's command behind at most this many of its own.
RUN = 16


class _Connection(asyncio.Protocol):
    """One peer: its bytes in through a :class:`protocol.zmtp.Reader`, its messages into the door's inbox."""

    def __init__(self, door: ZmtpDoor) -> None:
        self.door = door
        curve = None
        if door.curve_keys is not None:
            curve = curvezmq.CurveServer(*door.curve_keys, random=os.urandom)
        self.reader = zmtp.Reader(door.max_frame, curve=curve)
        self.writer = zmtp.Writer(curve)
        self.transport: asyncio.Transport | None = None
        self.identity: bytes | None = None  # set by the peer's READY
        self.metadata = _NO_METADATA
        self.full = False  # the transport asked us to stop writing (SEND_BUFFER reached)
        # The messages not yet (wholly) handed to the kernel, as where each ends in the bytes written since
        # the transport's buffer was last seen empty: how many there are is the send high-water mark's count.
        self.unsent: deque[int] = deque()
        self.written = 0
        self.paused = False  # not read while the inbox is full
        self.inbox: deque[list[bytes]] = deque()  # messages read, not yet taken by the router
        self.queued = False  # in the door's rotation of connections with messages waiting
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False  # closed by refuse() (counted there)
        self.gateway = door  # what the input budget counts a refusal on (``counters["over_budget"]``)
        self._budgeted = 0  # what the input budget was last told this connection holds

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # libzmq's default too
        self.transport.set_write_buffer_limits(high=SEND_BUFFER)
        self.transport.write(self.writer.greeting())
        self.door.connections.add(self)
        self.door.counters["accepted"] += 1
        self._deadline = asyncio.get_running_loop().call_later(self.door.handshake_timeout, self._too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self.door.budget is not None:
            self.door.budget.forget(self)
        if self.identity is None and not self._refused:
            # The peer hung up in its handshake (a plaintext client reading our CURVE greeting, say): what
            # libzmq's monitor reports as a handshake failed without detail.
            self.door.counters["refused_other"] += 1
        self.door.counters["closed"] += 1
        self.door.detach(self)

    def pause_writing(self) -> None:
        self.full = True

    def resume_writing(self) -> None:
        self.full = False
        self.door.writable()  # what waited for room can go now, not at the hub's next retry

    def data_received(self, data: bytes) -> None:
        try:
            events = self.reader.feed(data)
        except ProtocolError as error:  # ZMTP's or CurveZMQ's
            self.refuse(str(error), "protocol")
            return
        door = self.door
        held = self.reader.buffered
        if held != self._budgeted and door.budget is not None:
            self._budgeted = held
            door.budget.update(self, held)  # may refuse this connection, or another
            if self._refused:
                return
        arrived = 0
        for event in events:
            if type(event) is list:
                event.insert(0, self.identity)
                self.inbox.append(event)
                arrived += 1
            elif type(event) is zmtp.Ping:
                self.write(self.writer.pong(event.context))
            elif type(event) is zmtp.Reply:
                self.write([event.data])
            elif event == b"greeting":
                if self.writer.curve is None:
                    self.write([self.writer.ready()])  # NULL: both READYs cross; CURVE answers HELLO first
            elif type(event) is zmtp.Ready:
                if event.identity[:1] == b"\0":
                    self.refuse("an identity starting with a zero octet (those are the ROUTER's to give)",
                                "protocol")
                    return
                if event.client_key is not None:
                    self.metadata = PeerMetadata(z85.encode(event.client_key).decode("ascii"))
                    if not door.admits(event.client_key):
                        # "400", as a ZAP handler's refusal reaches a libzmq client: its monitor reports a
                        # failed authentication with that status.
                        self.refuse("its CURVE key is not admitted", "auth", ZAP_DENIED)
                        return
                    self.write([self.writer.ready()])
                if self._deadline is not None:
                    self._deadline.cancel()
                    self._deadline = None
                door.counters["handshakes"] += 1
                door.attach(self, event.identity)
        if arrived:
            door.arrived(self, arrived)

    def write(self, pieces: Sequence[bytes | memoryview]) -> None:
        if self.transport is not None:
            self.transport.writelines(pieces)

    def send(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Write one message, keeping count of it while any of it waits in the transport's buffer."""
        transport = self.transport
        if transport is None:
            return
        transport.writelines(pieces)
        waiting = transport.get_write_buffer_size()
        if not waiting:  # the usual case: the kernel took it all
            if self.unsent:
                self.unsent.clear()
            return
        if self.unsent:
            self.written += sum(map(len, pieces))
        else:
            self.written = waiting  # counted from where the unsent bytes begin
        self.unsent.append(self.written)

    def backlog(self) -> int:
        """How many messages wait in the transport's buffer."""
        unsent = self.unsent
        if unsent and self.transport is not None:
            sent = self.written - self.transport.get_write_buffer_size()
            while unsent and unsent[0] <= sent:
                unsent.popleft()
        return len(unsent)

    def refuse(self, reason: str, kind: str = "other", told: str | None = None) -> None:
        """Close the connection for ``reason``; while the handshake has not finished, count it under
        ``kind`` (``protocol``, ``auth``, ``other``) and, if ``told`` is given, send the peer a ZMTP ERROR
        saying it first. As libzmq's server, only a refused key is told (a ZAP status): a libzmq client
        reports a handshake that breaks off as failed, which the connector reads to say what is wrong, and
        an ERROR without a status would leave it nothing to report."""
        log.debug("mc0 door: closing a connection from %s: %s", self.peer_name(), reason)
        if self.transport is not None and not self._refused:
            self._refused = True
            if self.identity is None:
                self.door.counters[f"refused_{kind}"] += 1
                if told is not None:
                    self.transport.write(zmtp.error(told))
            self.transport.close()

    def peer_name(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    def _too_slow(self) -> None:
        self._deadline = None
        if self.identity is None:
            self.refuse(f"no ZMTP handshake within {self.door.handshake_timeout:g} s", "other")

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()


class ZmtpDoor:
    """The mc0 port served on the broker's own listening socket (:mod:`broker.listener`). Also the door the
    descriptor watch pauses: a pause holds the listener (new connections wait in the kernel), a shed closes
    every connection as unbinding libzmq's ROUTER would, and a resume lets connections in again."""

    name = "mc0"

    def __init__(
        self, listener: Listener, *, max_frame: int, send_hwm: int, recv_hwm: int, handshake_timeout: float,
        curve_keys: tuple[bytes, bytes] | None = None, admit: Callable[[bytes], bool] | None = None,
        budget: InputBudget | None = None,
    ) -> None:
        """``curve_keys``: the broker's public and secret key (32 bytes each) to serve CURVE, None for NULL;
        ``admit``: asked with each CURVE client's public key (Z85), None to admit any; ``budget``: the input
        budget the TCP doors share."""
        self.budget = budget
        self.listener = listener
        self.curve_keys = curve_keys
        self.admit = admit
        self.max_frame = max_frame
        self.send_hwm = send_hwm
        self.recv_hwm = recv_hwm
        self.handshake_timeout = handshake_timeout
        self.ready: deque[_Connection] = deque()  # connections with messages waiting, in turn
        self.waiting = 0  # messages waiting, all connections together (recv_hwm)
        self._run = 0  # messages taken from the connection in turn since it came to the front
        self.peers: dict[bytes, _Connection] = {}
        self.connections: set[_Connection] = set()
        # The counters libzmq's socket monitor gives for its ROUTER (broker.auth.HandshakeWatch): connections
        # accepted and closed, handshakes finished, and refused by reason (NULL has no authentication).
        # And, as the TCP doors count it, connections closed for the input budget.
        self.counters = dict.fromkeys(("accepted", "closed", "handshakes", "refused_auth", "refused_protocol",
                                       "refused_other", "over_budget"), 0)
        self.wake: Callable[[], None] = lambda: None  # the router's: schedule a turn
        self.writable: Callable[[], None] = lambda: None  # the router's: a full connection has room again
        self._server: asyncio.AbstractServer | None = None
        self._paused: set[_Connection] = set()
        self._next_identity = 0x6B8B4567  # libzmq starts its counter at a random value too

    def admits(self, client_key: bytes) -> bool:
        return self.admit is None or self.admit(z85.encode(client_key))

    @property
    def refused(self) -> dict[str, int]:
        return refused_by_reason(self.counters)

    @property
    def endpoint(self) -> str:
        host, port = self.listener.socket.getsockname()[:2]
        return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=self.listener.socket)

    # -------------------------------------------------------------------------------- what the router calls

    def readable(self) -> bool:
        return bool(self.ready)

    def receive(self) -> tuple[list[bytes], PeerMetadata]:
        """The oldest message of the next connection in turn, the sender's identity in front, and its
        connection's metadata. (A connection closed meanwhile still has its messages taken, in order.)"""
        ready = self.ready
        connection = ready[0]
        frames = connection.inbox.popleft()
        if not connection.inbox:
            ready.popleft()
            connection.queued = False
            self._run = 0
        elif self._run < RUN:
            self._run += 1
        else:
            ready.rotate(-1)
            self._run = 0
        self.waiting -= 1
        if self._paused and self.waiting <= self.recv_hwm // 2:
            for connection in self._paused:
                connection.resume()
            self._paused.clear()
        return frames, connection.metadata

    def send(self, identity: bytes, frames: Sequence[bytes | memoryview]) -> None:
        connection = self.peers.get(identity)
        if connection is None:
            raise zmq.ZMQError(errno.EHOSTUNREACH)
        if connection.full or (connection.unsent and connection.backlog() >= self.send_hwm):
            raise zmq.Again()
        connection.send(connection.writer.message(frames))

    # ------------------------------------------------------------------------------------- connections

    def attach(self, connection: _Connection, identity: bytes) -> None:
        if not identity:
            self._next_identity = (self._next_identity + 1) & 0xFFFFFFFF
            identity = _GENERATED.pack(0, self._next_identity)
        connection.identity = identity
        previous = self.peers.get(identity)
        if previous is not None and previous.transport is not None:
            previous.identity = b""  # handed over: its close must not take the identity with it
            previous.transport.close()
        self.peers[identity] = connection

    def detach(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        self._paused.discard(connection)
        if connection.identity and self.peers.get(connection.identity) is connection:
            del self.peers[connection.identity]

    def arrived(self, connection: _Connection, count: int) -> None:
        self.waiting += count
        if not connection.queued:
            connection.queued = True
            self.ready.append(connection)
        if self.waiting >= self.recv_hwm:
            connection.pause()
            self._paused.add(connection)
        self.wake()

    # ------------------------------------------------------------------------ the descriptor watch's door

    def pause(self) -> None:
        self.listener.hold()

    def shed(self) -> None:
        self.listener.hold()
        if self.connections:
            log.warning("mc0 door: closing its %d connections for want of descriptors: clients reconnect "
                        "once it takes connections again", len(self.connections))
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()

    def resume(self) -> None:
        self.listener.release()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        self.listener.close()
