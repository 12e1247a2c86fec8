"""The sexp door on real sockets: the handshake (accepted and refused), Connect first, Error frames that
leave the connection open, Subscribed/Unsubscribed with the topic's stable id, replay modes on persistent and
transient topics, round-robin topics shared with mc0 consumers, Pings and the expiry of a silent client, flow
control for a subscriber that stops reading, and one engine behind both doors (same message ids).

The client side here is a few lines of independent code over a plain socket (:class:`Raw`), not the codec
under test; :mod:`connector.sexp_client` gets its own tests at the end.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner
from conftest import RawStream

from broker.server import Broker
from broker.topics import Delivery, Persistence, TopicRule, TopicSpec
from connector import Client, ConnectorError
from connector.cli import main
from connector.sexp_client import SexpClient

VERSION_ONE = struct.pack(">q", 1)
REFUSED = struct.pack(">q", -1)
ERROR, PING, MESSAGE, SUBSCRIBED, UNSUBSCRIBED = range(5)
WAIT = 3.0

LOG = TopicSpec(persistence=Persistence.PERSISTENT)
QUEUE = TopicSpec(delivery=Delivery.ROUND_ROBIN)
RULES = (TopicRule("log.*", LOG), TopicRule("q.*", QUEUE))


class Raw(RawStream):
    """A sexp client in a few lines: sends bytes, reads ``(type, payload)`` frames with a timeout."""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self, text: str) -> None:
        self.send(text.encode() + b"\n")

    def exactly(self, size: int, timeout: float = WAIT) -> bytes:
        assert self._fill(size, time.monotonic() + timeout), f"{size} bytes did not arrive"
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def frame(self, timeout: float = WAIT, skip_pings: bool = True) -> tuple[int, bytes]:
        while True:
            (length,) = struct.unpack(">I", self.exactly(4, timeout))
            body = self.exactly(length, timeout)
            if body[0] != PING or not skip_pings:
                return body[0], body[1:]

    def nothing_for(self, seconds: float) -> bool:
        """True if no frame other than a Ping arrives within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self._fill(5, deadline):
            (length,) = struct.unpack(">I", self.buffer[:4])
            if not self._fill(4 + length, deadline):
                return False
            if self.buffer[4] != PING:
                return False
            self.buffer = self.buffer[4 + length:]
        return True


def message(payload: bytes) -> tuple[int, int, bytes]:
    message_id, topic_id = struct.unpack(">QI", payload[:12])
    return message_id, topic_id, payload[12:]


def record(payload: bytes) -> tuple[int, bytes]:
    found = re.fullmatch(rb"\(\(id (\d+)\) ?\(topic (.+)\)\)", payload)
    assert found, payload
    return int(found[1]), found[2]


@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker(topics=RULES, sexp_ping_interval=30.0)


@pytest.fixture
def connect(broker: Broker) -> Iterator[Callable[..., Raw]]:
    opened: list[Raw] = []

    def open_client(name: str = "tester", *, target: Broker | None = None) -> Raw:
        raw = Raw((target or broker).gateway_address("sexp"))
        opened.append(raw)
        raw.send(VERSION_ONE)
        assert raw.exactly(8) == VERSION_ONE
        raw.line(f"(Connect 1 {name})")
        return raw

    yield open_client
    for raw in opened:
        raw.close()


def subscribe(raw: Raw, topic: str, replay: str = "From_current") -> int:
    raw.line(f"(Subscribe {topic} {replay})")
    kind, payload = raw.frame()
    assert kind == SUBSCRIBED, payload
    topic_id, name = record(payload)
    assert name == topic.encode()
    return topic_id


def mc0_client(broker: Broker) -> Client:
    return Client(broker.endpoint, curve=False, timeout=WAIT)


# ------------------------------------------------------------------------------------------- the handshake


def test_version_one_is_accepted_and_anything_else_refused_and_closed(broker: Broker) -> None:
    accepted = Raw(broker.gateway_address("sexp"))
    accepted.send(VERSION_ONE)
    assert accepted.exactly(8) == VERSION_ONE
    refused = Raw(broker.gateway_address("sexp"))
    refused.send(struct.pack(">q", 2))
    assert refused.exactly(8) == REFUSED
    assert refused.closed_within(WAIT)
    accepted.close()
    refused.close()


def test_the_handshake_and_commands_fed_one_byte_at_a_time(broker: Broker) -> None:
    raw = Raw(broker.gateway_address("sexp"))
    for byte in VERSION_ONE + b"(Connect 1 slow)\n(Subscribe \"a topic\" From_current)\n":
        raw.send(bytes([byte]))
        if byte == 1:
            assert raw.exactly(8) == VERSION_ONE
    kind, payload = raw.frame()
    assert kind == SUBSCRIBED
    assert record(payload)[1] == b'"a topic"'
    raw.close()


# ------------------------------------------------------------------------------------- the dialect's rules


def test_connect_must_come_first_and_the_connection_stays(broker: Broker) -> None:
    raw = Raw(broker.gateway_address("sexp"))
    raw.send(VERSION_ONE)
    assert raw.exactly(8) == VERSION_ONE
    raw.line("(Subscribe orders From_current)")
    kind, payload = raw.frame()
    assert (kind, payload) == (ERROR, b"Connect must come first")
    raw.line("(Connect 1 late)")
    assert subscribe(raw, "orders") >= 1
    raw.close()


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("(Subscribe orders", "unbalanced"),
        ("(Frobnicate orders)", "Frobnicate"),
        ("(Subscribe orders From_yesterday)", "From_yesterday"),
        ("Connect", ""),
        ('(Publish "" body)', "empty"),
    ],
)
def test_a_bad_line_gets_an_error_frame_and_the_connection_stays(
    connect: Callable[..., Raw], line: str, says: str
) -> None:
    raw = connect()
    raw.line(line)
    kind, payload = raw.frame()
    assert kind == ERROR
    assert says.lower() in payload.decode().lower()
    assert subscribe(raw, "still.here") >= 1


def test_connect_twice_or_with_another_version_is_an_error(connect: Callable[..., Raw]) -> None:
    raw = connect()
    raw.line("(Connect 1 again)")
    assert raw.frame() == (ERROR, b"already connected")
    other = connect("other")
    # A fresh connection that names version 2 in Connect (after a version-1 handshake) is refused politely.
    fresh = Raw(other.sock.getpeername())
    fresh.send(VERSION_ONE)
    assert fresh.exactly(8) == VERSION_ONE
    fresh.line("(Connect 2 confused)")
    kind, payload = fresh.frame()
    assert kind == ERROR
    assert b"version 2" in payload
    fresh.close()


def test_subscribed_and_unsubscribed_carry_the_topic_id_and_name(
    broker: Broker, connect: Callable[..., Raw]
) -> None:
    raw = connect()
    topic_id = subscribe(raw, "orders")
    assert topic_id == broker.engine.topics[b"orders"].topic_id
    raw.line("(Unsubscribe orders)")
    kind, payload = raw.frame()
    assert kind == UNSUBSCRIBED
    assert record(payload) == (topic_id, b"orders")
    assert broker.engine.topics[b"orders"].subscriptions == []
    raw.line("(Unsubscribe orders)")
    kind, payload = raw.frame()
    assert kind == ERROR
    assert b"not subscribed" in payload


def test_topic_ids_of_persistent_topics_are_stable_across_a_restart(
    start_broker: Callable[..., Broker]
) -> None:
    first = start_broker(topics=RULES)
    raw = Raw(first.gateway_address("sexp"))
    raw.send(VERSION_ONE + b"(Connect 1 a)\n")
    assert raw.exactly(8) == VERSION_ONE
    ids = {name: subscribe(raw, name) for name in ("scratch", "log.b", "log.a")}
    raw.close()
    first.stop()
    time.sleep(0.3)  # the data directory is unlocked when the first broker's loop has closed its store
    second = start_broker(topics=RULES)
    again = Raw(second.gateway_address("sexp"))
    again.send(VERSION_ONE + b"(Connect 1 b)\n")
    assert again.exactly(8) == VERSION_ONE
    assert subscribe(again, "log.a") == ids["log.a"]
    assert subscribe(again, "log.b") == ids["log.b"]
    assert subscribe(again, "fresh") not in ids.values()
    again.close()


# -------------------------------------------------------------------------------------------- one engine


def test_mc0_publishes_reach_sexp_subscribers_with_the_same_ids(
    broker: Broker, connect: Callable[..., Raw]
) -> None:
    raw = connect()
    topic_id = subscribe(raw, "log.shared")
    with mc0_client(broker) as client:
        confirmed = [client.publish("log.shared", f"m{n}", confirm=True)["MESSAGE-ID"] for n in range(5)]
    received = [message(raw.frame()[1]) for _ in range(5)]
    assert [str(message_id) for message_id, _, _ in received] == confirmed
    assert {tid for _, tid, _ in received} == {topic_id}
    assert [body for _, _, body in received] == [b"m%d" % n for n in range(5)]


def test_sexp_publishes_reach_mc0_subscribers_and_sexp_subscribers_alike(
    broker: Broker, connect: Callable[..., Raw]
) -> None:
    listener = connect("listener")
    subscribe(listener, "log.mixed")
    publisher = connect("publisher")
    with mc0_client(broker) as client:
        client.subscribe("log.mixed")
        publisher.line('(Publish log.mixed "hello \\"world\\"\\n\\255")')
        got = client.receive(timeout=WAIT)
        assert got is not None
        assert got.body == b'hello "world"\n\xff'
        assert got.id == 1
    assert message(listener.frame()[1])[::2] == (1, b'hello "world"\n\xff')


def test_replay_modes_on_a_persistent_topic(broker: Broker, connect: Callable[..., Raw]) -> None:
    with mc0_client(broker) as client:
        for n in range(1, 6):
            client.publish("log.replay", f"m{n}", confirm=True)
    modes = {"From_beginning": [1, 2, 3, 4, 5], "(From_message 3)": [3, 4, 5], "From_current": []}
    readers = {}
    for mode, expected in modes.items():
        raw = readers[mode] = connect()
        subscribe(raw, "log.replay", mode)
        assert [message(raw.frame()[1])[0] for _ in expected] == expected
    with mc0_client(broker) as client:
        client.publish("log.replay", "live", confirm=True)
    for raw in readers.values():
        assert message(raw.frame()[1]) [::2] == (6, b"live")  # every mode goes live after its catch-up


@pytest.mark.parametrize("mode", ["From_beginning", "(From_message 1)"])
def test_replay_on_a_transient_topic_is_an_error_frame(connect: Callable[..., Raw], mode: str) -> None:
    raw = connect()
    raw.line(f"(Subscribe plain {mode})")
    kind, payload = raw.frame()
    assert kind == ERROR
    assert b"transient" in payload
    assert subscribe(raw, "plain") >= 1, "From_current is fine, and the connection stayed"


def test_round_robin_topics_share_messages_between_sexp_and_mc0_consumers(
    broker: Broker, connect: Callable[..., Raw]
) -> None:
    first, second = connect("w1"), connect("w2")
    subscribe(first, "q.jobs")
    subscribe(second, "q.jobs")
    with mc0_client(broker) as worker, mc0_client(broker) as publisher:
        worker.subscribe("q.jobs")
        for n in range(30):
            publisher.publish("q.jobs", f"job{n}")
        publisher.flush()
        bodies = [message(first.frame()[1])[2] for _ in range(10)]
        bodies += [message(second.frame()[1])[2] for _ in range(10)]
        for _ in range(10):
            got = worker.receive(timeout=WAIT)
            assert got is not None
            bodies.append(got.body)
        assert sorted(bodies) == sorted(b"job%d" % n for n in range(30)), "each job exactly once"
        assert first.nothing_for(0.2)
        assert second.nothing_for(0.2)


def test_a_closed_consumer_leaves_its_topics(broker: Broker, connect: Callable[..., Raw]) -> None:
    raw = connect()
    subscribe(raw, "q.gone")
    raw.close()
    deadline = time.monotonic() + WAIT
    while broker.engine.topics[b"q.gone"].subscriptions and time.monotonic() < deadline:
        time.sleep(0.02)
    assert broker.engine.topics[b"q.gone"].subscriptions == []


# ---------------------------------------------------------------------------------------------- liveness


def test_pings_arrive_and_a_client_that_answers_stays(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(sexp_ping_interval=0.2)
    raw = Raw(broker.gateway_address("sexp"))
    raw.send(VERSION_ONE + b"(Connect 1 lively)\n")
    assert raw.exactly(8) == VERSION_ONE
    start = time.time()
    for _ in range(6):  # 1.2 s: three times the silence that drops a client
        kind, payload = raw.frame(skip_pings=False)
        assert kind == PING
        (seconds,) = struct.unpack(">I", payload)
        assert abs(seconds - time.time()) <= 2
        raw.line(f"(Ack {seconds})")
    assert time.time() - start >= 0.8
    assert broker.hub.stats()["connections"]["sexp"] == 1
    raw.close()


def test_a_client_that_stops_answering_is_dropped_with_its_subscriptions(
    start_broker: Callable[..., Broker]
) -> None:
    broker = start_broker(sexp_ping_interval=0.2)
    raw = Raw(broker.gateway_address("sexp"))
    raw.send(VERSION_ONE + b"(Connect 1 mute)\n(Subscribe mute.topic From_current)\n")
    assert raw.exactly(8) == VERSION_ONE
    assert raw.frame()[0] == SUBSCRIBED
    began = time.monotonic()
    assert raw.closed_within(3.0), "a silent client is dropped after two ping intervals"
    assert time.monotonic() - began >= 0.35
    stats = broker.hub.stats()
    assert stats["doors"]["sexp"]["expired"] == 1
    assert stats["topics"]["mute.topic"]["subscribers"] == 0
    raw.close()


def test_a_client_that_never_completes_the_handshake_is_dropped(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(sexp_ping_interval=0.2)
    raw = Raw(broker.gateway_address("sexp"))
    raw.send(b"\x00\x00\x00")  # three bytes of eight
    assert raw.closed_within(3.0)
    raw.close()


# ------------------------------------------------------------------------------------------- flow control


def test_a_subscriber_that_stops_reading_gets_every_message_of_a_persistent_topic_later(
    broker: Broker, connect: Callable[..., Raw]
) -> None:
    raw = connect("sleepy")
    subscribe(raw, "log.flood")
    count = 2000
    body = b"x" * 16_000  # 32 MB: far more than the kernel's buffers and the gateway's high-water mark
    with mc0_client(broker) as client:
        for _ in range(count):
            client.publish("log.flood", body)
        client.flush()
        client.publish("log.flood", b"last", confirm=True)
    ids = []
    while len(ids) < count + 1:
        kind, payload = raw.frame(timeout=10)
        assert kind == MESSAGE
        ids.append(message(payload)[0])
    assert ids == list(range(1, count + 2)), "every message once and in order, none dropped"
    stats = broker.hub.stats()
    assert stats["topics"]["log.flood"]["dropped"] == 0
    assert stats["doors"]["sexp"]["paused"] >= 1, "the transport was meant to fill up"


def test_a_subscriber_that_stops_reading_a_transient_topic_loses_the_overflow_and_it_is_counted(
    start_broker: Callable[..., Broker]
) -> None:
    broker = start_broker(pending_limit=100)
    raw = Raw(broker.gateway_address("sexp"))
    raw.send(VERSION_ONE + b"(Connect 1 sleepy)\n")
    assert raw.exactly(8) == VERSION_ONE
    subscribe(raw, "flood")
    count = 2000
    with mc0_client(broker) as client:
        for _ in range(count):
            client.publish("flood", b"x" * 16_000)
        client.publish("flood", b"last", confirm=True)
    received = 0
    while True:  # the newest messages are the ones that did not fit: read until the stream stops
        try:
            kind, _ = raw.frame(timeout=1.0)
        except AssertionError:
            break
        assert kind == MESSAGE
        received += 1
    dropped = broker.hub.stats()["topics"]["flood"]["dropped"]
    assert dropped > 0, "the gateway's bounded buffer was meant to overflow"
    assert received + dropped == count + 1, "what was not delivered was counted, nothing else went missing"


# --------------------------------------------------------------------------------------------- the doors


def test_stats_count_sexp_connections(broker: Broker, connect: Callable[..., Raw]) -> None:
    connect("a")
    subscribe(connect("b"), "counted")
    stats = broker.hub.stats()
    assert stats["connections"]["sexp"] == 2
    assert stats["doors"]["sexp"]["accepted"] == 2
    host, port = broker.gateway_address("sexp")
    assert stats["doors"]["sexp"]["address"] == f"{host}:{port}"


def test_the_gateway_can_be_turned_off(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(sexp="off")
    assert "sexp" not in broker.gateways
    assert "sexp" not in broker.hub.stats()["connections"]


# ------------------------------------------------------------------------------------ the client and CLI


def test_the_client_library_subscribes_replays_publishes_and_reports_errors(broker: Broker) -> None:
    address = broker.gateway_address("sexp")
    with SexpClient(*address, client_id="lib") as publisher:
        for n in range(3):
            publisher.publish("log.lib", f"m{n}")
    with SexpClient(*address, client_id="reader") as reader:
        topic_id = reader.subscribe("log.lib", replay="beginning")
        got = [reader.receive(timeout=WAIT) for _ in range(3)]
        assert [(m.id, m.topic, m.topic_id, m.body) for m in got if m] == [
            (n + 1, b"log.lib", topic_id, b"m%d" % n) for n in range(3)
        ]
        assert reader.receive(timeout=0.1) is None
        with pytest.raises(ConnectorError, match="transient"):
            reader.subscribe("plain.lib", replay="beginning")
        reader.unsubscribe("log.lib")
        with pytest.raises(ConnectorError, match="not subscribed"):
            reader.unsubscribe("log.lib")


def test_the_client_answers_pings(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(sexp_ping_interval=0.2)
    with SexpClient(*broker.gateway_address("sexp")) as client:
        client.subscribe("kept")
        assert client.receive(timeout=1.0) is None  # 5 ping intervals, answered while waiting
        assert client.pings >= 3
        assert broker.hub.stats()["connections"]["sexp"] == 1


def test_the_client_refuses_a_version_the_broker_does_not_speak(broker: Broker) -> None:
    with pytest.raises(ConnectorError, match="version 7"):
        SexpClient(*broker.gateway_address("sexp"), version=7)


def test_cli_sexp_pub_and_sub(broker: Broker) -> None:
    host, port = broker.gateway_address("sexp")
    runner = CliRunner()
    published = runner.invoke(main, ["sexp", "pub", "log.cli", "--broker", f"{host}:{port}"],
                              input="one\ntwo\n")
    assert published.exit_code == 0, published.output
    received = runner.invoke(main, ["sexp", "sub", "log.cli", "--broker", f"{host}:{port}", "--replay",
                                    "beginning", "--count", "2", "--json"])
    assert received.exit_code == 0, received.output
    lines = received.output.splitlines()
    assert [line for line in lines if '"body"' in line] == [
        f'{{"topic": "log.cli", "topic_id": {broker.engine.topics[b"log.cli"].topic_id}, "id": {n}, '
        f'"body": "{body}"}}' for n, body in ((1, "one"), (2, "two"))
    ]


def test_cli_sexp_to_a_closed_port_is_one_line(runner_port: int) -> None:
    result = CliRunner().invoke(main, ["sexp", "sub", "t", "--broker", f"127.0.0.1:{runner_port}"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "Error: cannot connect" in result.output


@pytest.fixture
def runner_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
