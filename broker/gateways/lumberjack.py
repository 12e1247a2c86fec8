"""The Lumberjack door (seed 004): windowed, acknowledged log shipping from Beats, logstash-forwarder and
logging libraries into the broker's topics.

A thin shell over :mod:`protocol.lumberjack`; ``docs/lumberjack.md`` states the rules. Each event becomes one
message: its fields as a JSON object body, on the configured default topic or on the topic named by one of its
fields. The ack accounting (:class:`protocol.lumberjack.AckWindow`) says when an ack is due; the shell holds
every due ack until the hub's next commit (:meth:`Connection.after_commit`), so **an ACK is sent only once
every event it covers is as durable as its topic's sync level promises**: on a cluster's leader, for a strong
topic, once a majority of the cluster holds it (docs/cluster.md), else the connection closes unacked. v2
writers waiting on a batch get ``2A 0`` keepalives from the gateway's tick, at most every 5 s; v1 writers
never do. Malformed input closes the connection (the dialect has no error frame); events taken before it stay
published, and nothing is acknowledged that was not stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from broker.engine import EngineError, Message
from broker.gateways.tcp import Connection, Gateway
from protocol import ProtocolError, lumberjack

DEFAULT_PORT = 5044


@dataclass(frozen=True, slots=True)
class LumberjackOptions:
    topic: bytes = b"logs"  # where events go
    topic_field: tuple[str, ...] = ()  # a field path ("fields.topic" → ("fields", "topic")) naming the topic
    max_window: int = 65_536
    max_frame: int = 16 << 20
    max_decompressed: int = 64 << 20
    keepalive_interval: float = 5.0


def field_path(text: str) -> tuple[str, ...]:
    """``"fields.topic"`` as a path into an event; ``""`` is no path."""
    return tuple(part for part in text.split(".") if part) if text else ()


class LumberjackConnection(Connection):
    """One log shipper."""

    #: Events taken, acks sent after their commit (keepalives not counted), keepalives sent.
    counters = ("events", "acks", "keepalives")

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway)
        self.options: LumberjackOptions = gateway.options
        options = self.options
        self.codec = lumberjack.ServerConnection(max_window=options.max_window, max_frame=options.max_frame,
                                                 max_decompressed=options.max_decompressed)
        self.window = lumberjack.AckWindow(keepalive_interval=options.keepalive_interval)
        self.held: list[lumberjack.Ack] = []  # due, waiting for the commit of what they cover
        self.publishing: set[bytes] = set()  # topics given events since the last commit
        # In a cluster: topic -> id of the last event published, as the held acks cover them, and until when
        # they may wait for a majority.
        self.last_ids: dict[bytes, int] = {}
        self.needs: dict[bytes, int] = {}
        self.replicated_by: float | None = None

    def handle(self, event: Any) -> None:
        now = self.hub.monotonic()
        if isinstance(event, lumberjack.Window):
            self.hold(self.window.window(event, now))
            return
        topic = self.topic_of(event.fields)
        try:
            message = self.publish_message(topic, _body(event), {})
        except EngineError as error:
            raise ProtocolError(f"event {event.seq} refused: {error}") from None
        if not self.publishing:
            self.after_commit()  # hear of this commit even with no ack due: it may fail to store the event
        self.publishing.add(topic)
        self.last_ids[topic] = message.id
        self.gateway.counters["events"] += 1
        self.hold(self.window.event(event, now))

    def names_topics(self, event: Any) -> tuple[bytes, ...]:
        if isinstance(event, lumberjack.Event):
            return (self.topic_of(event.fields),)
        return ()

    def event_size(self, event: Any) -> int:
        if isinstance(event, lumberjack.Event):
            return len(event.text) if event.text else sum(len(k) + len(v) for k, v in event.fields.items())
        return 0

    def hold(self, acks: list[lumberjack.Ack]) -> None:
        if acks:
            self.held.extend(acks)
            if self.gateway.replication is not None:
                self.needs = dict(self.last_ids)  # every event so far: what the acks cover
            self.after_commit()

    def committed(self, now: float) -> None:
        """Everything before the held acks is stored: they may go out now, in order. If the commit could not
        store a topic this connection published to, nothing is acked: the connection closes, and the writer
        sends the batch again."""
        publishing, self.publishing = self.publishing, set()
        failed = self.engine.failed
        why = next((failed[topic] for topic in publishing if topic in failed), None) if failed else None
        if why is not None:
            self.held = []
            self.close(f"events not stored: {why}")
            return
        if not self.held:
            return
        replication = self.gateway.replication
        if replication is not None:
            if self.replicated_by is None:
                self.replicated_by = now + replication.commit_timeout
            verdict = replication.confirm(self.needs, now, self.replicated_by)
            if verdict is False:
                self.gateway.replicating.add(self)  # asked again after every turn until a majority holds it
                return
            self.replicated_by = None
            if verdict is not True:
                self.held = []
                self.close(f"events not acknowledged: {verdict}")
                return
        held, self.held = self.held, []
        self.write(b"".join(self.codec.send(ack) for ack in held))
        self.gateway.counters["acks"] += len(held)

    def tick(self, now: float) -> None:
        if self.held:
            return  # an ack is about to go out with the next commit
        keepalive = self.window.keepalive(now)
        if keepalive is not None:
            self.write(self.codec.send(keepalive))
            self.gateway.counters["keepalives"] += 1

    def topic_of(self, fields: dict[str, Any]) -> bytes:
        value: Any = fields
        for part in self.options.topic_field:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return value.encode()
        return self.options.topic

    def encode_delivery(self, message: Message) -> bytes:
        raise AssertionError("a Lumberjack connection only writes; it subscribes to nothing")


def _body(event: lumberjack.Event) -> bytes:
    """The event as a JSON object: a J frame's own text, a D frame's string map encoded."""
    if event.text:
        return event.text.encode()
    return json.dumps(event.fields, ensure_ascii=False, separators=(",", ":")).encode()
