"""FETCH, the range reads of persistent topics (docs/mc0.md, "FETCH"), against a real in-process broker: the
connector's ``fetch``/``offsets`` (blocking and asyncio) and raw frames from a DEALER, whose replies are
parsed here with plain msgpack, not with the codec under test.

Covered: reading from the beginning, the middle and past the end; the MAX-MESSAGES and MAX-BYTES bounds, their
caps and the at-least-one rule; offsets of an existing and of a not-yet-existing persistent topic (which the
read does not create); the refusals (transient topics, no ID, no TOPIC, bad numbers); FIRST-ID after
retention deleted segments; reads that see everything confirmed before them, also a FETCH pipelined right
behind a PUT; reply order with other commands, also when the broker's per-turn fetch budget makes replies
wait a turn; a read that consumes nothing from a queue; CURVE; a client made, used and closed in a process of
its own (as in a Spark task); and many readers while a publisher streams.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import pytest

from broker import engine as engine_module
from broker import router as router_module
from broker.topics import Delivery, Persistence, TopicRule, TopicSpec
from connector import AsyncClient, Client, ConnectorError, FetchResult
from connector import keys as key_files
from protocol import mc0

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer, Reply

    from broker.server import Broker

pytestmark = pytest.mark.timeout(30)

PERSISTENT = TopicSpec(persistence=Persistence.PERSISTENT)
#: Small segments and a small byte budget: retention deletes segments after a few dozen messages.
RETAINED = TopicSpec(persistence=Persistence.PERSISTENT, segment_bytes=1024, retention_bytes=4096)
QUEUE = TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT)
RULES = (
    TopicRule("log.retained.*", RETAINED),
    TopicRule("log.*", PERSISTENT),
    TopicRule("queue.*", QUEUE),
)
#: How long a test waits for something the broker does on a timer (retention).
PATIENCE = 5.0


@pytest.fixture
def broker(start_broker: BrokerFactory) -> Broker:
    return start_broker(topics=RULES, retention_interval=0.05)


@pytest.fixture
def client(broker: Broker) -> Iterator[Client]:
    with Client(broker.endpoint, timeout=5.0) as connected:
        yield connected


def publish_confirmed(
    client: Client, topic: str | bytes, bodies: list[bytes], headers: dict[str, str] | None = None
) -> list[int]:
    """Publish fire-and-forget, then one confirmed PUT: the broker handles a client's commands in order, so
    its OK means every earlier one was taken. Returns the ids given (the confirmed PUT's id says where they
    end)."""
    for body in bodies[:-1]:
        client.publish(topic, body, headers)
    reply = client.publish(topic, bodies[-1], headers, confirm=True)
    assert reply is not None
    last = int(reply["MESSAGE-ID"])
    return list(range(last - len(bodies) + 1, last + 1))


def assert_contiguous(result: FetchResult, start: int) -> None:
    ids = [message.id for message in result.messages]
    assert ids == list(range(start, start + len(ids))), ids
    assert all(message_id < result.next_id for message_id in ids)


# --------------------------------------------------------------------------------------------- reading


def test_fetch_from_the_beginning_returns_every_stored_message(client: Client) -> None:
    before = int(time.time() * 1000)
    ids = publish_confirmed(client, "log.a", [b"m%d" % n for n in range(20)], {"X-Kind": "test"})
    assert ids == list(range(1, 21))
    result = client.fetch("log.a")
    assert isinstance(result, FetchResult)
    assert (result.topic, result.first_id, result.next_id) == ("log.a", 1, 21)
    assert [m.id for m in result.messages] == ids
    assert [m.body for m in result.messages] == [b"m%d" % n for n in range(20)]
    assert all(m.topic == "log.a" and m.headers == {"X-Kind": "test"} for m in result.messages)
    assert all(m.timestamp is not None and m.timestamp >= before - 1000 for m in result.messages)


def test_fetch_from_the_middle_and_past_the_end(client: Client) -> None:
    publish_confirmed(client, b"log.b", [b"%d" % n for n in range(1, 21)])
    middle = client.fetch(b"log.b", 8, max_messages=5)
    assert middle.topic == "log.b"
    assert [m.id for m in middle.messages] == [8, 9, 10, 11, 12]
    assert [m.body for m in middle.messages] == [b"8", b"9", b"10", b"11", b"12"]
    assert middle.messages[0].headers == {}, "a message without headers has none"
    # Where the last read stopped, the next one goes on.
    following = client.fetch("log.b", middle.messages[-1].id + 1, max_messages=100)
    assert [m.id for m in following.messages] == list(range(13, 21))
    for start in (21, 22, 10**12):
        past = client.fetch("log.b", start)
        assert (past.messages, past.first_id, past.next_id) == ([], 1, 21)
    assert client.fetch("log.b", 0).messages[0].id == 1, "FROM 0 is below the first id: from the first"


def test_max_messages_bounds_the_reply_and_is_capped(client: Client) -> None:
    total = mc0.FETCH_MAX_MESSAGES + 50
    publish_confirmed(client, "log.many", [b"x"] * total)
    assert [m.id for m in client.fetch("log.many", 5, max_messages=3).messages] == [5, 6, 7]
    assert len(client.fetch("log.many").messages) == mc0.FETCH_DEFAULT_MAX_MESSAGES
    capped = client.fetch("log.many", max_messages=10**9, max_bytes=10**12)
    assert len(capped.messages) == mc0.FETCH_MAX_MESSAGES, "the broker lowers MAX-MESSAGES to its cap"
    assert_contiguous(capped, 1)
    assert capped.next_id == total + 1


def test_max_bytes_bounds_the_bodies_but_one_message_always_comes(client: Client) -> None:
    publish_confirmed(client, "log.sized", [b"a" * 100] * 5 + [b"b" * 5000] + [b"c" * 10])
    assert len(client.fetch("log.sized", max_bytes=350).messages) == 3, "300 bytes fit, a fourth would not"
    assert len(client.fetch("log.sized", max_bytes=300).messages) == 3, "exactly MAX-BYTES still fits"
    assert len(client.fetch("log.sized", max_bytes=0).messages) == 1, "at least one, even with MAX-BYTES 0"
    big = client.fetch("log.sized", 6, max_bytes=100)
    assert [(m.id, len(m.body)) for m in big.messages] == [(6, 5000)], "a body over MAX-BYTES is fetchable"
    everything = client.fetch("log.sized", max_bytes=10_000)
    assert [m.id for m in everything.messages] == list(range(1, 8))


def test_max_bytes_is_capped_at_16_mib(client: Client) -> None:
    body = b"z" * (3 << 20)
    publish_confirmed(client, "log.large", [body] * 7)  # 21 MiB stored
    result = client.fetch("log.large", max_bytes=1 << 40, timeout=10)
    assert len(result.messages) == 5, "five 3 MiB bodies fit in 16 MiB, a sixth would not"
    assert sum(len(m.body) for m in result.messages) <= mc0.FETCH_MAX_BYTES


def test_offsets_of_an_existing_and_of_a_not_yet_existing_persistent_topic(client: Client) -> None:
    publish_confirmed(client, "log.offsets", [b"1", b"2", b"3"])
    assert client.offsets("log.offsets") == (1, 4)
    counted = client.fetch("log.offsets", max_messages=0)
    assert (counted.messages, counted.first_id, counted.next_id) == ([], 1, 4)
    # A topic its rule makes persistent is an empty log before anyone used it, without a subscriber...
    assert client.offsets("log.nobody-yet") == (1, 1)
    empty = client.fetch("log.nobody-yet", 1)
    assert (empty.messages, empty.first_id, empty.next_id) == ([], 1, 1)
    # ...and reading it does not create it.
    assert "log.nobody-yet" not in client.topics()
    assert "log.offsets" in client.topics()


def test_a_read_consumes_nothing_from_a_persistent_queue(client: Client, broker: Broker) -> None:
    publish_confirmed(client, "queue.jobs", [b"j1", b"j2", b"j3"])
    assert [m.body for m in client.fetch("queue.jobs").messages] == [b"j1", b"j2", b"j3"]
    with Client(broker.endpoint, timeout=5.0) as consumer:
        consumer.subscribe("queue.jobs")
        got = [consumer.receive(timeout=PATIENCE) for _ in range(3)]
    assert [m.body for m in got if m is not None] == [b"j1", b"j2", b"j3"]


def test_the_async_client_fetches_too(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint, timeout=5.0) as client:
            for n in range(4):
                await client.publish("log.async", b"a%d" % n)
            await client.flush()
            result = await client.fetch("log.async", 2, max_messages=2)
            assert [(m.id, m.body) for m in result.messages] == [(2, b"a1"), (3, b"a2")]
            assert (result.topic, result.first_id, result.next_id) == ("log.async", 1, 5)
            assert await client.offsets("log.async") == (1, 5)
            with pytest.raises(ConnectorError, match="transient"):
                await client.fetch("plain")

    async def bounded() -> None:
        async with asyncio.timeout(15):
            await main()

    asyncio.run(bounded())


# ------------------------------------------------------------------------------------------- refusals


def test_fetch_on_a_transient_topic_is_refused_with_the_reason(client: Client) -> None:
    with pytest.raises(ConnectorError, match="would be transient: there is no log"):
        client.fetch("plain")  # no rule: it would be transient
    client.publish("plain", b"exists now", confirm=True)
    with pytest.raises(ConnectorError, match="is transient: there is no log"):
        client.offsets("plain")
    client.declare("declared", persistence="transient")
    with pytest.raises(ConnectorError, match="transient"):
        client.fetch("declared")
    assert client.offsets("log.still-fine") == (1, 1), "the client goes on after a refusal"


def test_fetch_arguments_are_checked_before_sending(client: Client) -> None:
    with pytest.raises(ValueError, match="non-empty topic"):
        client.fetch("")
    with pytest.raises(ValueError, match="max_messages"):
        client.fetch("log.x", max_messages=-1)
    with pytest.raises(TypeError, match="start"):
        client.fetch("log.x", "beginning")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_bytes"):
        client.fetch("log.x", max_bytes=True)


@pytest.mark.parametrize(
    ("frames", "command_id", "fragment"),
    [
        (["FETCH", "TOPIC", "log.raw"], None, "needs an ID"),
        (["FETCH", "TOPIC", "", "ID", "f1"], b"f1", "TOPIC"),
        (["FETCH", "ID", "f2"], b"f2", "TOPIC"),
        (["FETCH", "TOPIC", "log.raw", "FROM", "-1", "ID", "f3"], b"f3", "FROM"),
        (["FETCH", "TOPIC", "log.raw", "MAX-MESSAGES", "lots", "ID", "f4"], b"f4", "MAX-MESSAGES"),
        (["FETCH", "TOPIC", "log.raw", "MAX-BYTES", "1" * 30, "ID", "f5"], b"f5", "MAX-BYTES"),
        (["FETCH", "TOPIC", "log.raw", "ID", "f6", "", "extra"], b"f6", "positional"),
        (["FETCH", "TOPIC", "transient.raw", "ID", "f7"], b"f7", "transient"),
    ],
    ids=["no-id", "empty-topic", "no-topic", "negative-from", "word", "too-large", "positional", "transient"],
)
def test_malformed_or_refused_fetch_gets_an_error(
    broker: Broker, dealer: DealerFactory, frames: list[str], command_id: bytes | None, fragment: str
) -> None:
    peer = dealer(broker.endpoint)
    reply = peer.request(*frames)
    assert reply.verb == b"ERROR", reply.frames
    assert reply.header("ID") == command_id
    message = reply.header("MESSAGE")
    assert message is not None
    assert fragment in message.decode(), message
    peer.ok("NOOP")  # still connected, still answered


# ------------------------------------------------------------------------------------------- the wire


def fetch_raw(peer: Peer, *headers: str | bytes | int) -> tuple[Reply, list[list]]:
    reply = peer.ok("FETCH", *headers)
    assert reply.header("CONTENT-TYPE") == b"application/msgpack"
    entries = msgpack.unpackb(reply.body, raw=False)
    assert reply.header("COUNT") == b"%d" % len(entries)
    return reply, entries


def test_the_wire_format_of_the_reply(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint)
    peer.connect(extensions="ids")
    peer.ok("PUT", "TOPIC", "log.wire", "X-a", "1", "", b"\x00first")
    peer.ok("PUT", "TOPIC", "log.wire", "", b"second")
    reply, entries = fetch_raw(peer, "TOPIC", "log.wire", "FROM", 1, "MAX-MESSAGES", 10, "MAX-BYTES", 1000)
    assert reply.frames[:3] == [b"OK", b"ID", reply.header("ID")], "OK ID id first, then the other headers"
    assert (reply.header("FIRST-ID"), reply.header("NEXT-ID"), reply.header("COUNT")) == (b"1", b"3", b"2")
    assert len(reply.positional or []) == 1, "one payload frame"
    first, second = entries
    assert first[::2] == [1, b"\x00first"]
    assert first[3] == {b"X-a": b"1"}
    assert second[::2] == [2, b"second"]
    assert second[3] == {}, "headers are always there, maybe empty"
    assert isinstance(first[1], int), "timestamps in ms"
    assert first[1] <= second[1]
    reply, entries = fetch_raw(peer, "TOPIC", "log.wire", "MAX-MESSAGES", 0)
    assert (entries, reply.header("FIRST-ID"), reply.header("NEXT-ID")) == ([], b"1", b"3")


def test_a_packed_fetch_is_answered_with_packed_headers(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint)
    peer.connect(extensions="ids")
    peer.ok("PUT", "TOPIC", "log.packed", "", b"one")
    packed = msgpack.packb({b"TOPIC": b"log.packed", b"FROM": b"1", b"FORMAT": b"records"}, use_bin_type=True)
    reply = peer.ok("FETCH", "PACKED", packed)
    assert reply.frames[:3] == [b"OK", b"ID", reply.header("ID")]
    assert reply.frames[3] == b"PACKED", "the answer's headers in one frame, as the question's"
    headers = msgpack.unpackb(reply.frames[4], raw=True)
    assert (headers[b"START-ID"], headers[b"COUNT"], headers[b"NEXT-ID"]) == (b"1", b"1", b"2")
    assert headers[b"CONTENT-TYPE"] == b"application/x-mc0-records"
    assert reply.positional is not None
    assert len(reply.positional) == 1
    refused = peer.request("FETCH", "TOPIC", "log.packed", "PACKED", packed, "ID", "twice")
    assert refused.verb == b"ERROR"
    assert b"given twice" in (refused.header("MESSAGE") or b"")


def test_a_fetch_without_delimiter_is_answered_without_one(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint, delimiter=False)
    reply = peer.ok("FETCH", "TOPIC", "log.bare")
    assert (reply.header("COUNT"), reply.header("NEXT-ID")) == (b"0", b"1")


def test_a_fetch_right_behind_a_put_sees_it(broker: Broker, dealer: DealerFactory) -> None:
    """PUT and FETCH sent back to back, usually read in the same turn: the FETCH is answered after that turn's
    commit, so it sees the PUT, and NEXT-ID is one past it."""
    peer = dealer(broker.endpoint)
    peer.connect(extensions="ids")
    for n in range(1, 31):
        peer.send("PUT", "TOPIC", "log.pipelined", "ID", b"p%d" % n, "", b"body %d" % n)
        peer.send("FETCH", "TOPIC", "log.pipelined", "FROM", n, "ID", b"f%d" % n)
        put = peer.recv()
        fetched = peer.recv()
        assert (put.verb, put.header("ID"), put.header("MESSAGE-ID")) == (b"OK", b"p%d" % n, b"%d" % n)
        assert (fetched.verb, fetched.header("ID")) == (b"OK", b"f%d" % n)
        assert fetched.header("NEXT-ID") == b"%d" % (n + 1)
        entries = msgpack.unpackb(fetched.body, raw=False)
        assert [(entry[0], entry[2]) for entry in entries] == [(n, b"body %d" % n)]


def test_fetch_after_confirmed_publishes_sees_them_all(client: Client) -> None:
    for round_ in range(1, 11):
        ids = publish_confirmed(client, "log.confirmed", [b"r%d-%d" % (round_, n) for n in range(round_)])
        result = client.fetch("log.confirmed", ids[0])
        assert result.next_id == ids[-1] + 1
        assert [m.id for m in result.messages] == ids


def test_replies_keep_their_order_when_fetches_wait_for_a_later_turn(
    broker: Broker, dealer: DealerFactory, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_confirmed(client, "log.order", [b"x" * 10] * 5)
    # Every turn may build one FETCH reply only: the rest of a burst waits, in order, for later turns.
    monkeypatch.setattr(router_module, "FETCH_TURN_BYTES", 1)
    peer = dealer(broker.endpoint)
    expected = []
    for n in range(20):
        peer.send("FETCH", "TOPIC", "log.order", "FROM", n % 5 + 1, "MAX-MESSAGES", 1, "ID", b"f%d" % n)
        peer.send("NOOP", "ID", b"n%d" % n)
        expected += [b"f%d" % n, b"n%d" % n]
    replies = [peer.recv() for _ in expected]
    assert [reply.header("ID") for reply in replies] == expected
    fetched = [msgpack.unpackb(reply.body, raw=False) for reply in replies[::2]]
    assert [entries[0][0] for entries in fetched] == [n % 5 + 1 for n in range(20)]
    peer.expect_silence()


def test_first_id_moves_up_after_retention_and_a_read_below_starts_there(client: Client) -> None:
    publish_confirmed(client, "log.retained.a", [b"r" * 100 for _ in range(200)])  # about 25 KiB, 4 KiB kept
    deadline = time.monotonic() + PATIENCE
    while (offsets := client.offsets("log.retained.a"))[0] == 1:
        assert time.monotonic() < deadline, "retention never removed a segment"
        time.sleep(0.02)
    first_id, next_id = offsets
    assert 1 < first_id < next_id == 201
    for start in (None, 1, first_id - 1):
        result = client.fetch("log.retained.a", start)
        assert result.first_id >= first_id
        assert result.messages[0].id == result.first_id, "a read below FIRST-ID starts at it"
        assert_contiguous(result, result.first_id)
        assert result.messages[-1].id == 200
    assert [m.id for m in client.fetch("log.retained.a", 199, max_messages=5).messages] == [199, 200]


def test_fetch_under_curve(start_broker: BrokerFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key_files.generate(keys)
    broker = start_broker(curve=True, keys_dir=keys, topics=RULES)
    with Client(broker.endpoint, keys=str(keys), timeout=5.0) as client:
        publish_confirmed(client, "log.sealed", [b"\x00secret", b"plain"])
        result = client.fetch("log.sealed")
        assert [(m.id, m.body) for m in result.messages] == [(1, b"\x00secret"), (2, b"plain")]
        assert client.offsets("log.sealed") == (1, 3)


EXECUTOR_TASK = """
import json, sys
from connector import Client
client = Client(sys.argv[1], timeout=5.0)
try:
    result = client.fetch("log.exec", 2, max_messages=2)
    print(json.dumps([client.offsets("log.exec"), [[m.id, m.body.decode()] for m in result.messages]]))
finally:
    client.close()
"""


def test_a_client_made_used_and_closed_inside_another_process(client: Client, broker: Broker) -> None:
    """What a Spark task does: make a client in the executor's process, read, close, and let the process end
    (no thread or socket left to hold it)."""
    publish_confirmed(client, "log.exec", [b"e1", b"e2", b"e3"])
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", EXECUTOR_TASK, broker.endpoint], cwd=root,
                          capture_output=True, text=True, timeout=20, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[1, 4], [[2, "e2"], [3, "e3"]]]


def test_the_engine_and_the_wire_share_the_caps() -> None:
    assert engine_module.FETCH_MAX_MESSAGES == mc0.FETCH_MAX_MESSAGES
    assert engine_module.FETCH_MAX_BYTES == mc0.FETCH_MAX_BYTES


# ------------------------------------------------------------------------------------------- load


def test_many_readers_while_a_publisher_streams(broker: Broker) -> None:
    """8 readers x 50 fetches (4 with a client each, as Spark executors, 4 sharing one thread-safe client)
    while a publisher streams: every reply is a contiguous run from where it was asked, below its NEXT-ID,
    with the bodies that were published under those ids, and NEXT-ID never goes back."""
    topic = "log.busy"
    stop = threading.Event()
    errors: list[BaseException] = []
    published = [0]

    def publisher() -> None:
        try:
            with Client(broker.endpoint, timeout=5.0) as client:
                n = 0
                while not stop.is_set() and n < 200_000:
                    for _ in range(50):
                        n += 1
                        client.publish(topic, b"%d" % n)  # a fresh topic with one publisher: id == n
                    client.flush()
                    published[0] = n
        except BaseException as error:
            errors.append(error)

    def reader(client: Client | None, seed: int) -> None:
        own = client is None
        try:
            if client is None:
                client = Client(broker.endpoint, timeout=10.0)
            last_next = 1
            for n in range(50):
                start = 1 + (seed * 7919 + n * 104729) % max(1, last_next + 10)
                result = client.fetch(topic, start, max_messages=1 + (n * 37) % 500)
                assert result.first_id == 1
                assert result.next_id >= last_next, "NEXT-ID went back"
                last_next = result.next_id
                if start < result.next_id:
                    assert result.messages, "something is stored at or after FROM"
                    assert_contiguous(result, start)
                    assert all(m.body == b"%d" % m.id for m in result.messages)
                else:
                    assert result.messages == []
        except BaseException as error:
            errors.append(error)
        finally:
            if own and client is not None:
                client.close()

    streaming = threading.Thread(target=publisher, name="publisher")
    streaming.start()
    deadline = time.monotonic() + PATIENCE
    while published[0] < 500 and not errors:
        assert time.monotonic() < deadline, "the publisher did not get going"
        time.sleep(0.01)
    streamed_before = published[0]
    with Client(broker.endpoint, timeout=10.0) as shared:
        readers = [threading.Thread(target=reader, args=(None if k < 4 else shared, k), name=f"reader-{k}")
                   for k in range(8)]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join(20)
        stop.set()
        streaming.join(10)
        alive = [thread.name for thread in [*readers, streaming] if thread.is_alive()]
    assert not alive, f"still running: {alive}"
    if errors:
        raise errors[0]
    assert published[0] > streamed_before, "the publisher streamed while the readers read"
    with Client(broker.endpoint, timeout=5.0) as client:
        assert client.offsets(topic) == (1, published[0] + 1)
        stats = client.stats()
    assert stats["doors"]["mc0"]["fetches"] >= 8 * 50 + 1


def test_publish_batch_is_confirmed_whole_or_refused_whole(start_broker: BrokerFactory) -> None:
    broker = start_broker(topics=(TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT)),
                                  TopicRule("fixed", TopicSpec(element_size=2))))
    with Client(broker.endpoint, curve=False, timeout=5) as client:
        reply = client.publish_batch([("log.b", f"m{n}", {"X-N": str(n)}) for n in range(50)])
        assert reply["COUNT"] == "50"
        stored = client.fetch("log.b", 1, max_messages=100).messages
        assert [(m.body, m.headers["X-N"]) for m in stored] == [(f"m{n}".encode(), str(n)) for n in range(50)]
        with pytest.raises(ConnectorError, match="exactly 2 bytes"):
            client.publish_batch([("log.b", "fine", None), ("fixed", "too long", None)])
        assert client.offsets("log.b") == (1, 51), "a refused batch publishes nothing"
        assert client.publish_batch([]) == {}


# ------------------------------------------------------------------------------------- FORMAT records


def test_records_fetched_are_the_stored_messages_undecoded(broker: Broker) -> None:
    from protocol import records

    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([("log.records", f"m{n}", {"X-N": str(n)} if n % 3 == 0 else None)
                              for n in range(50)])
        plain = client.fetch("log.records", 5, max_messages=20)
        raw = client.fetch_records("log.records", 5, max_messages=20)
        assert (raw.first_id, raw.next_id, raw.start_id, raw.count) == (1, 51, 5, 20)
        assert raw.incarnation == plain.incarnation
        decoded = records.decode(raw.payload, raw.start_id, raw.count)
        assert [(r.id, r.timestamp, r.body) for r in decoded] == [
            (m.id, m.timestamp, m.body) for m in plain.messages]
        assert [{k.decode(): v.decode() for k, v in r.headers.items()} for r in decoded] == [
            m.headers for m in plain.messages]
        small = client.fetch_records("log.records", 1, max_messages=50, max_bytes=1)
        assert small.count == 1, "at least one record, however small MAX-BYTES"
        past = client.fetch_records("log.records", 51)
        assert (past.count, past.payload, past.start_id) == (0, b"", 51)


def test_records_fetches_stop_at_segment_ends_and_start_after_retention(broker: Broker) -> None:
    from protocol import records

    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([("log.retained.r", b"x" * 60, None) for _ in range(200)])
        deadline = time.monotonic() + PATIENCE
        while client.offsets("log.retained.r")[0] == 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        first, next_id = client.offsets("log.retained.r")
        assert first > 1, "retention removed the oldest segments"
        position, seen = 1, []
        while position < next_id:
            reply = client.fetch_records("log.retained.r", position)
            assert reply.count >= 1
            seen += [r.id for r in records.decode(reply.payload, reply.start_id, reply.count)]
            position = reply.start_id + reply.count
        assert seen == list(range(first, next_id)), "from the oldest stored, every one, one segment a reply"
