"""The space a log reserves after its records (:func:`broker.store.segment.reserve_ahead`): the active
segment's file and the journals' are longer than their records while the log writes them; readers see the
records only; a crash leaves zero bytes that the next open cuts without calling them torn, while a torn write
inside that space is still reported (by the broker and by ``mc0 verify``); sealing, letting the files go and
closing end each file at its last record; and a file system that cannot make a file longer loses nothing."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
from pathlib import Path

import pytest

from broker.engine import Message
from broker.store import check
from broker.store.files import FileStore, directory_name
from broker.store.segment import RESERVE_STEP
from broker.topics import Delivery, Persistence, Sync, TopicSpec

TOPIC = b"reserve/test"
NOW = 1_700_000_000_000
SPEC = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)
SMALL = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024)
QUEUE = TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT, sync=Sync.STRONG)


def message(message_id: int, size: int = 0) -> Message:
    body = b"body %d" % message_id * 4
    return Message(TOPIC, message_id, body + b"." * (size - len(body)), {}, NOW)


def write(log, first: int, count: int) -> list[Message]:
    messages = [message(n) for n in range(first, first + count)]
    for msg in messages:
        log.append(msg)
        log.commit()
    return messages


def topic_dir(root: Path) -> Path:
    return root / directory_name(TOPIC)


def segments(root: Path) -> list[Path]:
    return sorted(topic_dir(root).glob("*.log"))


def records_end(path: Path) -> int:
    """Where the records of a segment file end, read independently of the code under test: a record head of
    length 0 is where the written records stop (docs/storage.md)."""
    data = path.read_bytes()
    position = 16
    while position + 16 <= len(data):
        (length,) = struct.unpack_from(">I", data, position)
        if length == 0:
            break
        position += 16 + length
    return position


def crash(root: Path, tmp_path: Path) -> Path:
    """The data directory as a crash of the process leaves it while its logs are open."""
    copy = tmp_path / "after-crash"
    shutil.copytree(root, copy)
    return copy


def crashed(tmp_path: Path, count: int) -> tuple[Path, list[Message]]:
    """The data directory of a strong log of ``count`` messages, as a crash leaves it, and the messages."""
    store = FileStore(tmp_path / "data")
    messages = write(store.open(TOPIC, SPEC), 1, count)
    copy = crash(store.root, tmp_path)
    store.close()
    return copy, messages


def test_the_active_file_is_longer_than_its_records_until_the_log_closes(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "data")
    log = store.open(TOPIC, SPEC)
    messages = write(log, 1, 10)
    (active,) = segments(store.root)
    assert active.stat().st_size == RESERVE_STEP
    assert records_end(active) == log.bytes_on_disk < RESERVE_STEP
    assert log.read(1, 100, 1 << 20) == messages
    written = log.bytes_on_disk
    store.close()
    assert active.stat().st_size == records_end(active) == written


def test_a_crash_leaves_reserved_space_that_the_next_open_cuts_quietly(tmp_path: Path, caplog) -> None:
    copy, messages = crashed(tmp_path, 25)
    (active,) = segments(copy)
    assert active.stat().st_size == RESERVE_STEP
    with caplog.at_level(logging.WARNING, logger="mc0.store"):
        store = FileStore(copy)
        log = store.open(TOPIC, SPEC)
    assert log.truncated_bytes == 0
    assert not [record for record in caplog.records if "torn" in record.getMessage()]
    assert log.read(1, 100, 1 << 20) == messages
    assert active.stat().st_size == records_end(active)  # cut back to the records
    more = write(log, 26, 5)  # and reserved again by the next write
    assert active.stat().st_size == RESERVE_STEP
    store.close()
    assert FileStore(copy).open(TOPIC, SPEC).read(1, 100, 1 << 20) == messages + more


def test_a_torn_write_inside_the_reserved_space_is_still_reported(tmp_path: Path, caplog) -> None:
    copy, messages = crashed(tmp_path, 25)
    (active,) = segments(copy)
    end = records_end(active)
    torn = struct.pack(">IIQ", 40, 0x12345678, 26)[:8]  # a record head cut short by the crash
    with active.open("r+b") as file:
        file.seek(end)
        file.write(torn)
    assert active.stat().st_size == RESERVE_STEP
    assert [note for note in check.survey_topic(topic_dir(copy)).notes if "torn tail of 8 bytes" in note]
    with caplog.at_level(logging.WARNING, logger="mc0.store"):
        log = FileStore(copy).open(TOPIC, SPEC)
    assert log.truncated_bytes == 8
    assert [record for record in caplog.records if "truncated 8 bytes of torn tail" in record.getMessage()]
    assert log.read(1, 100, 1 << 20) == messages
    assert log.next_id == 26


def test_verify_does_not_call_reserved_space_torn(tmp_path: Path) -> None:
    copy, _ = crashed(tmp_path, 5)
    report = check.survey_topic(topic_dir(copy))
    assert report.problems == []
    assert report.notes == []
    assert sum(segment.records for segment in report.segments) == 5


def test_sealed_and_released_segments_end_at_their_last_record(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "data")
    log = store.open(TOPIC, SMALL)
    messages = write(log, 1, 60)
    *sealed, active = segments(store.root)
    assert len(sealed) >= 3
    assert all(path.stat().st_size == records_end(path) for path in sealed)
    assert active.stat().st_size == RESERVE_STEP
    log.release()  # the store lets go of a log's files to keep few open
    assert active.stat().st_size == records_end(active)
    messages += write(log, 61, 1)  # opened again, and reserved again
    assert segments(store.root)[-1].stat().st_size == RESERVE_STEP
    assert log.read(1, 100, 1 << 20) == messages
    store.close()


def test_a_file_system_that_cannot_lengthen_a_file_loses_nothing(tmp_path: Path, monkeypatch) -> None:
    def refused(fd: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    store = FileStore(tmp_path / "data")
    log = store.open(TOPIC, SPEC)
    monkeypatch.setattr(os, "ftruncate", refused)
    messages = write(log, 1, 10)
    (active,) = segments(store.root)
    assert active.stat().st_size == records_end(active) == log.bytes_on_disk  # appended, as without it
    assert log.read(1, 100, 1 << 20) == messages
    store.close()
    monkeypatch.undo()
    assert FileStore(tmp_path / "data").open(TOPIC, SPEC).read(1, 100, 1 << 20) == messages


@pytest.mark.parametrize("count", [1, 3000])
def test_a_log_reopened_after_a_clean_close_reads_the_same(tmp_path: Path, count: int) -> None:
    """Across reservations' edges too: 3,000 records of 1,000 bytes fill about three MiB."""
    store = FileStore(tmp_path / "data")
    log = store.open(TOPIC, SPEC)
    for n in range(1, count + 1, 70):  # 70 records a commit: the edges fall inside writes
        for m in range(n, min(n + 70, count + 1)):
            log.append(message(m, 1000))
        log.commit()
        assert segments(store.root)[0].stat().st_size % RESERVE_STEP == 0
    assert log.bytes_on_disk == records_end(segments(store.root)[0])
    store.close()
    (active,) = segments(store.root)
    assert active.stat().st_size == records_end(active)
    reopened = FileStore(tmp_path / "data").open(TOPIC, SPEC)
    assert reopened.truncated_bytes == 0
    assert reopened.read(1, 10_000, 1 << 30) == [message(n, 1000) for n in range(1, count + 1)]


def journaled_queue(root: Path):
    """A strong queue with acks and an idempotent producer's records, committed one message at a time."""
    store = FileStore(root)
    log = store.open(TOPIC, QUEUE)
    for n in range(1, 31):
        log.append(message(n))
        log.producers.record(b"producer-%d" % (n % 3), n, n, 1)
        if n > 1:
            log.ack([n - 1])
        log.commit()
    return store, log


def journals(root: Path) -> list[Path]:
    return [topic_dir(root) / "queue.acks", topic_dir(root) / "producers.journal"]


def test_the_journals_reserve_space_and_a_crash_leaves_it_without_a_warning(tmp_path: Path, caplog) -> None:
    store, log = journaled_queue(tmp_path / "data")
    assert [path.stat().st_size for path in journals(store.root)] == [RESERVE_STEP, RESERVE_STEP]
    sizes = [log._acks.size, log.producers.size]
    copy = crash(store.root, tmp_path)
    store.close()
    assert [path.stat().st_size for path in journals(store.root)] == sizes  # ended at their records
    with caplog.at_level(logging.WARNING, logger="mc0.store"):
        log = FileStore(copy).open(TOPIC, QUEUE)
    assert not [record for record in caplog.records if "torn" in record.getMessage()]
    assert "did not stop cleanly" in caplog.text  # the crash is seen, as it is
    assert log.acked_watermark == 29
    assert log.producers.last[b"producer-0"] == (30, 30)
    assert [path.stat().st_size for path in journals(copy)] == sizes


def test_a_torn_journal_write_inside_the_reserved_space_is_still_reported(tmp_path: Path, caplog) -> None:
    store, log = journaled_queue(tmp_path / "data")
    acks_end = log._acks.size
    copy = crash(store.root, tmp_path)
    store.close()
    acks = journals(copy)[0]
    with acks.open("r+b") as file:
        file.seek(acks_end)
        file.write(b"\x12\x34\x56\x78\x00\x00\x00\x00\x00\x00\x00\x1e\x05")  # a range cut short
    with caplog.at_level(logging.WARNING, logger="mc0.store"):
        log = FileStore(copy).open(TOPIC, QUEUE)
    assert "truncated 13 bytes of torn ack journal tail" in caplog.text
    assert log.acked_watermark == 29


def test_weak_and_async_topics_append_without_reserving(tmp_path: Path) -> None:
    """Their fsyncs are rare (a timer, a seal, a stop): reserved space would gain them nothing."""
    store = FileStore(tmp_path / "data")
    for sync in (Sync.WEAK, Sync.ASYNC):
        topic = b"reserve/" + sync.value.encode()
        log = store.open(topic, TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT,
                                          sync=sync))
        for n in range(1, 11):
            log.append(Message(topic, n, b"body", {}, NOW))
            log.ack([n])
            log.commit()
        directory = store.root / directory_name(topic)
        (segment,) = directory.glob("*.log")
        assert segment.stat().st_size == records_end(segment) == log.bytes_on_disk
        assert (directory / "queue.acks").stat().st_size == log._acks.size > 0
    store.close()
