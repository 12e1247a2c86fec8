"""What a cluster asks of the store (broker/store/): appending records another log numbered (checked, CRCs
included), cutting a log's suffix durably, changing a log's identity, and the idempotent batches a follower
copies with the records. Files are real, in a temporary directory."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgpack
import pytest

from broker.engine import Message
from broker.store import LogIdentity, StoreError
from broker.store.files import FileStore, read_topic_meta
from broker.store.log import SegmentLog
from broker.topics import Persistence, Sync, TopicSpec

TOPIC = b"t"
SPEC = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024)


def record(message_id: int, body: bytes, timestamp: int = 1000) -> bytes:
    """One stored record, built here by a few independent lines (docs/storage.md, "Records")."""
    payload = msgpack.packb([timestamp, {}, body], use_bin_type=True)
    crc = zlib.crc32(message_id.to_bytes(8, "big") + payload)
    return struct.pack(">IIQ", len(payload), crc, message_id) + payload


def bodies(log: SegmentLog, start: int = 1) -> list[tuple[int, bytes]]:
    return [(message.id, message.body) for message in log.read(start, 10_000, 1 << 24)]


def test_records_numbered_elsewhere_are_appended_as_they_are(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    data = b"".join(record(n, b"x" * 100 + b"%d" % n) for n in range(1, 40))  # crosses segments of 1 KiB
    log.append_records(data, 1, 39)
    log.commit()
    assert log.next_id == 40
    assert log.segment_count > 1
    log.close()
    again = SegmentLog(TOPIC, tmp_path, SPEC)
    assert bodies(again) == [(n, b"x" * 100 + b"%d" % n) for n in range(1, 40)]
    again.append(Message(TOPIC, 40, b"mine", {}, 2000))  # and the log goes on from there
    again.commit()
    assert again.next_id == 41


@pytest.mark.parametrize(("damage", "why"), [
    (lambda data: data[:-1], "ends inside|after the last|has id"),
    (lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:], "CRC"),
    (lambda data: data + record(9, b"extra"), "after the last|has id"),
])
def test_records_that_are_not_what_they_claim_append_nothing(tmp_path: Path, damage, why: str) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    data = record(1, b"one") + record(2, b"two")
    with pytest.raises(StoreError, match=why):
        log.append_records(damage(data), 1, 2)
    assert log.next_id == 1
    with pytest.raises(StoreError, match="expects 1"):
        log.append_records(record(2, b"two"), 2, 1)


def test_truncate_cuts_durably_across_segments(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    for n in range(1, 60):
        log.append(Message(TOPIC, n, b"y" * 100, {}, 1000 + n))
    log.commit()
    segments = log.segment_count
    assert log.truncate(25) == 35
    assert log.next_id == 25
    assert log.segment_count < segments
    log.append(Message(TOPIC, 25, b"new", {}, 5000))
    log.commit()
    log.close()
    again = SegmentLog(TOPIC, tmp_path, SPEC)  # what was cut stays cut after a restart
    assert [message_id for message_id, _ in bodies(again)] == list(range(1, 26))
    assert bodies(again, 25) == [(25, b"new")]
    assert again.truncate(30) == 0  # nothing past the end
    assert again.truncate(1) == 25
    assert again.next_id == 1


def test_a_log_restarts_past_its_end_durably(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    for n in range(1, 30):
        log.append(Message(TOPIC, n, b"y" * 100, {}, 1000 + n))
    log.commit()
    assert log.segment_count > 1
    with pytest.raises(StoreError, match="past its next id 30"):
        log.restart_at(30)
    assert log.restart_at(500) == 29
    assert (log.first_id, log.next_id, log.segment_count) == (500, 500, 1)
    assert bodies(log) == []
    log.append_records(record(500, b"five hundred"), 500, 1)  # a copy goes on at the leader's first id
    log.commit()
    log.close()
    again = SegmentLog(TOPIC, tmp_path, SPEC)  # and so it stays after a restart
    assert (again.first_id, again.next_id) == (500, 501)
    assert bodies(again) == [(500, b"five hundred")]


def test_truncate_forgets_the_producers_of_what_it_cut(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    for n in range(1, 11):
        log.append(Message(TOPIC, n, b"z", {}, 1000))
    log.producers.record(b"p", 4, 1, 5)
    log.producers.record(b"p", 9, 6, 5)
    log.commit()
    log.truncate(8)
    assert log.producers.last[b"p"] == (6, 7)  # the second batch holds ids 6 and 7 only now
    assert log.producers.duplicates(b"p", 7, 3) == 0
    assert log.producers.duplicates(b"p", 5, 3) == 2


def test_producer_entries_for_a_range(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    window = log.producers
    window.record(b"a", 2, 1, 3)  # ids 1..3
    window.record(b"b", 0, 4, 1)  # id 4
    window.record(b"a", 5, 5, 3)  # ids 5..7
    assert [entry[0] for entry in window.entries(1, 4)] == [1]
    assert [entry[0] for entry in window.entries(3, 6)] == [1, 4, 5]  # overlapping the range
    assert window.entries(8, 20) == []
    log.close()
    again = SegmentLog(TOPIC, tmp_path, SPEC)  # no messages were written: the records are cut at open
    assert again.producers.entries(1, 20) == []


def test_a_log_takes_another_identity_durably(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    successor = log.identity.successor(1)
    store.set_identity(TOPIC, successor)
    assert log.identity == successor
    assert read_topic_meta(tmp_path / "t").identity == successor
    store.close()
    again = FileStore(tmp_path)
    assert again.open(TOPIC, SPEC).identity == successor
    with pytest.raises(StoreError):
        again.set_identity(b"never-opened", LogIdentity.fresh())
    again.close()
