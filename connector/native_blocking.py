"""The blocking client's native wire: a DEALER's side of ZMTP on one non-blocking TCP socket, driven by the
client's I/O thread with an OS ``poll``, instead of a libzmq socket and libzmq's own I/O thread.

:class:`BlockingNativeSocket` is :class:`connector.native.NativeSocket` for :class:`connector.Client`: the
same methods the client calls on a socket (``readable``, ``recv_frames``, ``send_frames``) and libzmq's DEALER
semantics where the client relies on them: a message sent before the handshake is over waits for it (at most
``SEND_HWM``); past that, or while more than ``SEND_BUFFER`` bytes wait for the kernel, a send raises
``zmq.Again`` and the client keeps the message; at most ``RECV_HWM`` received messages wait for the client,
past which the socket is not read; after a refused connect, a failed handshake or a lost connection it
connects again after ``reconnect`` seconds, doubling up to ``reconnect_max``; its connection events are
libzmq's socket monitor's (``zmq.EVENT_*``), for the client's :class:`connector.connection.ConnectionWatch`.
The handshake's bytes are :mod:`connector.zmtp_dealer`'s (NULL, or CURVE pinned to the broker's key).

Threads: the client's I/O thread owns it and calls it holding the client's I/O lock; a caller that sends at
once (``Client._send_now``) calls :meth:`BlockingNativeSocket.send_frames` under the same lock while the I/O
thread waits in ``poll``, so no two threads are ever inside it. A send the kernel did not take whole leaves
the rest in the socket's buffer, and the caller wakes the I/O thread (:meth:`needs_service`), which then
waits for room (``POLLOUT``).

Why: through libzmq every message crosses to libzmq's I/O thread and back on each side, a thread wake-up each
way; here a caller's publish is one ``sendmsg`` from the caller's thread and a delivery one ``recv`` on the
client's I/O thread (docs/benchmarks.md, "The clients without libzmq").
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections import deque
from collections.abc import Sequence
from itertools import islice
from select import POLLIN, POLLOUT

import zmq

from connector.keys import Credentials
from connector.native import MAX_FRAME, RECV_HWM, SEND_HWM, curve_keys
from connector.zmtp_dealer import HANDSHAKE_TIMEOUT, READ_SIZE, SEND_BUFFER, answer, codecs, failed_handshake
from protocol import ProtocolError, zmtp

#: The most read in one service of the socket (then the client handles what came, and the next poll says at
#: once that more is waiting); each read asks the kernel for up to READ_SIZE bytes.
READ_MAX = 4 << 20
#: Buffers one ``sendmsg`` takes at most.
IOV_MAX = min(os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024, 1024)

_Piece = bytes | memoryview


class BlockingNativeSocket:
    """One client connection's wire on a non-blocking TCP socket (see the module docstring). The I/O thread
    polls :meth:`fileno` for :meth:`interest` and at most :meth:`next_timer` seconds, then calls
    :meth:`service` and takes the connection's events from :attr:`events`."""

    def __init__(self, host: str, port: int, credentials: Credentials | None, *, reconnect: float,
                 reconnect_max: float, max_frame: int = MAX_FRAME) -> None:
        self.host = host
        self.port = port
        self.max_frame = max_frame
        self.reconnect = reconnect
        self.reconnect_max = reconnect_max
        #: Connection events not yet taken: ``(zmq.EVENT_*, value)``.
        self.events: list[tuple[int, int]] = []
        self._keys = curve_keys(credentials)
        self._delay = reconnect
        self._sock: socket.socket | None = None
        self._reader: zmtp.Reader | None = None
        self._writer: zmtp.Writer | None = None
        self._connecting = False  # connect() under way: the socket becomes writable when it is done
        self._ready = False  # the handshake is over
        self._retry_at: float | None = None  # when to connect again
        self._deadline: float | None = None  # when a handshake under way has taken too long
        self._out: deque[_Piece] = deque()  # written, not yet taken by the kernel
        self._out_bytes = 0
        self._waiting: deque[Sequence[_Piece]] = deque()  # sent before the handshake was over
        self._received: deque[list[bytes]] = deque()
        self._into = bytearray(READ_SIZE)  # read into (see READ_SIZE): recv() would allocate every time
        self._connect(time.monotonic())

    # The calls of connector.zsock, as methods (the client calls BlockingNativeSocket.readable(socket)).

    def readable(self) -> bool:
        return bool(self._received)

    def recv_frames(self) -> list[bytes]:
        """The oldest message received; ``zmq.Again`` if none waits."""
        if not self._received:
            raise zmq.Again()
        return self._received.popleft()

    def send_frames(self, frames: Sequence[_Piece]) -> None:
        """Send one message, or keep it until the handshake is over; ``zmq.Again`` when it can do neither."""
        if not self._ready:
            if len(self._waiting) >= SEND_HWM:
                raise zmq.Again()
            self._waiting.append(frames)
        elif self._waiting or self._out_bytes >= SEND_BUFFER:
            raise zmq.Again()  # the kernel is not taking what was written (or what waited has not all left)
        else:
            assert self._writer is not None
            self._write(self._writer.message(frames))

    # What the I/O thread asks.

    def fileno(self) -> int | None:
        """The TCP socket's descriptor; None while waiting to connect again."""
        return None if self._sock is None else self._sock.fileno()

    def interest(self) -> int:
        """What to poll the descriptor for: POLLOUT while connecting or while written bytes wait for room,
        POLLIN while fewer than ``RECV_HWM`` messages wait for the client."""
        if self._sock is None:
            return 0
        if self._connecting:
            return POLLOUT
        return (POLLIN if len(self._received) < RECV_HWM else 0) | (POLLOUT if self._out else 0)

    def needs_service(self) -> bool:
        """Whether the I/O thread has something to do for the socket now: bytes a send left for later, or
        events (a send found the connection lost)."""
        return bool(self._out) or bool(self.events)

    def next_timer(self, now: float) -> float | None:
        """Seconds until the socket has to be serviced without a poll event (a retry, a handshake's end)."""
        due = self._retry_at if self._retry_at is not None else self._deadline
        return None if due is None else max(0.0, due - now)

    def service(self, fd: int | None, revents: int, now: float) -> None:
        """Act on what ``poll`` reported for descriptor ``fd`` (0 or None: nothing) and on the timers."""
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            self._connect(now)
            return
        if self._deadline is not None and now >= self._deadline:
            self._deadline = None
            self.events.append((zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0))
            self._lost(now, reported=True)
            return
        sock = self._sock
        if not revents or sock is None or fd != sock.fileno():
            return  # about a socket closed since (a send found the connection lost)
        if self._connecting:
            self._connected(now)
            return
        if revents & ~POLLOUT and len(self._received) < RECV_HWM:  # POLLIN, or POLLHUP/POLLERR to learn why
            self._read(now)
        if self._sock is not None and self._out and revents & POLLOUT:
            self._flush()
        if self._ready:
            self._send_waiting()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._retry_at = self._deadline = None
        self._out.clear()
        self._waiting.clear()

    # The connection.

    def _connect(self, now: float) -> None:
        try:
            # IPv6 for an IPv6 address, IPv4 for anything else, as libzmq's client does (without ZMQ_IPV6):
            # a name whose first address is ::1 would otherwise be refused by a broker bound to IPv4 alone.
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            found = socket.getaddrinfo(self.host, self.port, family, socket.SOCK_STREAM)
            family, kind, proto, _, address = found[0]
            sock = socket.socket(family, kind, proto)
        except OSError:
            self._retry(now, connect_failed=True)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        status = sock.connect_ex(address)
        if status not in (0, errno.EINPROGRESS):
            sock.close()
            self._retry(now, connect_failed=True)
            return
        self._sock = sock
        self._connecting = True
        if status == 0:
            self._connected(now)

    def _connected(self, now: float) -> None:
        """The connect is over: start the handshake, or try again later."""
        assert self._sock is not None
        self._connecting = False
        if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._sock.close()
            self._sock = None
            self._retry(now, connect_failed=True)
            return
        self.events.append((zmq.EVENT_CONNECTED, 0))
        self._reader, self._writer = codecs(self._keys, self.max_frame)
        self._deadline = now + HANDSHAKE_TIMEOUT
        self._write([self._writer.greeting()])

    def _retry(self, now: float, *, connect_failed: bool = False) -> None:
        if connect_failed:
            self.events.append((zmq.EVENT_CONNECT_RETRIED, int(self._delay * 1000)))
        self._retry_at = now + self._delay
        self._delay = min(self._delay * 2, self.reconnect_max)

    def _lost(self, now: float, *, reported: bool = False) -> None:
        """The connection is gone (``reported``: its failure already said why): what was written on it is
        too; connect again."""
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        self._out.clear()
        self._out_bytes = 0
        self._deadline = None
        if self._ready:
            self._ready = False
            self.events.append((zmq.EVENT_DISCONNECTED, 0))
        elif not reported:
            # The broker hung up in the handshake (a CURVE server that could not open our HELLO does): what
            # libzmq reports as a failure without detail.
            self.events.append((zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0))
        self._retry(now)

    def _read(self, now: float) -> None:
        sock, reader, writer, received = self._sock, self._reader, self._writer, self._received
        assert sock is not None
        assert reader is not None
        assert writer is not None
        total = 0
        while total < READ_MAX and len(received) < RECV_HWM:
            try:
                size = sock.recv_into(self._into)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._lost(now)
                return
            if not size:
                self._lost(now)
                return
            total += size
            try:
                with memoryview(self._into) as view, view[:size] as data:
                    events = reader.feed(data)  # which copies what it keeps
            except ProtocolError as error:
                if not self._ready:
                    self.events.append(failed_handshake(error))
                self._lost(now, reported=True)
                return
            for event in events:
                if type(event) is list:
                    received.append(event)
                elif type(event) is zmtp.Ready:
                    self._ready = True
                    self._deadline = None
                    self._delay = self.reconnect
                    self._send_waiting()  # what waited goes first: the event may lead the client to send more
                    self.events.append((zmq.EVENT_HANDSHAKE_SUCCEEDED, 0))
                else:
                    self._write(answer(writer, event))
                if self._sock is None:
                    return  # lost while writing an answer
            if size < READ_SIZE:
                return  # the kernel had no more; poll says when it has

    def _send_waiting(self) -> None:
        waiting, writer = self._waiting, self._writer
        assert writer is not None
        while waiting and self._out_bytes < SEND_BUFFER and self._sock is not None:
            self._write(writer.message(waiting.popleft()))

    def _write(self, pieces: list[_Piece]) -> None:
        """Write ``pieces`` after what is buffered; what the kernel does not take now waits for POLLOUT."""
        if self._out:
            self._out.extend(pieces)
            self._out_bytes += sum(map(len, pieces))
            return
        assert self._sock is not None
        try:
            sent = self._sock.sendmsg(pieces if len(pieces) <= IOV_MAX else pieces[:IOV_MAX])
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._lost(time.monotonic())
            return
        total = sum(map(len, pieces))
        if sent < total:
            self._out.extend(pieces)
            self._out_bytes = total
            self._drop(sent)

    def _flush(self) -> None:
        assert self._sock is not None
        out = self._out
        while out:
            batch = list(islice(out, IOV_MAX))
            try:
                sent = self._sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._lost(time.monotonic())
                return
            whole = sent == sum(map(len, batch))
            self._drop(sent)
            if not whole:
                return

    def _drop(self, sent: int) -> None:
        """Forget the first ``sent`` bytes of the buffer: the kernel took them."""
        out = self._out
        self._out_bytes -= sent
        while out:  # empty pieces (an empty frame) at the front go too: sending them takes nothing
            size = len(out[0])
            if size > sent:
                if sent:
                    out[0] = memoryview(out[0])[sent:]
                return
            sent -= size
            out.popleft()
