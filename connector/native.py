"""The asyncio client's native wire: its DEALER speaks ZMTP on the caller's own loop
(:mod:`connector.zmtp_dealer`) instead of through libzmq, in the shape of the libzmq socket the client drives
otherwise.

:class:`NativeSocket` offers what :class:`connector.AsyncClient` asks of a socket, as methods with the same
calls as :mod:`connector.zsock`'s functions (``NativeSocket.readable(socket)`` where the client would call
``readable(socket)``), and keeps libzmq's DEALER semantics where the client relies on them:

* a message sent before the connection's handshake is over waits for it (libzmq queues it in the session's
  pipe, ``ZMQ_IMMEDIATE`` off), at most ``SEND_HWM`` of them; one sent on a connection that is then lost is
  gone, as it is under libzmq (the client's CONNECT after a reconnect asks again for what it needs);
* past ``SEND_HWM`` waiting, or while the connection's transport is full, a send raises ``zmq.Again`` and the
  client keeps the message and tries again (``writable`` says when the transport has room);
* messages received wait in a queue of at most ``RECV_HWM``; past it the connection stops being read (the
  kernel's buffers, then the broker, hold the rest), and it is read again once half of them are taken;
* the connection's events reach the client's watch as libzmq's socket monitor reports them
  (:class:`connector.connection.ConnectionWatch`), so a broker that cannot be reached is diagnosed the same.

Why: every message through libzmq crosses to its I/O thread and back. With the asyncio client on both ends,
the one-way latency of a paced message through the broker was about the C proxy's with raw libzmq clients,
where it was 1.5-1.7 times it through libzmq (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import zmq
from zmq.utils import z85

from connector import addresses
from connector.core import ConnectorError
from connector.keys import Credentials
from connector.zmtp_dealer import Events, ZmtpDealer

#: Messages sent before the handshake that wait for it, and messages received that wait for the client: the
#: high-water marks the client's libzmq socket has (connector.base.make_socket).
SEND_HWM = 100_000
RECV_HWM = 100_000
#: The largest frame taken from the broker (its ``max_message_size`` is 16 MiB by default; a FETCH reply
#: holds at most 16 MiB of messages, or one larger message): a connection announcing more is closed.
MAX_FRAME = 256 << 20


#: What a client's ``wire`` may be, and what it is unless given: ``auto`` speaks ZMTP itself to a ``tcp://``
#: broker and goes through libzmq for any other endpoint, ``native`` refuses other endpoints, ``zeromq``
#: always goes through libzmq.
WIRES = ("auto", "native", "zeromq")
DEFAULT_WIRE = "auto"


def check_wire(wire: str | None) -> str:
    """``wire`` as a client keeps it (None: the default); ValueError for anything else."""
    wire = DEFAULT_WIRE if wire is None else wire
    if wire not in WIRES:
        raise ValueError(f"wire must be one of {', '.join(WIRES)}, not {wire!r}")
    return wire


def wire_address(wire: str, endpoint: str) -> tuple[str, int] | None:
    """Where a client on ``wire`` connects to ``endpoint`` natively (host and port), or None to go through
    libzmq; ConnectorError when ``wire`` is ``native`` and ``endpoint`` is not ``tcp://HOST:PORT``."""
    address = native_address(endpoint) if wire != "zeromq" else None
    if address is None and wire == "native":
        raise ConnectorError(f"wire 'native' cannot connect to {endpoint}: it takes tcp://HOST:PORT only; "
                             "use wire 'auto' or 'zeromq' for other endpoints")
    return address


def native_address(endpoint: str) -> tuple[str, int] | None:
    """Where the native wire connects for ``endpoint``: its host and port when it is ``tcp://HOST:PORT``;
    None for what only libzmq reads (``ipc://``, an interface to connect from)."""
    if not endpoint.startswith("tcp://"):
        return None
    try:
        host, port = addresses.host_port(endpoint, what="broker")
    except addresses.AddressError:
        return None
    return None if ";" in host else (host, port)


def curve_keys(credentials: Credentials | None) -> tuple[bytes, bytes, bytes] | None:
    """The broker's public key, ours and our secret key as the native wire's CURVE takes them (raw bytes);
    None for NULL."""
    if credentials is None:
        return None
    return (z85.decode(credentials.server_public), z85.decode(credentials.public),
            z85.decode(credentials.secret))


class NativeSocket:
    """One client connection's wire (see the module docstring). ``arrived`` is called after each read that
    brought messages, ``events`` with each connection event, ``writable`` when a full transport has room."""

    def __init__(
        self, host: str, port: int, credentials: Credentials | None, *, arrived: Callable[[], None],
        events: Events, writable: Callable[[], None], reconnect: float, reconnect_max: float,
    ) -> None:
        self._received: deque[list[bytes]] = deque()
        self._waiting: deque[Sequence[bytes | memoryview]] = deque()  # sent before the handshake was over
        self.dealer = ZmtpDealer(host, port, received=self._received.append, ready=self._ready,
                                 lost=lambda: None, curve_keys=curve_keys(credentials), max_frame=MAX_FRAME,
                                 writable=self._writable, after_read=self._after_read, events=events,
                                 reconnect=reconnect, reconnect_max=reconnect_max)
        self._arrived = arrived
        self._room = writable
        self.dealer.start()

    # The calls of connector.zsock, as methods: the client calls NativeSocket.readable(socket) and so on.

    def readable(self) -> bool:
        return bool(self._received)

    def recv_frames(self) -> list[bytes]:
        """The oldest message received; ``zmq.Again`` if none waits."""
        received = self._received
        if not received:
            raise zmq.Again()
        if self.dealer.paused and len(received) <= RECV_HWM // 2:
            self.dealer.resume_reading()
        return received.popleft()

    def send_frames(self, frames: Sequence[bytes | memoryview]) -> None:
        """Send one message, or keep it until the handshake is over; ``zmq.Again`` when it can do neither."""
        dealer = self.dealer
        if dealer.connection is None:
            if len(self._waiting) >= SEND_HWM:
                raise zmq.Again()
            self._waiting.append(frames)
        elif self._waiting or not dealer.send(frames):
            raise zmq.Again()  # the transport is full (or what waited has not all left yet)

    def close(self) -> None:
        self.dealer.close()
        self._waiting.clear()

    def _ready(self) -> None:
        waiting = self._waiting
        while waiting and self.dealer.send(waiting[0]):
            waiting.popleft()

    def _writable(self) -> None:
        self._ready()  # what waited for the handshake first, if the transport filled before it all left
        self._room()

    def _after_read(self) -> None:
        if len(self._received) >= RECV_HWM:
            self.dealer.pause_reading()
        self._arrived()
