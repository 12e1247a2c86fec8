"""The mc0 port served by the broker's own ZMTP engine (``mc0_engine = "native"``, broker/zmtp_door.py):
libzmq DEALERs (raw and the connector's) talk to it as to libzmq's ROUTER, and peers that break ZMTP are
closed while the broker serves the others. Its CURVE is tested in test_curve.py, which runs every test
against both engines."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import zmq
from conftest import RawStream

from broker import server
from broker.auth import HandshakeWatch
from broker.config import BrokerConfig, ConfigError, check_engine, load
from broker.zmtp_door import ZmtpDoor
from connector import Client
from protocol import zmtp

pytestmark = pytest.mark.timeout(60)

PEER_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31)
# A DEALER's READY command, written out byte by byte (not with the codec under test).
DEALER_READY = b"\x04\x1c" + b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"


def address(endpoint: str) -> tuple[str, int]:
    parts = urlsplit(endpoint)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


@pytest.fixture
def native(start_broker):  # type: ignore[no-untyped-def]
    return start_broker(mc0_engine="native")


def works(endpoint: str) -> None:
    with Client(endpoint, curve=False, timeout=5) as client:
        assert client.publish("still.there", b"x", confirm=True)["DURABILITY"] == "memory"


def test_a_raw_dealer_is_answered_as_by_libzmq(native, dealer) -> None:  # type: ignore[no-untyped-def]
    peer = dealer(native.endpoint)
    reply = peer.connect()
    assert reply.verb == b"OK"
    peer.send(b"PUT", b"TOPIC", b"t", b"ID", b"7", b"", b"body")
    reply = peer.recv()
    assert (reply.verb, reply.header(b"ID")) == (b"OK", b"7")


def test_the_connector_publishes_subscribes_and_confirms(native) -> None:  # type: ignore[no-untyped-def]
    with Client(native.endpoint, curve=False, timeout=10) as publisher, \
            Client(native.endpoint, curve=False, timeout=10) as subscriber:
        subscriber.subscribe("t")
        assert publisher.publish("t", b"first", confirm=True)["MESSAGE-ID"] == "1"
        confirms = [publisher.publish_async("t", b"%d" % index) for index in range(2_000)]
        assert [int(confirm.result(10)["MESSAGE-ID"]) for confirm in confirms] == list(range(2, 2_002))
        bodies = [subscriber.receive(timeout=5).body for _ in range(2_001)]
        assert bodies == [b"first", *(b"%d" % index for index in range(2_000))]


def test_a_large_message_crosses_whole_both_ways(native) -> None:  # type: ignore[no-untyped-def]
    body = bytes(range(256)) * (4 << 10)  # 1 MiB: eight-octet frame sizes, many reads
    with Client(native.endpoint, curve=False, timeout=10) as client:
        client.subscribe("big")
        client.publish("big", body, confirm=True)
        assert client.receive(timeout=5).body == body


def test_an_identity_in_use_is_handed_over(native, dealer) -> None:  # type: ignore[no-untyped-def]
    first = dealer(native.endpoint, identity=b"agent-1", monitor=zmq.EVENT_DISCONNECTED)
    assert first.connect().verb == b"OK"
    second = dealer(native.endpoint, identity=b"agent-1")
    assert second.connect().verb == b"OK"
    event = first.next_event(timeout=5)  # the broker closed the first connection when the second took over
    assert event is not None
    assert event["event"] == zmq.EVENT_DISCONNECTED
    second.send(b"PING", b"ID", b"1")
    assert second.recv().header(b"ID") == b"1"


def test_bytes_that_are_not_zmtp_close_that_connection_only(native) -> None:  # type: ignore[no-untyped-def]
    stream = RawStream(address(native.endpoint))
    stream.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert stream.closed_within(5)
    stream.close()
    works(native.endpoint)
    # Counted as libzmq's socket monitor counts them (what /metrics shows for the mc0 door).
    counters = native.handshakes.counters
    assert counters["refused_protocol"] == 1
    assert counters["handshakes"] == 1
    assert counters["accepted"] == 2
    assert native.handshakes.refused == {"auth": 0, "protocol": 1, "other": 0}


def test_a_connection_that_never_shakes_hands_is_closed(start_broker) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(mc0_engine="native", handshake_timeout=0.5)
    stream = RawStream(address(broker.endpoint))
    started = time.monotonic()
    assert stream.closed_within(5)
    assert 0.4 < time.monotonic() - started < 4
    stream.close()
    assert broker.handshakes.refused["other"] == 1


def test_a_frame_over_max_message_size_closes_the_connection(start_broker) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(mc0_engine="native", max_message_size=1_000)
    stream = RawStream(address(broker.endpoint))
    stream.sock.sendall(PEER_GREETING + DEALER_READY + b"\x02" + struct.pack(">Q", 5_000))
    assert stream.closed_within(5)
    stream.close()
    works(broker.endpoint)


def test_unfinished_input_counts_toward_the_doors_input_budget(start_broker) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(mc0_engine="native", input_budget=100_000)
    stream = RawStream(address(broker.endpoint))
    # A frame of 1 MB announced (under max_message_size) and 150 KB of it sent: more than the budget holds.
    announced = b"\x02" + struct.pack(">Q", 1_000_000)
    stream.sock.sendall(PEER_GREETING + DEALER_READY + announced + bytes(150_000))
    assert stream.closed_within(5)
    stream.close()
    assert broker.handshakes.counters["over_budget"] == 1
    works(broker.endpoint)


def test_a_curve_client_is_refused_in_its_handshake(native, dealer) -> None:  # type: ignore[no-untyped-def]
    public, secret = zmq.curve_keypair()
    server_public, _ = zmq.curve_keypair()
    peer = dealer(native.endpoint, server_key=server_public, public_key=public, secret_key=secret,
                  monitor=zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_DISCONNECTED)
    peer.send(b"CONNECT")
    event = peer.next_event(timeout=5)  # libzmq reports the refused handshake
    assert event is not None
    assert event["event"] in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_DISCONNECTED)
    assert peer.poll(0.3) is None
    works(native.endpoint)


def test_a_full_inbox_pauses_reading_without_losing_a_message(start_broker, dealer) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(mc0_engine="native", recv_hwm=10)
    peer = dealer(broker.endpoint)
    peer.connect()
    for index in range(3_000):
        peer.send(b"PUT", b"TOPIC", b"flood", b"ID", b"%d" % index, b"", b"%d" % index)
    ids = [int(peer.recv().header(b"ID")) for _ in range(3_000)]
    assert ids == list(range(3_000))


def test_a_socket_type_a_router_cannot_talk_to_is_closed(native) -> None:  # type: ignore[no-untyped-def]
    with socket.create_connection(address(native.endpoint), timeout=5) as sock:
        ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
        sock.sendall(PEER_GREETING + bytes((4, len(ready))) + ready)
        received = b""
        while True:
            data = sock.recv(4096)
            if not data:
                break
            received += data
    # Our greeting (and READY, if the peer's came in two reads), then the close: no ERROR, as libzmq's
    # server (see ZmtpDoor's refuse).
    assert received in (zmtp.GREETING, zmtp.GREETING + zmtp.READY_ROUTER)
    assert native.handshakes.refused["protocol"] == 1


def test_native_needs_tcp(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TCP only"):
        check_engine(BrokerConfig(mc0_engine="native", curve=False, bind="ipc:///tmp/mc0.sock"))
    check_engine(BrokerConfig(mc0_engine="native", curve=False))
    check_engine(BrokerConfig(mc0_engine="native", curve=True))
    path = tmp_path / "mc0.toml"
    path.write_text('[broker]\nmc0_engine = "libzmq"\n')
    with pytest.raises(ConfigError, match="mc0_engine: 'libzmq' is not one of auto, native, zeromq"):
        load(path)


def test_auto_serves_with_the_native_engine_where_it_can(  # type: ignore[no-untyped-def]
    start_broker, monkeypatch, tmp_path: Path
) -> None:
    assert isinstance(start_broker(mc0_engine="auto").handshakes, ZmtpDoor)
    # An address only libzmq resolves (no listening socket of the broker's own): libzmq's ROUTER serves it.
    monkeypatch.setattr(server, "open_listener", lambda endpoint, backlog: None)
    fallback = start_broker(mc0_engine="auto")
    assert isinstance(fallback.handshakes, HandshakeWatch)
    works(fallback.endpoint)
    config = BrokerConfig(bind="tcp://127.0.0.1:*", curve=False, mc0_engine="native", data_dir=tmp_path / "d",
                          sexp="off", msgq="off", rstreams="off", lumberjack="off", http="off")
    with pytest.raises(ConfigError, match=r"cannot listen on tcp://127\.0\.0\.1:\* itself"):
        asyncio.run(server.serve(config))


class HeldTransport:
    """A transport that takes everything written (into ``written``) and reports its buffer as the test says:
    as full as uvloop's is when it calls ``pause_writing``."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.buffered = 0

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.written += piece

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def close(self) -> None:
        pass

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_a_full_connection_is_written_as_soon_as_it_has_room(tmp_path: Path) -> None:
    """A delivery that met a full transport leaves when the transport says it has room again (its
    ``resume_writing``), not when the hub's retry timer, backed off to 100 ms by then, comes back."""
    from broker.zmtp_door import _Connection
    from connector.core import WANTED_EXTENSIONS
    from protocol import mc0

    def wire(event: mc0.Event) -> bytes:
        return b"".join(bytes(piece) for piece in zmtp.message(mc0.encode(event)))

    async def scenario() -> None:
        config = BrokerConfig(bind="tcp://127.0.0.1:0", curve=False, mc0_engine="native", data_dir=tmp_path,
                              sexp="off", msgq="off", rstreams="off", lumberjack="off", http="off")
        started: asyncio.Future[server.Broker] = asyncio.get_running_loop().create_future()
        serving = asyncio.ensure_future(server.serve(config, started.set_result))
        broker = await started
        door = broker.router.wire
        assert isinstance(door, ZmtpDoor)
        subscriber, publisher = _Connection(door), _Connection(door)
        hello = zmtp.greeting(b"NULL", as_server=False) + zmtp.command(b"READY", zmtp.DEALER_METADATA)
        for connection in (subscriber, publisher):
            connection.connection_made(HeldTransport())  # type: ignore[arg-type]
            connection.data_received(hello)
            connection.data_received(wire(mc0.Connect(mc0.PROTOCOL_VERSION, None, b"c", WANTED_EXTENSIONS)))
        subscriber.data_received(wire(mc0.Sub([b"held"], b"s")))
        await asyncio.sleep(0.05)
        received = subscriber.transport.written  # type: ignore[union-attr]
        subscriber.transport.buffered = 32 << 20  # type: ignore[union-attr]
        subscriber.pause_writing()  # as uvloop does past the high-water mark
        before = len(received)
        publisher.data_received(wire(mc0.Put(b"held", b"the one message")))
        await asyncio.sleep(0.4)  # retried on the timer all along: 1 ms, doubling to 100 ms
        assert len(received) == before
        assert broker.hub.retry >= 0.05
        subscriber.transport.buffered = 0  # type: ignore[union-attr]
        subscriber.resume_writing()
        for _ in range(5):  # a few loop iterations, far less than the retry timer's 50-100 ms
            await asyncio.sleep(0)
        assert b"the one message" in received[before:]
        broker.stop_event.set()
        await asyncio.wait_for(serving, 10)

    asyncio.run(scenario())
