"""What the small clients of the TCP dialects share: one blocking socket, reads with a deadline into a
sans-IO codec, and a graceful close.

A dialect client (:mod:`connector.sexp_client`, :mod:`connector.msgq_client`) subclasses
:class:`StreamClient` and only speaks its codec. Not thread-safe: one thread uses one client.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from connector.core import ConnectorError
from protocol import ProtocolError

E = TypeVar("E")

#: Bytes read per recv() call.
READ_SIZE = 256 << 10


class _Codec(Protocol):
    def receive_data(self, data: bytes) -> None: ...


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` deadline ``timeout`` seconds from now; None (wait forever) for None."""
    return None if timeout is None else time.monotonic() + timeout


class StreamClient:
    """One TCP connection to a broker gateway. ``timeout`` bounds connecting and each wait for a reply;
    receiving a delivery waits as long as its caller says."""

    #: Said after "the broker closed the connection" (or "connection lost", when the close came as a reset): a
    #: dialect without error messages explains what it means.
    closed_why = ""

    def __init__(self, host: str, port: int, timeout: float, *, tls: ssl.SSLContext | None = None,
                 server_hostname: str | None = None) -> None:
        self.timeout = timeout
        self.inbox: deque[Any] = deque()  # deliveries, filed by next_event()
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as error:
            raise ConnectorError(f"cannot connect to {host}:{port}: {error.strerror or error}") from None
        if tls is None:
            self.sock = sock
            return
        try:
            self.sock = tls.wrap_socket(sock, server_hostname=server_hostname or host)
        except (OSError, ssl.SSLError) as error:
            sock.close()
            raise ConnectorError(f"TLS with {host}:{port} failed: {error}") from None

    codec: Any  # the dialect's sans-IO client codec, set by the subclass

    def receive(self, timeout: float | None = None) -> Any:
        """The next delivery, or None after ``timeout`` seconds (None waits until one comes)."""
        deadline = deadline_after(timeout)
        while not self.inbox:
            if self.next_event(deadline) is None:
                return None
        return self.inbox.popleft()

    def send_event(self, event: Any) -> None:
        self.send_bytes(self.codec.send(event))

    def wait_for(self, kind: type[E], what: str) -> E:
        """The next event of type ``kind`` (others are filed or skipped by :meth:`next_event`), waiting at
        most the client's timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            event = self.next_event(deadline)
            if event is None:
                raise ConnectorError(f"no {what} from the broker within {self.timeout:g} s")
            if isinstance(event, kind):
                return event

    def next_event(self, deadline: float | None) -> Any:
        """The dialect's next event after the client has acted on it (filed a delivery, answered a ping),
        reading as needed until ``deadline``; None once it passed."""
        raise NotImplementedError

    def decoded(self, deadline: float | None) -> Any:
        """The codec's next event, reading from the socket as needed; None once ``deadline`` passed."""
        codec = self.codec
        while True:
            try:
                event = codec.next_event()
            except ProtocolError as error:
                raise ConnectorError(f"the broker broke the protocol: {error}") from None
            if event is not None:
                return event
            if not self.read_into(codec, deadline):
                return None

    def send_bytes(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as error:
            raise ConnectorError(f"connection lost: {error.strerror or error}{self.closed_why}") from None

    def read_into(self, codec: _Codec, deadline: float | None) -> bool:
        """Wait for bytes until ``deadline`` (a ``time.monotonic()`` value; None waits as long as it takes)
        and feed them to ``codec``; False if none came in time. The broker closing the connection raises
        ConnectorError."""
        if deadline is None:
            self.sock.settimeout(None)
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(READ_SIZE)
        except TimeoutError:
            return False
        except OSError as error:
            raise ConnectorError(f"connection lost: {error.strerror or error}{self.closed_why}") from None
        if not data:
            raise ConnectorError(f"the broker closed the connection{self.closed_why}")
        codec.receive_data(data)
        return True

    def close(self) -> None:
        """Close gracefully: say we are done sending, then wait (up to the timeout) for the broker to close.

        The broker closes only after reading everything before our end of stream, so whatever was sent has
        reached it. (Closing at once could reset the connection and lose the last messages.)"""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + self.timeout
            while (remaining := deadline - time.monotonic()) > 0:
                self.sock.settimeout(remaining)
                if not self.sock.recv(READ_SIZE):
                    break
        except OSError:
            pass  # already gone: nothing more to wait for
        finally:
            self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
