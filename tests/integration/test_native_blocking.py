"""The blocking client's native wire (connector/native_blocking.py) against libzmq's own ROUTER: the handshake
with NULL and CURVE, messages both ways, what waits for the handshake, a peer that stops reading, a received
queue that stops the reading, and the connection events libzmq's monitor would report; then the Client on it:
its wire chosen and checked, and a subscriber that does not take its deliveries."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from conftest import free_endpoint, receive_all

from broker.server import Broker
from connector import Client, ConnectorError, native_blocking
from connector.keys import Credentials
from connector.native_blocking import BlockingNativeSocket
from protocol import zmtp


def turn(wire: BlockingNativeSocket, wait: float = 0.0) -> None:
    """One turn of the client's I/O thread for ``wire``: poll it for what it wants (at most ``wait`` seconds,
    or until its timer), then service it."""
    now = time.monotonic()
    fd, interest = wire.fileno(), wire.interest()
    timer = wire.next_timer(now)
    wait = wait if timer is None else min(wait, timer)
    events = []
    if fd is not None and interest:
        poller = select.poll()
        poller.register(fd, interest)
        events = poller.poll(int(wait * 1000))
    elif wait:
        time.sleep(wait)
    wire.service(fd, sum(mask for _, mask in events), time.monotonic())


def drive(wire: BlockingNativeSocket, done: Callable[[], bool], timeout: float = 5.0) -> None:
    """Turn ``wire`` until ``done()``; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the wire did not get there in time"
        turn(wire, 0.05)


def kinds(wire: BlockingNativeSocket) -> list[int]:
    return [kind for kind, _ in wire.events]


@pytest.fixture
def router() -> Iterator[tuple[zmq.Socket, int]]:
    context = zmq.Context()
    server = context.socket(zmq.ROUTER)
    server.linger = 0
    port = server.bind_to_random_port("tcp://127.0.0.1")
    yield server, port
    server.close(0)
    context.term()


def open_wire(port: int, credentials: Credentials | None = None) -> BlockingNativeSocket:
    return BlockingNativeSocket("127.0.0.1", port, credentials, reconnect=0.01, reconnect_max=0.04)


def test_messages_both_ways_with_a_libzmq_router(router: tuple[zmq.Socket, int]) -> None:
    server, port = router
    wire = open_wire(port)
    wire.send_frames([b"", b"before the handshake"])  # waits for it
    drive(wire, lambda: zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds(wire))
    assert kinds(wire) == [zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED]
    wire.send_frames([b"", b"x" * 300, b""])  # a long frame and an empty one
    identity, *first = server.recv_multipart()
    assert first == [b"", b"before the handshake"]
    assert server.recv_multipart() == [identity, b"", b"x" * 300, b""]
    big = bytes(range(256)) * 8192  # 2 MiB: read in several pieces
    server.send_multipart([identity, b"", big])
    server.send_multipart([identity, b"", b"second"])
    drive(wire, lambda: len(wire._received) == 2)
    assert wire.readable()
    assert wire.recv_frames() == [b"", big]
    assert wire.recv_frames() == [b"", b"second"]
    assert not wire.readable()
    with pytest.raises(zmq.Again):
        wire.recv_frames()
    wire.close()


def test_curve_pinned_to_a_libzmq_servers_key(router: tuple[zmq.Socket, int]) -> None:
    server, _ = router
    server.close(0)
    context = zmq.Context.instance()
    server_public, server_secret = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    curve_server = context.socket(zmq.ROUTER)
    curve_server.linger = 0
    curve_server.curve_server = True
    curve_server.curve_secretkey = server_secret
    port = curve_server.bind_to_random_port("tcp://127.0.0.1")
    try:
        credentials = Credentials(server_public=server_public, public=public, secret=secret)
        wire = open_wire(port, credentials)
        drive(wire, lambda: zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds(wire))
        wire.send_frames([b"", b"sealed"])
        frames = curve_server.recv_multipart(copy=False)
        assert [f.bytes for f in frames[1:]] == [b"", b"sealed"]
        curve_server.send_multipart([frames[0].bytes, b"", b"back"])
        drive(wire, wire.readable)
        assert wire.recv_frames() == [b"", b"back"]
        wire.close()
        # Pinned to another key: the server cannot open our HELLO and hangs up, as libzmq reports it.
        other_public, _ = zmq.curve_keypair()
        wrong = open_wire(port, Credentials(server_public=other_public, public=public, secret=secret))
        drive(wrong, lambda: zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL in kinds(wrong))
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in kinds(wrong)
        wrong.close()
        # A CURVE client meeting a server whose greeting names NULL: a mechanism mismatch, as libzmq reports
        # it (a libzmq server hangs up without its greeting, which the client's watch then probes for).
        with socket.create_server(("127.0.0.1", 0)) as listener:
            wire = open_wire(listener.getsockname()[1], credentials)
            accepted, _ = listener.accept()
            with accepted:
                accepted.sendall(zmtp.greeting(b"NULL"))
                drive(wire, lambda: zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL in kinds(wire))
            mismatch = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            assert mismatch in wire.events
            wire.close()
    finally:
        curve_server.close(0)


def test_what_waits_for_the_handshake_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_blocking, "SEND_HWM", 3)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    wire = open_wire(port)
    for n in range(3):
        wire.send_frames([b"", b"%d" % n])
    with pytest.raises(zmq.Again):
        wire.send_frames([b"", b"one too many"])
    # Nothing listens: connect retried, each time after twice the wait, up to the most.
    drive(wire, lambda: kinds(wire).count(zmq.EVENT_CONNECT_RETRIED) >= 4)
    waits = [value for kind, value in wire.events if kind == zmq.EVENT_CONNECT_RETRIED]
    assert waits[:4] == [10, 20, 40, 40]
    wire.close()


def test_a_peer_that_stops_reading_makes_sends_fail_until_it_reads(
    router: tuple[zmq.Socket, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native_blocking, "SEND_BUFFER", 1 << 20)
    server, port = router
    server.close(0)
    context = zmq.Context.instance()
    slow = context.socket(zmq.ROUTER)
    slow.linger = 0
    slow.rcvhwm = 2  # libzmq stops reading the connection once two messages wait
    slow.rcvbuf = 64 << 10
    port = slow.bind_to_random_port("tcp://127.0.0.1")
    try:
        wire = open_wire(port)
        drive(wire, lambda: zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds(wire))
        body = b"y" * (64 << 10)
        sent = 0
        with pytest.raises(zmq.Again):  # noqa: PT012 - sends until the buffer is full
            for sent in range(1000):  # sent: the message refused, which is how many went
                wire.send_frames([b"", b"%d" % sent, body])
        assert 16 <= sent < 1000
        assert wire.interest() & native_blocking.POLLOUT  # the I/O thread now waits for room
        got = []
        deadline = time.monotonic() + 10
        while len(got) < sent:
            assert time.monotonic() < deadline, f"{len(got)} of {sent} messages arrived"
            if slow.poll(10):
                got.append(int(slow.recv_multipart()[2]))
            turn(wire)  # room again: what the kernel did not take goes out
        assert got == list(range(sent)), "messages were lost or reordered while the kernel was full"
        wire.close()
    finally:
        slow.close(0)


def test_a_full_received_queue_stops_the_reading(
    router: tuple[zmq.Socket, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native_blocking, "RECV_HWM", 5)
    server, port = router
    wire = open_wire(port)
    wire.send_frames([b"", b"hello"])
    drive(wire, lambda: zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds(wire))
    identity = server.recv_multipart()[0]
    for n in range(20):
        server.send_multipart([identity, b"%d" % n])
    drive(wire, lambda: len(wire._received) >= 5)  # one read may bring more than the bound: all of it is kept
    assert not wire.interest() & native_blocking.POLLIN, "still reading with the queue full"
    held = len(wire._received)
    for n in range(20, 40):
        server.send_multipart([identity, b"%d" % n])
    time.sleep(0.05)
    wire.service(wire.fileno(), native_blocking.POLLIN, time.monotonic())
    assert len(wire._received) == held, "read past the bound"
    got = []
    while len(got) < 40:
        while wire.readable():
            got.append(int(wire.recv_frames()[0]))
        drive(wire, lambda: wire.readable() or len(got) == 40)
    assert got == list(range(40))
    wire.close()


def test_a_lost_connection_is_reported_and_made_again(router: tuple[zmq.Socket, int]) -> None:
    server, port = router
    wire = open_wire(port)
    drive(wire, lambda: zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds(wire))
    wire.events.clear()
    server.close(0)  # the broker goes away
    drive(wire, lambda: zmq.EVENT_DISCONNECTED in kinds(wire))
    assert wire.fileno() is None  # waiting to connect again
    context = zmq.Context.instance()
    again = context.socket(zmq.ROUTER)
    again.linger = 0
    again.bind(f"tcp://127.0.0.1:{port}")
    try:
        drive(wire, lambda: zmq.EVENT_HANDSHAKE_SUCCEEDED in kinds(wire))
        assert zmq.EVENT_CONNECTED in kinds(wire)
        wire.send_frames([b"", b"on the new connection"])
        assert again.recv_multipart()[1:] == [b"", b"on the new connection"]
        wire.close()
    finally:
        again.close(0)


# ------------------------------------------------------------------------------ the Client on its native wire


def test_the_clients_wire_is_checked_and_native_takes_tcp_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wire must be one of auto, native, zeromq, not 'libzmq'"):
        Client(free_endpoint(), wire="libzmq")
    with pytest.raises(ConnectorError, match=r"wire 'native' cannot connect to ipc://.* tcp://HOST:PORT"):
        Client(f"ipc://{tmp_path}/mc0.sock", wire="native", curve=False, timeout=1.0)


def test_the_client_is_native_by_default_and_zeromq_on_request(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as native, \
            Client(broker.endpoint, curve=False, wire="zeromq") as through_libzmq:
        assert type(native._socket) is BlockingNativeSocket
        assert isinstance(through_libzmq._socket, zmq.Socket)
        native.subscribe("both")
        through_libzmq.publish("both", "from libzmq", confirm=True)  # stored before the next one is sent
        native.publish("both", "from the native wire", confirm=True)
        assert [m.text for m in receive_all(native, 2)] == ["from libzmq", "from the native wire"]


def test_a_native_client_stops_reading_past_its_queue_and_loses_nothing(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries the caller does not take fill the client's inbox, then the wire's queue up to RECV_HWM: past
    it the connection is not read (the kernel's buffers and the broker hold the rest); it is read again as
    they are taken, in order and complete."""
    monkeypatch.setattr(native_blocking, "RECV_HWM", 20)
    with Client(broker.endpoint, curve=False, max_inbox=10) as subscriber, \
            Client(broker.endpoint, curve=False) as publisher:
        subscriber.subscribe("queue")
        for index in range(200):  # confirmed one by one: each is delivered in a message of its own
            publisher.publish("queue", b"%d" % index, confirm=True)
        time.sleep(0.3)  # everything has reached the subscriber, or waits because it stopped reading
        wire = subscriber._socket
        assert type(wire) is BlockingNativeSocket
        with subscriber._io_lock:
            held = len(wire._received)
            assert held >= 20, "the wire's queue did not fill"
            assert not wire.interest() & native_blocking.POLLIN, "still reading past the wire's queue"
        got = [int(m.body) for m in receive_all(subscriber, 200)]
        assert got == list(range(200))


def test_a_caller_waiting_in_receive_reads_the_socket_itself(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paced deliveries reach a caller waiting in receive() through its own read of the socket (no hand-off
    from the I/O thread), in order; a confirmation's callback still runs on the I/O thread meanwhile."""
    outcomes: list[bool] = []
    real = Client._read_directly

    def spy(self: Client, remaining: float | None) -> bool:
        outcome = real(self, remaining)
        outcomes.append(outcome)
        return outcome

    monkeypatch.setattr(Client, "_read_directly", spy)
    with Client(broker.endpoint, curve=False) as subscriber, \
            Client(broker.endpoint, curve=False) as publisher:
        subscriber.subscribe("paced")
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.extend(m.text for m in receive_all(subscriber, 20)))
        reader.start()
        for index in range(20):
            time.sleep(0.005)
            publisher.publish("paced", f"{index}")
        callback_threads: list[str] = []
        confirmation = subscriber.publish_async("confirmed", "x")
        confirmation.add_done_callback(lambda _: callback_threads.append(threading.current_thread().name))
        confirmation.result(5)
        reader.join(10)
        assert got == [f"{index}" for index in range(20)]
        assert outcomes.count(True) >= 10, f"the caller read for itself {outcomes.count(True)} times of 20"
        # On the I/O thread; or at once on this one, had it been settled before the callback was added (never
        # on the reader's, which was reading the socket itself).
        assert callback_threads in ([subscriber._thread.name], [threading.current_thread().name])
