"""The on-disk log (broker/store/): round trips, ids across restarts, read bounds, reads from any id over many
segments, the sequential-read cursor, rolling, retention, index rebuilding, topic directory names and the meta
file, group commit and fsync accounting, and a hypothesis model check of append/commit/read/reopen.

Crash recovery is in test_store_recovery.py, the ack journal in test_store_acks.py. Files are parsed here by
a few lines of independent code, not by the module under test.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.engine import Engine, Message
from broker.store import StoreError
from broker.store import files as files_module
from broker.store.files import FileStore, directory_name, spec_to_json
from broker.store.log import MAX_OPEN_SEALED, SegmentLog
from broker.store.segment import RESERVE_STEP
from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicRules, TopicSpec

TOPIC = b"t"
NOW = 1_700_000_000_000
SMALL = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024)
SMALL_JSON = json.dumps(spec_to_json(SMALL)).encode()


def spec(**changes: object) -> TopicSpec:
    fields = {"persistence": Persistence.PERSISTENT, "sync": Sync.STRONG, "segment_bytes": 1024, **changes}
    return TopicSpec(**fields)  # type: ignore[arg-type]


def message(message_id: int, body: bytes | None = None, headers: dict[bytes, bytes] | None = None,
            timestamp: int = NOW, topic: bytes = TOPIC) -> Message:
    if body is None:
        body = b"body %d " % message_id + bytes([message_id % 256]) * (message_id % 37)
    return Message(topic, message_id, body, headers if headers is not None else {}, timestamp)


def fill(log: SegmentLog, count: int, commit_every: int = 1, **kwargs: object) -> list[Message]:
    messages = []
    for _ in range(count):
        msg = message(log.next_id, **kwargs)  # type: ignore[arg-type]
        log.append(msg)
        messages.append(msg)
        if len(messages) % commit_every == 0:
            log.commit()
    log.commit()
    return messages


def read_all(log: SegmentLog, start: int = 1) -> list[Message]:
    return log.read(start, 1 << 30, 1 << 40)


def topic_dir(root: Path, topic: bytes = TOPIC) -> Path:
    return root / directory_name(topic)


def parse_segment(path: Path) -> tuple[int, list[tuple[int, int, int, bytes]]]:
    """Independent reader: (base id, [(position, id, length, payload)]) of a whole, valid segment file."""
    data = path.read_bytes()
    assert data[:8] == b"MC0LOG\x00\x01"
    (base,) = struct.unpack(">Q", data[8:16])
    records, position = [], 16
    while position < len(data):
        if not any(data[position:]):  # space the broker reserved after the active segment's last record
            break
        length, crc, record_id = struct.unpack_from(">IIQ", data, position)
        payload = data[position + 16 : position + 16 + length]
        assert len(payload) == length
        assert zlib.crc32(data[position + 8 : position + 16 + length]) == crc
        records.append((position, record_id, length, payload))
        position += 16 + length
    return base, records


def segment_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def written_bytes(path: Path) -> int:
    """Where a segment file's last record ends (space reserved after it not counted)."""
    _, records = parse_segment(path)
    if not records:
        return 16
    position, _, length, _ = records[-1]
    return position + 16 + length


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch) -> None:
    """Crashes are simulated by editing files, so the page cache is the disk here: a real fsync would only
    make the tests as slow as the machine's disk. Tests that count fsyncs replace this with a counter."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture
def store(tmp_path: Path):
    opened = FileStore(tmp_path / "data", index_interval=64)
    yield opened
    opened.close()


def reopen(store: FileStore, topic_spec: TopicSpec = SMALL, topic: bytes = TOPIC) -> SegmentLog:
    """Close every log of the store (as at shutdown) and open the topic again from its files."""
    store.close()
    return store.open(topic, topic_spec)


# ------------------------------------------------------------------------------------------- round trips


def test_round_trip_of_headers_empty_and_binary_bodies(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    messages = [
        message(1, b"plain", {b"k": b"v"}),
        message(2, b"", {}),
        message(3, bytes(range(256)), {b"\x00\xff": b"", b"": b"\x00"}),
        message(4, b"x" * 100_000, {b"big": b"y" * 1000}, timestamp=0),  # bigger than a segment
        message(5, b"\x93\xcf\x80", {}, timestamp=(1 << 63) - 1),  # looks like our own msgpack framing
    ]
    for msg in messages:
        log.append(msg)
    assert read_all(log) == []  # nothing written yet
    log.commit()
    assert read_all(log) == messages
    assert all(msg.topic == TOPIC for msg in read_all(log))
    again = reopen(store)
    assert read_all(again) == messages
    assert again.first_id == 1
    assert again.next_id == 6
    again.verify()


def test_empty_log(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    assert (log.first_id, log.next_id, log.segment_count, log.truncated_bytes) == (1, 1, 1, 0)
    assert read_all(log) == []
    assert log.read(5, 10, 10) == []
    assert not log.dirty
    log.verify()
    assert reopen(store).next_id == 1


def test_ids_continue_after_close_and_reopen(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    first = fill(log, 30, commit_every=7)
    log.close()
    log.close()  # idempotent
    log = reopen(store)
    assert (log.first_id, log.next_id) == (1, 31)
    later = fill(log, 5)
    log = reopen(store)
    assert read_all(log) == first + later
    assert log.next_id == 36


def test_append_with_the_wrong_id_raises(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    log.append(message(1))
    with pytest.raises(StoreError, match="expects 2"):
        log.append(message(3))
    with pytest.raises(StoreError):
        log.append(message(1))
    log.append(message(2))
    log.commit()
    assert [msg.id for msg in read_all(log)] == [1, 2]


def test_only_written_data_is_readable(store: FileStore) -> None:
    log = store.open(TOPIC, spec(sync=Sync.ASYNC))
    fill(log, 3)
    log.append(message(4))
    assert [msg.id for msg in read_all(log)] == [1, 2, 3]
    assert log.read(4, 10, 100) == []
    log.commit()
    assert [msg.id for msg in log.read(4, 10, 100)] == [4]


# ---------------------------------------------------------------------------------------------- bounds


def test_read_is_bounded_by_count(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    fill(log, 20)
    assert [msg.id for msg in log.read(3, 4, 1 << 20)] == [3, 4, 5, 6]
    assert [msg.id for msg in log.read(19, 4, 1 << 20)] == [19, 20]
    assert log.read(21, 4, 1 << 20) == []
    assert log.read(3, 0, 1 << 20) == []


def test_read_is_bounded_by_body_bytes_but_returns_at_least_one(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    for n in range(1, 11):
        log.append(message(n, b"%02d" % n * 5))  # 10-byte bodies
    log.commit()
    log.append(message(11, b""))
    log.append(message(12, b"z" * 10))
    log.commit()
    assert [msg.id for msg in log.read(1, 100, 25)] == [1, 2]  # a third would make 30 > 25
    assert [msg.id for msg in log.read(1, 100, 30)] == [1, 2, 3]  # exactly the budget
    assert [msg.id for msg in log.read(4, 100, 5)] == [4]  # too big for the budget, but always one
    assert [msg.id for msg in log.read(4, 100, 0)] == [4]
    assert [msg.id for msg in log.read(10, 100, 10)] == [10, 11]  # an empty body still fits
    assert [msg.id for msg in log.read(1, 100, 1 << 20)] == list(range(1, 13))


def test_start_before_the_first_id_reads_from_the_first(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    fill(log, 5)
    assert [msg.id for msg in log.read(0, 2, 1 << 20)] == [1, 2]
    assert [msg.id for msg in log.read(-7, 2, 1 << 20)] == [1, 2]


# ----------------------------------------------------------------------------------- multi-segment reads


def test_read_from_every_id_of_a_multi_segment_log(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    messages = fill(log, 300, commit_every=13)
    assert log.segment_count > 10
    for reopened in (False, True):  # in memory, then with sealed indexes loaded from disk
        fresh = reopen(store) if reopened else log
        for start in range(1, 305):
            assert fresh.read(start, 7, 1 << 20) == messages[start - 1 : start + 6], start
        for start in range(300, 0, -17):  # backwards: every read is a seek
            assert fresh.read(start, 3, 1 << 20) == messages[start - 1 : start + 2]


def test_sequential_reads_match_a_full_scan_and_do_not_seek(store: FileStore, monkeypatch) -> None:
    log = store.open(TOPIC, SMALL)
    messages = fill(log, 400, commit_every=50)
    log = reopen(store)
    seeks = []
    original = log._seek
    monkeypatch.setattr(log, "_seek", lambda start_id: seeks.append(start_id) or original(start_id))
    got: list[Message] = []
    position, step = 1, 0
    while True:
        step += 1
        batch = log.read(position, 1 + step % 9, 1 + (step * 37) % 400)
        if not batch:
            break
        got.extend(batch)
        position = batch[-1].id + 1
    assert got == messages == read_all(log)
    assert seeks == [1, 1]  # the first read, then read_all's: none between


def test_sequential_reads_follow_new_commits_and_rolls(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    got: list[Message] = []
    written: list[Message] = []
    for round_ in range(40):
        written += fill(log, 1 + round_ % 5)
        while batch := log.read(len(got) + 1, 3, 1 << 20):
            got.extend(batch)
    assert got == written
    assert log.segment_count > 3


def test_interleaved_readers_each_keep_their_place(store: FileStore, monkeypatch) -> None:
    log = store.open(TOPIC, SMALL)
    messages = fill(log, 200, commit_every=200)
    seeks = []
    original = log._seek
    monkeypatch.setattr(log, "_seek", lambda start_id: seeks.append(start_id) or original(start_id))
    a, b = 1, 120
    for _ in range(10):
        batch_a, batch_b = log.read(a, 5, 1 << 20), log.read(b, 5, 1 << 20)
        assert batch_a == messages[a - 1 : a + 4]
        assert batch_b == messages[b - 1 : b + 4]
        a, b = a + 5, b + 5
    assert seeks == [1, 120]


def open_files_under(directory: Path) -> list[str]:
    """Paths of this process's open file descriptors inside ``directory`` (Linux /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            out.append(target)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_reading_many_segments_keeps_few_files_open(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    messages = fill(log, 400, commit_every=400)
    log = reopen(store)
    assert log.segment_count > 2 * MAX_OPEN_SEALED
    for start in range(1, 401, 9):
        assert log.read(start, 2, 1 << 20) == messages[start - 1 : start + 1]
    open_now = open_files_under(topic_dir(store.root))
    assert len([path for path in open_now if path.endswith(".log")]) <= MAX_OPEN_SEALED + 1  # + the active
    log.verify()  # reads every segment once more, through the same bounded cache
    assert len(open_files_under(topic_dir(store.root))) <= MAX_OPEN_SEALED + 2
    store.close()
    assert open_files_under(topic_dir(store.root)) == []


# --------------------------------------------------------------------------------------------- rolling


def test_segments_roll_by_size(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    fill(log, 200, commit_every=9)
    paths = segment_paths(topic_dir(store.root))
    assert len(paths) == log.segment_count > 5
    expected_base = 1
    for path in paths:
        base, records = parse_segment(path)
        assert path.name == f"{base:020d}.log"
        assert base == expected_base
        assert [record[1] for record in records] == list(range(base, base + len(records)))
        if path is not paths[-1]:
            size = path.stat().st_size
            last_length = 16 + records[-1][2]
            assert size >= 1024 > size - last_length  # sealed by the record that reached the size
        expected_base = base + len(records)
    assert expected_base == log.next_id == 201
    assert log.bytes_on_disk == sum(map(written_bytes, paths))
    # The active segment's file is longer than its records while the log has it; sealed ones never are.
    assert paths[-1].stat().st_size % RESERVE_STEP == 0 < paths[-1].stat().st_size - written_bytes(paths[-1])
    assert all(path.stat().st_size == written_bytes(path) for path in paths[:-1])
    store.close()
    assert [path.stat().st_size for path in paths] == list(map(written_bytes, paths))


def test_rolling_does_not_depend_on_how_appends_are_committed(tmp_path: Path) -> None:
    layouts = []
    for commit_every in (1, 7, 1000):
        store = FileStore(tmp_path / str(commit_every))
        fill(store.open(TOPIC, SMALL), 150, commit_every=commit_every)
        store.close()
        directory = topic_dir(store.root)
        # Every log has an incarnation of its own (a random id in topic.json): the rest must be identical.
        layouts.append([(path.name, path.read_bytes()) for path in sorted(directory.glob("*.*"))
                        if path.name != "topic.json"])
        meta = json.loads((directory / "topic.json").read_bytes())
        assert len(meta.pop("incarnation")) == 32
        layouts[-1].append(("topic.json", meta))
    assert layouts[0] == layouts[1] == layouts[2]


# ------------------------------------------------------------------------------------------- retention


def test_retention_by_bytes_deletes_whole_sealed_segments_oldest_first(store: FileStore) -> None:
    log = store.open(TOPIC, spec(retention_bytes=3000))
    messages = fill(log, 200, commit_every=10)
    directory = topic_dir(store.root)
    before = segment_paths(directory)
    sizes = [path.stat().st_size for path in before]
    deleted = log.enforce_retention(NOW)
    after = segment_paths(directory)
    assert deleted == len(before) - len(after) > 0
    assert after == before[deleted:]  # the oldest went
    assert log.bytes_on_disk == sum(map(written_bytes, after)) <= 3000
    assert sum(sizes[deleted - 1 :]) > 3000  # no more than needed
    assert not (directory / before[0].name.replace(".log", ".index")).exists()
    first_id = parse_segment(after[0])[0]
    assert log.first_id == first_id == messages[-1].id + 1 - sum(len(parse_segment(p)[1]) for p in after)
    assert read_all(log) == messages[first_id - 1 :]
    assert log.read(1, 2, 1 << 20) == messages[first_id - 1 : first_id + 1]
    assert log.enforce_retention(NOW) == 0
    again = reopen(store, spec(retention_bytes=3000))
    assert again.first_id == first_id
    assert read_all(again) == messages[first_id - 1 :]


def test_retention_never_deletes_the_active_segment(store: FileStore) -> None:
    log = store.open(TOPIC, spec(retention_bytes=1, retention_seconds=1))
    messages = fill(log, 60, commit_every=5)
    segments = log.segment_count
    assert segments > 2
    assert log.enforce_retention(NOW + 10**9) == segments - 1
    assert log.segment_count == 1
    active = segment_paths(topic_dir(store.root))
    assert len(active) == 1
    assert read_all(log) == messages[log.first_id - 1 :]
    assert log.first_id > 1
    more = fill(log, 3)
    assert read_all(log)[-3:] == more


def test_retention_keeps_every_segment_from_the_one_holding_keep_from(store: FileStore) -> None:
    log = store.open(TOPIC, spec(retention_bytes=1))
    messages = fill(log, 120, commit_every=5)
    bases = [parse_segment(path)[0] for path in segment_paths(topic_dir(store.root))]
    assert len(bases) > 3
    keep_from = bases[2] + 1  # inside the third segment: a cluster's messages not yet on a majority
    assert log.enforce_retention(NOW, keep_from) == 2
    assert log.first_id == bases[2]
    assert log.enforce_retention(NOW, keep_from) == 0
    assert read_all(log) == messages[bases[2] - 1 :]
    assert log.enforce_retention(NOW) == len(bases) - 3  # once they are, the rest may go


def test_retention_by_age_stops_at_the_first_young_segment(store: FileStore) -> None:
    log = store.open(TOPIC, spec(retention_seconds=10))
    # Three segments' worth of old messages, then young ones; timestamps ascend by 1 s per message.
    messages = [message(n, b"z" * 200, timestamp=NOW + n * 1000) for n in range(1, 40)]
    for msg in messages:
        log.append(msg)
    log.commit()
    directory = topic_dir(store.root)
    bases = [parse_segment(path)[0] for path in segment_paths(directory)]
    last_ids = [base - 1 for base in bases[1:]]
    assert len(bases) >= 4
    # "Now" makes the second sealed segment's newest record exactly at the cutoff: not older, so it stays.
    now = NOW + last_ids[1] * 1000 + 10_000
    assert log.enforce_retention(now) == 1
    assert log.first_id == bases[1]
    assert log.enforce_retention(now + 1) == 1
    assert log.first_id == bases[2]
    assert log.enforce_retention(NOW + 10**9) == len(bases) - 3  # everything but the active one
    assert log.first_id == bases[-1]


def test_retention_without_limits_deletes_nothing(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    fill(log, 100)
    assert log.enforce_retention(NOW + 10**12) == 0
    assert log.first_id == 1


def test_reads_in_progress_survive_retention(store: FileStore) -> None:
    log = store.open(TOPIC, spec(retention_bytes=2500))
    messages = fill(log, 150, commit_every=150)
    assert log.read(1, 5, 1 << 20) == messages[:5]
    log.enforce_retention(NOW)
    assert log.read(6, 5, 1 << 20) == messages[log.first_id - 1 : log.first_id + 4]


# ------------------------------------------------------------------------------------------------- index


def index_entries(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [struct.unpack_from(">QQ", data, at) for at in range(0, len(data), 16)]


def test_index_entries_point_at_their_records(store: FileStore) -> None:
    log = store.open(TOPIC, SMALL)
    fill(log, 120, commit_every=4)
    log.close()
    for path in segment_paths(topic_dir(store.root)):
        base, records = parse_segment(path)
        positions = {record[0]: record[1] for record in records}
        entries = index_entries(path.with_suffix(".index"))
        assert entries[0] == (base, 16)
        for entry_id, position in entries:
            assert positions[position] == entry_id
        # One entry whenever at least 64 bytes (index_interval) were written since the previous one.
        expected, last = [], None
        for position, record_id, _, _ in records:
            if last is None or position - last >= 64:
                expected.append((record_id, position))
                last = position
        assert entries == expected


@pytest.mark.parametrize("damage", ["delete", "empty", "short", "garbage", "wrong-id", "out-of-order"])
def test_index_is_rebuilt_when_missing_or_garbled(store: FileStore, damage: str, caplog) -> None:
    log = store.open(TOPIC, SMALL)
    messages = fill(log, 150, commit_every=11)
    log.close()
    directory = topic_dir(store.root)
    originals = {path: path.read_bytes() for path in directory.glob("*.index")}
    assert len(originals) > 3
    for path, data in originals.items():
        if damage == "delete":
            path.unlink()
        elif damage == "empty":
            path.write_bytes(b"")
        elif damage == "short":
            path.write_bytes(data[:-5])
        elif damage == "garbage":
            path.write_bytes(bytes((b * 7 + 3) % 256 for b in data))
        elif damage == "wrong-id":  # still in order, but the second entry names the id after its record's
            entry_id, position = struct.unpack_from(">QQ", data, 16)
            path.write_bytes(data[:16] + struct.pack(">QQ", entry_id + 1, position) + data[32:])
        elif damage == "out-of-order":
            path.write_bytes(data[16:32] + data[:16] + data[32:])
    log = reopen(store)
    for start in range(150, 0, -1):  # backwards: every read seeks by the index
        assert log.read(start, 4, 1 << 20) == messages[start - 1 : start + 3]
    assert read_all(log) == messages
    log.close()
    for path, data in originals.items():
        assert path.read_bytes() == data, path.name  # derived data: rebuilt to exactly the same bytes
    assert "index" in caplog.text


# ----------------------------------------------------------------------------------- names and meta files


NAMES = [
    b"plain",
    b"a/b/../c",
    b"with space",
    b"..",
    b".",
    b".hidden",
    b"-dash_under.score",
    b"\xff\xfe\x00\x01",
    "caf\u00e9 \u2603".encode(),
    b"%41",
    b"A",
    b"a" * 300,
    b"/" * 100,  # 300 characters once encoded: hashed
    b"~tilde",
]


def test_topic_names_round_trip_through_existing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root)
    specs = {}
    for n, name in enumerate(NAMES):
        topic_spec = spec(delivery=Delivery.ROUND_ROBIN if n % 2 else Delivery.BROADCAST, max_backlog=n)
        specs[name] = topic_spec
        log = store.open(name, topic_spec)
        log.append(message(1, name, topic=name))
        log.commit()
    store.close()
    entries = sorted(entry for entry in os.listdir(root) if entry != ".lock")
    assert len(entries) == len(NAMES)
    for entry in entries:
        assert not entry.startswith(".")
        assert len(entry) <= 200
        assert set(entry) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-%~")
    store = FileStore(root)
    assert [(t.name, t.spec) for t in store.existing()] == sorted(specs.items())
    for name in NAMES:
        assert read_all(store.open(name, specs[name])) == [message(1, name, topic=name)]
    store.close()


def test_directory_names(tmp_path: Path) -> None:
    assert directory_name(b"a/b c") == "a%2Fb%20c"
    assert directory_name(b"..") == "%2E."
    assert directory_name(b".x.") == "%2Ex."
    assert directory_name(b"%") == "%25"
    assert directory_name(b"\xff") == "%FF"
    assert directory_name(b"Az09._-") == "Az09._-"
    assert directory_name(b"x" * 200) == "x" * 200
    assert directory_name(b"x" * 201).startswith("~")
    assert len(directory_name(b"x" * 201)) == 65
    with pytest.raises(ValueError, match="empty"):
        directory_name(b"")


def test_meta_file_contents(store: FileStore) -> None:
    topic_spec = spec(
        delivery=Delivery.ROUND_ROBIN, sync=Sync.WEAK, retention_bytes=5 << 20, retention_seconds=1.5
    )
    store.open(b"caf\xc3\xa9", topic_spec)
    store.open(b"\xff", SMALL)
    meta = json.loads((store.root / "caf%C3%A9" / "topic.json").read_text())
    incarnation = meta.get("incarnation", "")
    assert len(incarnation) == 32, "a new log gets an incarnation"
    assert int(incarnation, 16) >= 0
    assert meta == {
        "format": 1,
        "name_hex": "636166c3a9",
        "name": "caf\u00e9",
        "incarnation": incarnation,
        "spec": {
            "delivery": "round-robin",
            "persistence": "persistent",
            "sync": "weak",
            "max_backlog": 10_000,
            "retention_bytes": 5 << 20,
            "retention_seconds": 1.5,
            "segment_bytes": 1024,
            "element_size": 0,
        },
    }
    assert "name" not in json.loads((store.root / "%FF" / "topic.json").read_text())
    store.close()
    assert FileStore(store.root).existing() == [(b"caf\xc3\xa9", topic_spec, None), (b"\xff", SMALL, None)]


def test_the_topic_id_is_recorded_and_kept(store: FileStore) -> None:
    store.open(TOPIC, SMALL, topic_id=7)
    store.close()
    assert json.loads((topic_dir(store.root) / "topic.json").read_text())["topic_id"] == 7
    for asked, recorded in ((None, 7), (9, 9)):  # no id asked: the recorded one stays; the engine owns ids
        again = FileStore(store.root)
        again.open(TOPIC, SMALL, topic_id=asked)
        again.close()
        found = FileStore(store.root)
        assert found.existing() == [(TOPIC, SMALL, recorded)]
        found.close()


def test_opening_with_another_spec_rewrites_the_meta_file(store: FileStore) -> None:
    fill(store.open(TOPIC, SMALL), 3)
    changed = spec(retention_seconds=60)
    log = reopen(store, changed)
    assert log.spec == changed
    assert store.existing() == [(TOPIC, changed, None)]
    assert log.next_id == 4


@pytest.mark.parametrize(
    "content",
    [None, b"", b"{", b"[]", b'{"format": 2}', b'{"format": 1, "name_hex": "zz", "spec": {}}',
     b'{"format": 1, "name_hex": "74", "spec": {"delivery": "broadcast"}}',
     b'{"format": 1, "name_hex": "74", "topic_id": 0, "spec": ' + SMALL_JSON + b"}",
     b'{"format": 1, "name_hex": "74", "topic_id": "3", "spec": ' + SMALL_JSON + b"}"],
)
def test_a_missing_or_garbled_meta_file_is_skipped_at_start_and_refuses_the_topic(
    store: FileStore, content: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    fill(store.open(TOPIC, SMALL), 2)
    store.close()
    meta = topic_dir(store.root) / "topic.json"
    if content is None:
        meta.unlink()
    else:
        meta.write_bytes(content)
    found = FileStore(store.root)
    with caplog.at_level(logging.WARNING, logger="mc0.store"):
        assert found.existing() == []
    found.close()
    assert "skipped, not a topic directory" in caplog.text
    assert "topic.json" in caplog.text
    with pytest.raises(StoreError, match=r"topic\.json"):
        FileStore(store.root).open(TOPIC, SMALL)
    assert meta.exists() == (content is not None)  # never rewritten over


def test_a_stray_folder_in_the_data_directory_is_skipped_with_a_warning(
    store: FileStore, caplog: pytest.LogCaptureFixture
) -> None:
    fill(store.open(TOPIC, SMALL), 2)
    store.close()
    (store.root / "keys").mkdir()
    (store.root / "keys" / "broker.key").write_text("not ours")
    found = FileStore(store.root)
    with caplog.at_level(logging.WARNING, logger="mc0.store"):
        assert [stored.name for stored in found.existing()] == [TOPIC]
    found.close()
    assert "keys: skipped, not a topic directory" in caplog.text


def test_existing_ignores_half_created_directories_and_files(store: FileStore) -> None:
    store.open(TOPIC, SMALL)
    (store.root / ".new-x").mkdir()  # a crash while creating topic "x"
    (store.root / "README").write_text("not a topic")
    (store.root / "lost+found").mkdir()  # the data directory is the root of its own file system
    assert [stored.name for stored in store.existing()] == [TOPIC]
    store.open(b"x", SMALL)  # and creating it again cleans up
    assert not (store.root / ".new-x").exists()
    assert [stored.name for stored in store.existing()] == [TOPIC, b"x"]


def test_open_returns_the_same_log_and_refuses_transient_topics(store: FileStore) -> None:
    assert store.open(TOPIC, SMALL) is store.open(TOPIC, SMALL)
    with pytest.raises(ValueError, match="not persistent"):
        store.open(b"other", TopicSpec())
    with pytest.raises(ValueError, match="empty"):
        store.open(b"", SMALL)


def test_store_close_writes_and_closes_every_log(store: FileStore) -> None:
    logs = [store.open(name, spec(sync=Sync.ASYNC)) for name in (b"a", b"b")]
    for log in logs:
        log.append(message(1, topic=log.topic))
    store.close()
    again = FileStore(store.root)
    assert [read_all(again.open(name, SMALL))[0].id for name in (b"a", b"b")] == [1, 1]
    again.close()
    with pytest.raises(StoreError, match="closed"):
        logs[0].read(1, 1, 1)


# -------------------------------------------------------------------------------- commit and fsync counts


@pytest.fixture
def fsync_calls(monkeypatch) -> list[int]:
    """Every os.fsync the store makes (data, index, journal and directory alike)."""
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    return calls


def test_strong_commit_fsyncs_once_per_commit_with_data(store: FileStore, fsync_calls: list[int]) -> None:
    log = store.open(TOPIC, spec(segment_bytes=1 << 20))
    fsync_calls.clear()
    log.append(message(1))
    log.append(message(2))
    assert log.dirty
    log.commit()
    assert log.fsyncs == 1
    assert len(fsync_calls) == 1  # nothing else: no new file, no acks
    assert not log.dirty
    log.commit()  # nothing appended: nothing to do
    log.sync()
    assert log.fsyncs == 1
    assert len(fsync_calls) == 1
    for n in range(3, 13):
        log.append(message(n))
        log.commit()
    assert log.fsyncs == 11
    assert len(fsync_calls) == 11


def test_strong_commit_fsyncs_the_directory_after_creating_a_segment(
    store: FileStore, fsync_calls: list[int]
) -> None:
    log = store.open(TOPIC, SMALL)
    fill(log, 30, commit_every=30)  # rolls: the full segment is sealed, a new file is created
    assert log.segment_count == 2
    fsync_calls.clear()
    log.append(message(31))
    log.commit()
    assert len(fsync_calls) == 1  # the directory was made durable when the segment was created


@pytest.mark.parametrize("level", [Sync.WEAK, Sync.ASYNC])
def test_weak_and_async_commits_never_fsync(store: FileStore, fsync_calls: list[int], level: Sync) -> None:
    log = store.open(TOPIC, spec(sync=level, segment_bytes=1 << 20))
    fsync_calls.clear()
    for n in range(1, 21):
        log.append(message(n))
        log.commit()
    assert log.fsyncs == 0
    assert fsync_calls == []
    assert log.dirty  # written, not fsynced
    assert len(read_all(log)) == 20
    log.sync()
    assert log.fsyncs == 1
    assert len(fsync_calls) == 1
    assert not log.dirty
    log.sync()  # clean: no-op
    assert len(fsync_calls) == 1
    log.append(message(21))
    log.sync()  # writes and fsyncs
    assert log.fsyncs == 2
    assert [msg.id for msg in log.read(21, 1, 1)] == [21]


def test_commit_writes_a_turn_with_one_write(store: FileStore, monkeypatch) -> None:
    log = store.open(TOPIC, spec(segment_bytes=1 << 20))
    writes: list[int] = []
    real, real_writev, real_pwritev = os.write, os.writev, os.pwritev

    def counting(fd: int, data: bytes) -> int:
        writes.append(len(data))
        return real(fd, data)

    def counting_v(fd: int, buffers: list[memoryview]) -> int:
        writes.append(sum(len(buffer) for buffer in buffers))
        return real_writev(fd, buffers)

    def counting_pv(fd: int, buffers: list[memoryview], offset: int) -> int:
        writes.append(sum(len(buffer) for buffer in buffers))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "write", counting)
    monkeypatch.setattr(os, "writev", counting_v)
    monkeypatch.setattr(os, "pwritev", counting_pv)
    for n in range(1, 501):
        log.append(message(n))
    log.commit()
    entries = len(index_entries(topic_dir(store.root) / f"{1:020d}.index"))
    assert entries > 1
    assert writes == [log.bytes_on_disk - 16, 16 * entries]  # the records, then the new index entries


# ---------------------------------------------------------------------------------------- model check


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.binary(max_size=300)),
            st.tuples(st.just("commit"), st.none()),
            st.tuples(st.just("reopen"), st.none()),
            st.tuples(st.just("read"), st.tuples(st.integers(0, 80), st.integers(0, 9), st.integers(0, 700))),
        ),
        max_size=60,
    )
)
def test_model(tmp_path_factory, steps) -> None:
    root = tmp_path_factory.mktemp("model")
    store = FileStore(root, index_interval=100)
    log = store.open(TOPIC, SMALL)
    model: list[Message] = []
    committed = 0
    for action, argument in steps:
        if action == "append":
            msg = message(len(model) + 1, argument, {b"n": str(len(model)).encode()})
            log.append(msg)
            model.append(msg)
        elif action == "commit":
            log.commit()
            committed = len(model)
        elif action == "reopen":
            log.commit()
            committed = len(model)
            store.close()
            store = FileStore(root, index_interval=100)
            log = store.open(TOPIC, SMALL)
            assert log.next_id == len(model) + 1
        else:
            start, count, budget = argument
            got = log.read(start, count, budget)
            readable = model[max(start, 1) - 1 : committed]
            if count == 0 or not readable:
                assert got == []
                continue
            expected, total = [], 0
            for msg in readable[:count]:
                total += len(msg.body)
                if expected and total > budget:
                    break
                expected.append(msg)
            assert got == expected
    log.commit()
    assert read_all(log) == model
    log.verify()
    store.close()


def test_the_data_directory_is_created_only_when_a_persistent_topic_needs_it(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root)
    assert store.existing() == []
    assert not root.exists(), "a broker with transient topics only never touches the disk"
    store.open(b"t", TopicSpec(persistence=Persistence.PERSISTENT))
    assert root.is_dir()
    store.close()


def test_a_second_store_on_a_data_directory_in_use_is_refused(tmp_path: Path) -> None:
    first = FileStore(tmp_path)
    first.open(b"t", TopicSpec(persistence=Persistence.PERSISTENT))
    second = FileStore(tmp_path)
    with pytest.raises(StoreError, match="another broker"):
        second.existing()
    first.close()
    assert [stored.name for stored in second.existing()] == [b"t"], "the lock goes with close()"
    second.close()


def test_topics_made_in_one_turn_share_one_fsync_of_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new topic's directory is built whole under a hidden name (meta file and first segment, one fsync of
    that directory), then renamed; the renames of every topic a turn made become durable with one fsync of
    the data directory, which the engine asks for before its commit (so before anything is confirmed)."""
    synced: list[Path] = []
    original = files_module.fsync_directory
    monkeypatch.setattr(files_module, "fsync_directory", lambda path: (synced.append(path), original(path)))
    store = FileStore(tmp_path / "data")
    engine = Engine(TopicRules([TopicRule("*", spec())]), store)
    try:
        for n in range(5):
            engine.topic(b"t%d" % n)
        assert all(path.name.startswith(".new-") for path in synced), "no fsync of the data directory yet"
        assert len(synced) == 5
        assert sorted(os.listdir(store.root / directory_name(b"t0"))) == [
            "00000000000000000001.index", "00000000000000000001.log", "topic.json"]
        engine.commit()  # nothing published: a DECLARE's OK still needs its topic to exist for good
        assert synced[5:] == [store.root]
        engine.publish(b"t0", b"x", {}, NOW)
        engine.commit()
        assert synced[5:] == [store.root], "nothing new made: no fsync of it again"
    finally:
        engine.close()
    reopened = FileStore(tmp_path / "data")
    try:
        assert [topic.name for topic in reopened.existing()] == [b"t%d" % n for n in range(5)]
        assert reopened.open(b"t0", spec()).next_id == 2
    finally:
        reopened.close()
