"""The sexp door (seed 000): the version handshake, s-expression commands, binary server frames.

A thin shell over :mod:`protocol.sexp`. Its rules, as ``docs/sexp.md`` states them:

* the handshake answers version 1 with 1 and anything else with -1, then closes;
* ``Connect`` comes first: anything else before it gets an Error frame (the connection stays);
* a bad line, an unknown constructor or a refused request gets an Error frame, and the connection stays;
* ``Subscribe`` maps the replay mode onto the engine's replay (a replay the topic cannot honour, such as
  ``From_beginning`` on a transient topic, is an Error frame) and is answered with ``Subscribed`` carrying the
  topic's stable id; ``Unsubscribe`` is answered with ``Unsubscribed``;
* ``(Publish topic body)``, our extension, publishes into the engine like an mc0 PUT;
* every client is pinged every ``ping_interval`` seconds (50 by default, as the seed requires), and a client
  from which nothing at all has arrived for two ping intervals is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.engine import EngineError, Message
from broker.gateways.tcp import Connection, Gateway
from protocol import sexp

#: The seed: "the server is expected to ping the client at least once every 50 seconds".
DEFAULT_PING_INTERVAL = 50.0
#: A client is dropped when nothing has arrived from it for this many ping intervals (our choice: it has
#: missed answering two pings).
SILENT_INTERVALS = 2
#: u32 epoch seconds on the wire.
PING_TIME_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SexpOptions:
    ping_interval: float = DEFAULT_PING_INTERVAL
    max_line: int = 4 << 20  # bytes in one client line (a Publish body is escaped, so it needs room)


class SexpConnection(Connection):
    """One sexp client."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway)
        self.options: SexpOptions = gateway.options
        self.codec = sexp.ServerConnection(max_line=self.options.max_line)
        self.client_id: bytes | None = None
        self.next_ping = self.last_heard + self.options.ping_interval

    def handle(self, event: object) -> None:
        codec = self.codec
        match event:
            case sexp.Version(number):
                if number == sexp.VERSION_ONE:
                    self.write(codec.send(sexp.VersionReply(number)))
                else:
                    self.write(codec.send(sexp.VersionReply(sexp.REFUSED)))
                    self.close(f"unsupported version {number}")
            case sexp.Invalid(reason):
                self.error(reason)
            case sexp.Connect(version, client_id):
                if self.client_id is not None:
                    self.error("already connected")
                elif version != sexp.VERSION_ONE:
                    self.error(f"Connect names version {version}; this connection speaks version 1")
                else:
                    self.client_id = client_id
            case _ if self.client_id is None:
                self.error("Connect must come first")
            case sexp.Subscribe(topic, replay):
                try:
                    subscribed = self.engine.subscribe(self.subscriber, topic, replay=replay)
                except EngineError as error:
                    self.error(str(error))
                    return
                self.write(codec.send(sexp.Subscribed(subscribed.topic_id, topic)))
            case sexp.Unsubscribe(topic):
                subscription = self.subscriber.topics.get(topic)
                if subscription is None:
                    self.error(f"not subscribed to {topic.decode('utf-8', 'replace')!r}")
                    return
                self.engine.unsubscribe(self.subscriber, topic)
                self.write(codec.send(sexp.Unsubscribed(subscription.topic.topic_id, topic)))
            case sexp.Publish(topic, body):
                try:
                    self.publish_message(topic, body, {})
                except EngineError as error:
                    self.error(str(error))
            case sexp.Ack():
                pass  # the answer to a Ping: that something arrived is all the liveness rule needs

    def names_topics(self, event: object) -> tuple[bytes, ...]:
        if self.client_id is not None and isinstance(event, sexp.Publish | sexp.Subscribe):
            return (event.topic,)
        return ()

    def event_size(self, event: object) -> int:
        if isinstance(event, sexp.Publish):
            return len(event.topic) + len(event.body)
        return 0  # the rest are a few words each (a subscription, a version, an error's reason)

    def refuse(self, why: str) -> None:
        """An Error frame saying why, then the connection closes."""
        if self.codec.state == "open":
            self.write(self.codec.send(sexp.Error(f"closing: {why}")))
        self.close(why)

    def error(self, text: str) -> None:
        self.gateway.counters["errors"] += 1
        self.write(self.codec.send(sexp.Error(text)))

    def encode_delivery(self, message: Message) -> bytes:
        # The trusted fast path: engine ids are u64, topic ids u32, and bodies far below 4 GiB.
        return sexp.message_frame(message.id, self.engine.topics[message.topic].topic_id, message.body)

    def tick(self, now: float) -> None:
        interval = self.options.ping_interval
        if now - self.last_heard > SILENT_INTERVALS * interval:
            self.gateway.counters["expired"] += 1
            self.close(f"nothing received for {SILENT_INTERVALS} ping intervals ({interval:g} s each)")
        elif now >= self.next_ping and self.codec.state == "open":
            self.write(self.codec.send(sexp.Ping((self.hub.wall_ms() // 1000) & PING_TIME_MASK)))
            self.next_ping = now + interval
