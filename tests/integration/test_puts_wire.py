"""PUTS's extensions on the wire, spoken by a raw DEALER.

``confirms``: ``PUTS CONFIRM each`` stores or refuses every entry on its own and answers one OK carrying one
result per entry, after the commit that makes each result true.

``columns``: ``PUTS TOPIC t ... '' lengths bodies`` stores one topic's bodies from two frames, alone or
idempotent or with ``CONFIRM each``, in bulk or one by one (a topic with a reader online), exactly as the
same entries in msgpack would be; malformed frames are refused whole with an ERROR that says what is wrong.

Payloads are built and read here with msgpack and ``struct`` directly, not with the codec under test.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import pytest

from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from protocol import mc0

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer, Reply

    from broker.server import Broker

pytestmark = pytest.mark.timeout(30)

RULES = (
    TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),
    TopicRule("w.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)),
    TopicRule("fixed", TopicSpec(element_size=4)),
)


@pytest.fixture
def broker(start_broker: BrokerFactory, tmp_path: Path) -> Broker:
    return start_broker(topics=RULES, data_dir=tmp_path / "data")


@pytest.fixture
def peer(broker: Broker, dealer: DealerFactory) -> Peer:
    peer = dealer(broker.endpoint)
    peer.negotiate("confirms", "ids", "columns")
    return peer


def puts(peer: Peer, entries: list[list[object]]) -> tuple[Reply, bytes]:
    """Send a PUTS CONFIRM each with an ID; its reply and the ID."""
    command_id = peer.next_id()
    return peer.request(b"PUTS", b"CONFIRM", b"each", b"ID", command_id, b"",
                        msgpack.packb(entries, use_bin_type=True)), command_id


def results(reply: Reply) -> list[list[object]]:
    assert reply.verb == b"OK", reply.frames
    assert set(reply.headers) == {b"ID"}, "the fewest frames: the payload says everything else"
    assert reply.body is not None
    return msgpack.unpackb(reply.body, raw=False)


def test_each_entry_gets_its_own_id_and_durability_in_order(peer: Peer) -> None:
    entries = [[b"p.a", b"one"], [b"p.a", b"two"], [b"plain", b"three"], [b"w.b", b"four"],
               [b"p.a", b"five", {b"X-k": b"v"}]]
    reply, command_id = puts(peer, entries)
    assert reply.header("ID") == command_id
    assert results(reply) == [[1, "fsync"], [2, "fsync"], [1, "memory"], [1, "written"], [3, "fsync"]]


def test_a_refused_entry_fails_alone_and_the_others_are_stored(peer: Peer, dealer: DealerFactory,
                                                                broker: Broker) -> None:
    subscriber = dealer(broker.endpoint)
    subscriber.sub(b"fixed")
    reply, _ = puts(peer, [[b"fixed", b"aaaa"], [b"fixed", b"bbb"], [b"fixed", b"cccc"]])
    first, refused, third = results(reply)
    assert first == [1, "memory"]
    assert refused[0] is None
    assert "exactly 4 bytes, not 3" in refused[1]
    assert third == [2, "memory"]
    bodies = [subscriber.recv().body for _ in range(2)]
    assert bodies == [b"aaaa", b"cccc"]
    subscriber.expect_silence()


def test_one_commit_covers_the_whole_batch(peer: Peer) -> None:
    before = peer.stats()["topics"].get("p.many", {}).get("fsyncs", 0)
    reply, _ = puts(peer, [[b"p.many", b"m%d" % n] for n in range(500)])
    assert [entry[0] for entry in results(reply)] == list(range(1, 501))
    assert peer.stats()["topics"]["p.many"]["fsyncs"] - before == 1


def test_the_ok_promises_only_what_a_reader_can_already_fetch(peer: Peer) -> None:
    puts(peer, [[b"p.read", b"x"], [b"p.read", b"y"]])
    fetched = peer.ok(b"FETCH", b"TOPIC", b"p.read")
    assert fetched.header("NEXT-ID") == b"3"


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ((b"PUTS", b"CONFIRM", b"each", b""), b"needs an ID"),
        ((b"PUTS", b"CONFIRM", b"all", b"ID", b"x1", b""), b"CONFIRM must be 'each'"),
    ],
)
def test_malformed_confirm_requests_are_refused(
    peer: Peer, frames: tuple[bytes, ...], message: bytes
) -> None:
    payload = msgpack.packb([[b"t", b"b"]], use_bin_type=True)
    reply = peer.request(*frames, payload)
    assert reply.verb == b"ERROR", reply.frames
    assert message in (reply.header("MESSAGE") or b"")
    if b"ID" in frames:
        assert reply.header("ID") == b"x1"


def test_a_plain_puts_is_still_refused_whole(peer: Peer) -> None:
    payload = msgpack.packb([[b"fixed", b"aaaa"], [b"fixed", b"bbb"]], use_bin_type=True)
    command_id = peer.next_id()
    reply = peer.request(b"PUTS", b"ID", command_id, b"", payload)
    assert reply.verb == b"ERROR"
    assert peer.stats()["topics"].get("fixed", {}).get("messages_in", 0) == 0


# ---------------------------------------------------------------------------------------------------- columns


def frames(bodies: list[bytes]) -> tuple[bytes, bytes]:
    return struct.pack(f">{len(bodies)}I", *map(len, bodies)), b"".join(bodies)


def stored(peer: Peer, topic: bytes) -> list[bytes]:
    reply = peer.ok(b"FETCH", b"TOPIC", topic, b"MAX-MESSAGES", b"10000")
    assert reply.body is not None
    return [entry[2] for entry in msgpack.unpackb(reply.body, raw=False)]


@pytest.mark.parametrize("count", [3, 300, 3000])  # one by one, and in bulk from the frames (256 and more)
def test_the_bodies_are_stored_in_order(peer: Peer, count: int) -> None:
    bodies = [b"m%d" % n * (n % 5) for n in range(count)]
    reply = peer.ok(b"PUTS", b"TOPIC", b"p.t", b"", *frames(bodies))
    assert reply.header("COUNT") == b"%d" % count
    assert reply.header("MESSAGE-ID") == b"%d" % count
    assert reply.header("DURABILITY") == b"fsync"
    assert stored(peer, b"p.t") == bodies


def test_a_reader_online_gets_each_body(peer: Peer, dealer: DealerFactory, broker: Broker) -> None:
    subscriber = dealer(broker.endpoint)
    subscriber.sub(b"p.live")
    bodies = [b"%d" % n for n in range(400)]
    peer.ok(b"PUTS", b"TOPIC", b"p.live", b"", *frames(bodies))
    assert [subscriber.recv().body for _ in bodies] == bodies
    assert stored(peer, b"p.live") == bodies


def test_an_idempotent_batch_sent_again_is_stored_once(peer: Peer) -> None:
    bodies = [b"r%d" % n for n in range(500)]
    head = (b"PUTS", b"TOPIC", b"p.once", b"PRODUCER", b"task-1", b"SEQUENCE", b"0")
    first = peer.ok(*head, b"", *frames(bodies))
    assert (first.header("COUNT"), first.header("DUPLICATES")) == (b"500", b"0")
    again = peer.ok(*head, b"", *frames([*bodies, b"new"]))
    assert (again.header("COUNT"), again.header("DUPLICATES")) == (b"1", b"500")
    assert stored(peer, b"p.once") == [*bodies, b"new"]


def test_confirm_each_refuses_the_wrong_sizes_alone(peer: Peer) -> None:
    reply = peer.request(b"PUTS", b"TOPIC", b"fixed", b"CONFIRM", b"each", b"ID", b"x1", b"",
                         *frames([b"aaaa", b"bbb", b"cccc"]))
    assert reply.verb == b"OK", reply.frames
    assert reply.body is not None
    first, refused, third = msgpack.unpackb(reply.body, raw=False)
    assert first == [1, "memory"]
    assert refused[0] is None
    assert "exactly 4 bytes, not 3" in refused[1]
    assert third == [2, "memory"]


def test_a_plain_batch_of_a_wrong_size_is_refused_whole(peer: Peer) -> None:
    reply = peer.request(b"PUTS", b"TOPIC", b"fixed", b"ID", b"x2", b"", *frames([b"aaaa", b"bbb"]))
    assert reply.verb == b"ERROR", reply.frames
    assert b"exactly 4 bytes" in (reply.header("MESSAGE") or b"")
    assert peer.stats()["topics"].get("fixed", {}).get("messages_in", 0) == 0


@pytest.mark.parametrize(
    ("rest", "message"),
    [
        ((b"", b"\x00\x00\x00\x02", b"ab", b"cd"), b"two frames after the empty key"),
        ((b"", b"ab"), b"two frames after the empty key"),
        ((b"", b"\x00\x00\x02", b"ab"), b"not a multiple of 4"),
        ((b"", b"\x00\x00\x00\x03", b"ab"), b"add up to 3 bytes, the bodies frame has 2"),
        ((b"", b"\xff\xff\xff\xff" * 2, b"ab"), b"add up to"),
    ],
)
def test_malformed_frames_are_refused_whole(peer: Peer, rest: tuple[bytes, ...], message: bytes) -> None:
    reply = peer.request(b"PUTS", b"TOPIC", b"p.bad", b"ID", b"x3", *rest)
    assert reply.verb == b"ERROR", reply.frames
    assert reply.header("ID") == b"x3"
    assert message in (reply.header("MESSAGE") or b"")
    assert "p.bad" not in peer.stats()["topics"]


def test_an_empty_topic_is_refused(peer: Peer) -> None:
    reply = peer.request(b"PUTS", b"TOPIC", b"", b"ID", b"x4", b"", *frames([b"a"]))
    assert reply.verb == b"ERROR"
    assert b"TOPIC must be non-empty" in (reply.header("MESSAGE") or b"")


def test_no_bodies_is_an_empty_batch(peer: Peer) -> None:
    reply = peer.ok(b"PUTS", b"TOPIC", b"p.none", b"", b"", b"")
    assert reply.header("COUNT") == b"0"


@pytest.mark.parametrize("form", ["msgpack", "columns"])
def test_a_batch_may_hold_up_to_puts_max_entries(peer: Peer, form: str) -> None:
    most = mc0.PUTS_MAX_ENTRIES

    def send(count: int, command_id: bytes) -> Reply:
        if form == "columns":
            return peer.request(b"PUTS", b"TOPIC", b"p.max", b"ID", command_id, b"", bytes(4 * count), b"")
        entries = msgpack.packb([[b"p.max", b""]] * count, use_bin_type=True)
        return peer.request(b"PUTS", b"ID", command_id, b"", entries)

    refused = send(most + 1, b"x5")
    assert refused.verb == b"ERROR", refused.frames
    assert f"PUTS carries {most + 1:,} entries, more than the {most:,}".encode() in (refused.header("MESSAGE")
                                                                                    or b"")
    assert "p.max" not in peer.stats()["topics"]
    stored_whole = send(most, b"x6")
    assert stored_whole.verb == b"OK", stored_whole.frames
    assert stored_whole.header("COUNT") == b"%d" % most
