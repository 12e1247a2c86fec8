"""The msgq door on real sockets: unique local names, getlname first, every routing rule (group and instance
with the wildcard, no duplicates, never back to the sender, ``to`` a local name or ``*``, meonly, promisc),
``from`` checked, working unsubscribe, subscriptions gone on disconnect, stats with real counters, the size
cap, replay on persistent groups, and one engine behind mc0, sexp and msgq (same message ids both ways).

The raw client here encodes and decodes with a few lines of its own (:func:`encode`, :func:`decode`), not the
codec under test; :mod:`connector.msgq_client` is used where a test is about the door, not the bytes.
"""

from __future__ import annotations

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
from connector.msgq_client import MsgqClient
from connector.sexp_client import SexpClient

WAIT = 3.0
QUIET = 0.3
RULES = (TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT)),
         TopicRule("q.*", TopicSpec(delivery=Delivery.ROUND_ROBIN)))


def encode(fields: dict[bytes, bytes | dict | list | None]) -> bytes:
    """A message in the Skan format: u32 length, magic, then tag/item pairs (DATA, HASH, LIST, NULL)."""

    def item(value: bytes | dict | list | None) -> bytes:
        if value is None:
            return b"\x04"
        if isinstance(value, bytes):
            kind, data = 0x01, value
        elif isinstance(value, dict):
            kind, data = 0x02, entries(value)
        else:
            kind, data = 0x03, b"".join(item(v) for v in value)
        if len(data) < 256:
            return bytes([kind | 0x20, len(data)]) + data
        return bytes([kind]) + struct.pack(">I", len(data)) + data

    def entries(hash_: dict) -> bytes:
        return b"".join(bytes([len(tag)]) + tag + item(value) for tag, value in hash_.items())

    body = b"Skan" + entries(fields)
    return struct.pack(">I", len(body)) + body


def decode(message: bytes) -> dict:
    assert message[:4] == b"Skan"

    def item(data: bytes, pos: int) -> tuple[object, int]:
        tylen = data[pos]
        kind, code = tylen & 0x0F, tylen & 0x30
        if kind == 0x04:
            return None, pos + 1
        size_len = {0x20: 1, 0x10: 2, 0x00: 4}[code]
        size = int.from_bytes(data[pos + 1 : pos + 1 + size_len], "big")
        start = pos + 1 + size_len
        chunk = data[start : start + size]
        if kind == 0x01:
            return chunk, start + size
        if kind == 0x02:
            return entries(chunk), start + size
        values, at = [], 0
        while at < len(chunk):
            value, at = item(chunk, at)
            values.append(value)
        return values, start + size

    def entries(data: bytes) -> dict:
        out, at = {}, 0
        while at < len(data):
            tag = data[at + 1 : at + 1 + data[at]]
            out[tag], at = item(data, at + 1 + data[at])
        return out

    return entries(message[4:])


class Raw(RawStream):
    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, WAIT)
        self.held: list[dict] = []  # sends that arrived while waiting for a stats reply

    def send(self, fields: dict) -> None:
        self.sock.sendall(encode(fields))

    def receive(self, timeout: float = WAIT) -> dict | None:
        if self.held:
            return self.held.pop(0)
        return self.from_wire(timeout)

    def from_wire(self, timeout: float = WAIT) -> dict | None:
        deadline = time.monotonic() + timeout
        if not self._fill(4, deadline):
            return None
        (length,) = struct.unpack(">I", self.buffer[:4])
        if not self._fill(4 + length, deadline):
            return None
        message, self.buffer = self.buffer[4 : 4 + length], self.buffer[4 + length :]
        return decode(message)

    def lname(self) -> bytes:
        self.send({b"type": b"getlname"})
        reply = self.receive()
        assert reply is not None
        return reply[b"lname"]

    def barrier(self) -> None:
        """A stats round trip: everything sent before it has been acted on."""
        self.send({b"type": b"stats"})
        while True:
            reply = self.from_wire()
            assert reply is not None, "no stats reply"
            if b"stats" in reply:
                return
            self.held.append(reply)

    def subscribe(self, group: bytes, instance: bytes = b"*", subtype: bytes = b"normal",
                  **extra: bytes) -> None:
        self.send({b"type": b"subscribe", b"group": group, b"instance": instance, b"subtype": subtype,
                   **{k.encode(): v for k, v in extra.items()}})
        self.barrier()



@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker(topics=RULES)


@pytest.fixture
def peer(broker: Broker) -> Iterator[Callable[[], tuple[Raw, bytes]]]:
    opened: list[Raw] = []

    def open_peer() -> tuple[Raw, bytes]:
        raw = Raw(broker.gateway_address("msgq"))
        opened.append(raw)
        return raw, raw.lname()

    yield open_peer
    for raw in opened:
        raw.close()


def send(raw: Raw, sender: bytes, group: bytes, msg: object = b"hi", *, to: bytes = b"*",
         instance: bytes = b"*", seq: bytes = b"1") -> None:
    raw.send({b"type": b"send", b"from": sender, b"to": to, b"group": group, b"instance": instance,
              b"seq": seq, b"msg": msg})


def received(raw: Raw) -> list[dict]:
    """Every send that arrives before the line goes quiet."""
    out = []
    while (message := raw.receive(QUIET)) is not None:
        out.append(message)
    return out


# ----------------------------------------------------------------------------------------- local names


def test_each_connection_gets_its_own_name_and_asking_again_repeats_it(peer: Callable) -> None:
    first, name = peer()
    _, other = peer()
    assert name != other
    assert first.lname() == name


def test_getlname_must_come_first(broker: Broker) -> None:
    raw = Raw(broker.gateway_address("msgq"))
    raw.send({b"type": b"subscribe", b"group": b"g", b"instance": b"*", b"subtype": b"normal"})
    assert raw.closed_within(WAIT)
    assert broker.hub.stats()["doors"]["msgq"]["errors"] == 1
    raw.close()


@pytest.mark.parametrize(
    "fields",
    [{b"type": b"frobnicate"}, {b"type": b"getlname", b"lname": b"me@there"}, {b"no": b"type"}],
    ids=["unknown type", "a reply", "no type"],
)
def test_a_message_the_router_does_not_take_closes_the_connection(
    broker: Broker, peer: Callable, fields: dict
) -> None:
    raw, _ = peer()
    raw.send(fields)
    assert raw.closed_within(WAIT)
    assert broker.hub.stats()["doors"]["msgq"]["errors"] == 1


def test_the_103_byte_example_goes_through_the_door_whole(peer: Callable) -> None:
    listener, _ = peer()
    listener.subscribe(b"example")
    sender, name = peer()
    data = {b"list": [b"1", b"2", None, b"this"], b"description": b"Fun for all"}
    send(sender, name, b"example", data, seq=b"1234")
    [got] = received(listener)
    assert got[b"msg"] == data
    assert (got[b"from"], got[b"to"], got[b"seq"], got[b"group"]) == (name, b"*", b"1234", b"example")


# ------------------------------------------------------------------------------------------------ routing


def test_group_and_instance_with_the_wildcard(peer: Callable) -> None:
    everything, _ = peer()
    everything.subscribe(b"g", b"*")
    only_a, _ = peer()
    only_a.subscribe(b"g", b"a")
    only_b, _ = peer()
    only_b.subscribe(b"g", b"b")
    sender, name = peer()
    send(sender, name, b"g", b"to-a", instance=b"a")
    send(sender, name, b"g", b"to-all", instance=b"*")
    assert [m[b"msg"] for m in received(everything)] == [b"to-a", b"to-all"]
    assert [m[b"msg"] for m in received(only_a)] == [b"to-a", b"to-all"]
    assert [m[b"msg"] for m in received(only_b)] == [b"to-all"]


def test_no_duplicates_when_several_subscriptions_match(peer: Callable) -> None:
    raw, _ = peer()
    raw.subscribe(b"g", b"*")
    raw.subscribe(b"g", b"a")
    raw.subscribe(b"g", b"a", b"promisc")
    sender, name = peer()
    send(sender, name, b"g", instance=b"a")
    assert len(received(raw)) == 1


def test_never_back_to_the_sender(peer: Callable) -> None:
    raw, name = peer()
    raw.subscribe(b"g")
    other, _ = peer()
    other.subscribe(b"g")
    send(raw, name, b"g")
    assert received(raw) == []
    assert len(received(other)) == 1


def test_to_a_local_name_reaches_that_connection_and_promisc_ones_only(peer: Callable) -> None:
    target, target_name = peer()
    target.subscribe(b"g")
    bystander, _ = peer()
    bystander.subscribe(b"g")
    snoop, _ = peer()
    snoop.subscribe(b"g", subtype=b"promisc")
    unsubscribed_target, unsubscribed_name = peer()
    sender, name = peer()
    send(sender, name, b"g", b"direct", to=target_name)
    send(sender, name, b"g", b"nobody", to=unsubscribed_name)
    assert [m[b"msg"] for m in received(target)] == [b"direct"]
    assert received(bystander) == []
    assert [m[b"msg"] for m in received(snoop)] == [b"direct", b"nobody"]
    assert received(unsubscribed_target) == [], "a connection not subscribed to the group gets nothing"


def test_meonly_gets_only_what_is_addressed_to_it(peer: Callable) -> None:
    me, my_name = peer()
    me.subscribe(b"g", subtype=b"meonly")
    sender, name = peer()
    send(sender, name, b"g", b"broadcast", to=b"*")
    send(sender, name, b"g", b"for me", to=my_name)
    assert [m[b"msg"] for m in received(me)] == [b"for me"]


def test_promisc_ignores_the_instance_too(peer: Callable) -> None:
    snoop, _ = peer()
    snoop.subscribe(b"g", b"other", b"promisc")
    sender, name = peer()
    send(sender, name, b"g", instance=b"a")
    assert len(received(snoop)) == 1


def test_a_send_from_another_name_is_refused_and_closes(broker: Broker, peer: Callable) -> None:
    listener, _ = peer()
    listener.subscribe(b"g")
    liar, _ = peer()
    send(liar, b"someone-else@mc0", b"g")
    assert liar.closed_within(WAIT)
    assert received(listener) == []


def test_unsubscribe_works_per_instance(peer: Callable) -> None:
    raw, _ = peer()
    raw.subscribe(b"g", b"a")
    raw.subscribe(b"g", b"b")
    raw.send({b"type": b"unsubscribe", b"group": b"g", b"instance": b"a"})
    raw.barrier()
    sender, name = peer()
    send(sender, name, b"g", b"to-a", instance=b"a")
    send(sender, name, b"g", b"to-b", instance=b"b")
    assert [m[b"msg"] for m in received(raw)] == [b"to-b"]
    raw.send({b"type": b"unsubscribe", b"group": b"g", b"instance": b"b"})
    raw.barrier()
    send(sender, name, b"g", b"to-b again", instance=b"b")
    assert received(raw) == []


def test_subscriptions_go_with_the_connection(broker: Broker, peer: Callable) -> None:
    raw, _ = peer()
    raw.subscribe(b"left")
    assert broker.hub.stats()["topics"]["left"]["subscribers"] == 1
    raw.close()
    deadline = time.monotonic() + WAIT
    while broker.hub.stats()["topics"]["left"]["subscribers"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert broker.hub.stats()["topics"]["left"]["subscribers"] == 0


def test_stats_answers_with_real_counters(peer: Callable) -> None:
    listener, _ = peer()
    listener.subscribe(b"g")
    sender, name = peer()
    for n in range(3):
        send(sender, name, b"g", seq=b"%d" % n)
    assert len(received(listener)) == 3
    sender.send({b"type": b"stats"})
    reply = sender.receive()
    assert reply is not None
    stats = reply[b"stats"]
    assert stats[b"connections"] == b"2"
    assert stats[b"sent"] == b"3"
    assert stats[b"delivered"] == b"3"
    assert stats[b"group_subscriptions"] == b"1"
    assert stats[b"oversize"] == b"0"


def test_an_oversize_message_closes_the_connection(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(msgq_max_message=1024)
    raw = Raw(broker.gateway_address("msgq"))
    name = raw.lname()
    send(raw, name, b"g", b"x" * 2000)
    assert raw.closed_within(WAIT)
    raw.close()


# ---------------------------------------------------------------------------------------------- one engine


def test_a_msgq_send_reaches_mc0_and_sexp_subscribers_with_its_message_id(
    broker: Broker, peer: Callable
) -> None:
    with Client(broker.endpoint, curve=False, timeout=WAIT) as mc0, \
            SexpClient(*broker.gateway_address("sexp")) as sexp:
        mc0.subscribe("log.orders")
        sexp.subscribe("log.orders")
        sender, name = peer()
        send(sender, name, b"log.orders", b"paid", instance=b"eu", seq=b"7")
        got = mc0.receive(timeout=WAIT)
        assert got is not None
        assert (got.id, got.body) == (1, b"paid")
        assert got.headers["MSGQ-FROM"] == name.decode()
        assert got.headers["MSGQ-INSTANCE"] == "eu"
        assert got.headers["MSGQ-SEQ"] == "7"
        through_sexp = sexp.receive(timeout=WAIT)
        assert through_sexp is not None
        assert (through_sexp.id, through_sexp.body) == (1, b"paid")


def test_an_mc0_put_reaches_msgq_subscribers_as_a_well_formed_send(broker: Broker, peer: Callable) -> None:
    raw, _ = peer()
    raw.subscribe(b"orders")
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        reply = client.publish("orders", "hello", {"X-Trace": "abc"}, confirm=True)
    [got] = received(raw)
    assert got[b"type"] == b"send"
    assert got[b"msg"] == b"hello"
    assert (got[b"from"], got[b"to"], got[b"instance"]) == (b"mc0", b"*", b"*")
    assert got[b"msgid"] == reply["MESSAGE-ID"].encode() == got[b"seq"]
    assert got[b"X-Trace"] == b"abc"
    assert got[b"group"] == b"orders"


def test_replay_of_a_persistent_group_with_the_subscribe_extension(broker: Broker, peer: Callable) -> None:
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        for n in range(1, 6):
            client.publish("log.replay", f"m{n}", confirm=True)
    raw, _ = peer()
    raw.subscribe(b"log.replay", replay=b"3")
    assert [m[b"msgid"] for m in received(raw)] == [b"3", b"4", b"5"]
    whole, _ = peer()
    whole.subscribe(b"log.replay", replay=b"beginning")
    assert [m[b"msg"] for m in received(whole)] == [b"m%d" % n for n in range(1, 6)]


def test_replay_on_a_transient_group_closes_the_connection(peer: Callable) -> None:
    raw, _ = peer()
    raw.send({b"type": b"subscribe", b"group": b"plain", b"instance": b"*", b"subtype": b"normal",
              b"replay": b"beginning"})
    assert raw.closed_within(WAIT)


def test_the_client_says_what_a_closed_connection_may_mean(broker: Broker) -> None:
    """msgq has no error message: the client's error says so and points at the broker's log."""
    with MsgqClient(*broker.gateway_address("msgq")) as client, pytest.raises(ConnectorError) as closed:
        client.subscribe("plain", replay="beginning")  # answered by a closed connection
    # A close, or a reset when the broker closes with unread data: either way the client says what it means.
    assert "(msgq has no error message, so the broker closes a connection whose request it refuses" \
        in str(closed.value)
    assert "a replay of a group that is not persistent" in str(closed.value)


def test_a_round_robin_group_gives_each_message_to_one_consumer(broker: Broker, peer: Callable) -> None:
    first, _ = peer()
    first.subscribe(b"q.jobs")
    second, _ = peer()
    second.subscribe(b"q.jobs")
    sender, name = peer()
    for n in range(10):
        send(sender, name, b"q.jobs", b"job%d" % n, seq=b"%d" % n)
    jobs = [m[b"msg"] for m in received(first) + received(second)]
    assert sorted(jobs) == sorted(b"job%d" % n for n in range(10))


# ------------------------------------------------------------------------------------- the client and CLI


def test_the_client_library(broker: Broker) -> None:
    address = broker.gateway_address("msgq")
    with MsgqClient(*address) as listener, MsgqClient(*address) as sender:
        listener.subscribe("weather", instance="oslo")
        seq = sender.send("weather", {b"temp": b"-3"}, instance="oslo")
        got = listener.receive(timeout=WAIT)
        assert got is not None
        assert (got.sender, got.seq, got.msg) == (sender.lname, seq, {b"temp": b"-3"})
        assert got.extra[b"msgid"] == b"1"
        assert sender.receive(timeout=QUIET) is None, "a client does not see its own sends"
        assert listener.stats()[b"delivered"] == b"1"


def test_cli_msgq_pub_sub_and_stats(broker: Broker) -> None:
    host, port = broker.gateway_address("msgq")
    where = ["--broker", f"{host}:{port}"]
    runner = CliRunner()
    sent = runner.invoke(main, ["msgq", "pub", "log.cli", *where], input="one\ntwo\n")
    assert sent.exit_code == 0, sent.output
    got = runner.invoke(main, ["msgq", "sub", "log.cli", *where, "--replay", "beginning", "--count", "2"])
    assert got.exit_code == 0, got.output
    assert got.output.splitlines()[-2:] == ["one", "two"]
    stats = runner.invoke(main, ["msgq", "stats", *where])
    assert stats.exit_code == 0, stats.output
    assert '"sent": "2"' in stats.output
