"""The ack journal of round-robin persistent topics (queue.acks): watermark and acked-above sets for acks in
and out of order, coalesced ranges on disk, durability at commit, torn tails, compaction, forgetting acks of
ids a crash took from the log, retention raising the watermark, and the fsync rule shared with messages.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from broker.engine import Message
from broker.store.acks import coalesce
from broker.store.files import FileStore, directory_name
from broker.store.log import SegmentLog
from broker.topics import Delivery, Persistence, Sync, TopicSpec

TOPIC = b"jobs"
NOW = 1_700_000_000_000
QUEUE = TopicSpec(
    delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024
)


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch) -> None:
    """Crashes are simulated by editing files: the page cache is the disk here, and fsync only costs time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def journal(root: Path) -> Path:
    return root / directory_name(TOPIC) / "queue.acks"


def journal_ranges(root: Path) -> list[tuple[int, int]]:
    """Independent reader of the journal: every record must be whole and carry a good CRC; while the log is
    open, zero bytes follow them up to a whole MiB (docs/storage.md, "Reserved space")."""
    data = journal(root).read_bytes()
    ranges, at = [], 0
    while at + 20 <= len(data) and data[at : at + 20] != bytes(20):
        crc, first, last = struct.unpack_from(">IQQ", data, at)
        assert zlib.crc32(data[at + 4 : at + 20]) == crc
        ranges.append((first, last))
        at += 20
    assert at == len(data) or (len(data) % (1 << 20) == 0 and data.count(0, at) == len(data) - at)
    return ranges


def open_log(root: Path, spec: TopicSpec = QUEUE) -> tuple[FileStore, SegmentLog]:
    store = FileStore(root)
    return store, store.open(TOPIC, spec)


def fill(log: SegmentLog, count: int) -> None:
    for _ in range(count):
        log.append(Message(TOPIC, log.next_id, b"job %d" % log.next_id, {}, NOW))
    log.commit()


def state(log: SegmentLog) -> tuple[int, set[int]]:
    return log.acked_watermark, set(log.acked_above)


@pytest.fixture
def queue(tmp_path: Path):
    store, log = open_log(tmp_path)
    fill(log, 50)
    yield log
    store.close()


def test_nothing_acked_at_first(queue: SegmentLog, tmp_path: Path) -> None:
    assert state(queue) == (0, set())
    assert not journal(tmp_path).exists()  # created by the first ack


def test_acks_in_order_move_the_watermark(queue: SegmentLog) -> None:
    queue.ack([1, 2, 3])
    assert state(queue) == (3, set())
    queue.ack(range(4, 11))
    assert state(queue) == (10, set())


def test_acks_out_of_order(queue: SegmentLog) -> None:
    queue.ack([3, 5])
    assert state(queue) == (0, {3, 5})
    queue.ack([1])
    assert state(queue) == (1, {3, 5})
    queue.ack([2])
    assert state(queue) == (3, {5})
    queue.ack([4])
    assert state(queue) == (5, set())
    queue.ack([9, 7, 8])
    assert state(queue) == (5, {7, 8, 9})
    queue.ack([6])
    assert state(queue) == (9, set())


def test_duplicate_acks_are_ignored_and_unknown_ids_refused(queue: SegmentLog) -> None:
    queue.ack([2, 2, 1, 1, 7, 7])
    assert state(queue) == (2, {7})
    with pytest.raises(ValueError, match="51"):
        queue.ack([51])
    with pytest.raises(ValueError, match="cannot ack id 0"):
        queue.ack([0])


def test_acks_are_written_as_coalesced_ranges_at_commit(queue: SegmentLog, tmp_path: Path) -> None:
    queue.ack([8, 1, 2, 3, 7, 12])
    assert queue.dirty
    assert not journal(tmp_path).exists()  # buffered
    queue.commit()
    assert journal_ranges(tmp_path) == [(1, 3), (7, 8), (12, 12)]
    queue.ack([4, 5, 6])
    queue.commit()
    assert journal_ranges(tmp_path) == [(1, 3), (7, 8), (12, 12), (4, 6)]
    assert state(queue) == (8, {12})


def test_acks_survive_a_reopen(tmp_path: Path) -> None:
    store, log = open_log(tmp_path)
    fill(log, 30)
    log.ack([1, 2, 4, 10, 11, 30])
    log.commit()
    store.close()
    store, log = open_log(tmp_path)
    assert state(log) == (2, {4, 10, 11, 30})
    log.ack([3])
    store.close()  # close commits too
    store, log = open_log(tmp_path)
    assert state(log) == (4, {10, 11, 30})
    store.close()


def test_uncommitted_acks_are_not_on_disk(tmp_path: Path) -> None:
    store, log = open_log(tmp_path)
    fill(log, 10)
    log.ack([1, 2])
    log.commit()
    log.ack([3])
    crash = tmp_path / "crash"
    shutil.copytree(tmp_path / directory_name(TOPIC), crash / directory_name(TOPIC))  # the disk, mid-turn
    store.close()
    store, log = open_log(crash)
    assert state(log) == (2, set())
    store.close()


@pytest.mark.parametrize("damage", ["cut", "crc", "garbage-tail", "bad-range"])
def test_a_torn_journal_tail_is_truncated(tmp_path: Path, damage: str, caplog) -> None:
    store, log = open_log(tmp_path)
    fill(log, 20)
    for acked in ([1, 2], [5], [9, 10]):
        log.ack(acked)
        log.commit()
    store.close()
    path = journal(tmp_path)
    data = bytearray(path.read_bytes())
    assert len(data) == 60
    if damage == "cut":
        data = data[:53]
    elif damage == "crc":
        data[50] ^= 0x10
    elif damage == "garbage-tail":
        data += b"\x00\x01\x02"
    elif damage == "bad-range":  # a well-formed record that says [10, 9]
        body = struct.pack(">QQ", 10, 9)
        data[40:] = struct.pack(">I", zlib.crc32(body)) + body
    path.write_bytes(data)
    store, log = open_log(tmp_path)
    if damage == "garbage-tail":
        assert state(log) == (2, {5, 9, 10})
        assert path.stat().st_size == 60
    else:
        assert state(log) == (2, {5})
        assert path.stat().st_size == 40
    assert "queue.acks" in caplog.text
    log.ack([3])
    store.close()
    store, log = open_log(tmp_path)
    assert state(log)[0] == 3
    store.close()


def test_compaction_keeps_the_state(tmp_path: Path) -> None:
    store, log = open_log(tmp_path)
    fill(log, 400)
    log._acks.compact_bytes = 200  # ten records: compact often
    model: set[int] = set()
    for acked in [*range(1, 60), *range(100, 400, 3), *range(300, 250, -2)]:
        log.ack([acked])
        log.commit()
        model.add(acked)
        watermark, above = state(log)
        compacted = ([(1, watermark)] if watermark else []) + coalesce(above)
        ranges = journal_ranges(tmp_path)
        assert len(ranges) <= 10 or ranges == compacted  # past 200 bytes it is rewritten as its state
    expected = (59, {n for n in model if n > 59})
    assert state(log) == expected
    ranges = journal_ranges(tmp_path)
    assert ranges[0] == (1, 59)
    store.close()
    store, log = open_log(tmp_path)
    assert state(log) == expected
    store.close()
    assert not journal(tmp_path).with_name("queue.acks.tmp").exists()


def test_compaction_rewrites_the_watermark_and_ranges(tmp_path: Path) -> None:
    store, log = open_log(tmp_path)
    fill(log, 30)
    for acked in (1, 2, 3, 5, 6, 9):
        log.ack([acked])
        log.commit()
    log._acks.compact()
    assert journal_ranges(tmp_path) == [(1, 3), (5, 6), (9, 9)]
    store.close()


def test_acks_of_ids_lost_from_the_log_are_forgotten_durably(tmp_path: Path) -> None:
    store, log = open_log(tmp_path)
    fill(log, 10)
    log.ack([1, 2, 3, 8, 9, 10])
    log.commit()
    store.close()
    # A crash took messages 8..10 from the log (written, never fsynced) while their acks reached the disk.
    (segment,) = (tmp_path / directory_name(TOPIC)).glob("*.log")
    data = segment.read_bytes()
    position = 16
    for _ in range(7):
        (length,) = struct.unpack_from(">I", data, position)
        position += 16 + length
    segment.write_bytes(data[:position])
    store, log = open_log(tmp_path)
    assert log.next_id == 8
    assert state(log) == (3, set())
    fill(log, 3)  # new messages 8..10: not acked
    store.close()
    store, log = open_log(tmp_path)
    assert state(log) == (3, set())
    store.close()


def test_ids_below_the_first_id_count_as_acked(tmp_path: Path) -> None:
    spec = TopicSpec(
        delivery=Delivery.ROUND_ROBIN,
        persistence=Persistence.PERSISTENT,
        sync=Sync.STRONG,
        segment_bytes=1024,
        retention_bytes=3000,
    )
    store, log = open_log(tmp_path, spec)
    fill(log, 180)
    log.ack([150, 152])
    log.commit()
    assert log.enforce_retention(NOW) > 0
    first = log.first_id
    assert 1 < first < 150
    assert state(log) == (first - 1, {150, 152})
    store.close()
    store, log = open_log(tmp_path, spec)
    assert state(log) == (first - 1, {150, 152})
    log.ack(range(first, 151))
    assert state(log) == (150, {152})
    store.close()


def test_strong_acks_are_fsynced_and_weak_ones_are_not(tmp_path: Path, monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    store, strong = open_log(tmp_path / "strong")
    fill(strong, 5)
    weak_spec = TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT, sync=Sync.WEAK)
    weak_store, weak = open_log(tmp_path / "weak", weak_spec)
    fill(weak, 5)
    calls.clear()
    strong.ack([1])
    strong.commit()
    assert len(calls) == 2  # the journal, and the directory it was created in
    assert strong.fsyncs == 1  # (the data's fsync, from fill: acks do not count)
    assert not strong.dirty
    strong.ack([2])
    strong.commit()
    assert len(calls) == 3  # the journal only
    calls.clear()
    weak.ack([1, 2])
    weak.commit()
    assert calls == []
    assert weak.dirty
    weak.sync()
    assert len(calls) == 3  # the data written by fill, the journal, the directory
    assert not weak.dirty
    store.close()
    weak_store.close()


def test_acking_through_an_id_is_one_range_however_many_ids(tmp_path: Path) -> None:
    """A cluster's follower or new leader takes the queue's position in one step: one record, not one id at
    a time."""
    store, queue = open_log(tmp_path)
    fill(queue, 50)
    queue.ack([3, 30])
    queue.ack_through(20)
    assert state(queue) == (20, {30})
    queue.ack_through(10)  # behind the watermark: nothing
    queue.commit()
    assert journal_ranges(tmp_path) == [(1, 20), (3, 3), (30, 30)]
    with pytest.raises(ValueError, match="holds ids below 51"):
        queue.ack_through(51)
    store.close()
    store, queue = open_log(tmp_path)  # the journal replays to the same state
    try:
        assert state(queue) == (20, {30})
    finally:
        store.close()
