"""A small blocking client for the reactive-streams door, with demand control, so the dialect can be tried
without writing one.

    from connector.rstreams_client import RStreamsClient
    with RStreamsClient("127.0.0.1", 61618) as client:
        stream = client.subscribe("orders", demand=10, replay="beginning")   # at most 10 until request()
        element = client.receive(timeout=1)            # Element(stream, topic, data, id)
        client.request(stream, 10)
        client.offer("orders")                         # publish: the broker subscribes to us...
        client.publish("orders", b"hello")             # ...and each element waits for its demand

It speaks :mod:`protocol.rstreams`: the hellos (asking for our ``publish`` extension), ``subscribe`` answered
by ``onSubscribe`` or ``onError``, ``request``/``cancel``, elements (parts joined), and the publisher side of
an ``offer``: it never sends more elements than the broker requested. Not thread-safe.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from connector.core import ConnectorError
from connector.stream import StreamClient
from protocol import rstreams

DEFAULT_PORT = 61618


@dataclass(frozen=True, slots=True)
class Element:
    """One element of a stream: ``id`` is the message id when the stream asked for ids (``ids=True``)."""

    stream: int
    topic: bytes
    data: bytes
    id: int | None = None


@dataclass(slots=True)
class _Publisher:
    subscription: int  # the broker's subscriber id for our offered publisher
    demand: rstreams.Demand
    cancelled: bool = False


def _publisher_string(topic: str, replay: str | int | None, ids: bool) -> str:
    options = ([f"replay={replay}"] if replay is not None else []) + (["ids=1"] if ids else [])
    # A topic holding "?" needs the separator even without options (the broker reads from the last "?").
    return topic + ("?" + "&".join(options) if options or "?" in topic else "")


class RStreamsClient(StreamClient):
    """One connection to a broker's reactive-streams gateway."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, timeout: float = 5.0,
                 max_message: int = 16 << 20) -> None:
        super().__init__(host, port, timeout)
        self.codec = rstreams.Connection(client=True, max_message=max_message)
        self.stream_ids = itertools.count(1)
        self.streams: dict[int, tuple[bytes, bool]] = {}  # open streams: id -> (topic, ids)
        self.errors: dict[int, str] = {}  # onError received, by stream id
        self.publishers: dict[bytes, _Publisher] = {}  # offered publishers the broker subscribed to
        self.reassembler = rstreams.Reassembler(max_element=max_message)
        try:
            self.send_event(rstreams.ClientHello(rstreams.VERSION, (rstreams.EXT_PUBLISH,)))
            hello = self.wait_for(rstreams.ServerHello, "server hello")
            if hello.version != rstreams.VERSION:
                raise ConnectorError(f"the broker speaks version {hello.version}, not {rstreams.VERSION}")
        except BaseException:
            self.sock.close()
            raise

    # ---------------------------------------------------------------------------------------- subscribing

    def subscribe(self, topic: str, *, demand: int = 0, replay: str | int | None = None,
                  ids: bool = False) -> int:
        """Open a stream on ``topic`` with ``demand`` elements allowed (``rstreams.UNBOUNDED`` for no limit);
        returns its id. ``replay`` (beginning, current or a message id) needs a persistent topic; ``ids``
        prefixes each element with its message id (given as ``Element.id``)."""
        stream = next(self.stream_ids)
        self.streams[stream] = (topic.encode(), ids)
        self.send_event(rstreams.Subscribe(_publisher_string(topic, replay, ids), stream, demand))
        deadline = time.monotonic() + self.timeout
        while True:
            if stream in self.errors:  # refused: next_event() already closed the stream
                raise ConnectorError(self.errors.pop(stream))
            event = self.next_event(deadline)
            if event is None:
                raise ConnectorError(f"no answer to subscribe from the broker within {self.timeout:g} s")
            if isinstance(event, rstreams.OnSubscribe) and event.subscriber == stream:
                return stream

    def request(self, stream: int, demand: int) -> None:
        self.send_event(rstreams.Request(stream, demand))

    def cancel(self, stream: int) -> None:
        self.streams.pop(stream, None)
        self.send_event(rstreams.Cancel(stream))

    def receive(self, timeout: float | None = None) -> Element | None:
        """The next element of any stream, or None after ``timeout`` seconds (None waits until one comes)."""
        return super().receive(timeout)

    # ----------------------------------------------------------------------------------------- publishing

    def offer(self, topic: str) -> None:
        """Offer a publisher for ``topic`` and wait until the broker has subscribed to it."""
        self.send_event(rstreams.Offer(topic))
        name = topic.encode()
        deadline = time.monotonic() + self.timeout
        while name not in self.publishers:
            if self.next_event(deadline) is None:
                raise ConnectorError(f"the broker did not subscribe to {topic!r} within {self.timeout:g} s")

    def publish(self, topic: str, element: bytes, timeout: float | None = None) -> None:
        """Send one element as soon as the broker's demand allows it (waiting up to ``timeout`` seconds, or
        the client's timeout): backpressure from the broker reaches the caller here."""
        publisher = self.publishers.get(topic.encode())
        if publisher is None:
            raise ConnectorError(f"no publisher offered for {topic!r}: call offer() first")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while publisher.demand.outstanding == 0:
            if publisher.cancelled:
                raise ConnectorError(f"the broker cancelled the publisher of {topic!r}")
            if self.next_event(deadline) is None:
                raise ConnectorError(f"no demand from the broker for {topic!r} within the timeout")
        publisher.demand.take(1)
        self.send_event(rstreams.OnNext(publisher.subscription, element))

    def demand(self, topic: str) -> int:
        """What the broker currently allows the offered publisher of ``topic`` to send."""
        return self.publishers[topic.encode()].demand.outstanding

    # ------------------------------------------------------------------------------------------- the wire

    def close(self) -> None:
        """Say goodbye (closing every stream), then close once the broker has answered or gone."""
        try:
            if not self.codec.closed:
                self.send_event(rstreams.Goodbye("client closing"))
        except ConnectorError:
            pass
        super().close()

    def next_event(self, deadline: float | None) -> object | None:
        """The next event; elements are filed in the inbox and the broker's subscriptions and requests to our
        publishers are recorded. None once the deadline passed."""
        while True:
            event = self.decoded(deadline)
            if event is None:
                return None
            match event:
                case rstreams.OnNext(stream, data):
                    self._file(stream, data)
                case rstreams.OnNextPacked(stream, elements):
                    for data in elements:
                        self._file(stream, data)
                case rstreams.OnNextPart(stream, element, data):
                    self.reassembler.part(stream, element, data)
                case rstreams.OnNextLastPart(stream, element, data):
                    self._file(stream, self.reassembler.last(stream, element, data))
                case rstreams.OnError(stream, error):
                    self.errors[stream] = error
                    self.streams.pop(stream, None)
                case rstreams.OnComplete(stream):
                    self.streams.pop(stream, None)
                case rstreams.Subscribe(publisher, subscription, initial):
                    # The broker subscribes to a publisher we offered.
                    self.publishers[publisher.encode()] = _Publisher(subscription, rstreams.Demand(initial))
                    self.send_event(rstreams.OnSubscribe(subscription, 0))
                case rstreams.Request(subscription, demand):
                    for publisher in self.publishers.values():
                        if publisher.subscription == subscription:
                            publisher.demand.add(demand)
                case rstreams.Cancel(subscription):
                    for publisher in self.publishers.values():
                        if publisher.subscription == subscription:
                            publisher.cancelled = True
                case rstreams.Goodbye(reason):
                    raise ConnectorError(f"the broker said goodbye: {reason}")
            return event

    def _file(self, stream: int, data: bytes) -> None:
        topic, ids = self.streams.get(stream, (b"", False))
        if ids:
            self.inbox.append(Element(stream, topic, data[8:], int.from_bytes(data[:8], "big")))
        else:
            self.inbox.append(Element(stream, topic, data))
