"""The blocking :class:`connector.Client` against a real in-process broker on a loopback port: the usage shown
in the package docstring, SUB/UNSUB waiting for OK (and raising on ERROR), confirmed and fire-and-forget
publishing (complete, in order, with increasing ids), flush, stats, receive timeouts, headers, close
(DISCONNECT, idempotent, no use afterwards, nothing queued lost), a missing broker, CURVE with a generated
keys folder, publishing from several threads, a full inbox, TTL heartbeats during idleness, and reconnecting
(with re-SUB) to a broker that was restarted on the same port. Every test runs on both wires: the client's own
ZMTP (its default for tcp://) and libzmq's.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import pytest
import zmq
from conftest import ARRIVAL, FREE_GATEWAY_PORTS, BrokerThread, free_endpoint, receive_all

from broker.config import BrokerConfig
from broker.server import Broker
from connector import Client, ConnectorError
from connector import client as client_module
from connector import keys as key_files

if TYPE_CHECKING:
    from conftest import BrokerFactory

pytestmark = [pytest.mark.timeout(20), pytest.mark.usefixtures("each_wire")]  # the native wire and libzmq

#: How long a message that should arrive may take (generous for a loaded machine).


def connections(observer: Client) -> int:
    return observer.stats()["connections"]["mc0"]


def wait_for(condition: object, timeout: float = ARRIVAL, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(every)


def plain_broker(bind: str, running: list[BrokerThread]) -> BrokerThread:
    runner = BrokerThread(BrokerConfig(bind=bind, curve=False, heartbeat_tick=0.01, **FREE_GATEWAY_PORTS))
    running.append(runner)
    return runner


@pytest.fixture
def client(broker: Broker) -> Iterator[Client]:
    with Client(broker.endpoint, timeout=3.0) as connected:
        yield connected


@pytest.fixture
def other(broker: Broker) -> Iterator[Client]:
    with Client(broker.endpoint, timeout=3.0) as connected:
        yield connected


# ------------------------------------------------------------------------------------------------- the basics


def test_the_usage_from_the_package_docstring(start_broker: BrokerFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key_files.generate(keys)
    broker = start_broker(curve=True, keys_dir=keys)
    with Client(broker.endpoint, keys=str(keys)) as client:
        client.subscribe("orders")
        client.publish("orders", "hello")
        message = client.receive(timeout=ARRIVAL)
        assert message is not None
        assert message.text == "hello"
        assert message.topic == "orders"


def test_publisher_receives_its_own_message_with_id_and_timestamp(client: Client) -> None:
    client.subscribe("self")
    before = int(time.time() * 1000)
    client.publish("self", b"\x00\xffbinary")
    message = client.receive(timeout=ARRIVAL)
    assert message is not None
    assert message.body == b"\x00\xffbinary"
    assert isinstance(message.id, int)
    assert message.timestamp is not None
    assert before - 1000 <= message.timestamp <= time.time() * 1000 + 1000


def test_subscribe_waits_for_ok_so_the_next_publish_arrives(client: Client, other: Client) -> None:
    client.subscribe("a", "b")
    other.publish("b", "first")
    other.publish("a", "second")
    assert [m.text for m in receive_all(client, 2)] == ["first", "second"]


def test_subscribe_refused_raises_and_the_client_keeps_working(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with Client(broker.endpoint, timeout=3.0) as client:
        with pytest.raises(ConnectorError, match=r"refused SUB.*transient"):
            client.subscribe("p.orders", replay="beginning")  # nothing to replay on a transient topic
        client.subscribe("plain")
        client.publish("plain", "still fine")
        message = client.receive(timeout=ARRIVAL)
        assert message is not None
        assert message.text == "still fine"
        assert "p.orders" not in client.stats()["topics"]


def test_unsubscribe_stops_delivery(client: Client, other: Client) -> None:
    client.subscribe("gone", "kept")
    client.unsubscribe("gone")
    other.publish("gone", "not for you")
    other.publish("kept", "marker")
    message = client.receive(timeout=ARRIVAL)
    assert message is not None
    assert message.text == "marker"
    assert client.receive(timeout=0.2) is None


def test_unsubscribe_refused_raises(client: Client) -> None:
    with pytest.raises(ConnectorError, match="refused UNSUB"):
        client.unsubscribe("")  # empty topic names are a protocol error


def test_confirmed_publish_returns_the_message_id(client: Client, other: Client) -> None:
    client.subscribe("confirmed")
    first = other.publish("confirmed", "one", confirm=True)
    second = other.publish("confirmed", "two", confirm=True)
    assert first is not None
    assert second is not None
    assert int(second["MESSAGE-ID"]) > int(first["MESSAGE-ID"])
    received = receive_all(client, 2)
    assert [m.id for m in received] == [int(first["MESSAGE-ID"]), int(second["MESSAGE-ID"])]


def test_fire_and_forget_publishes_arrive_complete_and_in_order(client: Client, other: Client) -> None:
    client.subscribe("bulk")
    count = 5000
    for n in range(count):
        assert other.publish("bulk", b"%d" % n) is None
    received = receive_all(client, count)
    assert [m.body for m in received] == [b"%d" % n for n in range(count)]
    ids = [m.id for m in received]
    assert all(isinstance(i, int) for i in ids)
    assert all(a < b for a, b in itertools.pairwise(ids))  # type: ignore[operator]


def test_flush_returns_once_the_broker_has_everything(client: Client) -> None:
    for n in range(300):
        client.publish("flushed", b"%d" % n)
    client.flush()
    assert client.stats()["topics"]["flushed"]["messages_in"] == 300


def test_stats_describe_the_broker(client: Client) -> None:
    client.subscribe("seen")
    client.publish("seen", "x", confirm=True)
    data = client.stats()
    assert data["uptime_seconds"] >= 0
    assert data["connections"]["mc0"] >= 1
    topic = data["topics"]["seen"]
    assert topic["subscribers"] == 1
    assert topic["messages_in"] == 1


def test_receive_returns_none_on_timeout(client: Client) -> None:
    client.subscribe("quiet")
    start = time.monotonic()
    assert client.receive(timeout=0.3) is None
    waited = time.monotonic() - start
    assert 0.25 <= waited < 2.0
    assert client.receive(timeout=0) is None


def test_headers_round_trip(client: Client, other: Client) -> None:
    client.subscribe("headed")
    headers = {"X-Reply-To": "me", "X-Empty": "", "X-Unicode": "é ✓"}
    other.publish("headed", "body", headers)
    other.publish("headed", "confirmed", {"X-Confirmed": "yes"}, confirm=True)
    first, second = receive_all(client, 2)
    assert first.headers == headers
    assert second.headers == {"X-Confirmed": "yes"}


def test_topic_names_with_spaces_and_unicode(client: Client) -> None:
    client.subscribe("collective agent", "données")
    client.publish("données", "u")
    client.publish("collective agent", "s")
    assert {m.topic for m in receive_all(client, 2)} == {"données", "collective agent"}


def test_iterating_the_client_yields_messages(client: Client) -> None:
    client.subscribe("iter")
    for n in range(3):
        client.publish("iter", b"%d" % n)
    bodies = []
    for message in client:
        bodies.append(message.body)
        if len(bodies) == 3:
            break
    assert bodies == [b"0", b"1", b"2"]


# ---------------------------------------------------------------------------------------------------- closing


def test_close_sends_disconnect(broker: Broker, other: Client) -> None:
    client = Client(broker.endpoint, timeout=3.0)
    client.subscribe("leaving")
    assert connections(other) == 2
    assert other.stats()["topics"]["leaving"]["subscribers"] == 1
    client.close()
    wait_for(lambda: connections(other) == 1, timeout=2.0)
    assert other.stats()["topics"]["leaving"]["subscribers"] == 0


def test_close_is_idempotent_and_use_after_close_raises(broker: Broker) -> None:
    client = Client(broker.endpoint, timeout=3.0)
    client.close()
    client.close()
    with pytest.raises(ConnectorError):
        client.publish("t", "fire and forget")
    with pytest.raises(ConnectorError):
        client.publish("t", "confirmed", confirm=True)
    with pytest.raises(ConnectorError):
        client.subscribe("t")
    with pytest.raises(ConnectorError):
        client.unsubscribe("t")
    with pytest.raises(ConnectorError):
        client.flush()
    with pytest.raises(ConnectorError):
        client.stats()
    with pytest.raises(ConnectorError):
        client.receive(timeout=0.1)


def test_close_right_after_publishing_loses_nothing(broker: Broker, client: Client) -> None:
    client.subscribe("last words")
    count = 2000
    publisher = Client(broker.endpoint, timeout=3.0)
    for n in range(count):
        publisher.publish("last words", b"%d" % n)
    publisher.close()
    assert [m.body for m in receive_all(client, count)] == [b"%d" % n for n in range(count)]


def test_close_waits_until_a_slow_broker_has_taken_everything() -> None:
    """A broker that reads slowly (small buffers, busy for a moment) still gets every queued message and the
    DISCONNECT: close() must not drop what is still in the socket's pipe."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    router.rcvhwm = 5
    router.rcvbuf = 64 * 1024
    port = router.bind_to_random_port("tcp://127.0.0.1")
    taken: list[int] = []
    disconnected = threading.Event()

    def slow_broker() -> None:
        assert router.poll(5000)
        frames = router.recv_multipart()
        command_id = frames[frames.index(b"ID") + 1]
        router.send_multipart([frames[0], b"", b"OK", b"ID", command_id, b"EXTENSIONS", b"batch ids"])
        time.sleep(0.5)  # busy: the client's pipe fills up meanwhile
        while router.poll(3000):
            frames = router.recv_multipart()
            if frames[2] == b"PUTS":
                taken.append(len(msgpack.unpackb(frames[4])))
            elif frames[2] == b"PUT":
                taken.append(1)
            elif frames[2] == b"DISCONNECT":
                if b"ID" in frames:
                    router.send_multipart([frames[0], b"", b"OK", b"ID", frames[frames.index(b"ID") + 1]])
                disconnected.set()
                return

    server = threading.Thread(target=slow_broker)
    server.start()
    try:
        client = Client(f"tcp://127.0.0.1:{port}", timeout=3.0)
        count = 600
        for _ in range(count):
            client.publish("t", b"x" * 50_000)  # 30 MB: far more than the kernel buffers hold
        client.close(timeout=10)
        server.join(10)
        assert not server.is_alive()
        assert disconnected.is_set(), "DISCONNECT never arrived"
        assert sum(taken) == count
    finally:
        router.close(linger=0)
        context.term()


def test_close_is_prompt(broker: Broker) -> None:
    client = Client(broker.endpoint, timeout=3.0)
    client.subscribe("t")
    start = time.monotonic()
    client.close()
    assert time.monotonic() - start < 1.0


def test_close_with_the_broker_gone_returns_within_its_timeout(restartable: list[BrokerThread]) -> None:
    runner = plain_broker("tcp://127.0.0.1:*", restartable)
    client = Client(runner.start().endpoint, ttl=None, timeout=3.0)
    client.publish("t", "queued before the broker went away")
    client.flush()
    runner.stop()
    start = time.monotonic()
    client.close(timeout=0.5)
    assert time.monotonic() - start < 1.5
    with pytest.raises(ConnectorError, match="closed"):
        client.flush()


def test_context_manager_closes(broker: Broker, other: Client) -> None:
    with Client(broker.endpoint, timeout=3.0) as client:
        client.flush()
    with pytest.raises(ConnectorError, match="closed"):
        client.flush()
    wait_for(lambda: connections(other) == 1, timeout=2.0)


def test_no_broker_listening_raises_within_the_timeout() -> None:
    endpoint = free_endpoint()
    start = time.monotonic()
    with pytest.raises(ConnectorError, match=f"nothing is listening at {endpoint}: start the broker"):
        Client(endpoint, timeout=0.5)
    assert time.monotonic() - start < 2.0


def test_no_broker_with_a_short_ttl_still_raises_within_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(ConnectorError):
        Client(free_endpoint(), ttl=100, timeout=0.6)
    assert time.monotonic() - start < 2.0


def test_a_bad_endpoint_raises_connector_error() -> None:
    with pytest.raises(ConnectorError):
        Client("tcp://127.0.0.1:not-a-port", timeout=1.0)


# ------------------------------------------------------------------------------------------------------ CURVE


def test_curve_with_a_generated_keys_folder(start_broker: BrokerFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key_files.generate(keys)
    broker = start_broker(curve=True, keys_dir=keys)
    with Client(broker.endpoint, keys=keys, timeout=3.0) as client:
        client.subscribe("secret")
        headers = client.publish("secret", "encrypted", confirm=True)
        assert headers is not None
        assert "MESSAGE-ID" in headers
        message = client.receive(timeout=ARRIVAL)
        assert message is not None
        assert message.text == "encrypted"


def test_curve_with_the_wrong_server_key_fails_to_connect(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    key_files.generate(tmp_path / "keys")
    broker = start_broker(curve=True, keys_dir=tmp_path / "keys")
    key_files.generate(tmp_path / "elsewhere")  # a different broker key pinned
    with pytest.raises(ConnectorError):
        Client(broker.endpoint, keys=tmp_path / "elsewhere", timeout=0.5)


def test_curve_with_a_client_not_admitted_fails_to_connect(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    key_files.generate(keys, clients=("alice", "mallory"))
    (keys / "allowed" / "mallory.key").unlink()
    broker = start_broker(curve=True, keys_dir=keys)
    credentials = key_files.Credentials.from_dir(keys, "alice")
    with Client(broker.endpoint, credentials=credentials, timeout=3.0) as alice:
        alice.flush()
    with pytest.raises(ConnectorError):
        Client(broker.endpoint, credentials=key_files.Credentials.from_dir(keys, "mallory"), timeout=0.5)


def test_missing_keys_folder_is_reported(tmp_path: Path) -> None:
    with pytest.raises(key_files.KeyFileError, match=r"broker\.key"):
        Client(free_endpoint(), keys=tmp_path / "nowhere", timeout=0.5)


# ---------------------------------------------------------------------------------------------------- threads


def test_publishing_from_several_threads(broker: Broker, client: Client) -> None:
    client.subscribe("threads")
    threads, per_thread = 4, 1000
    errors: list[BaseException] = []
    with Client(broker.endpoint, timeout=3.0) as shared:
        start = threading.Barrier(threads)

        def publish(worker: int) -> None:
            try:
                start.wait(5)
                for n in range(per_thread):
                    shared.publish("threads", f"{worker}:{n}")
                shared.flush()
            except BaseException as error:
                errors.append(error)

        workers = [threading.Thread(target=publish, args=(w,)) for w in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(10)
        assert not any(worker.is_alive() for worker in workers)
    assert errors == []
    received = receive_all(client, threads * per_thread)
    by_worker: dict[int, list[int]] = {}
    for message in received:
        worker, n = message.text.split(":")
        by_worker.setdefault(int(worker), []).append(int(n))
    assert by_worker == {w: list(range(per_thread)) for w in range(threads)}


class SendSpy:
    """Which thread sent each PUT/PUTS frame set of ``publisher``, on whichever wire it has (libzmq's send or
    the native wire's: the socket call it was opened with)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, publisher: Client) -> None:
        self.sent: list[tuple[str, list[bytes]]] = []
        real = publisher._send_raw

        def spy(socket: object, frames: list[bytes]) -> None:
            real(socket, frames)
            if frames[1] in (b"PUT", b"PUTS"):
                self.sent.append((threading.current_thread().name, list(frames)))

        monkeypatch.setattr(publisher, "_send_raw", spy)

    def threads(self) -> list[str]:
        return ["caller" if name == threading.current_thread().name else "io" for name, _ in self.sent]


def test_a_publish_that_comes_alone_is_sent_by_its_caller_and_a_burst_by_the_io_thread(
    client: Client, other: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.subscribe("alone")
    spy = SendSpy(monkeypatch, other)
    for n in range(5):
        time.sleep(client_module.DIRECT_GAP * 2)
        other.publish("alone", f"paced {n}")
    assert spy.threads() == ["caller"] * 5, "a paced publish waited for the I/O thread"
    confirmed = other.publish("alone", "confirmed", confirm=True)
    assert confirmed is not None
    assert "MESSAGE-ID" in confirmed
    assert spy.threads()[-1] == "caller"
    del spy.sent[:]
    for n in range(2000):
        other.publish("alone", f"burst {n}")
    other.flush()
    # The caller sends again only after a pause of its own (the I/O thread holding the GIL for a while).
    assert spy.threads().count("caller") < 20, "a burst was sent message by message from the caller"
    assert len(spy.sent) < 200, "a burst did not leave in PUTS batches"
    received = receive_all(client, 5 + 1 + 2000)
    assert [m.text for m in received] == [f"paced {n}" for n in range(5)] + ["confirmed"] + [
        f"burst {n}" for n in range(2000)]


def test_a_publish_never_overtakes_one_queued_before_it(
    client: Client, other: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish queued for the I/O thread (its lock was busy) and not sent yet: a later one that comes alone
    must wait behind it, not leave from the caller's thread ahead of it."""
    client.subscribe("order")
    spy = SendSpy(monkeypatch, other)
    real_wake = other._wake
    with monkeypatch.context() as held:
        held.setattr(other, "_wake", lambda: None)  # the I/O thread is not told: "first" stays queued
        with other._io_lock:  # the I/O thread at work: nobody else may touch the socket
            other.publish("order", "first")
        time.sleep(client_module.DIRECT_GAP * 2)
        other.publish("order", "second")
        assert spy.sent == [], "a publish left ahead of one queued before it"
        assert len(other._outbox) == 2
    real_wake()
    assert [m.text for m in receive_all(client, 2)] == ["first", "second"]
    assert spy.threads() == ["io"]


def test_replies_that_wait_when_the_caller_sends_are_read_at_once(client: Client) -> None:
    """A caller's send takes in the socket's pending events, and with them the signal the I/O thread waits
    for: the client must still read what arrived (its own messages coming back here) without waiting for a
    timer."""
    client.subscribe("echo")
    for n in range(100):
        client.publish("echo", f"{n}")
        message = client.receive(timeout=1.0)
        assert message is not None, f"message {n} was not read"
        assert message.text == f"{n}"
    # Deliveries streaming in while the caller keeps sending alone: each send may take the signal.
    client.subscribe("stream")
    count = 20_000
    stop = threading.Event()

    def paced() -> None:
        while not stop.is_set():
            client.publish("elsewhere", "x")
            time.sleep(client_module.DIRECT_GAP * 1.5)

    with Client(client.endpoint, timeout=3.0) as flooder:
        sender = threading.Thread(target=paced)
        sender.start()
        try:
            for n in range(count):
                flooder.publish("stream", f"{n}")
            got = 0
            while got < count:
                message = client.receive(timeout=2.0)
                assert message is not None, f"{got} of {count} deliveries read, then nothing for 2 s"
                got += 1
        finally:
            stop.set()
            sender.join(5)


def test_receiving_from_several_threads_hands_each_message_out_once(client: Client, other: Client) -> None:
    client.subscribe("shared inbox")
    count = 400
    got: list[bytes] = []
    lock = threading.Lock()

    def take() -> None:
        while (message := client.receive(timeout=0.5)) is not None:
            with lock:
                got.append(message.body)

    readers = [threading.Thread(target=take) for _ in range(3)]
    for reader in readers:
        reader.start()
    for n in range(count):
        other.publish("shared inbox", b"%d" % n)
    for reader in readers:
        reader.join(10)
    assert sorted(got) == sorted(b"%d" % n for n in range(count))


def test_threads_waiting_together_are_each_woken_by_one_batch(client: Client, other: Client) -> None:
    """One batch reaches the inbox with one wake-up: the first thread woken passes it on to the next while
    deliveries remain, so none of them waits for its next look at the clock (a second)."""
    client.subscribe("waiting together")
    got: list[tuple[bytes, float]] = []
    lock = threading.Lock()

    def take() -> None:
        message = client.receive(timeout=5.0)
        if message is not None:
            with lock:
                got.append((message.body, time.monotonic()))

    readers = [threading.Thread(target=take) for _ in range(3)]
    for reader in readers:
        reader.start()
    time.sleep(0.3)  # all three are waiting
    sent = time.monotonic()
    other.publish_batch([("waiting together", body, None) for body in (b"a", b"b", b"c")])
    for reader in readers:
        reader.join(10)
    assert sorted(body for body, _ in got) == [b"a", b"b", b"c"]
    assert max(at for _, at in got) - sent < 0.5


def test_close_wakes_every_thread_waiting_to_receive(broker: Broker) -> None:
    client = Client(broker.endpoint, timeout=3.0)
    errors: list[BaseException] = []

    def wait_forever() -> None:
        try:
            client.receive()
        except ConnectorError as error:
            errors.append(error)

    readers = [threading.Thread(target=wait_forever) for _ in range(3)]
    for reader in readers:
        reader.start()
    time.sleep(0.3)
    client.close()
    for reader in readers:
        reader.join(2.0)
    assert not any(reader.is_alive() for reader in readers)
    assert len(errors) == 3
    assert all("closed" in str(error) for error in errors)


def test_a_full_inbox_pauses_reading_without_losing_messages(broker: Broker, other: Client) -> None:
    with Client(broker.endpoint, timeout=3.0, max_inbox=10) as client:
        client.subscribe("slow reader")
        count = 300
        for n in range(count):
            other.publish("slow reader", b"%d" % n)
        other.flush()
        time.sleep(0.2)  # let the inbox fill up and reading pause
        assert client.pending > 0
        assert [m.body for m in receive_all(client, count)] == [b"%d" % n for n in range(count)]
        client.flush()  # the I/O thread is still alive and answering


def test_close_is_prompt_with_a_full_inbox(broker: Broker, other: Client) -> None:
    """The OK to DISCONNECT queues behind deliveries nobody will take: closing must read past the bound."""
    client = Client(broker.endpoint, timeout=3.0, max_inbox=5)
    client.subscribe("unread")
    for n in range(2000):
        other.publish("unread", b"%d" % n)
    other.flush()
    deadline = time.monotonic() + ARRIVAL
    while client.pending < 5:
        assert time.monotonic() < deadline, "deliveries did not arrive"
        time.sleep(0.01)
    start = time.monotonic()
    client.close()
    assert time.monotonic() - start < 1.0
    wait_for(lambda: connections(other) == 1, timeout=2.0)


def test_a_full_outbox_waits_then_everything_arrives(broker: Broker, client: Client) -> None:
    client.subscribe("backpressure")
    with Client(broker.endpoint, timeout=3.0, max_outbox=5) as publisher:
        for n in range(500):
            publisher.publish("backpressure", b"%d" % n)
    assert len(receive_all(client, 500)) == 500


# ----------------------------------------------------------------------------------- heartbeats and reconnect


def test_heartbeats_keep_an_idle_client_connected(start_broker: BrokerFactory) -> None:
    broker = start_broker(heartbeat_tick=0.01)
    with Client(broker.endpoint, ttl=400, timeout=3.0) as client, \
            Client(broker.endpoint, timeout=3.0) as publisher:
        client.subscribe("idle")
        assert client.receive(timeout=2.0) is None  # 2 s of idleness, five TTLs
        assert publisher.stats()["topics"]["idle"]["subscribers"] == 1
        publisher.publish("idle", "still there")
        message = client.receive(timeout=ARRIVAL)
        assert message is not None
        assert message.text == "still there"
        assert client.reconnects == 0


def test_without_heartbeats_the_broker_drops_a_silent_client(start_broker: BrokerFactory) -> None:
    """The counter-check: a peer that stops sending is dropped, so the test above proves the NOOPs matter."""
    broker = start_broker(heartbeat_tick=0.01)
    context = zmq.Context()
    try:
        peer = context.socket(zmq.DEALER)
        peer.linger = 0
        peer.connect(broker.endpoint)
        peer.send_multipart([b"", b"CONNECT", b"VERSION", b"0.3", b"TTL", b"300", b"ID", b"1"])
        peer.send_multipart([b"", b"SUB", b"ID", b"2", b"", b"idle"])
        # Both OKs (the broker's NOOP heartbeats may come between): the broker took the subscription. Asking
        # another connection's STATS at once could race the peer's handshake on a loaded machine.
        oks = 0
        while oks < 2:
            assert peer.poll(3000), "the broker did not answer CONNECT and SUB"
            verb = peer.recv_multipart()[1]
            assert verb in (b"OK", b"NOOP"), verb
            oks += verb == b"OK"
        with Client(broker.endpoint, timeout=3.0) as observer:
            wait_for(lambda: observer.stats()["topics"]["idle"]["subscribers"] == 0, timeout=5.0)
        peer.close()
    finally:
        context.destroy(linger=0)


def test_reconnect_after_a_broker_restart(restartable: list[BrokerThread]) -> None:
    first = plain_broker("tcp://127.0.0.1:*", restartable)
    endpoint = first.start().endpoint
    with Client(endpoint, ttl=400, timeout=3.0) as client:
        client.subscribe("survivor", "second topic")
        client.flush()
        first.stop()
        second = plain_broker(endpoint, restartable)  # the port the first broker resolved
        assert second.start().endpoint == endpoint
        with Client(endpoint, timeout=3.0) as publisher:
            # Publish until the re-SUB has happened: the client notices silence after 1.05 x TTL.
            deadline = time.monotonic() + 6.0
            message = None
            while message is None:
                assert time.monotonic() < deadline, "no message after the restart"
                publisher.publish("second topic", "after restart")
                message = client.receive(timeout=0.1)
            assert message.text == "after restart"
            assert client.reconnects >= 1
            publisher.publish("survivor", "both topics", confirm=True)
            while (message := client.receive(timeout=ARRIVAL)) is not None and message.topic != "survivor":
                pass
            assert message is not None
            assert message.text == "both topics"
            client.flush()  # commands work on the new connection


def test_a_confirmed_publish_made_while_the_broker_is_down_is_confirmed_once_it_is_back(
    restartable: list[BrokerThread],
) -> None:
    """The socket queues what is published while the connection is down and sends it on the new connection
    ahead of the CONNECT; the broker answers in order, so the publish is confirmed, not failed as lost."""
    first = plain_broker("tcp://127.0.0.1:*", restartable)
    endpoint = first.start().endpoint
    with Client(endpoint, ttl=400, timeout=3.0) as client:
        client.publish("down", "before", confirm=True)
        first.stop()
        time.sleep(0.3)  # the connection is gone
        pending = client.publish_async("down", "while down")
        second = plain_broker(endpoint, restartable)
        assert second.start().endpoint == endpoint
        confirmed = pending.result(10)
        assert confirmed["MESSAGE-ID"] == "1", "stored by the new broker, the first message of its topic"
        assert client.reconnects >= 1
