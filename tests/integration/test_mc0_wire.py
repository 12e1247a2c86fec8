"""Wire compatibility of the mc0 door on real sockets, spoken by raw pyzmq DEALERs.

Each test plays the part of a client by hand (PROTOCOLS.md section 1, seed 002): the MCollective connector's
frame shapes, OK/ERROR replies, delivery (broadcast, round-robin, to the sender itself), malformed input, our
extensions (EXTENSIONS, MESSAGES/PUTS, MESSAGE-ID/TIMESTAMP, STATS) and the cleanup of a vanished peer.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
import zmq

from broker.topics import Delivery, TopicRule, TopicSpec

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer

    from broker.server import Broker

pytestmark = pytest.mark.timeout(20)

#: How long we listen after a reply to be sure no second reply follows it.
QUIET_AFTER = 0.15

ROUND_ROBIN = (TopicRule("jobs.*", TopicSpec(delivery=Delivery.ROUND_ROBIN)),)


#: A subscriber that holds little: ten messages in its pipe, 16 KiB in its kernel buffer (the sending side's
#: buffer still grows to the kernel's limit: 4 MiB here).
SMALL_RECEIVER = {zmq.RCVHWM: 10, zmq.RCVBUF: 16_384}

def connected(dealer: DealerFactory, broker: Broker, **options: Any) -> Peer:
    peer = dealer(broker.endpoint)
    peer.connect(**options)
    return peer


def json_body(body: bytes | None) -> dict[str, Any]:
    assert body is not None
    return json.loads(body)


def topic_stats(peer: Peer, topic: str) -> dict[str, Any]:
    return peer.stats()["topics"][topic]


# ----------------------------------------------------------------------------------------- the client's shape


def test_real_connector_conversation(broker: Broker, dealer: DealerFactory) -> None:
    """The frames the MCollective 0.3 connector sends, byte for byte, and the replies it waits for."""
    peer = dealer(broker.endpoint)
    connect_id = str(uuid.uuid4()).encode()
    peer.send_raw(b"", b"CONNECT", b"ID", connect_id, b"TTL", b"30000", b"VERSION", b"0.2")
    assert peer.recv_raw() == [b"", b"OK", b"ID", connect_id]
    peer.expect_silence()

    sub_id = str(uuid.uuid4()).encode()
    peer.send_raw(b"", b"SUB", b"ID", sub_id, b"", b"mcollective.discovery agent")
    assert peer.recv_raw() == [b"", b"OK", b"ID", sub_id]
    peer.expect_silence()

    unsub_id = str(uuid.uuid4()).encode()
    peer.send_raw(b"", b"UNSUB", b"ID", unsub_id, b"", b"mcollective.discovery agent")
    assert peer.recv_raw() == [b"", b"OK", b"ID", unsub_id]
    peer.expect_silence()

    peer.send_raw(b"", b"PUT", b"TOPIC", b"mcollective.discovery agent", b"", b"ping")
    peer.expect_silence(0.3)


def test_client_without_delimiter_gets_replies_without_it(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint, delimiter=False)
    peer.send_raw(b"CONNECT", b"VERSION", b"0.3", b"ID", b"1")
    assert peer.recv_raw() == [b"OK", b"ID", b"1"]
    peer.send_raw(b"SUB", b"ID", b"2", b"", b"t")
    assert peer.recv_raw() == [b"OK", b"ID", b"2"]
    peer.send_raw(b"PUT", b"TOPIC", b"t", b"", b"hello")
    assert peer.recv_raw() == [b"MESSAGE", b"TOPIC", b"t", b"", b"hello"]
    peer.send_raw(b"FROB", b"ID", b"3")
    error = peer.recv_raw()
    assert error[0] == b"ERROR", error
    assert b"" not in error
    peer.expect_silence()


def test_first_command_may_be_any_verb(broker: Broker, dealer: DealerFactory) -> None:
    """No CONNECT needed: the broker creates client state on the first command, whatever it is."""
    subscriber = dealer(broker.endpoint)
    subscriber.sub("t")
    publisher = dealer(broker.endpoint)
    publisher.put("t", "no connect")
    assert subscriber.recv().body == b"no connect"


# ---------------------------------------------------------------------------------------------------- CONNECT


@pytest.mark.parametrize("version", ["0.1", "0.2", "0.3"])
def test_supported_versions_are_accepted(broker: Broker, dealer: DealerFactory, version: str) -> None:
    peer = dealer(broker.endpoint)
    reply = peer.connect(ttl=30000, version=version)
    assert reply.frames == [b"OK", b"ID", reply.header("ID")]


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(["CONNECT", "VERSION", "0.4", "TTL", "1000"], id="version-0.4"),
        pytest.param(["CONNECT", "VERSION", "1.0"], id="version-1.0"),
        pytest.param(["CONNECT", "TTL", "1000"], id="no-version"),
        pytest.param(["CONNECT", "VERSION", "0.2", "TTL", "soon"], id="ttl-word"),
        pytest.param(["CONNECT", "VERSION", "0.2", "TTL", "1.5"], id="ttl-fraction"),
        pytest.param(["CONNECT", "VERSION", "0.2", "TTL", "-100"], id="ttl-negative"),
        pytest.param(["CONNECT", "VERSION", "0.2", "TTL", ""], id="ttl-empty"),
    ],
)
def test_refused_connect_gets_error_with_id(broker: Broker, dealer: DealerFactory, frames: list[str]) -> None:
    peer = dealer(broker.endpoint)
    reply = peer.request(*frames, "ID", "abc", quiet=QUIET_AFTER)
    assert reply.verb == b"ERROR", reply.frames
    assert reply.header("ID") == b"abc"
    assert reply.header("MESSAGE"), "an ERROR says why"
    # The same client can still connect properly.
    peer.connect(ttl=30000)


def test_refused_connect_without_id_gets_error_without_id(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint)
    reply = peer.request("CONNECT", "VERSION", "0.4", quiet=QUIET_AFTER)
    assert reply.verb == b"ERROR"
    assert reply.header("ID") is None
    assert reply.header("MESSAGE")


# ----------------------------------------------------------------------------------------- OK, ERROR, neither


@pytest.mark.parametrize(
    ("verb", "rest"),
    [
        pytest.param("NOOP", [], id="NOOP"),
        pytest.param("CONNECT", ["VERSION", "0.2", "TTL", "30000"], id="CONNECT"),
        pytest.param("SUB", ["", "a", "b"], id="SUB"),
        pytest.param("UNSUB", ["", "a"], id="UNSUB"),
        pytest.param("UNSUB", ["", "never-subscribed"], id="UNSUB-unknown"),
        pytest.param("PUT", ["TOPIC", "nobody-listens", "", "body"], id="PUT"),
        pytest.param("DISCONNECT", [], id="DISCONNECT"),
    ],
)
def test_any_command_with_id_gets_exactly_one_ok(
    broker: Broker, dealer: DealerFactory, verb: str, rest: list[str]
) -> None:
    peer = dealer(broker.endpoint)
    reply = peer.request(verb, "ID", "the-id", *rest, quiet=QUIET_AFTER)
    assert reply.verb == b"OK", reply.frames
    assert reply.header("ID") == b"the-id"


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(["NOOP"], id="NOOP"),
        pytest.param(["CONNECT", "VERSION", "0.2", "TTL", "30000"], id="CONNECT"),
        pytest.param(["SUB", "", "a"], id="SUB"),
        pytest.param(["UNSUB", "", "a"], id="UNSUB"),
        pytest.param(["PUT", "TOPIC", "nobody-listens", "", "body"], id="PUT"),
        pytest.param(["DISCONNECT"], id="DISCONNECT"),
    ],
)
def test_commands_without_id_get_no_reply(broker: Broker, dealer: DealerFactory, frames: list[str]) -> None:
    peer = dealer(broker.endpoint)
    peer.send(*frames)
    peer.expect_silence(0.3)
    # The broker did handle it and is still answering this client.
    peer.ok("NOOP")


def test_a_stream_of_commands_gets_one_reply_each_in_order(broker: Broker, dealer: DealerFactory) -> None:
    """OK or ERROR per command with an ID, never both, never a reply to one without ID, in order."""
    peer = dealer(broker.endpoint)
    script: list[tuple[list[str], bytes | None]] = [
        (["CONNECT", "VERSION", "0.2", "TTL", "30000", "ID", "1"], b"OK"),
        (["SUB", "ID", "2", "", "s"], b"OK"),
        (["PUT", "TOPIC", "elsewhere", "", "x"], None),
        (["FROB", "ID", "3"], b"ERROR"),
        (["NOOP"], None),
        (["CONNECT", "VERSION", "0.9", "ID", "4"], b"ERROR"),
        (["SUB", "ID", "5", ""], b"ERROR"),
        (["NOOP", "ID", "6"], b"OK"),
        (["UNSUB", "ID", "7", "", "s"], b"OK"),
        (["OK", "ID", "8"], b"ERROR"),
        (["PUT", "TOPIC", "elsewhere", "ID", "9", "", "y"], b"OK"),
    ]
    for frames, _ in script:
        peer.send(*frames)
    expected = [(verb, frames[frames.index("ID") + 1].encode()) for frames, verb in script if verb]
    replies = [peer.recv() for _ in expected]
    assert [(r.verb, r.header("ID")) for r in replies] == expected
    peer.expect_silence(0.3)


# --------------------------------------------------------------------------------------------------- delivery


def test_sender_gets_its_own_put_with_every_header_but_id(broker: Broker, dealer: DealerFactory) -> None:
    peer = connected(dealer, broker, ttl=30000)
    peer.sub("news")
    peer.send("PUT", "TOPIC", "news", "X-ONE", "1", "ID", "put-1", "X-Two", "zwei", "", "the body")
    replies = [peer.recv(), peer.recv()]
    peer.expect_silence()
    ok = next(r for r in replies if r.verb == b"OK")
    message = next(r for r in replies if r.verb == b"MESSAGE")
    assert ok.header("ID") == b"put-1"
    assert message.headers == {b"TOPIC": b"news", b"X-ONE": b"1", b"X-Two": b"zwei"}
    assert message.positional == [b"the body"]


def test_plain_put_to_self(broker: Broker, dealer: DealerFactory) -> None:
    peer = connected(dealer, broker)
    peer.sub("loop")
    peer.put("loop", "echo")
    message = peer.recv()
    assert message.frames == [b"MESSAGE", b"TOPIC", b"loop", b"", b"echo"]


@pytest.mark.parametrize(
    ("topic", "body"),
    [
        pytest.param(b"collective agent", b"mcollective request", id="spaces"),
        pytest.param(b"\x00\xff\x01 \x80raw\n", bytes(range(256)), id="binary"),
        pytest.param(b"t", b"", id="empty-body"),
        pytest.param("caf\u00e9 \u2603".encode(), b"\x00" * 100_000, id="utf8-topic-large-body"),
    ],
)
def test_topic_and_body_bytes_survive(
    broker: Broker, dealer: DealerFactory, topic: bytes, body: bytes
) -> None:
    subscriber = connected(dealer, broker)
    subscriber.sub(topic)
    publisher = connected(dealer, broker)
    publisher.put(topic, body, {"X-Bin": b"\x00\xfe"})
    message = subscriber.recv()
    assert message.verb == b"MESSAGE"
    assert message.headers == {b"TOPIC": topic, b"X-Bin": b"\x00\xfe"}
    assert message.positional == [body]


def test_put_with_several_body_frames_is_joined(broker: Broker, dealer: DealerFactory) -> None:
    peer = connected(dealer, broker)
    peer.sub("parts")
    peer.send("PUT", "TOPIC", "parts", "", "ab", "cd")
    assert peer.recv().positional == [b"abcd"]


def test_broadcast_reaches_every_subscriber_in_order(broker: Broker, dealer: DealerFactory) -> None:
    subscribers = [connected(dealer, broker) for _ in range(3)]
    for subscriber in subscribers:
        subscriber.sub("fan")
    bystander = connected(dealer, broker)
    bystander.sub("other")
    publisher = connected(dealer, broker)
    bodies = [b"m%d" % n for n in range(20)]
    for body in bodies:
        publisher.put("fan", body)
    for subscriber in subscribers:
        got = [subscriber.recv() for _ in bodies]
        assert [m.body for m in got] == bodies
        assert all(m.header("TOPIC") == b"fan" for m in got)
        subscriber.expect_silence()
    publisher.expect_silence()
    bystander.expect_silence()


def test_round_robin_strict_rotation(start_broker: BrokerFactory, dealer: DealerFactory) -> None:
    broker = start_broker(topics=ROUND_ROBIN)
    consumers = [connected(dealer, broker) for _ in range(3)]
    for consumer in consumers:
        consumer.sub("jobs.build")
    publisher = connected(dealer, broker)
    for n in range(12):
        publisher.put("jobs.build", b"job-%d" % n)
    for index, consumer in enumerate(consumers):
        got = [consumer.recv().body for _ in range(4)]
        assert got == [b"job-%d" % n for n in range(index, 12, 3)]
        consumer.expect_silence()
    stats = topic_stats(publisher, "jobs.build")
    assert stats["delivery"] == "round-robin"
    assert stats["messages_in"] == 12
    assert stats["messages_out"] == 12


def test_round_robin_holds_messages_until_a_consumer_subscribes(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    broker = start_broker(topics=ROUND_ROBIN)
    publisher = connected(dealer, broker)
    for n in range(5):
        publisher.put("jobs.later", b"held-%d" % n)
    assert topic_stats(publisher, "jobs.later")["backlog"] == 5

    first = connected(dealer, broker)
    first.sub("jobs.later")
    assert [first.recv().body for _ in range(5)] == [b"held-%d" % n for n in range(5)]
    first.expect_silence()

    # A second consumer joins: from now on the two alternate, each message to exactly one of them.
    second = connected(dealer, broker)
    second.sub("jobs.later")
    for n in range(6):
        publisher.put("jobs.later", b"live-%d" % n)
    got_first = [m.body for m in first.drain(0.3)]
    got_second = [m.body for m in second.drain(0.3)]
    assert sorted(got_first + got_second) == sorted(b"live-%d" % n for n in range(6))
    assert len(got_first) == len(got_second) == 3
    assert topic_stats(publisher, "jobs.later")["backlog"] == 0


def test_round_robin_topic_does_not_deliver_to_other_topics(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    broker = start_broker(topics=ROUND_ROBIN)
    consumer = connected(dealer, broker)
    consumer.sub("jobs.a")
    broadcast = [connected(dealer, broker) for _ in range(2)]
    for peer in broadcast:
        peer.sub("plain")
    publisher = connected(dealer, broker)
    publisher.put("plain", "both get it")
    publisher.put("jobs.a", "only one")
    assert [p.recv().body for p in broadcast] == [b"both get it"] * 2
    assert consumer.recv().body == b"only one"
    consumer.expect_silence()


@pytest.mark.usefixtures("each_engine")
def test_slow_subscriber_gets_everything_soon_after_it_reads_again(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    """Small pipes fill up while the subscriber does not read; the broker keeps what did not fit and writes
    it as soon as there is room again, not one pipe-full per heartbeat tick."""
    broker = start_broker(send_hwm=10, heartbeat_tick=1.0)
    subscriber = dealer(broker.endpoint, options=SMALL_RECEIVER)
    subscriber.sub("slow")
    publisher = connected(dealer, broker)
    count = 2000
    for n in range(count):  # 10 MB: more than the kernel's socket buffers hold (the send side's: 4 MiB)
        publisher.put("slow", b"%d." % n + bytes(5_000))
    publisher.ok("NOOP")  # every PUT has been handled
    assert publisher.stats()["doors"]["mc0"]["blocked"] >= 1, "the pipe was meant to fill up"
    started = time.monotonic()
    got = [int((subscriber.recv(timeout=1.0).body or b"-1.").split(b".")[0]) for _ in range(count)]
    assert got == list(range(count))
    assert time.monotonic() - started < 3.0
    subscriber.expect_silence()
    assert topic_stats(publisher, "slow")["dropped"] == 0


def test_unsub_stops_delivery(broker: Broker, dealer: DealerFactory) -> None:
    subscriber = connected(dealer, broker)
    subscriber.sub("a", "b")
    subscriber.unsub("a")
    publisher = connected(dealer, broker)
    publisher.put("a", "gone")
    publisher.put("b", "kept")
    assert subscriber.recv().headers[b"TOPIC"] == b"b"
    subscriber.expect_silence()
    assert topic_stats(publisher, "a")["subscribers"] == 0
    assert topic_stats(publisher, "b")["subscribers"] == 1


def test_disconnect_forgets_subscriptions(broker: Broker, dealer: DealerFactory) -> None:
    subscriber = connected(dealer, broker, ttl=30000)
    subscriber.sub("a", "b")
    publisher = connected(dealer, broker)
    assert topic_stats(publisher, "a")["subscribers"] == 1
    reply = subscriber.request("DISCONNECT", "ID", "bye", quiet=QUIET_AFTER)
    assert reply.frames == [b"OK", b"ID", b"bye"]
    publisher.put("a", "x")
    publisher.put("b", "y")
    subscriber.expect_silence(0.3)
    topics = publisher.stats()["topics"]
    assert topics["a"]["subscribers"] == topics["b"]["subscribers"] == 0
    # The same socket may come back, and must subscribe again to receive.
    subscriber.connect(ttl=30000)
    publisher.put("a", "after reconnect")
    subscriber.expect_silence()
    subscriber.sub("a")
    publisher.put("a", "resubscribed")
    assert subscriber.recv().body == b"resubscribed"


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("frames", "command_id"),
    [
        pytest.param(["FROB", "ID", "m1"], b"m1", id="unknown-verb"),
        pytest.param(["frob"], None, id="unknown-verb-no-id"),
        pytest.param(["PUT", "TOPIC", "t", "ID", "m2", "X-ORPHAN"], b"m2", id="header-without-value"),
        pytest.param(["NOOP", "ID"], None, id="id-without-value"),
        pytest.param(["SUB", "ID", "m3"], b"m3", id="sub-without-topics"),
        pytest.param(["SUB", "ID", "m4", ""], b"m4", id="sub-empty-list"),
        pytest.param(["UNSUB", "ID", "m5", ""], b"m5", id="unsub-without-topics"),
        pytest.param(["SUB", "ID", "m6", "", "ok", ""], b"m6", id="sub-empty-topic"),
        pytest.param(["PUT", "ID", "m7", "", "body"], b"m7", id="put-without-topic"),
        pytest.param(["PUT", "TOPIC", "", "ID", "m8", "", "body"], b"m8", id="put-empty-topic"),
        pytest.param(["PUT", "TOPIC", "t", "ID", "m9"], b"m9", id="put-without-body"),
        pytest.param(["NOOP", "ID", "m10", "ID", "m10"], b"m10", id="header-twice"),
        pytest.param(["NOOP", "ID", "m11", "", "extra"], b"m11", id="noop-with-positional"),
        pytest.param(["STATS"], None, id="stats-without-id"),
        pytest.param([], None, id="lone-delimiter"),
    ],
)
def test_malformed_commands_get_error_and_the_client_keeps_working(
    broker: Broker, dealer: DealerFactory, frames: list[str], command_id: bytes | None
) -> None:
    peer = connected(dealer, broker, ttl=30000)
    peer.sub("still")
    reply = peer.request(*frames, quiet=QUIET_AFTER)
    assert reply.verb == b"ERROR", reply.frames
    assert reply.header("ID") == command_id
    assert reply.header("MESSAGE")
    # Same socket, same session: subscriptions survive and commands still work.
    peer.ok("NOOP")
    peer.put("still", "alive")
    assert peer.recv().body == b"alive"


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(["MESSAGE", "TOPIC", "t", "ID", "x1", "", "body"], id="MESSAGE"),
        pytest.param(["OK", "ID", "x1"], id="OK"),
        pytest.param(["ERROR", "MESSAGE", "oops", "ID", "x1"], id="ERROR"),
        pytest.param(["MESSAGES", "ID", "x1", "", msgpack.packb([[b"t", 1, 2, b"b"]])], id="MESSAGES"),
    ],
)
def test_broker_verbs_from_a_client_get_error(
    broker: Broker, dealer: DealerFactory, frames: list[Any]
) -> None:
    peer = connected(dealer, broker)
    peer.sub("t")
    reply = peer.request(*frames, quiet=QUIET_AFTER)
    assert reply.verb == b"ERROR", reply.frames
    assert reply.header("ID") == b"x1", "an ERROR names the command it refuses"
    peer.ok("NOOP")
    peer.expect_silence()  # in particular, the MESSAGE was not delivered to the subscriber


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(
            ["PUT", "TOPIC", "t", "MESSAGE-ID", "999", "ID", "r1", "", "forged"], id="PUT-MESSAGE-ID"
        ),
        pytest.param(["PUT", "TOPIC", "t", "TIMESTAMP", "5", "ID", "r1", "", "forged"], id="PUT-TIMESTAMP"),
        pytest.param(
            ["PUTS", "ID", "r1", "", msgpack.packb([[b"t", b"fine"], [b"t", b"bad", {b"TOPIC": b"u"}]])],
            id="PUTS-TOPIC",
        ),
        pytest.param(["PUTS", "ID", "r1", "", msgpack.packb([[b"t", b"bad", {b"ID": b"i"}]])], id="PUTS-ID"),
        pytest.param(
            ["PUTS", "ID", "r1", "", msgpack.packb([[b"t", b"bad", {b"MESSAGE-ID": b"1"}]])],
            id="PUTS-MESSAGE-ID",
        ),
    ],
)
def test_publishers_cannot_set_delivery_headers(
    broker: Broker, dealer: DealerFactory, frames: list[Any]
) -> None:
    """MESSAGE's TOPIC, MESSAGE-ID and TIMESTAMP come from the broker: a PUT may not double or forge them."""
    subscriber = dealer(broker.endpoint)
    subscriber.connect(extensions="ids")
    subscriber.sub("t")
    publisher = connected(dealer, broker)
    reply = publisher.request(*frames, quiet=QUIET_AFTER)
    assert reply.verb == b"ERROR", reply.frames
    assert reply.header("ID") == b"r1"
    subscriber.expect_silence()  # all or nothing: not even the good part of a batch went out
    publisher.put("t", "clean", {"X-Message-Id": "mine"})
    message = subscriber.recv()
    assert message.header("MESSAGE-ID") == b"1"
    assert message.header("X-Message-Id") == b"mine"


def test_bad_input_from_one_client_does_not_disturb_others(broker: Broker, dealer: DealerFactory) -> None:
    good = connected(dealer, broker)
    good.sub("t")
    bad = dealer(broker.endpoint)
    for frames in (["FROB"], ["PUT"], ["SUB"], ["CONNECT"], ["\xff\xfe"], ["MESSAGES", "", "not msgpack"]):
        bad.send(*frames)
    assert all(r.verb == b"ERROR" for r in (bad.recv() for _ in range(6)))
    bad.put("t", "from the bad one")
    assert good.recv().body == b"from the bad one"


# ----------------------------------------------------------------------------------------------- extensions


def test_batch_extension_messages_and_puts(broker: Broker, dealer: DealerFactory) -> None:
    subscriber = dealer(broker.endpoint)
    reply = subscriber.connect(ttl=30000, extensions="batch ids")
    assert reply.header("EXTENSIONS") == b"batch ids"
    subscriber.sub("batched")

    plain = connected(dealer, broker)
    before = time.time_ns() // 1_000_000
    plain.put("batched", "one", {"X-K": "v"})
    plain.put("batched", "two")
    frames = subscriber.recv_raw()
    assert frames[:3] == [b"", b"MESSAGES", b""]
    assert len(frames) == 4
    entries = msgpack.unpackb(frames[3], raw=True)
    deliveries = list(entries)
    if len(deliveries) == 1:  # the two PUTs may have been handled in two turns of the broker's loop
        deliveries += msgpack.unpackb(subscriber.recv_raw()[3], raw=True)
    after = time.time_ns() // 1_000_000
    assert [d[0] for d in deliveries] == [b"batched", b"batched"]
    assert [d[1] for d in deliveries] == [1, 2]
    assert all(before - 1000 <= d[2] <= after + 1000 for d in deliveries)
    assert [d[3] for d in deliveries] == [b"one", b"two"]
    assert deliveries[0][4] == {b"X-K": b"v"}
    assert len(deliveries[1]) == 4

    # PUTS: many messages in one frame set, confirmed once; ids keep increasing.
    batch = msgpack.packb([[b"batched", b"three"], [b"batched", b"four", {b"X-N": b"4"}]], use_bin_type=True)
    subscriber.send("PUTS", "ID", "p1", "", batch)
    replies = subscriber.drain(0.3)
    ok = [r for r in replies if r.verb == b"OK"]
    assert len(ok) == 1
    assert ok[0].header("ID") == b"p1"
    assert ok[0].header("COUNT") == b"2"
    assert ok[0].header("MESSAGE-ID") == b"4"
    delivered = [e for r in replies if r.verb == b"MESSAGES" for e in msgpack.unpackb(r.body, raw=True)]
    assert [(e[1], e[3]) for e in delivered] == [(3, b"three"), (4, b"four")]
    assert delivered[1][4] == {b"X-N": b"4"}


def test_unknown_extension_tokens_are_ignored(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint)
    assert peer.connect(extensions="frobnicate batch").header("EXTENSIONS") == b"batch"
    other = dealer(broker.endpoint)
    reply = other.connect(extensions="frobnicate")
    assert reply.frames == [b"OK", b"ID", reply.header("ID")]


def test_puts_from_a_plain_client_reach_plain_subscribers(broker: Broker, dealer: DealerFactory) -> None:
    subscriber = connected(dealer, broker)
    subscriber.sub("x", "y")
    publisher = connected(dealer, broker)
    publisher.send("PUTS", "", msgpack.packb([[b"x", b"1"], [b"y", b"2"], [b"x", b"3"]], use_bin_type=True))
    got = [subscriber.recv() for _ in range(3)]
    assert [(m.header("TOPIC"), m.body) for m in got] == [(b"x", b"1"), (b"y", b"2"), (b"x", b"3")]
    assert all(m.header("MESSAGE-ID") is None for m in got)
    publisher.expect_silence()


def test_ids_extension_adds_message_id_and_timestamp(broker: Broker, dealer: DealerFactory) -> None:
    subscriber = dealer(broker.endpoint)
    assert subscriber.connect(extensions="ids").header("EXTENSIONS") == b"ids"
    subscriber.sub("counted")
    publisher = connected(dealer, broker)
    before = time.time_ns() // 1_000_000
    for n in range(3):
        publisher.put("counted", b"n%d" % n, {"X-Seq": n})
    got = [subscriber.recv() for _ in range(3)]
    after = time.time_ns() // 1_000_000
    assert [m.verb for m in got] == [b"MESSAGE"] * 3
    assert [m.header("MESSAGE-ID") for m in got] == [b"1", b"2", b"3"]
    assert all(before - 1000 <= int(m.header("TIMESTAMP") or b"0") <= after + 1000 for m in got)
    assert [m.header("X-Seq") for m in got] == [b"0", b"1", b"2"]
    assert [m.body for m in got] == [b"n0", b"n1", b"n2"]
    # With "ids", an OK for a PUT names the id it got.
    reply = subscriber.ok("PUT", "TOPIC", "counted", "", "mine")
    assert reply.header("MESSAGE-ID") == b"4"
    assert subscriber.recv().header("MESSAGE-ID") == b"4"


def test_stats(broker: Broker, dealer: DealerFactory) -> None:
    subscribers = [connected(dealer, broker) for _ in range(2)]
    for subscriber in subscribers:
        subscriber.sub("counted topic")
    publisher = connected(dealer, broker)
    for n in range(3):
        publisher.put("counted topic", b"%d" % n)
    for subscriber in subscribers:
        assert len([subscriber.recv() for _ in range(3)]) == 3
    reply = publisher.ok("STATS")
    assert reply.positional is not None
    assert len(reply.positional) == 1
    assert reply.header("CONTENT-TYPE") == b"application/json"
    stats = json_body(reply.body)
    assert stats["uptime_seconds"] >= 0
    assert stats["connections"]["mc0"] == 3
    topic = stats["topics"]["counted topic"]
    assert topic["messages_in"] == 3
    assert topic["messages_out"] == 6
    assert topic["subscribers"] == 2


# ------------------------------------------------------------------------------------------ vanished peers


def wait_for_unreachable(publisher: Peer, topic: str, deadline: float = 3.0) -> dict[str, Any]:
    """Publish (with an ID, so the turn is over when the OK comes) until the broker saw the peer gone."""
    end = time.monotonic() + deadline
    while True:
        publisher.ok("PUT", "TOPIC", topic, "", "probe")
        stats = publisher.stats()
        if stats["doors"]["mc0"]["unreachable"] >= 1 or time.monotonic() > end:
            return stats
        time.sleep(0.05)


def test_vanished_subscriber_is_cleaned_up_on_delivery(broker: Broker, dealer: DealerFactory) -> None:
    publisher = connected(dealer, broker)
    vanishing = connected(dealer, broker)
    vanishing.sub("t", "u")
    staying = connected(dealer, broker)
    staying.sub("t")
    stats = publisher.stats()
    assert stats["topics"]["t"]["subscribers"] == 2
    assert stats["connections"]["mc0"] == 3

    vanishing.close()  # no DISCONNECT
    time.sleep(0.2)
    stats = wait_for_unreachable(publisher, "t")
    assert stats["doors"]["mc0"]["unreachable"] == 1
    assert stats["topics"]["t"]["subscribers"] == 1
    assert stats["topics"]["u"]["subscribers"] == 0, "all its subscriptions go, not only the one delivered"
    assert stats["connections"]["mc0"] == 2
    assert all(m.body == b"probe" for m in staying.drain())


def test_vanished_round_robin_consumer_loses_no_message(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    # A slow heartbeat tick: the redelivery must go out in the same turn, not wait for a timer.
    broker = start_broker(topics=ROUND_ROBIN, heartbeat_tick=2.0)
    vanishing = connected(dealer, broker)
    vanishing.sub("jobs.q")
    staying = connected(dealer, broker)
    staying.sub("jobs.q")
    publisher = connected(dealer, broker)
    vanishing.close()
    time.sleep(0.3)
    # It is the vanished consumer's turn: the broker finds it gone and hands the message to the next one.
    publisher.put("jobs.q", b"job-0")
    assert staying.recv(timeout=1.0).body == b"job-0"
    for n in range(1, 4):
        publisher.put("jobs.q", b"job-%d" % n)
    got = [staying.recv(timeout=1.0).body for _ in range(3)]
    assert got == [b"job-%d" % n for n in range(1, 4)]
    staying.expect_silence()
    stats = publisher.stats()
    assert stats["doors"]["mc0"]["unreachable"] == 1
    assert stats["topics"]["jobs.q"]["subscribers"] == 1
    assert stats["topics"]["jobs.q"]["messages_out"] == 4


@pytest.mark.usefixtures("each_engine")
def test_reply_to_a_client_with_a_full_pipe_waits_instead_of_vanishing(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    """A command with an ID always gets its answer: an OK that meets a full pipe is held, in order, and sent
    once the client reads again."""
    broker = start_broker(send_hwm=10, heartbeat_tick=1.0)
    subscriber = dealer(broker.endpoint, options=SMALL_RECEIVER)
    subscriber.sub("full")
    publisher = connected(dealer, broker)
    for n in range(3000):  # 12 MB: more than the pipe and the kernel's socket buffers hold
        publisher.put("full", b"%d" % n + b"." * 4000)
    publisher.ok("NOOP")  # every PUT has been handled, so the subscriber's pipe is full now
    assert publisher.stats()["doors"]["mc0"]["blocked"] >= 1, "the pipe was meant to fill up"
    subscriber.send("NOOP", "ID", "after-the-flood")
    time.sleep(0.2)  # the broker answers while the pipe is still full
    bodies: list[bytes] = []
    reply = None
    deadline = time.monotonic() + 5.0
    while reply is None and time.monotonic() < deadline:
        frames = subscriber.recv(timeout=1.0)
        if frames.verb == b"OK":
            reply = frames
        else:
            bodies.append(frames.body or b"")
    assert reply is not None
    assert reply.header("ID") == b"after-the-flood"
