"""The ``confirms`` extension on the wire, spoken by a raw DEALER: ``PUTS CONFIRM each`` stores or refuses
every entry on its own and answers one OK carrying one result per entry, after the commit that makes each
result true.

Payloads are built and read here with msgpack directly, not with the codec under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import pytest

from broker.topics import Persistence, Sync, TopicRule, TopicSpec

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer, Reply

    from broker.server import Broker

pytestmark = pytest.mark.timeout(20)

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
    reply = peer.connect(extensions="confirms ids")
    assert set((reply.header("EXTENSIONS") or b"").split()) == {b"confirms", b"ids"}
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
