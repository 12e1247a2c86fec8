"""The reactive-streams door on real sockets: the hellos, demand (never more elements than requested, on
transient, persistent and round-robin topics), replay and message ids, request(0), cancel, split elements,
publishing through an offered publisher with backpressure (demand re-opened only after the commit, more than
requested refused), goodbye, protocol errors, and one engine behind every door.

The raw client here writes and reads the bytes with a few lines of its own (:class:`Raw`), not the codec
under test; :mod:`connector.rstreams_client` is used where a test is about the door, not the bytes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner
from conftest import RawStream

from broker.server import Broker
from broker.topics import Delivery, Persistence, TopicRule, TopicSpec
from connector import Client, ConnectorError
from connector.cli import main
from connector.msgq_client import MsgqClient
from connector.rstreams_client import RStreamsClient
from connector.sexp_client import SexpClient

WAIT = 3.0
QUIET = 0.3
RULES = (TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT)),
         TopicRule("q.*", TopicSpec(delivery=Delivery.ROUND_ROBIN)))
# Message codes (our choice, docs/rstreams.md).
CLIENT_HELLO, SERVER_HELLO, GOODBYE, SUBSCRIBE, REQUEST, CANCEL, ON_SUBSCRIBE, ON_NEXT = range(8)
ON_COMPLETE, ON_ERROR, ON_NEXT_PACKED, ON_NEXT_PART, ON_NEXT_LAST_PART, OFFER = range(8, 14)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return varint(len(raw)) + raw


class Raw(RawStream):
    """Writes messages from their fields and reads them back as ``(code, fields...)`` tuples."""

    def __init__(self, address: tuple[str, int], hello: bool = True,
                 extensions: tuple[int, ...] = (1,)) -> None:
        super().__init__(address, WAIT)
        if hello:
            self.send(CLIENT_HELLO, b"\x00" + varint(len(extensions)) + b"".join(map(varint, extensions)))
            assert self.read() == (SERVER_HELLO, 0, (1,))

    def send(self, code: int, payload: bytes = b"") -> None:
        self.sock.sendall(bytes([code]) + payload)

    def _varint(self, deadline: float) -> int:
        value = shift = 0
        while True:
            assert self._fill(1, deadline), "a varint did not arrive"
            byte, self.buffer = self.buffer[0], self.buffer[1:]
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    def _bytes(self, deadline: float) -> bytes:
        size = self._varint(deadline)
        assert self._fill(size, deadline)
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read(self, timeout: float = WAIT) -> tuple | None:
        deadline = time.monotonic() + timeout
        if not self._fill(1, deadline):
            return None
        code, self.buffer = self.buffer[0], self.buffer[1:]
        if code == SERVER_HELLO:
            assert self._fill(1, deadline)
            version, self.buffer = self.buffer[0], self.buffer[1:]
            return code, version, tuple(self._varint(deadline) for _ in range(self._varint(deadline)))
        if code == GOODBYE:
            return code, self._bytes(deadline).decode()
        if code == SUBSCRIBE:
            return code, self._bytes(deadline).decode(), self._varint(deadline), self._varint(deadline)
        if code in (REQUEST, ON_SUBSCRIBE):
            return code, self._varint(deadline), self._varint(deadline)
        if code in (CANCEL, ON_COMPLETE):
            return code, self._varint(deadline)
        if code == ON_ERROR:
            return code, self._varint(deadline), self._bytes(deadline).decode()
        if code == ON_NEXT:
            return code, self._varint(deadline), self._bytes(deadline)
        if code in (ON_NEXT_PART, ON_NEXT_LAST_PART):
            return code, self._varint(deadline), self._varint(deadline), self._bytes(deadline)
        raise AssertionError(f"unexpected message code {code}")

    def elements(self, stream: int, timeout: float = QUIET) -> list[bytes]:
        """Every onNext of ``stream`` until the line goes quiet."""
        out = []
        while (message := self.read(timeout)) is not None:
            assert message[:2] == (ON_NEXT, stream), message
            out.append(message[2])
        return out

    def subscribe(self, publisher: str, stream: int, demand: int = 0) -> tuple:
        self.send(SUBSCRIBE, string(publisher) + varint(stream) + varint(demand))
        reply = self.read()
        assert reply is not None
        return reply

    def request(self, stream: int, demand: int) -> None:
        self.send(REQUEST, varint(stream) + varint(demand))


@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker(topics=RULES)


@pytest.fixture
def raw(broker: Broker) -> Iterator[Callable[..., Raw]]:
    opened: list[Raw] = []

    def open_raw(**kwargs: object) -> Raw:
        peer = Raw(broker.gateway_address("rstreams"), **kwargs)  # type: ignore[arg-type]
        opened.append(peer)
        return peer

    yield open_raw
    for peer in opened:
        peer.close()


def publish(broker: Broker, topic: str, count: int, size: int = 0) -> list[str]:
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        ids = [client.publish(topic, (b"m%d" % n).ljust(size, b"."), confirm=True)["MESSAGE-ID"]
               for n in range(count)]
    return ids


# -------------------------------------------------------------------------------------------- handshake


def test_the_server_says_hello_first_and_refuses_another_version(broker: Broker) -> None:
    early = Raw(broker.gateway_address("rstreams"), hello=False)
    assert early.read() == (SERVER_HELLO, 0, (1,)), "the loose handshake: the broker does not wait"
    early.send(CLIENT_HELLO, b"\x07\x00")
    reply = early.read()
    assert reply is not None
    assert reply[0] == GOODBYE
    assert "version 7" in reply[1]
    assert early.closed_within(WAIT)
    early.close()


def test_a_protocol_error_gets_goodbye_and_close(raw: Callable[..., Raw]) -> None:
    peer = raw()
    peer.send(0x7F)
    reply = peer.read()
    assert reply is not None
    assert reply[0] == GOODBYE
    assert reply[1].startswith("protocol error")
    assert peer.closed_within(WAIT)


def test_goodbye_is_answered_and_closes_every_stream(broker: Broker, raw: Callable[..., Raw]) -> None:
    peer = raw()
    assert peer.subscribe("q.bye", 1, 5)[0] == ON_SUBSCRIBE
    peer.send(GOODBYE, string("done"))
    assert peer.read()[0] == GOODBYE  # type: ignore[index]
    assert peer.closed_within(WAIT)
    deadline = time.monotonic() + WAIT
    while broker.hub.stats()["topics"]["q.bye"]["subscribers"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert broker.hub.stats()["topics"]["q.bye"]["subscribers"] == 0


# ---------------------------------------------------------------------------------------------- demand


def test_never_more_elements_than_the_demand(broker: Broker, raw: Callable[..., Raw]) -> None:
    peer = raw()
    assert peer.subscribe("demand", 1, 3) == (ON_SUBSCRIBE, 1, 0)
    publish(broker, "demand", 10)
    assert peer.elements(1) == [b"m0", b"m1", b"m2"]
    peer.request(1, 4)
    assert peer.elements(1) == [b"m3", b"m4", b"m5", b"m6"]
    peer.request(1, 100)
    assert peer.elements(1) == [b"m7", b"m8", b"m9"]


@pytest.mark.parametrize("seed", range(3))
def test_random_demand_is_never_exceeded(broker: Broker, raw: Callable[..., Raw], seed: int) -> None:
    chooser = random.Random(seed)
    peer = raw()
    topic = f"log.random{seed}"
    peer.subscribe(topic, 1, 0)
    publish(broker, topic, 60)
    granted = received = 0
    while received < 60:
        step = chooser.randint(1, 15)
        peer.request(1, step)
        granted += step
        received += len(peer.elements(1, timeout=0.15))
        assert received <= granted, "more elements than the total demand"
        assert received == min(granted, 60), "everything the demand allowed arrived"


def test_a_persistent_topic_keeps_what_demand_does_not_allow_in_the_log(
    start_broker: Callable[..., Broker]
) -> None:
    broker = start_broker(topics=RULES, pending_limit=20)
    peer = Raw(broker.gateway_address("rstreams"))
    peer.subscribe("log.slow", 1, 0)
    publish(broker, "log.slow", 100)
    assert peer.elements(1) == []
    peer.request(1, rstreams_unbounded())
    assert peer.elements(1) == [b"m%d" % n for n in range(100)], "nothing dropped, nothing out of order"
    assert broker.hub.stats()["topics"]["log.slow"]["dropped"] == 0
    peer.close()


def test_a_transient_topic_buffers_a_bounded_number_and_counts_the_drops(
    start_broker: Callable[..., Broker]
) -> None:
    broker = start_broker(topics=RULES, pending_limit=20)
    peer = Raw(broker.gateway_address("rstreams"))
    peer.subscribe("flood", 1, 0)
    publish(broker, "flood", 100)
    peer.request(1, 1000)
    got = peer.elements(1)
    assert got == [b"m%d" % n for n in range(20)], "the buffer keeps the first pending_limit"
    assert broker.hub.stats()["topics"]["flood"]["dropped"] == 80
    peer.close()


def rstreams_unbounded() -> int:
    return 2**63 - 1


def test_request_zero_ends_the_stream_with_on_error(raw: Callable[..., Raw]) -> None:
    peer = raw()
    peer.subscribe("zero", 1, 1)
    peer.request(1, 0)
    reply = peer.read()
    assert reply is not None
    assert reply[:2] == (ON_ERROR, 1)
    assert "0" in reply[2]
    assert peer.subscribe("zero", 1, 1)[0] == ON_SUBSCRIBE, "the id may be used again, the connection stayed"


def test_cancel_stops_delivery(broker: Broker, raw: Callable[..., Raw]) -> None:
    peer = raw()
    peer.subscribe("cancelled", 1, 100)
    publish(broker, "cancelled", 2)
    assert len(peer.elements(1)) == 2
    peer.send(CANCEL, varint(1))
    time.sleep(0.1)
    publish(broker, "cancelled", 2)
    assert peer.elements(1) == []


def test_a_stream_id_in_use_is_a_protocol_error(raw: Callable[..., Raw]) -> None:
    peer = raw()
    peer.subscribe("twice", 1, 0)
    reply = peer.subscribe("twice", 1, 0)
    assert reply[0] == GOODBYE
    assert "in use" in reply[1]


def test_round_robin_demand_is_the_queue_credit(broker: Broker, raw: Callable[..., Raw]) -> None:
    first, second = raw(), raw()
    first.subscribe("q.jobs", 1, 2)
    second.subscribe("q.jobs", 1, 0)
    with Client(broker.endpoint, curve=False, timeout=WAIT) as worker:
        worker.subscribe("q.jobs")
        publish(broker, "q.jobs", 12)
        from_first = first.elements(1)
        assert len(from_first) == 2, "only what it asked for"
        assert second.elements(1) == [], "no demand, nothing handed to it"
        rest = []
        while (message := worker.receive(timeout=QUIET)) is not None:
            rest.append(message.body)
    assert sorted(from_first + rest) == sorted(b"m%d" % n for n in range(12)), "each job exactly once"


# ------------------------------------------------------------------------------------ replay, ids, parts


def test_replay_and_message_ids(broker: Broker, raw: Callable[..., Raw]) -> None:
    ids = publish(broker, "log.replay", 5)
    peer = raw()
    peer.subscribe("log.replay?replay=3&ids=1", 1, 100)
    got = peer.elements(1)
    assert [int.from_bytes(element[:8], "big") for element in got] == [3, 4, 5]
    assert [element[8:] for element in got] == [b"m2", b"m3", b"m4"]
    assert ids == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("publisher", ["plain?replay=beginning", "q.jobs?replay=1", "x?replay=yesterday",
                                       "x?colour=blue", "?replay=current"])
def test_a_refused_subscription_is_on_error_and_the_connection_stays(
    raw: Callable[..., Raw], publisher: str
) -> None:
    peer = raw()
    reply = peer.subscribe(publisher, 1, 1)
    assert reply[:2] == (ON_ERROR, 1)
    assert peer.subscribe("fine", 2, 1)[0] == ON_SUBSCRIBE


def test_large_elements_are_split_into_parts(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(rstreams_part_size=1000)
    peer = Raw(broker.gateway_address("rstreams"))
    peer.subscribe("big", 1, 1)
    body = bytes(range(256)) * 20  # 5,120 bytes: six parts of at most 1,000
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        client.publish("big", body, confirm=True)
    parts = []
    while True:
        message = peer.read()
        assert message is not None
        assert message[0] in (ON_NEXT_PART, ON_NEXT_LAST_PART)
        assert all(len(data) <= 1000 for *_, data in [message])
        parts.append(message[3])
        if message[0] == ON_NEXT_LAST_PART:
            break
    assert len(parts) == 6
    assert b"".join(parts) == body
    peer.close()


# ---------------------------------------------------------------------------------------------- publishing


def test_an_offered_publisher_gets_demand_and_its_elements_reach_the_other_doors(
    broker: Broker, raw: Callable[..., Raw]
) -> None:
    with Client(broker.endpoint, curve=False, timeout=WAIT) as mc0, \
            SexpClient(*broker.gateway_address("sexp")) as sexp, \
            MsgqClient(*broker.gateway_address("msgq")) as msgq:
        mc0.subscribe("log.offered")
        sexp.subscribe("log.offered")
        msgq.subscribe("log.offered")
        producer = raw()
        producer.send(OFFER, string("log.offered"))
        reply = producer.read()
        assert reply is not None
        code, publisher, subscription, demand = reply
        assert (code, publisher, demand) == (SUBSCRIBE, "log.offered", 1024)
        producer.send(ON_SUBSCRIBE, varint(subscription) + varint(0))
        producer.send(ON_NEXT, varint(subscription) + string(b"first"))
        got = mc0.receive(timeout=WAIT)
        assert got is not None
        assert (got.id, got.body) == (1, b"first")
        through_sexp = sexp.receive(timeout=WAIT)
        assert through_sexp is not None
        assert (through_sexp.id, through_sexp.body) == (1, b"first")
        through_msgq = msgq.receive(timeout=WAIT)
        assert through_msgq is not None
        assert (through_msgq.msg, through_msgq.extra[b"msgid"]) == (b"first", b"1")
        assert producer.read() == (REQUEST, subscription, 1), "demand re-opened once the element was stored"


def test_more_elements_than_requested_is_a_protocol_error(raw: Callable[..., Raw]) -> None:
    producer = raw()
    producer.send(OFFER, string("greedy"))
    _, _, subscription, demand = producer.read()  # type: ignore[misc]
    producer.send(ON_SUBSCRIBE, varint(subscription) + varint(0))
    element = varint(subscription) + string(b"x")
    producer.sock.sendall((bytes([ON_NEXT]) + element) * (demand + 1))
    while (message := producer.read()) is not None:
        if message[0] == GOODBYE:
            assert "more than requested" in message[1]
            break
        assert message[0] == REQUEST
    else:
        pytest.fail("no goodbye")
    assert producer.closed_within(WAIT)


def test_an_offer_is_taken_once_the_broker_listed_the_extension(broker: Broker) -> None:
    """The draft: a new message type may be sent once the other side's hello confirmed the extension; the
    client listing it too is not required."""
    peer = Raw(broker.gateway_address("rstreams"), extensions=())
    peer.send(OFFER, string("t"))
    reply = peer.read()
    assert reply is not None
    assert reply[0] == SUBSCRIBE, "the broker's hello listed the extension: an offer is understood"
    peer.close()


# ------------------------------------------------------------------------------------- the client and CLI


def test_the_client_library_subscribes_with_demand_and_publishes_with_backpressure(broker: Broker) -> None:
    address = broker.gateway_address("rstreams")
    with RStreamsClient(*address) as consumer, RStreamsClient(*address) as producer:
        stream = consumer.subscribe("log.lib", demand=2, ids=True)
        producer.offer("log.lib")
        assert producer.demand("log.lib") == 1024
        for n in range(5):
            producer.publish("log.lib", b"e%d" % n)
        first = [consumer.receive(timeout=WAIT) for _ in range(2)]
        assert [(e.id, e.data) for e in first if e] == [(1, b"e0"), (2, b"e1")]
        assert consumer.receive(timeout=QUIET) is None, "demand 2 means two"
        consumer.request(stream, 3)
        rest = [consumer.receive(timeout=WAIT) for _ in range(3)]
        assert [(e.id, e.data) for e in rest if e] == [(3, b"e2"), (4, b"e3"), (5, b"e4")]
        with pytest.raises(ConnectorError, match="transient"):
            consumer.subscribe("plain.lib", replay="beginning")


def test_cli_rstreams_pub_and_sub(broker: Broker) -> None:
    host, port = broker.gateway_address("rstreams")
    where = ["--broker", f"{host}:{port}"]
    runner = CliRunner()
    published = runner.invoke(main, ["rstreams", "pub", "log.cli", *where], input="one\ntwo\nthree\n")
    assert published.exit_code == 0, published.output
    received = runner.invoke(main, ["rstreams", "sub", "log.cli", *where, "--replay", "beginning",
                                    "--demand", "2", "--count", "3", "--json"])
    assert received.exit_code == 0, received.output
    lines = [line for line in received.output.splitlines() if line.startswith("{")]
    assert lines == [f'{{"topic": "log.cli", "id": {n}, "body": "{word}"}}'
                     for n, word in ((1, "one"), (2, "two"), (3, "three"))]


def test_an_offered_publisher_may_send_fixed_size_elements_packed(
    broker: Broker, raw: Callable[..., Raw]
) -> None:
    producer = raw()
    producer.send(OFFER, string("log.packed"))
    _, _, subscription, _ = producer.read()  # type: ignore[misc]
    producer.send(ON_SUBSCRIBE, varint(subscription) + varint(4))
    producer.send(ON_NEXT_PACKED, varint(subscription) + varint(3) + b"aaaabbbbcccc")
    producer.send(ON_NEXT, varint(subscription) + b"dddd")  # fixed size: no length prefix
    assert producer.read() is not None, "more demand once the four were stored"
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        client.subscribe("log.packed", replay="beginning")
        bodies = [message.body for message in [client.receive(timeout=WAIT) for _ in range(4)] if message]
    assert bodies == [b"aaaa", b"bbbb", b"cccc", b"dddd"]


def test_a_fixed_size_topic_is_sent_packed(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(topics=(TopicRule("ticks", TopicSpec(element_size=4)),))
    peer = Raw(broker.gateway_address("rstreams"))
    assert peer.subscribe("ticks", 1, 0) == (ON_SUBSCRIBE, 1, 4)
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        for n in range(5):
            client.publish("ticks", b"t%03d" % n)
        client.publish("ticks", b"last", confirm=True)
    peer.request(1, 5)
    assert peer._fill(1, time.monotonic() + WAIT)
    code, peer.buffer = peer.buffer[0], peer.buffer[1:]
    assert code == ON_NEXT_PACKED
    deadline = time.monotonic() + WAIT
    assert (peer._varint(deadline), peer._varint(deadline)) == (1, 5)
    assert peer._fill(20, deadline)
    assert peer.buffer[:20] == b"t000t001t002t003t004", "count x element size bytes, no length prefixes"
    peer.close()
