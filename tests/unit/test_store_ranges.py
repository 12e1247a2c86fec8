"""The store's newer reads and records: raw record ranges (``read_records``), the search by time
(``find_time``), the log identity in ``topic.json`` (new, recorded, recreated, a successor after an unclean
stop on another boot) and the producer journal (replayed, cut back to what the log holds, compacted).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from broker.engine import Message
from broker.producers import ProducerWindow
from broker.store import LogIdentity
from broker.store import files as files_module
from broker.store.files import LOCK_FILE, FileStore
from broker.store.log import SegmentLog
from broker.store.producers import JOURNAL_FILE, ProducerJournal
from broker.topics import Persistence, Sync, TopicSpec
from protocol import records

TOPIC = b"t"
SMALL = TopicSpec(persistence=Persistence.PERSISTENT, segment_bytes=4096)
WEAK = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)


def fill(log: SegmentLog, count: int, *, size: int = 40, start_ms: int = 1000, step_ms: int = 10) -> None:
    for n in range(count):
        message_id = log.next_id
        body = (b"%06d" % message_id).ljust(size, b".")
        log.append(Message(TOPIC, message_id, body, {b"X-N": b"%d" % n} if n % 7 == 0 else {},
                           start_ms + (message_id - 1) * step_ms))
        if n % 13 == 0:
            log.commit()
    log.commit()


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    opened = SegmentLog(TOPIC, tmp_path, SMALL, index_interval=256)
    yield opened
    opened.close()


# ------------------------------------------------------------------------------------------ read_records


def test_records_are_the_stored_bytes_of_a_range_and_decode_to_what_read_returns(log: SegmentLog) -> None:
    fill(log, 400)
    for start, count in ((1, 5), (17, 100), (250, 151), (399, 10)):
        first, got, data = log.read_records(start, count, 1 << 20)
        assert first == start
        decoded = records.decode(data, first, got)
        expected = log.read(start, got, 1 << 20)
        assert got >= 1
        assert [(r.id, r.timestamp, r.headers, r.body) for r in decoded] == [
            (m.id, m.timestamp, m.headers, m.body) for m in expected]


def test_a_reader_that_keeps_up_reads_each_write_where_it_landed(log: SegmentLog) -> None:
    # The follower's pattern: read from the first id of each commit, right after it (the log remembers where
    # that write began): commits of every size, so that some begin a new segment (whose first write starts
    # with the segment's header) and some fill several; then after a truncation that rewrites the tail.
    def tail_reads(batches: int) -> None:
        for size in range(1, batches + 1):
            first = log.next_id
            for _ in range(size % 7 + 1 if size % 9 else 120):  # now and then more than a segment holds
                log.append(Message(TOPIC, log.next_id, b"%06d" % log.next_id, {}, 1000))
            log.commit()
            position = first
            while position < log.next_id:
                got_first, got, data = log.read_records(position, 10_000, 1 << 20)
                assert got_first == position
                assert 1 <= got <= log.next_id - position  # fewer where a segment ends
                decoded = records.decode(data, got_first, got)
                assert [r.body for r in decoded] == [b"%06d" % n for n in range(position, position + got)]
                position += got

    tail_reads(60)
    assert len(log._segments) > 3  # the commits crossed segments
    log.truncate(log.next_id - 3)
    tail_reads(20)


def test_a_records_read_stops_at_its_segment_its_count_and_its_bytes(log: SegmentLog) -> None:
    fill(log, 400)
    assert log.segment_count > 3
    first, count, data = log.read_records(1, 10_000, 1 << 20)
    segment_end = log._segments[1].base
    assert (first, count) == (1, segment_end - 1), "one segment per read"
    _, count, data = log.read_records(1, 7, 1 << 20)
    assert count == 7
    assert len(records.walk(data, 1, 7)) == 7
    _, count, data = log.read_records(3, 1000, 600)
    assert count >= 1
    assert len(data) <= 600 + 256, "cut by bytes at an index entry or by a short walk"
    _, count, data = log.read_records(3, 1000, 10)
    assert count == 1, "at least one record, however small the budget"
    assert log.read_records(10_000, 5, 1000) == (10_000, 0, b"")


def test_records_start_at_the_first_stored_id_after_retention(tmp_path: Path) -> None:
    spec = TopicSpec(persistence=Persistence.PERSISTENT, segment_bytes=1024, retention_bytes=2048)
    opened = SegmentLog(TOPIC, tmp_path, spec, index_interval=128)
    fill(opened, 200)
    opened.enforce_retention(10**12)
    assert opened.first_id > 1
    first, count, data = opened.read_records(1, 5, 1 << 20)
    assert first == opened.first_id
    assert [r.id for r in records.decode(data, first, count)] == list(range(first, first + count))
    opened.close()


def test_walk_refuses_what_a_broker_must_never_send(log: SegmentLog) -> None:
    fill(log, 20)
    first, count, data = log.read_records(1, 20, 1 << 20)
    with pytest.raises(records.ProtocolError, match="CRC"):
        records.walk(data[:-1] + bytes([data[-1] ^ 1]), first, count)
    with pytest.raises(records.ProtocolError, match="expected id"):
        records.walk(data, first + 1, count)
    with pytest.raises(records.ProtocolError, match="after its"):
        records.walk(data + b"x", first, count)
    with pytest.raises(records.ProtocolError, match="ends inside"):
        records.walk(data[:10], first, count)


# --------------------------------------------------------------------------------------------- find_time


def test_find_time_is_the_first_id_at_or_after_a_time(log: SegmentLog) -> None:
    fill(log, 500, start_ms=1000, step_ms=10)  # id n stored at 1000 + (n - 1) * 10
    assert log.segment_count > 3
    for wanted, expected in ((0, 1), (1000, 1), (1001, 2), (1010, 2), (3005, 202), (5990, 500), (5991, 501)):
        assert log.find_time(wanted) == expected, wanted
    assert log.find_time(10**12) == log.next_id


def test_find_time_of_an_empty_log_is_its_next_id(log: SegmentLog) -> None:
    assert log.find_time(0) == 1


# ----------------------------------------------------------------------------------------- log identity


def open_once(root: Path, spec: TopicSpec = SMALL) -> tuple[LogIdentity, int]:
    store = FileStore(root)
    opened = store.open(TOPIC, spec)
    identity, next_id = opened.identity, opened.next_id
    if next_id == 1:
        fill(opened, 30)
        next_id = opened.next_id
    store.close()
    return identity, next_id


def test_a_log_keeps_its_identity_across_restarts_and_records_it(tmp_path: Path) -> None:
    first, _ = open_once(tmp_path)
    again, _ = open_once(tmp_path)
    assert first == again
    assert first.lineage == ()
    meta = json.loads((tmp_path / "t" / "topic.json").read_text())
    assert meta["incarnation"] == first.incarnation
    assert "lineage" not in meta


def test_a_log_whose_files_were_lost_is_a_new_one(tmp_path: Path) -> None:
    first, _ = open_once(tmp_path)
    for path in (tmp_path / "t").glob("*.log"):
        path.unlink()
    second, _ = open_once(tmp_path)
    assert second.incarnation != first.incarnation
    assert second.lineage == ()
    assert second.resume_point(first.incarnation, 25) is None, "nothing shared: read from the beginning"


def test_an_unclean_stop_across_a_machine_restart_starts_a_successor_for_weak_logs_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weak, next_id = open_once(tmp_path / "weak", WEAK)
    strong, _ = open_once(tmp_path / "strong", SMALL)
    boot = tmp_path / "boot_id"
    boot.write_text("this-boot\n")
    monkeypatch.setattr(files_module, "BOOT_ID_FILE", boot)
    for root in ("weak", "strong"):  # as a broker killed before the machine went down leaves it
        (tmp_path / root / LOCK_FILE).write_text("boot an-earlier-boot\n")
    after, recovered = open_once(tmp_path / "weak", WEAK)
    assert recovered == next_id
    assert after.incarnation != weak.incarnation
    assert after.lineage == ((weak.incarnation, next_id),)
    assert after.resume_point(weak.incarnation, 10) == 10, "below the divergence: the same messages"
    assert after.resume_point(weak.incarnation, next_id + 50) == next_id, "past it: from where they part"
    assert open_once(tmp_path / "strong", SMALL)[0] == strong, "a strong log hands out nothing unsynced"
    assert open_once(tmp_path / "weak", WEAK)[0] == after, "a clean stop keeps it"
    (tmp_path / "weak" / LOCK_FILE).write_text("boot this-boot\n")
    assert open_once(tmp_path / "weak", WEAK)[0] == after, "killed on this boot: the page cache kept all"


def test_lineage_resume_points_over_several_steps() -> None:
    a = LogIdentity.fresh()
    b = a.successor(100)
    c = b.successor(80)
    assert c.resume_point(c.incarnation, 500) == 500
    assert c.resume_point(b.incarnation, 90) == 80
    assert c.resume_point(a.incarnation, 120) == 80
    assert c.resume_point(a.incarnation, 50) == 50
    assert c.resume_point("f" * 32, 50) is None


def test_a_resume_point_from_an_identity_no_log_recorded() -> None:
    """A cluster's epoch whose leader died before it wrote anything: its identity (a successor of the log's
    identity then) is in no log's lineage, but the cluster knows its lineage. A reader of it goes on from
    where the two part after their latest shared ancestor, not from the beginning."""
    a = LogIdentity.fresh()
    lost = a.successor(100)  # epoch 2: its leader died before writing; readers learnt it from a SUB's OK
    taken = a.successor(100).successor(100)  # epoch 3, by a member that followed epoch 1 only ...
    now = LogIdentity(taken.incarnation, (taken.lineage[0],))  # ... whose lineage never named epoch 2's
    assert now.resume_point(lost.incarnation, 100) is None
    assert now.resume_point_from(lost, 100) == 100  # read up to 99 in epoch 2: all of it epoch 1's
    assert now.resume_point_from(lost, 140) == 100  # past where epoch 2 began: from there
    assert now.resume_point_from(LogIdentity("f" * 32, (("e" * 32, 5),)), 50) is None  # nothing shared
    assert now.resume_point_from(now, 70) == 70


def test_a_lock_file_is_emptied_by_a_clean_stop_only(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.open(TOPIC, SMALL)
    assert (tmp_path / LOCK_FILE).read_text().startswith("boot ")
    store.close()
    assert (tmp_path / LOCK_FILE).read_text() == ""
    assert not FileStore(tmp_path).unclean


def test_what_the_last_broker_left_is_read_by_the_first_claim_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker checks the directory (claiming and letting go of it) before it opens any log: the second
    claim must not take the first one's mark for an unclean stop, nor forget a real one."""
    boot = tmp_path / "boot_id"
    boot.write_text("this-boot\n")
    monkeypatch.setattr(files_module, "BOOT_ID_FILE", boot)
    fresh = FileStore(tmp_path / "fresh")
    fresh.check()
    fresh.open(TOPIC, SMALL)
    assert not fresh.unclean
    fresh.close()
    (tmp_path / "crashed").mkdir()
    (tmp_path / "crashed" / LOCK_FILE).write_text("boot an-earlier-boot\n")
    crashed = FileStore(tmp_path / "crashed")
    crashed.check()
    crashed.open(TOPIC, SMALL)
    assert crashed.unclean
    assert not crashed.same_boot
    crashed.close()


# ------------------------------------------------------------------------------------ producer journal


def test_the_producer_journal_survives_a_reopen(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SMALL)
    fill(log, 10)
    log.producers.record(b"p1", 41, 3, 5)
    log.producers.record(b"p2", 7, 8, 2)
    log.producers.record(b"p1", 45, 9, 2)
    log.commit()
    log.close()
    again = SegmentLog(TOPIC, tmp_path, SMALL)
    assert again.producers.last == {b"p2": (7, 9), b"p1": (45, 10)}
    assert again.producers.duplicates(b"p1", 44, 5) == 2
    again.close()


def test_records_of_messages_the_log_lost_are_cut_back(tmp_path: Path) -> None:
    journal = ProducerJournal(tmp_path)
    journal.record(b"p", 9, 1, 10)  # ids 1..10, sequences 0..9
    journal.record(b"p", 19, 11, 10)  # ids 11..20, sequences 10..19
    journal.record(b"q", 4, 21, 5)  # ids 21..25
    journal.write()
    journal.close()
    cut = ProducerJournal(tmp_path)
    cut.open(next_id=15)  # the log came back holding ids below 15
    assert cut.last == {b"p": (13, 14)}, "p stored up to sequence 13 (id 14); q's messages are all gone"
    cut.close()
    assert ProducerJournal(tmp_path).duplicates(b"q", 0, 5) == 0


def test_a_torn_journal_tail_is_cut_and_a_big_journal_compacted(tmp_path: Path) -> None:
    journal = ProducerJournal(tmp_path)
    for n in range(100):
        journal.record(b"p%d" % (n % 5), n, n + 1, 1)
    journal.write()
    journal.close()
    path = tmp_path / JOURNAL_FILE
    with path.open("ab") as file:
        file.write(b"\x00\x01\x02")
    reopened = ProducerJournal(tmp_path)
    reopened.compact_bytes = 100
    reopened.open(next_id=1000)
    assert len(reopened.last) == 5
    assert reopened.last[b"p4"] == (99, 100)
    assert os.path.getsize(path) == reopened.size < 100 * 30, "rewritten as five records"
    reopened.close()


def test_a_window_forgets_its_least_recently_active_producers() -> None:
    window = ProducerWindow(limit=2)
    window.record(b"a", 1, 1, 1)
    window.record(b"b", 1, 2, 1)
    window.record(b"a", 2, 3, 1)
    window.record(b"c", 1, 4, 1)
    assert set(window.last) == {b"a", b"c"}
    assert window.evicted == 1
    assert window.duplicates(b"b", 0, 3) == 0, "forgotten: a stranger again"
    assert window.duplicates(b"a", 1, 3) == 2


def test_a_known_producer_may_not_leave_a_gap_but_a_stranger_begins_anywhere() -> None:
    window = ProducerWindow()
    assert window.gap(b"new", 500) is None, "a stranger's first batch begins where it likes"
    window.record(b"p", 9, 1, 10)  # numbers 0-9 stored
    assert window.gap(b"p", 10) is None, "follows on"
    assert window.gap(b"p", 3) is None, "overlaps: its first entries are duplicates"
    assert window.gap(b"p", 11) == 10, "number 10 would never be stored: send it first"


def test_a_stale_index_entry_is_rebuilt_when_a_records_read_meets_it(tmp_path: Path) -> None:
    log = SegmentLog(TOPIC, tmp_path, SMALL, index_interval=256)
    fill(log, 200)
    log.close()
    index = sorted(tmp_path.glob("*.index"))[0]
    data = bytearray(index.read_bytes())
    entry = 3 * 16  # the fourth entry: its id one too high, still in order (the cheap checks pass)
    entry_id = int.from_bytes(data[entry : entry + 8], "big")
    data[entry : entry + 8] = (entry_id + 1).to_bytes(8, "big")
    index.write_bytes(bytes(data))
    reopened = SegmentLog(TOPIC, tmp_path, SMALL, index_interval=256)
    first, count, payload = reopened.read_records(entry_id + 1, 5, 1 << 20)
    assert [r.id for r in records.decode(payload, first, count)] == list(range(entry_id + 1, entry_id + 6))
    reopened.close()
