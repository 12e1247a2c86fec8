"""The reactive-streams door (seed 001): demand-driven subscriptions, and publishing by offering a publisher.

A thin shell over :mod:`protocol.rstreams`; ``docs/rstreams.md`` states the rules. In short:

* **Subscribing.** A client's ``subscribe(publisher, id, initialDemand)`` names a topic
  (``TOPIC[?replay=beginning|current|ID][&ids=1]``). Each stream is an engine subscriber of its own, whose
  outlet is a :class:`Stream`: the hub hands it deliveries, and it writes at most as many as the stream's
  outstanding demand, as ``onNext`` (or ``onNextPart``… ``onNextLastPart`` above ``part_size``). What demand
  does not allow waits: on a persistent topic in the log (the stream reads on from there when demand comes),
  on a transient topic in a bounded buffer of ``buffer`` messages whose overflow is dropped and counted. On a
  round-robin topic demand is the engine's credit, so a queue hands a consumer only what it asked for.
* **Publishing** (our extension ``EXT_PUBLISH``, negotiated in the hellos): the client sends
  ``offer(TOPIC)``; the broker subscribes to it and requests ``publish_window`` elements. Each element it
  receives is published to the topic; more demand is requested only after the hub's commit has made the
  received elements as durable as the topic promises, so a producer can never run ahead of the store.
* **Errors.** A refused subscription (unknown replay, replay on a transient topic, ``request(0)``) ends that
  stream with ``onError``; the connection stays. A protocol error, or more elements than requested from an
  offered publisher, is answered with ``goodbye`` and the connection closes. A client's ``goodbye`` is
  answered with ``goodbye`` and closes everything.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from urllib.parse import parse_qsl

from broker.engine import REPLAY_BEGINNING, REPLAY_CURRENT, EngineError, Message, Subscriber
from broker.gateways.tcp import Connection, Gateway
from protocol import ProtocolError, rstreams

log = logging.getLogger("mc0.gateway")

DEFAULT_PORT = 61618


@dataclass(frozen=True, slots=True)
class RStreamsOptions:
    max_message: int = 16 << 20  # the largest protocol message accepted (one onNext, one part)
    part_size: int = 64 << 10  # elements larger than this go out split into parts
    buffer: int = 10_000  # messages a transient stream holds beyond its demand before dropping
    publish_window: int = 1024  # demand the broker keeps open towards an offered publisher


class Stream:
    """One subscription of a client: an engine subscriber of its own, and the hub's outlet for it."""

    polled = False  # the connection wakes it: on more demand, or when its transport drains

    def __init__(self, connection: RStreamsConnection, stream_id: int, topic: bytes, ids: bool,
                 demand: rstreams.Demand, buffer: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.topic = topic
        self.ids = ids  # each element is prefixed with its u64 message id
        self.demand = demand
        self.subscriber = Subscriber(self, buffer)
        self.queue = False  # a round-robin topic: demand is the engine's credit
        self.element_size = 0  # a fixed-size topic's elements (with the id prefix, if asked): sent packed
        self.open = True

    @property
    def attached(self) -> bool:
        return self.open and not self.connection.closing

    @property
    def who(self) -> tuple[str, str]:
        """The door and the peer's stream, as the monitoring names a subscriber."""
        door, peer = self.connection.who
        return door, f"{peer} stream {self.id}"

    def deliver(self, messages: list[Message], now: float) -> int:
        return self.connection.deliver_stream(self, messages)


@dataclass(slots=True)
class Offered:
    """A publisher the client offered: the broker is its subscriber."""

    topic: bytes
    granted: int  # demand requested and not yet used up by the publisher
    received: int = 0  # elements received since the last request for more


def parse_publisher(publisher: str) -> tuple[bytes, str | int | None, bool]:
    """``TOPIC[?replay=beginning|current|ID][&ids=1]`` as (topic, replay, ids); ValueError when malformed.

    The query starts at the last ``?``: a topic whose name holds a ``?`` is written with a trailing one."""
    name, mark, query = publisher.rpartition("?")
    if not mark:
        name, query = publisher, ""
    replay: str | int | None = None
    ids = False
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key == "replay":
            if value in (REPLAY_BEGINNING, REPLAY_CURRENT):
                replay = value
            elif value.isdigit():
                replay = int(value)
            else:
                raise ValueError(f"replay must be beginning, current or a message id, not {value!r}")
        elif key == "ids":
            if value not in ("0", "1"):
                raise ValueError(f"ids must be 0 or 1, not {value!r}")
            ids = value == "1"
        else:
            raise ValueError(f"unknown publisher option {key!r} (known: replay, ids)")
    if not name:
        raise ValueError("the publisher names no topic")
    return name.encode(), replay, ids


class RStreamsConnection(Connection):
    """One reactive-streams client."""

    counters = ("streams", "elements_out", "offers", "elements_in")

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway)
        self.options: RStreamsOptions = gateway.options
        self.codec = rstreams.Connection(client=False, max_message=self.options.max_message)
        self.streams: dict[int, Stream] = {}  # by the client's subscriber id
        self.offered: dict[int, Offered] = {}  # by the broker's subscriber id
        self.offer_ids = itertools.count(1)
        self.element_ids = itertools.count(1)  # ids of elements the broker splits into parts
        self.reassembler = rstreams.Reassembler(max_element=self.options.max_message)
        self.said_goodbye = False

    def connection_made(self, transport: object) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        # The loose handshake: the server does not wait for the client's hello.
        self.write(self.codec.send(rstreams.ServerHello(rstreams.VERSION, (rstreams.EXT_PUBLISH,))))

    def subscribers(self) -> list[Subscriber]:
        return [stream.subscriber for stream in self.streams.values()]

    def input_held(self) -> int:
        return super().input_held() + self.reassembler.held

    def close(self, why: str) -> None:
        """Every close says goodbye first (the draft's orderly close); a protocol error says which."""
        if not self.closing and not self.said_goodbye:
            self.said_goodbye = True
            self.write(self.codec.send(rstreams.Goodbye(why)))
        super().close(why)

    # ------------------------------------------------------------------------------------------- the client

    def handle(self, event: object) -> None:
        match event:
            case rstreams.ClientHello(version, _):
                if version != rstreams.VERSION:
                    self.close(f"unsupported version {version}: this broker speaks {rstreams.VERSION}")
            case rstreams.Goodbye(reason):
                log.info("rstreams client %s says goodbye: %s", self.peer, reason)
                self.close("goodbye")
            case rstreams.Subscribe(publisher, stream_id, initial):
                self.subscribe(publisher, stream_id, initial)
            case rstreams.Request(stream_id, demand):
                self.request(stream_id, demand)
            case rstreams.Cancel(stream_id):
                self.end(stream_id)
            case rstreams.Offer(publisher):
                self.offer(publisher)
            case rstreams.OnSubscribe():
                pass  # the offered publisher took our subscription; its element size is the codec's business
            case rstreams.OnNext(offer_id, element):
                self.take_elements(offer_id, [element])
            case rstreams.OnNextPacked(offer_id, elements):
                self.take_elements(offer_id, list(elements))
            case rstreams.OnNextPart(offer_id, element_id, data):
                self.owned(offer_id)
                self.reassembler.part(offer_id, element_id, data)
            case rstreams.OnNextLastPart(offer_id, element_id, data):
                self.owned(offer_id)
                self.take_elements(offer_id, [self.reassembler.last(offer_id, element_id, data)])
            case rstreams.OnComplete(offer_id) | rstreams.OnError(offer_id, _):
                self.owned(offer_id)
                del self.offered[offer_id]
                self.reassembler.drop(offer_id)
            case _:
                raise ProtocolError(f"a client does not send {type(event).__name__}")

    def names_topics(self, event: object) -> tuple[bytes, ...]:
        if isinstance(event, rstreams.OnNext | rstreams.OnNextPacked | rstreams.OnNextLastPart):
            offered = self.offered.get(event.subscriber)  # the broker's subscription: the offer's id
            return (offered.topic,) if offered is not None else ()
        if isinstance(event, rstreams.Subscribe):
            try:
                return (parse_publisher(event.publisher)[0],)
            except ValueError:
                return ()
        return ()

    def event_size(self, event: object) -> int:
        if isinstance(event, rstreams.OnNext):
            return len(event.element)
        if isinstance(event, rstreams.OnNextPacked):
            return sum(map(len, event.elements))
        if isinstance(event, rstreams.OnNextPart | rstreams.OnNextLastPart):
            return len(event.data)
        return 0

    def subscribe(self, publisher: str, stream_id: int, initial: int) -> None:
        if stream_id in self.streams:
            raise ProtocolError(f"subscriber id {stream_id} is in use")
        try:
            topic, replay, ids = parse_publisher(publisher)
        except ValueError as error:
            self.write(self.codec.send(rstreams.OnError(stream_id, str(error))))
            return
        demand = rstreams.Demand(initial)
        stream = Stream(self, stream_id, topic, ids, demand, self.options.buffer)
        engine = self.engine
        try:
            engine.check_subscribe(topic, replay)
            queue = engine.topic(topic).round_robin
            # A queue hands a consumer only what it asked for: its demand is the engine's credit.
            credit = None if not queue or demand.unbounded else demand.outstanding
            engine.subscribe(stream.subscriber, topic, replay=replay, credit=credit)
        except EngineError as error:
            self.write(self.codec.send(rstreams.OnError(stream_id, str(error))))
            return
        stream.queue = queue
        fixed = engine.topics[topic].element_size
        stream.element_size = fixed + 8 * ids if fixed else 0
        self.streams[stream_id] = stream
        self.gateway.counters["streams"] += 1
        self.write(self.codec.send(rstreams.OnSubscribe(stream_id, stream.element_size)))

    def request(self, stream_id: int, demand: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a request racing the stream's end is a no-op (RS rule 3.6)
        try:
            stream.demand.add(demand)
        except ValueError as error:  # request(0): RS rule 3.9, answered with onError
            self.end(stream_id, str(error))
            return
        if stream.queue:
            self.engine.set_credit(stream.subscriber, stream.topic, self._credit(stream))
        self.hub.wake(stream.subscriber)

    def end(self, stream_id: int, error: str | None = None) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        stream.open = False
        self.engine.detach(stream.subscriber)  # a queue's messages it held go to the others
        if error is not None:
            self.write(self.codec.send(rstreams.OnError(stream_id, error)))

    @staticmethod
    def _credit(stream: Stream) -> int | None:
        return None if stream.demand.unbounded else stream.demand.outstanding

    # ---------------------------------------------------------------------------------- offered publishers

    def offer(self, publisher: str) -> None:
        offer_id = next(self.offer_ids)
        window = self.options.publish_window
        self.offered[offer_id] = Offered(publisher.encode(), window)
        self.gateway.counters["offers"] += 1
        self.write(self.codec.send(rstreams.Subscribe(publisher, offer_id, window)))

    def owned(self, offer_id: int) -> Offered:
        offered = self.offered.get(offer_id)
        if offered is None:
            raise ProtocolError(f"no subscription {offer_id} of the broker's is open on this connection")
        return offered

    def take_elements(self, offer_id: int, elements: list[bytes]) -> None:
        offered = self.owned(offer_id)
        if len(elements) > offered.granted:
            raise ProtocolError(f"{len(elements)} elements on subscription {offer_id} with demand "
                                f"{offered.granted}: more than requested")
        offered.granted -= len(elements)
        offered.received += len(elements)
        wall = self.hub.wall_ms()
        try:
            for element in elements:
                self.publish_message(offered.topic, element, {}, wall)
        except EngineError as error:
            self.write(self.codec.send(rstreams.Cancel(offer_id)))
            del self.offered[offer_id]
            log.info("rstreams client %s: publishing to %r refused: %s", self.peer, offered.topic, error)
            return
        self.gateway.counters["elements_in"] += len(elements)
        self.after_commit()

    def committed(self, now: float) -> None:
        """What the offered publishers sent is stored: open the same demand again, once every byte the client
        sent so far has been read (input read over several turns must not meet demand granted between them).
        A publisher whose topic the commit could not store is cancelled, as a refused one is."""
        failed = self.engine.failed
        for offer_id, offered in list(self.offered.items()):
            if offered.received and offered.topic in failed:
                self.write(self.codec.send(rstreams.Cancel(offer_id)))
                del self.offered[offer_id]
                log.info("rstreams client %s: publishing to %r refused: not stored: %s", self.peer,
                         offered.topic, failed[offered.topic])
        if self.draining:
            self.after_commit()  # the rest of the input first; demand after the commit that follows it
            return
        for offer_id, offered in self.offered.items():
            if offered.received:
                self.write(self.codec.send(rstreams.Request(offer_id, offered.received)))
                offered.granted += offered.received
                offered.received = 0

    # ------------------------------------------------------------------------------------------ deliveries

    def deliver_stream(self, stream: Stream, messages: list[Message]) -> int:
        if not self.writable or self.closing or not stream.open:
            return 0
        count = min(len(messages), stream.demand.outstanding)
        if count == 0:
            return 0
        elements = [message.id.to_bytes(8, "big") + message.body if stream.ids else message.body
                    for message in messages[:count]]
        out = self._packed(stream, elements) if stream.element_size else self._variable(stream, elements)
        self.write(b"".join(out))
        self.gateway.counters["messages_out"] += count
        stream.demand.take(count)
        if stream.queue:
            # Written ones used their demand up; the hub counts them out of the engine's in-flight next.
            self.engine.set_credit(stream.subscriber, stream.topic, self._credit(stream))
        self.gateway.counters["elements_out"] += count
        return count

    def _packed(self, stream: Stream, elements: list[bytes]) -> list[bytes]:
        """A fixed-size stream's elements, as many per onNextPacked as the size limit allows."""
        per_message = max(1, (self.options.max_message - 32) // stream.element_size)
        out = []
        for start in range(0, len(elements), per_message):
            chunk = elements[start : start + per_message]
            out.append(self.codec.send(rstreams.OnNext(stream.id, chunk[0]) if len(chunk) == 1
                                       else rstreams.OnNextPacked(stream.id, tuple(chunk))))
        return out

    def _variable(self, stream: Stream, elements: list[bytes]) -> list[bytes]:
        """Variable-size elements: onNext each, or parts above ``part_size``."""
        codec = self.codec
        part_size = self.options.part_size
        out = []
        for element in elements:
            if len(element) <= part_size:
                out.append(codec.send(rstreams.OnNext(stream.id, element)))
                continue
            element_id = next(self.element_ids)
            parts = rstreams.split(element, part_size)
            out.extend(codec.send(rstreams.OnNextPart(stream.id, element_id, part)) for part in parts[:-1])
            out.append(codec.send(rstreams.OnNextLastPart(stream.id, element_id, parts[-1])))
        return out

    def encode_delivery(self, message: Message) -> bytes:
        raise AssertionError("streams deliver through their own outlets")
