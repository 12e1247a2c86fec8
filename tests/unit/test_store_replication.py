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
from broker.store import files as files_module
from broker.store import log as log_module
from broker.store.files import FileStore, read_topic_meta
from broker.store.log import COPY_BULK_MIN, COPY_UNIFORM_MIN, SegmentLog
from broker.topics import Persistence, Sync, TopicSpec
from protocol.crcs import FOLD_FROM

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


@pytest.fixture
def bulk_checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each bulk check of a run said (True: checked and placed at once; False: left to the loop)."""
    said: list[bool] = []
    check = SegmentLog._append_run

    def spied(log: SegmentLog, records: bytes, start_id: int, count: int) -> bool:
        said.append(check(log, records, start_id, count))
        return said[-1]

    monkeypatch.setattr(SegmentLog, "_append_run", spied)
    return said


@pytest.fixture
def uniform_checks(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """What each check of a run by byte columns said (a record size: recognised; None: not)."""
    said: list[int | None] = []
    check = log_module.uniform_run

    def spied(records: bytes, start_id: int, count: int) -> int | None:
        said.append(check(records, start_id, count))
        return said[-1]

    monkeypatch.setattr(log_module, "uniform_run", spied)
    return said


def run_of(count: int, first: int = 1) -> bytes:
    """``count`` records of one size and layout, as a leader's plain publishes are stored: what a follower
    checks at once (the ids and timestamps differ, the sizes do not)."""
    return b"".join(record(n, b"%06d" % n + b"x" * 94, 1_700_000_000_000 + 7 * n)
                    for n in range(first, first + count))


def body_of(n: int) -> bytes:
    """Bodies of many sizes, each length's msgpack head among them (bin 8 and bin 16)."""
    return b"%06d" % n + b"v" * (n * 37 % 300)


def mixed_run(count: int) -> bytes:
    """Plain records of many sizes and timestamps of every width msgpack has (a fixint to eight bytes)."""
    stamps = [5, 200, 60_000, 4_000_000_000, 1_700_000_000_000]
    return b"".join(record(n, body_of(n), stamps[n % len(stamps)]) for n in range(1, count + 1))


def two_layouts_body(n: int) -> bytes:
    return b"%06d" % n + b"w" * (94 if n % 3 else 98)


def two_layouts(count: int) -> bytes:
    """Plain records of one size in two layouts: every third one's timestamp four bytes narrower and its body
    four bytes longer."""
    return b"".join(record(n, two_layouts_body(n), 1_700_000_000_000 + n if n % 3 else 4_000_000_000 + n)
                    for n in range(1, count + 1))


def same_body(n: int) -> bytes:
    return b"%06d" % n + b"x" * 94


@pytest.mark.parametrize(("count", "make", "body", "by_columns"), [
    (10, run_of, same_body, True),
    (COPY_BULK_MIN, run_of, same_body, True),
    (300, run_of, same_body, True),
    (FOLD_FROM + 16, run_of, same_body, None),
    (300, mixed_run, body_of, False),
    (COPY_BULK_MIN + 8, two_layouts, two_layouts_body, False),
], ids=["one-size-short", "one-size-few", "one-size", "one-size-folded", "many-sizes",
        "one-size-two-layouts"])
def test_a_run_checked_at_once_is_stored_as_records_one_at_a_time_are(
    tmp_path: Path, count: int, make, body, by_columns: bool | None, bulk_checks: list[bool],
    uniform_checks: list[int | None],
) -> None:
    """``by_columns``: the run is recognised by byte columns (True), looked at with numpy after they did not
    recognise it (False), or with numpy alone (None: too long for the columns to pay)."""
    data = make(count)
    places = [0]
    for _ in range(count):  # where each record ends, read from its head
        places.append(places[-1] + 16 + struct.unpack_from(">I", data, places[-1])[0])
    for folder in ("at_once", "one_by_one"):
        (tmp_path / folder).mkdir()
    at_once = SegmentLog(TOPIC, tmp_path / "at_once", SPEC)
    at_once.append_records(data, 1, count)  # checked in bulk
    one_by_one = SegmentLog(TOPIC, tmp_path / "one_by_one", SPEC)
    for index in range(count):  # each below COPY_UNIFORM_MIN: checked one by one
        one_by_one.append_records(data[places[index] : places[index + 1]], index + 1, 1)
    assert bulk_checks == [True]
    assert uniform_checks == {True: [len(data) // count], False: [None], None: []}[by_columns]
    for log in (at_once, one_by_one):
        log.commit()
        assert log.next_id == count + 1
    assert at_once.segment_count > 1  # the run crossed segments of 1 KiB
    # The same files byte for byte (segments and their sparse indexes), each segment's newest timestamp the
    # one of its last record, and the same answers to a search by time.
    names = sorted(path.name for path in (tmp_path / "at_once").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "one_by_one").iterdir())
    for name in names:
        assert (tmp_path / "at_once" / name).read_bytes() == (tmp_path / "one_by_one" / name).read_bytes()
    assert ([segment.last_timestamp for segment in at_once._segments]
            == [segment.last_timestamp for segment in one_by_one._segments])
    for moment in (0, 1_700_000_000_000 + 7 * (count // 2) - 3, 1_700_000_000_000 + 7 * count + 1,
                   4_000_000_000 + count // 2):
        assert at_once.find_time(moment) == one_by_one.find_time(moment)
    at_once.close()
    again = SegmentLog(TOPIC, tmp_path / "at_once", SPEC)
    assert bodies(again) == [(n, body(n)) for n in range(1, count + 1)]


def test_records_with_headers_are_appended_one_by_one(tmp_path: Path, bulk_checks: list[bool]) -> None:
    count = COPY_BULK_MIN + 8
    with_headers = msgpack.packb([1_700_000_000_035, {b"k": b"v"}, b"h" * 94], use_bin_type=True)
    data = run_of(4) + payload_record(5, with_headers) + run_of(count - 5, first=6)
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    log.append_records(data, 1, count)
    log.commit()
    assert bulk_checks == [False]
    assert log.next_id == count + 1
    assert [(message.id, message.headers) for message in log.read(5, 1, 1 << 20)] == [(5, {b"k": b"v"})]


def payload_record(message_id: int, payload: bytes) -> bytes:
    return struct.pack(">IIQ", len(payload), zlib.crc32(message_id.to_bytes(8, "big") + payload),
                       message_id) + payload


@pytest.mark.parametrize(("damage", "why"), [
    (lambda data, size: data[: 9 * size + 30] + bytes([data[9 * size + 30] ^ 4]) + data[9 * size + 31 :],
     "record 10 fails its CRC"),
    (lambda data, size: data[: 9 * size] + record(11, b"%06d" % 10 + b"x" * 94, 1_700_000_000_070)
     + data[10 * size :], "has id 11, expected 10"),
    # Well-formed msgpack of the record's size, but a text body where the store keeps bytes.
    (lambda data, size: data[: 9 * size]
     + payload_record(10, msgpack.packb([1_700_000_000_070, {}, "z" * 100], use_bin_type=True))
     + data[10 * size :], "record 10: payload fields have the wrong types"),
])
@pytest.mark.parametrize("count", [12, COPY_BULK_MIN + 8], ids=["short", "long"])
def test_a_bad_record_in_a_run_appends_nothing_and_is_named(tmp_path: Path, damage, why: str, count: int,
                                                            bulk_checks: list[bool]) -> None:
    """A short run (byte columns only) and a longer one (numpy's checks too) alike."""
    data = run_of(count)
    size = len(data) // count
    broken = damage(data, size)
    assert len(broken) == len(data)
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    with pytest.raises(StoreError, match=why):
        log.append_records(broken, 1, count)
    assert log.next_id == 1
    log.append_records(data, 1, count)  # and the good run goes in whole afterwards
    log.commit()
    assert log.next_id == count + 1
    assert bulk_checks == [False, True]


def test_the_shortest_runs_are_appended_one_by_one(tmp_path: Path, bulk_checks: list[bool],
                                                   uniform_checks: list[int | None]) -> None:
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    log.append_records(run_of(COPY_UNIFORM_MIN - 1), 1, COPY_UNIFORM_MIN - 1)  # the loop costs less
    assert (bulk_checks, uniform_checks) == ([], [])
    log.append_records(run_of(COPY_UNIFORM_MIN, first=COPY_UNIFORM_MIN), COPY_UNIFORM_MIN, COPY_UNIFORM_MIN)
    assert bulk_checks == [True]
    assert uniform_checks == [len(run_of(1))]
    log.commit()
    assert bodies(log) == [(n, same_body(n)) for n in range(1, 2 * COPY_UNIFORM_MIN)]


def test_a_short_run_of_many_sizes_is_appended_one_by_one(tmp_path: Path, bulk_checks: list[bool],
                                                          uniform_checks: list[int | None]) -> None:
    count = COPY_BULK_MIN - 1  # too few for numpy's checks to pay
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    log.append_records(mixed_run(count), 1, count)
    log.commit()
    assert (bulk_checks, uniform_checks) == ([False], [None])
    assert bodies(log) == [(n, body_of(n)) for n in range(1, count + 1)]


def test_a_bad_record_among_many_sizes_appends_nothing_and_is_named(tmp_path: Path,
                                                                      bulk_checks: list[bool]) -> None:
    count = COPY_BULK_MIN + 8
    data = mixed_run(count)
    position = 0
    for _ in range(9):  # to the tenth record
        position += 16 + struct.unpack_from(">I", data, position)[0]
    broken = data[: position + 30] + bytes([data[position + 30] ^ 4]) + data[position + 31 :]
    log = SegmentLog(TOPIC, tmp_path, SPEC)
    with pytest.raises(StoreError, match="record 10 fails its CRC"):
        log.append_records(broken, 1, count)
    assert log.next_id == 1
    log.append_records(data, 1, count)
    log.commit()
    assert log.next_id == count + 1
    assert bulk_checks == [False, True]


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


def test_a_log_takes_another_identity_recorded_before_its_next_write(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    first = log.identity
    log.append(Message(TOPIC, 1, b"before", {}, 1000))
    log.commit()
    successor = first.successor(2)
    store.set_identity(TOPIC, successor)
    assert log.identity == successor  # answered at once
    assert read_topic_meta(tmp_path / "t").identity == first  # the files hold a prefix of both logs
    log.append(Message(TOPIC, 2, b"after", {}, 1000))
    log.commit()
    assert read_topic_meta(tmp_path / "t").identity == successor
    store.close()
    again = FileStore(tmp_path)
    reopened = again.open(TOPIC, SPEC)
    assert reopened.identity == successor
    assert bodies(reopened) == [(1, b"before"), (2, b"after")]
    with pytest.raises(StoreError):
        again.set_identity(b"never-opened", LogIdentity.fresh())
    again.close()


def test_an_identity_nothing_was_written_under_is_recorded_at_close(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    successor = log.identity.successor(1)
    store.set_identity(TOPIC, successor)
    store.close()
    assert read_topic_meta(tmp_path / "t").identity == successor


def test_an_identity_that_cannot_be_recorded_stops_the_write_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    first = log.identity
    successor = first.successor(1)
    store.set_identity(TOPIC, successor)
    real = files_module.write_file_atomically

    def full_disk(path: Path, data: bytes) -> None:
        raise StoreError(f"{path}: cannot write: [Errno 28] No space left on device")

    monkeypatch.setattr(files_module, "write_file_atomically", full_disk)
    log.append(Message(TOPIC, 1, b"x", {}, 1000))
    with pytest.raises(StoreError, match="No space left"):
        log.commit()
    assert log.next_id == 1  # nothing of it reached the files under the old identity
    assert read_topic_meta(tmp_path / "t").identity == first
    monkeypatch.setattr(files_module, "write_file_atomically", real)
    log.append(Message(TOPIC, 1, b"x", {}, 1000))
    log.commit()  # owed still: recorded now, before the record
    assert read_topic_meta(tmp_path / "t").identity == successor
    assert bodies(log) == [(1, b"x")]
    store.close()


@pytest.mark.parametrize("cut", ["truncate", "restart_at"])
def test_a_cut_under_a_new_identity_records_it_first(tmp_path: Path, cut: str) -> None:
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    for n in range(1, 6):
        log.append(Message(TOPIC, n, b"y", {}, 1000))
    log.commit()
    successor = log.identity.successor(3)
    store.set_identity(TOPIC, successor)
    if cut == "truncate":
        log.truncate(3)
    else:
        log.restart_at(20)
    assert read_topic_meta(tmp_path / "t").identity == successor
    store.close()
