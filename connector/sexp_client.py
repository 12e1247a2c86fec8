"""A small blocking client for the sexp door, so the dialect can be tried without writing one.

    from connector.sexp_client import SexpClient
    with SexpClient("127.0.0.1", 61617) as client:
        client.subscribe("orders", replay="beginning")
        client.publish("orders", b"hello")
        print(client.receive(timeout=1))

It speaks :mod:`protocol.sexp` over one TCP socket: the version handshake and ``Connect`` on open,
``Subscribe``/``Unsubscribe`` waiting for the broker's ``Subscribed``/``Unsubscribed`` (or its Error),
``Publish`` (our extension; fire-and-forget, as the dialect has no publish acknowledgement), and every Ping
answered with an ``Ack`` while the caller waits in :meth:`SexpClient.receive`. Not thread-safe: one thread
uses one client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from connector.core import ConnectorError
from connector.stream import StreamClient
from protocol import sexp

DEFAULT_PORT = 61617


@dataclass(frozen=True, slots=True)
class SexpMessage:
    """A delivery: the engine's message id, the topic (its name, from the Subscribed that announced its id),
    and the body."""

    topic: bytes
    topic_id: int
    id: int
    body: bytes


def _encode(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


class SexpClient(StreamClient):
    """One connection to a broker's sexp gateway."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, client_id: str | bytes = "mc0",
                 timeout: float = 5.0, version: int = sexp.VERSION_ONE) -> None:
        super().__init__(host, port, timeout)
        self.codec = sexp.ClientConnection()
        self.topics: dict[int, bytes] = {}  # topic id -> name, from Subscribed frames
        self.pings = 0  # Pings answered
        try:
            self.send_event(sexp.Version(version))
            reply = self.wait_for(sexp.VersionReply, "version reply")
            if reply.number == sexp.REFUSED:
                raise ConnectorError(f"the broker does not speak version {version}")
            self.send_event(sexp.Connect(version, _encode(client_id)))
        except BaseException:
            self.sock.close()
            raise

    # ------------------------------------------------------------------------------------------ the commands

    def subscribe(self, topic: str | bytes, replay: str | int = sexp.REPLAY_CURRENT) -> int:
        """Subscribe from ``replay`` ("beginning", "current" or a message id); returns the topic's id."""
        name = _encode(topic)
        self.send_event(sexp.Subscribe(name, replay))
        return self._wait_topic(sexp.Subscribed, name).topic_id

    def unsubscribe(self, topic: str | bytes) -> None:
        name = _encode(topic)
        self.send_event(sexp.Unsubscribe(name))
        self._wait_topic(sexp.Unsubscribed, name)

    def publish(self, topic: str | bytes, body: str | bytes) -> None:
        self.send_event(sexp.Publish(_encode(topic), _encode(body)))

    def receive(self, timeout: float | None = None) -> SexpMessage | None:
        """The next delivery, or None after ``timeout`` seconds (None waits until one comes).

        An Error frame from the broker (a refused Publish, say) raises ConnectorError."""
        return super().receive(timeout)

    def _wait_topic(self, kind: type, name: bytes) -> sexp.Subscribed:
        """The Subscribed/Unsubscribed for ``name``; an Error first means the broker refused."""
        deadline = time.monotonic() + self.timeout
        while True:
            event = self.next_event(deadline, errors=False)
            if event is None:
                raise ConnectorError(f"no answer from the broker within {self.timeout:g} s")
            if isinstance(event, sexp.Error):
                raise ConnectorError(event.text)
            if isinstance(event, kind) and event.topic == name:  # type: ignore[attr-defined]
                return event  # type: ignore[return-value]

    def next_event(self, deadline: float | None, *, errors: bool = True) -> object | None:
        """The next event that is not a delivery or a Ping (those are filed and answered here); None at the
        deadline. An Error raises ConnectorError unless ``errors`` is False."""
        while True:
            event = self.decoded(deadline)
            if event is None:
                return None
            match event:
                case sexp.Message(message_id, topic_id, body):
                    self.inbox.append(SexpMessage(self.topics.get(topic_id, b""), topic_id, message_id, body))
                    return event
                case sexp.Ping(time=seconds):
                    self.pings += 1
                    self.send_event(sexp.Ack(seconds))
                case sexp.Subscribed(topic_id, topic):
                    self.topics[topic_id] = topic
                    return event
                case sexp.Error(text) if errors:
                    raise ConnectorError(text)
                case _:
                    return event
