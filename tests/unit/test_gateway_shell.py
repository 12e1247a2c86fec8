"""The TCP shell's connection rules with a stand-in transport: a peer's ProtocolError closes that peer and
is counted; our own failure (a store error while handling input) is not the peer's fault and stops the
broker through the hub; a full transport stops deliveries and reading until it drains, then wakes the
subscriber.
"""

from __future__ import annotations

from typing import Any

from broker.engine import Engine, Message
from broker.gateways.tcp import Connection, Gateway
from broker.hub import Hub
from broker.store import StoreError
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
