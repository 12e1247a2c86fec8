"""A DEALER's side of ZMTP on the loop's TCP transports, without libzmq: what a broker's link to another
broker of its cluster (:mod:`broker.cluster.link`) and the asyncio client's native wire
(:mod:`connector.native`) send through.

It owns one connection to one TCP address at a time and keeps one, as a libzmq DEALER does: after a refused
connect, a handshake that fails or a lost connection it tries again after ``reconnect`` seconds, doubling up
to ``reconnect_max``. It speaks NULL, or CURVE as a client pinned to the server's key
(:mod:`protocol.curvezmq`), and answers the other side's PINGs. It reports what libzmq's socket monitor
would (``events``: connected, connect retried, handshake succeeded or failed and why, disconnected), so a
caller can diagnose a broker it cannot reach the same way under either. What it does not do for its caller:

* queue: :meth:`ZmtpDealer.send` says False while no connection has finished its handshake, or while the
  connection's transport is full (past its high-water mark, as uvloop's ``pause_writing`` says); the caller
  keeps what it wanted to send and is told by ``ready`` and ``writable`` when to try again;
* stay silent about a lost connection: ``lost`` is called, since nothing sent on it will be answered (a libzmq
  DEALER says nothing, and its caller waits out its timeouts).

Why not libzmq: through a libzmq socket every message crosses to libzmq's I/O thread and back (two thread
hand-offs and a dozen system calls each way); here it is one write and one read on the caller's own loop.

Bounded: a frame over ``max_frame`` bytes closes the connection from its head, before its bytes arrive, and
every message goes to ``received`` from the read that completed it (nothing is queued here); a caller that
cannot keep up stops the reading with :meth:`ZmtpDealer.pause_reading`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence

import zmq

from protocol import ProtocolError, curvezmq, zmtp

#: Seconds before the first attempt to connect again, and the most it doubles to (libzmq's DEALER in the
#: cluster's links used 20 ms and 200 ms).
RECONNECT = 0.02
RECONNECT_MAX = 0.2
#: Seconds a connection has to finish its handshake (libzmq's default, ZMQ_HANDSHAKE_IVL).
HANDSHAKE_TIMEOUT = 30.0
#: Bytes a connection's transport may hold unsent before it counts as full (a send says False).
SEND_BUFFER = 16 << 20
#: Bytes a connection takes from the kernel per read, into one buffer of its own: asyncio's loop otherwise
#: allocates 256 KiB for every read, past malloc's threshold for mapping fresh pages, and shrinks it to what
#: came (a small read 13.9 us that way, 2.2 into a buffer, measured in a socketpair loop).
READ_SIZE = 256 << 10

#: What :attr:`ZmtpDealer.events` gets: a libzmq monitor event (``zmq.EVENT_*``) and its value.
Events = Callable[[int, int], None]


def failed_handshake(error: ProtocolError) -> tuple[int, int]:
    """The monitor event libzmq reports for a handshake that fails this way."""
    if isinstance(error, zmtp.HandshakeRefused) and error.reason.isdigit():
        return zmq.EVENT_HANDSHAKE_FAILED_AUTH, int(error.reason)  # a ZAP status: our key was refused
    if isinstance(error, zmtp.MechanismMismatch):
        return zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    return zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0


def codecs(curve_keys: tuple[bytes, bytes, bytes] | None, max_frame: int) -> tuple[zmtp.Reader, zmtp.Writer]:
    """The reader and writer of one DEALER connection: NULL, or CURVE as a client pinned to the server's key
    (``curve_keys``: the server's public key, ours and our secret key)."""
    curve = None
    if curve_keys is not None:
        server_key, public, secret = curve_keys
        curve = curvezmq.CurveClient(server_key, public, secret, os.urandom, zmtp.DEALER_METADATA)
    reader = zmtp.Reader(max_frame, curve=curve, socket_type=b"DEALER")
    return reader, zmtp.Writer(curve, socket_type=b"DEALER")


def answer(writer: zmtp.Writer, event: object) -> list[bytes | memoryview]:
    """What a DEALER writes back for one of its reader's events other than a message and READY: the next step
    of the handshake, or a PONG."""
    if type(event) is zmtp.Ping:
        return writer.pong(event.context)
    if type(event) is zmtp.Reply:
        return [event.data]  # CURVE: our INITIATE
    if event == b"greeting":
        # NULL: both READYs cross; CURVE: HELLO, and the metadata travels in the INITIATE.
        return [writer.ready() if writer.curve is None else writer.hello()]
    return []


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection's handshake and messages, reported to its :class:`ZmtpDealer`."""

    def __init__(self, dealer: ZmtpDealer) -> None:
        self.dealer = dealer
        self.reader, self.writer = codecs(dealer.curve_keys, dealer.max_frame)
        self.transport: asyncio.Transport | None = None
        self._into = bytearray(READ_SIZE)
        self.ready = False
        self.full = False  # the transport asked us to stop writing
        self.refused = False  # closed for a broken handshake (already reported)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] - uvloop's transports do not subclass asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(high=SEND_BUFFER)
        self.transport.write(self.writer.greeting())
        if self.dealer.paused:
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.dealer._lost(self)

    def pause_writing(self) -> None:
        self.full = True

    def resume_writing(self) -> None:
        self.full = False
        self.dealer.writable()

    def get_buffer(self, sizehint: int) -> bytearray:
        return self._into

    def buffer_updated(self, nbytes: int) -> None:
        with memoryview(self._into) as view, view[:nbytes] as data:
            self.data_received(data)

    def data_received(self, data: bytes | memoryview) -> None:
        """What came, through the reader (which copies what it keeps)."""
        try:
            events = self.reader.feed(data)
        except ProtocolError as error:
            self.dealer._refused(self, error)
            return
        transport = self.transport
        if transport is None:
            return
        dealer = self.dealer
        got = False
        for event in events:
            if type(event) is list:
                dealer.received(event)
                got = True
            elif type(event) is zmtp.Ready:
                self.ready = True
                self.dealer._ready(self)
            else:
                transport.writelines(answer(self.writer, event))
            if self.transport is None:
                return  # closed by what an event led to (the caller closed the dealer)
        if got:
            dealer.after_read()

    def send(self, frames: Sequence[bytes | memoryview]) -> None:
        if self.transport is not None:
            self.transport.writelines(self.writer.message(frames))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None  # nothing more is written or read from it (connection_lost comes later)


class ZmtpDealer:
    """One DEALER connection to ``host``:``port``, kept up until :meth:`close`.

    ``received`` gets every message (its frames), and ``after_read`` is called once the messages of one read
    are all out; ``ready`` is called when a connection has finished its handshake (send what waited); ``lost``
    when a connection that finished it is gone (what was sent on it will not be answered); ``writable`` when a
    full connection has room again. ``curve_keys``: the server's
    public key, ours and our secret key (32 bytes each) for CURVE, None for NULL. ``log``: where failures to
    connect are logged (once, until a connection succeeds), None not to log them (``events`` reports
    them)."""

    def __init__(
        self, host: str, port: int, *, received: Callable[[list[bytes]], None], ready: Callable[[], None],
        lost: Callable[[], None], curve_keys: tuple[bytes, bytes, bytes] | None, max_frame: int,
        writable: Callable[[], None] = lambda: None, after_read: Callable[[], None] = lambda: None,
        events: Events | None = None,
        log: logging.Logger | None = None, reconnect: float = RECONNECT, reconnect_max: float = RECONNECT_MAX,
    ) -> None:
        self.host = host
        self.port = port
        self.received = received
        self.on_ready = ready
        self.on_lost = lost
        self.writable = writable
        self.after_read = after_read
        self.events = events
        self.log = log
        self.curve_keys = curve_keys
        self.max_frame = max_frame
        self.reconnect = reconnect
        self.reconnect_max = reconnect_max
        self.connection: _Connection | None = None  # the one that finished its handshake, if any
        self.closed = False
        self.paused = False  # reading stopped by the caller
        self._pending: _Connection | None = None  # connected, its handshake under way
        self._attempt: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._delay = reconnect
        self._complained = False  # a failure is logged once, until a connection succeeds again

    def start(self) -> None:
        """Start connecting (on the running loop)."""
        if not self.closed and self._attempt is None and self._retry is None:
            self._attempt = asyncio.get_running_loop().create_task(self._connect())

    def send(self, frames: Sequence[bytes | memoryview]) -> bool:
        """Send one message on the connection; False (nothing sent) while there is none or it is full."""
        connection = self.connection
        if connection is None or connection.full:
            return False
        connection.send(frames)
        return True

    def pause_reading(self) -> None:
        """Stop reading (the caller's queue is full): the kernel's buffers, then the sender, hold the rest."""
        if not self.paused:
            self.paused = True
            for connection in (self.connection, self._pending):
                if connection is not None and connection.transport is not None:
                    connection.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            for connection in (self.connection, self._pending):
                if connection is not None and connection.transport is not None:
                    connection.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        for handle in (self._retry, self._deadline, self._attempt):
            if handle is not None:
                handle.cancel()
        self._retry = self._deadline = self._attempt = None
        for connection in (self.connection, self._pending):
            if connection is not None:
                connection.close()
        self.connection = self._pending = None

    def _event(self, kind: int, value: int = 0) -> None:
        if self.events is not None:
            self.events(kind, value)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        connection = _Connection(self)
        try:
            await loop.create_connection(lambda: connection, self.host, self.port)
        except OSError as error:
            self._attempt = None
            self._event(zmq.EVENT_CONNECT_RETRIED, int(self._delay * 1000))
            self._failed(f"cannot connect to {self.host}:{self.port}: {error.strerror or error}")
            return
        finally:
            self._attempt = None
        if self.closed:
            connection.close()
            return
        if connection.transport is None or connection.ready:
            return  # lost already (and the next attempt scheduled), or the handshake is over
        self._pending = connection
        self._event(zmq.EVENT_CONNECTED)
        self._deadline = loop.call_later(HANDSHAKE_TIMEOUT, self._too_slow, connection)

    def _ready(self, connection: _Connection) -> None:
        if self.closed:
            connection.close()
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._pending = None
        self.connection = connection
        self._delay = self.reconnect
        if self._complained:
            self._complained = False
            if self.log is not None:
                self.log.info("connected to %s:%d again", self.host, self.port)
        self.on_ready()  # what waited goes first: the event may lead the caller to send more
        self._event(zmq.EVENT_HANDSHAKE_SUCCEEDED)

    def _lost(self, connection: _Connection) -> None:
        if self._pending is connection:
            self._pending = None
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if not connection.refused:
                # The other side hung up in the handshake (a CURVE server that could not open our HELLO
                # does): what libzmq reports as a failure without detail.
                self._event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        if self.connection is connection:
            self.connection = None
            self._event(zmq.EVENT_DISCONNECTED)
            self.on_lost()
        if not self.closed:
            self._again()

    def _refused(self, connection: _Connection, error: ProtocolError) -> None:
        connection.refused = True
        if not connection.ready:
            self._event(*failed_handshake(error))
        self._complain(logging.WARNING, f"{self.host}:{self.port} broke ZMTP: {error}")
        connection.close()  # connection_lost follows, and the next attempt with it

    def _too_slow(self, connection: _Connection) -> None:
        self._deadline = None
        connection.refused = True
        self._event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self._complain(logging.WARNING, f"{self.host}:{self.port} did not finish the ZMTP handshake within "
                                        f"{HANDSHAKE_TIMEOUT:g} s")
        connection.close()

    def _failed(self, reason: str) -> None:
        self._complain(logging.INFO, reason)
        self._again()

    def _complain(self, level: int, reason: str) -> None:
        if not self._complained:
            self._complained = True
            if self.log is not None:
                self.log.log(level, "%s; trying again", reason)

    def _again(self) -> None:
        if (self.closed or self._retry is not None or self._attempt is not None or self._pending is not None
                or self.connection is not None):
            return
        loop = asyncio.get_running_loop()
        self._retry = loop.call_later(self._delay, self._retry_now)
        self._delay = min(self._delay * 2, self.reconnect_max)

    def _retry_now(self) -> None:
        self._retry = None
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self.start()
