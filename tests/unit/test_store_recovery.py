"""Crash recovery of the on-disk log: a torn tail cut at every byte offset of the last record, a flipped byte
in it, torn segment headers, and damage that must stay local: a corrupt sealed segment or a broken chain of
segments fails reads of the ids it holds, with an error naming it, and the rest of the log serves.

Each case works on a copy of a log written and closed once, damaged the way a crash (or a bad disk) would.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from pathlib import Path

import pytest

from broker.engine import Message
from broker.store import DamagedRange, StoreError, files
from broker.store.files import FileStore, directory_name
from broker.topics import Persistence, Sync, TopicSpec

TOPIC = b"crash/test"
NOW = 1_700_000_000_000
SPEC = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024)
COUNT = 6


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch) -> None:
    """These tests make crashes by editing files: the page cache is the disk, and fsync only costs time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def message(message_id: int) -> Message:
    return Message(TOPIC, message_id, b"payload %d" % message_id * 3, {b"n": b"%d" % message_id}, NOW)


def write_log(root: Path, count: int, index_interval: int = 4096, spec: TopicSpec = SPEC) -> list[Message]:
    store = FileStore(root, index_interval=index_interval)
    log = store.open(TOPIC, spec)
    messages = [message(n) for n in range(1, count + 1)]
    for msg in messages:
        log.append(msg)
        log.commit()
    store.close()
    return messages


def topic_dir(root: Path) -> Path:
    return root / directory_name(TOPIC)


def segments(root: Path) -> list[Path]:
    return sorted(topic_dir(root).glob("*.log"))


def record_starts(path: Path) -> list[int]:
    """Byte positions of the records of a valid segment, plus its end (independent of the code under test)."""
    data = path.read_bytes()
    starts, position = [], 16
    while position < len(data):
        starts.append(position)
        (length,) = struct.unpack_from(">I", data, position)
        position += 16 + length
    return [*starts, position]


def read_all(root: Path, index_interval: int = 4096) -> tuple[FileStore, list[Message]]:
    store = FileStore(root, index_interval=index_interval)
    log = store.open(TOPIC, SPEC)
    return store, log.read(1, 1 << 30, 1 << 40)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[int, tuple[Path, list[Message]]]:
    """One pristine log per index interval (1: every record has an entry, the torn one too)."""
    out = {}
    for interval in (1, 4096):
        root = tmp_path_factory.mktemp(f"pristine{interval}")
        out[interval] = (root, write_log(root, COUNT, interval))
    return out


@pytest.mark.parametrize("interval", [1, 4096])
def test_truncating_the_last_record_at_every_offset(written, tmp_path: Path, interval: int, caplog) -> None:
    pristine, messages = written[interval]
    (active,) = segments(pristine)
    starts = record_starts(active)
    last_start, end = starts[-2], starts[-1]
    caplog.set_level(logging.WARNING, logger="mc0.store")
    for cut in range(last_start, end):
        caplog.clear()
        root = tmp_path / f"cut{cut}"
        shutil.copytree(pristine, root)
        (copy,) = segments(root)
        with copy.open("r+b") as file:
            file.truncate(cut)
        store = FileStore(root, index_interval=interval)
        log = store.open(TOPIC, SPEC)
        assert log.read(1, 100, 1 << 20) == messages[:-1], cut
        assert log.next_id == COUNT
        assert log.truncated_bytes == cut - last_start
        assert copy.stat().st_size == last_start
        if cut > last_start:
            assert f"{cut - last_start} bytes" in caplog.text
            assert copy.name in caplog.text
        else:
            assert caplog.text == ""
        replacement = Message(TOPIC, COUNT, b"after the crash", {}, NOW + 1)
        log.append(replacement)
        log.commit()
        log.verify()
        store.close()
        store, again = read_all(root, interval)
        assert again == [*messages[:-1], replacement]
        assert store.open(TOPIC, SPEC).truncated_bytes == 0
        store.close()
        shutil.rmtree(root)


@pytest.mark.parametrize("interval", [1, 4096])
def test_a_flipped_byte_in_the_last_record_cuts_it_off(written, tmp_path: Path, interval: int) -> None:
    pristine, messages = written[interval]
    (active,) = segments(pristine)
    starts = record_starts(active)
    last_start, end = starts[-2], starts[-1]
    for at in range(last_start, end):
        root = tmp_path / f"flip{at}"
        shutil.copytree(pristine, root)
        (copy,) = segments(root)
        data = bytearray(copy.read_bytes())
        data[at] ^= 0x40
        copy.write_bytes(data)
        store = FileStore(root, index_interval=interval)
        log = store.open(TOPIC, SPEC)
        assert log.read(1, 100, 1 << 20) == messages[:-1], at
        assert log.next_id == COUNT
        assert log.truncated_bytes == end - last_start
        store.close()
        shutil.rmtree(root)


def test_a_torn_tail_in_the_second_segment(tmp_path: Path) -> None:
    messages = write_log(tmp_path, 40)
    paths = segments(tmp_path)
    assert len(paths) >= 2
    starts = record_starts(paths[-1])
    with paths[-1].open("r+b") as file:
        file.truncate(starts[-2] + 3)
    store, got = read_all(tmp_path)
    assert got == messages[:-1]
    assert store.open(TOPIC, SPEC).truncated_bytes == 3
    store.close()


@pytest.mark.parametrize("header_bytes", [0, 1, 7, 15])
def test_a_torn_header_of_the_last_segment_is_an_empty_segment(tmp_path: Path, header_bytes: int) -> None:
    messages = write_log(tmp_path, 30)
    next_id = len(messages) + 1
    torn = topic_dir(tmp_path) / f"{next_id:020d}.log"
    torn.write_bytes((b"MC0LOG\x00\x01" + struct.pack(">Q", next_id))[:header_bytes])
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    assert log.next_id == next_id
    assert log.truncated_bytes == header_bytes
    assert torn.read_bytes() == b"MC0LOG\x00\x01" + struct.pack(">Q", next_id)
    assert log.read(1, 100, 1 << 20) == messages
    log.append(Message(TOPIC, next_id, b"new", {}, NOW))
    log.commit()
    store.close()
    store, got = read_all(tmp_path)
    assert [msg.id for msg in got] == list(range(1, next_id + 1))
    store.close()


@pytest.mark.parametrize("zeros", [16, 100])
def test_a_last_segment_of_zeros_is_an_empty_segment(tmp_path: Path, zeros: int) -> None:
    messages = write_log(tmp_path, 30)
    next_id = len(messages) + 1
    (topic_dir(tmp_path) / f"{next_id:020d}.log").write_bytes(bytes(zeros))
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    assert (log.next_id, log.truncated_bytes) == (next_id, zeros)
    assert log.read(1, 100, 1 << 20) == messages
    store.close()


def test_a_garbage_header_of_the_last_segment_is_an_error(tmp_path: Path) -> None:
    messages = write_log(tmp_path, 30)
    path = topic_dir(tmp_path) / f"{len(messages) + 1:020d}.log"
    path.write_bytes(b"not a segment header")
    with pytest.raises(StoreError, match="not an mc0 segment"):
        FileStore(tmp_path).open(TOPIC, SPEC)


def test_a_torn_header_of_a_sealed_segment_makes_its_ids_unreadable(tmp_path: Path) -> None:
    messages = write_log(tmp_path, 60)
    paths = segments(tmp_path)
    assert len(paths) >= 3
    first, last = int(paths[1].stem), int(paths[2].stem) - 1
    paths[1].write_bytes(paths[1].read_bytes()[:10])
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)  # the log opens: the rest of it serves
    with pytest.raises(DamagedRange, match=rf"ids {first}\.\.{last} are unreadable: segment {paths[1].name}"):
        log.read(first, 10, 1 << 20)
    assert log.read(1, 100, 1 << 20) == messages[: first - 1]  # a read stops before the damage
    assert log.read(last + 1, 100, 1 << 20) == messages[last:]
    assert [(damage.first_id, damage.last_id) for damage in log.damaged] == [(first, last)]
    store.close()


def test_a_corrupt_sealed_segment_fails_reads_of_its_range_and_verify(tmp_path: Path) -> None:
    messages = write_log(tmp_path, 60, index_interval=64)
    paths = segments(tmp_path)
    first_end = len(record_starts(paths[0])) - 1  # records in the first segment
    data = bytearray(paths[0].read_bytes())
    data[16 + 16 + 5] ^= 0x01  # inside the first record's payload: only a full scan can see it
    paths[0].write_bytes(data)
    store = FileStore(tmp_path, index_interval=64)
    log = store.open(TOPIC, SPEC)  # the cheap open-time checks pass
    with pytest.raises(DamagedRange, match=rf"segment {paths[0].name} is damaged \(byte 16: CRC mismatch"):
        log.read(1, 10, 1 << 20)
    with pytest.raises(StoreError, match=paths[0].name):
        log.verify()
    (damage,) = log.damaged
    assert damage.first_id == 1
    # Reads resume at the next index entry after the bad record: everything after it still reads.
    assert log.read(damage.resume_id, 100, 1 << 20) == messages[damage.resume_id - 1 :]
    assert damage.resume_id <= first_end
    with pytest.raises(DamagedRange):  # known now: refused without reading the file again
        log.read(1, 10, 1 << 20)
    store.close()


@pytest.mark.parametrize("interval", [64, 1 << 20])
def test_a_corrupt_record_header_in_a_sealed_segment_is_reported_with_its_offset(
    tmp_path: Path, interval: int
) -> None:
    messages = write_log(tmp_path, 60, index_interval=interval)
    paths = segments(tmp_path)
    starts = record_starts(paths[0])
    data = bytearray(paths[0].read_bytes())
    data[starts[2] + 15] ^= 0x01  # the id of the third record
    paths[0].write_bytes(data)
    store = FileStore(tmp_path, index_interval=interval)
    log = store.open(TOPIC, SPEC)
    # With one index entry per 64 bytes the read finds it; with one per segment the open-time tail scan does.
    why = "record has id" if interval == 64 else "corrupt sealed segment"
    assert log.read(1, 10, 1 << 20) == messages[:2]  # the records before it
    damaged = rf"ids 3\.\..* {paths[0].name} is damaged \(byte {starts[2]}: {why}"
    with pytest.raises(DamagedRange, match=damaged):
        log.read(3, 10, 1 << 20)
    store.close()


@pytest.mark.parametrize(
    "damage", ["cut-mid-record", "drop-last-record", "drop-segment", "bad-magic", "bad-base"]
)
def test_a_broken_chain_of_sealed_segments_fails_reads_of_the_missing_ids(tmp_path: Path,
                                                                         damage: str) -> None:
    messages = write_log(tmp_path, 80)
    paths = segments(tmp_path)
    assert len(paths) >= 4
    victim = paths[1]
    starts = record_starts(victim)
    data = victim.read_bytes()
    unreadable = int(paths[2].stem) - 1  # the victim's last id: unreadable in every case
    if damage == "cut-mid-record":
        victim.write_bytes(data[: starts[-1] - 3])
    elif damage == "drop-last-record":
        victim.write_bytes(data[: starts[-2]])
    elif damage == "drop-segment":
        victim.unlink()
        victim.with_suffix(".index").unlink()
        victim = paths[0]  # the segment before the gap is the one whose end no longer meets its successor
    elif damage == "bad-magic":
        victim.write_bytes(b"XX" + data[2:])
    elif damage == "bad-base":
        victim.write_bytes(data[:8] + struct.pack(">Q", 12345) + data[16:])
    active = paths[-1]
    with active.open("ab") as file:
        file.write(b"\x00\x01torn")  # a torn tail of the active segment: cut as usual, damage or not
    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    assert log.truncated_bytes == 6
    with pytest.raises(DamagedRange, match=victim.name):
        log.read(unreadable, 10, 1 << 20)
    assert log.read(int(paths[2].stem), 1000, 1 << 20) == messages[int(paths[2].stem) - 1 :]
    store.close()


def test_a_failed_open_can_be_retried_after_the_damage_is_repaired(tmp_path: Path, monkeypatch) -> None:
    messages = write_log(tmp_path, 50)
    active = segments(tmp_path)[-1]
    original = active.read_bytes()
    active.write_bytes(b"not a segment header" + original[20:])  # the active segment cannot be appended to
    store = FileStore(tmp_path)
    with pytest.raises(StoreError, match="not an mc0 segment"):
        store.open(TOPIC, SPEC)
    active.write_bytes(original)
    # The failure is given again for a while without reading the files (a crowd of requests costs nothing)...
    with pytest.raises(StoreError, match="not an mc0 segment"):
        store.open(TOPIC, SPEC)
    # ...then the files are tried again.
    monkeypatch.setattr(files, "RETRY_OPEN", 0.0)
    assert store.open(TOPIC, SPEC).read(1, 100, 1 << 20) == messages
    store.close()


def test_orphan_index_and_tmp_files_are_cleaned_up(tmp_path: Path) -> None:
    messages = write_log(tmp_path, 10)
    directory = topic_dir(tmp_path)
    (directory / f"{999:020d}.index").write_bytes(b"\x00" * 16)
    (directory / "queue.acks.tmp").write_bytes(b"half")
    store, got = read_all(tmp_path)
    assert got == messages
    assert not (directory / f"{999:020d}.index").exists()
    assert not (directory / "queue.acks.tmp").exists()
    store.close()


def test_the_sealed_segment_check_extends_a_short_index(tmp_path: Path) -> None:
    messages = write_log(tmp_path, 60, index_interval=64)
    paths = segments(tmp_path)
    index = paths[0].with_suffix(".index")
    full = index.read_bytes()
    index.write_bytes(full[:32])  # a consistent prefix: only the first two entries
    store, got = read_all(tmp_path, index_interval=64)
    assert got == messages
    store.close()
    assert index.read_bytes() == full
