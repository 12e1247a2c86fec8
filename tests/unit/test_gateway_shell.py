"""The TCP shell's connection rules with a stand-in transport: a peer's ProtocolError closes that peer and
is counted; our own failure (a store error while handling input) is not the peer's fault and stops the
broker through the hub; a full transport stops deliveries and reading until it drains, then wakes the
subscriber.
"""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from broker import engine as engine_module
from broker.engine import CREATES_PER_TURN, Engine, Message
from broker.gateways.tcp import Connection, Gateway
from broker.hub import Hub
from broker.store import StoreError
from broker.store.files import FileStore
from broker.topics import Persistence, TopicRule, TopicRules, TopicSpec
from protocol import ProtocolError


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True
        self.closed = self.aborted = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


class Echo(Connection):
    """Publishes each chunk to topic t; b"bad" is a protocol error, b"disk" a store failure."""

    def received(self, data: bytes) -> None:
        if data == b"bad":
            raise ProtocolError("bad input")
        if data == b"disk":
            raise StoreError("disk gone")
        self.engine.publish(b"t", data, {}, 0)

    def encode_delivery(self, message: Message) -> bytes:
        return message.body


def connection() -> tuple[Echo, Transport, Hub, Gateway]:
    hub = Hub(Engine())
    gateway = Gateway("echo", hub, Echo, host="127.0.0.1", port=0, tick=1.0)
    echo = Echo(gateway)
    transport = Transport()
    echo.connection_made(transport)  # type: ignore[arg-type]
    return echo, transport, hub, gateway


def test_a_protocol_error_closes_the_peer_and_is_counted() -> None:
    echo, transport, hub, gateway = connection()
    echo.data_received(b"bad")
    assert transport.closed
    assert gateway.counters["errors"] == 1
    assert hub.failure is None, "the peer's mistake is not the broker's failure"


def test_our_own_failure_stops_the_broker_through_the_hub() -> None:
    echo, transport, hub, _ = connection()
    echo.data_received(b"disk")
    assert isinstance(hub.failure, StoreError)
    assert transport.aborted


def test_a_full_transport_pauses_deliveries_and_reading_until_it_drains() -> None:
    echo, transport, hub, gateway = connection()
    hub.engine.subscribe(echo.subscriber, b"t")
    echo.pause_writing()
    assert not transport.reading
    assert gateway.counters["paused"] == 1
    echo.data_received(b"one")
    hub.flush(0.0)
    assert transport.written == []
    assert [message.body for message in echo.subscriber.pending] == [b"one"]
    echo.resume_writing()
    assert transport.reading
    hub.flush(0.0)
    assert transport.written == [b"one"]
    echo.connection_lost(None)
    assert gateway.connections == set()
    assert hub.engine.topics[b"t"].subscriptions == []


class Prepared:
    """A codec handing out prepared events: topic names to publish to."""

    def __init__(self, topics: list[bytes]) -> None:
        self.topics = deque(topics)

    def receive_data(self, data: bytes) -> None: ...

    def next_event(self) -> bytes | None:
        return self.topics.popleft() if self.topics else None


class Publisher(Echo):
    def handle(self, event: Any) -> None:
        self.engine.publish(event, b"x", {}, 0)


class Loop:
    def __init__(self) -> None:
        self.soon: list[Any] = []

    def call_soon(self, callback: Any, *arguments: Any) -> None:
        self.soon.append((callback, arguments))


def test_a_slice_ends_after_a_few_new_persistent_topics(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new persistent topic costs fsyncs: a connection whose events name hundreds (a Lumberjack window
    routed by a field) lets the loop go round after CREATES_PER_TURN of them, not after SLICE_EVENTS."""
    monkeypatch.setattr(engine_module, "CREATE_SECONDS_PER_TURN", 60.0)  # counted here, not timed
    rules = TopicRules([TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT))])
    engine = Engine(rules, FileStore(tmp_path))
    hub = Hub(engine)
    loop = Loop()
    hub.loop = loop  # type: ignore[assignment]
    gateway = Gateway("publisher", hub, Publisher, host="127.0.0.1", port=0, tick=1.0)
    publisher = Publisher(gateway)
    publisher.connection_made(Transport())  # type: ignore[arg-type]
    new = [b"log.%d" % n for n in range(3 * CREATES_PER_TURN)]
    events = [*new[:CREATES_PER_TURN], *[b"log.0"] * 20, *new[CREATES_PER_TURN:]]
    publisher.codec = Prepared(events)  # type: ignore[assignment]
    try:
        made = []
        publisher._drain()
        made.append(len(engine.topics))
        while loop.soon:
            callback, arguments = loop.soon.pop(0)
            callback(*arguments)
            if arguments == (publisher._drain,):  # the connection going on with its events
                made.append(len(engine.topics))
        assert made == [CREATES_PER_TURN, 2 * CREATES_PER_TURN, 3 * CREATES_PER_TURN, 3 * CREATES_PER_TURN]
        assert engine.topics[b"log.0"].next_id == 22  # every event handled, in order
    finally:
        engine.close()


class Silent:
    """A connection that has sent nothing since it opened, long ago."""

    closing = heard = False
    opened = 0.0
    why: str | None = None

    def close(self, why: str) -> None:
        self.why = why

    def tick(self, now: float) -> None: ...


def test_a_tick_that_comes_late_judges_nobody_silent() -> None:
    """The loop held up longer than a tick has not read what peers sent meanwhile: that tick closes nobody
    for silence; the next one, on time, does."""
    clock = [100.0]
    hub = Hub(Engine(), monotonic=lambda: clock[0])
    gateway = Gateway("echo", hub, Echo, host="127.0.0.1", port=0, tick=0.01)
    silent = Silent()
    gateway.connections.add(silent)  # type: ignore[arg-type]

    async def run() -> list[str | None]:
        ticking = asyncio.create_task(gateway.run())
        await asyncio.sleep(0)  # its first tick is due a tick from now
        seen = []
        clock[0] += 5.0  # held up: the first tick comes seconds late
        await asyncio.sleep(0.015)
        seen.append(silent.why)
        clock[0] += 0.01  # on time
        await asyncio.sleep(0.01)
        seen.append(silent.why)
        ticking.cancel()
        return seen

    late, on_time = asyncio.run(run())
    assert late is None
    assert "nothing received" in (on_time or "")
