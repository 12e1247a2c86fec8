"""What a store failure does, over the real files: a write that fails (a full disk) or a file that will not
open (no descriptors left) fails that commit or that request only. The log reads its state back from its
files, so it stays consistent and goes on taking messages; the engine takes the turn's messages back and names
the topic in ``Engine.failed``. Only a failed fsync stops everything (SyncFailed). The store keeps its open
files under a bound by letting the least recently used logs close theirs, and those logs work as before.
Damaged stored messages fail FETCH with an error naming them and are skipped, counted, by readers.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import failing_writes

from broker.engine import Engine, EngineError, Message, Subscriber
from broker.store import StoreError, SyncFailed
from broker.store.files import FileStore, directory_name
from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicRules, TopicSpec

NOW = 1_700_000_000_000
STRONG = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=1024)
WEAK = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK, segment_bytes=1024)
QUEUE = TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT, segment_bytes=1024)
RULES = TopicRules([TopicRule("s.*", STRONG), TopicRule("w.*", WEAK), TopicRule("q.*", QUEUE)])


def message(topic: bytes, message_id: int) -> Message:
    return Message(topic, message_id, b"body %d" % message_id * 4, {}, NOW)


@contextmanager
def failing_opens(monkeypatch: pytest.MonkeyPatch, match: str, code: int = errno.EMFILE) -> Iterator[None]:
    """os.open fails with ``code`` for paths containing ``match`` (no descriptor left for that file)."""
    real = os.open

    def open_(path: object, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        if match in os.fspath(path):  # type: ignore[arg-type]
            raise OSError(code, os.strerror(code), os.fspath(path))  # type: ignore[arg-type]
        return real(path, flags, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    yield
    monkeypatch.setattr(os, "open", real)


def bodies(messages: list[Message]) -> list[int]:
    return [message.id for message in messages]


# ------------------------------------------------------------------------------------------------ the log


def test_a_failed_write_refuses_the_commit_and_the_log_reads_itself_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    log = store.open(b"s.one", STRONG)
    for n in range(1, 6):
        log.append(message(b"s.one", n))
    log.commit()
    for n in range(6, 9):
        log.append(message(b"s.one", n))
    with failing_writes(monkeypatch, ".log"), pytest.raises(StoreError, match="write failed"):
        log.commit()
    assert log.next_id == 6, "what was never written is not in the log"
    log.append(message(b"s.one", 6))
    log.commit()
    assert bodies(log.read(1, 100, 1 << 20)) == [1, 2, 3, 4, 5, 6]
    store.close()
    again = FileStore(tmp_path)
    assert bodies(again.open(b"s.one", STRONG).read(1, 100, 1 << 20)) == [1, 2, 3, 4, 5, 6]
    again.close()


def test_writes_that_go_on_failing_are_said_once_and_their_end_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk under a busy topic: every commit fails, but the log says so once (an error), not once a
    commit, and says when a write succeeds again and how many failed."""
    caplog.set_level(logging.DEBUG, logger="mc0.store")
    store = FileStore(tmp_path)
    log = store.open(b"s.one", STRONG)
    log.append(message(b"s.one", 1))
    log.commit()
    with failing_writes(monkeypatch, ".log"):
        for _ in range(5):
            log.append(message(b"s.one", 2))
            with pytest.raises(StoreError, match="write failed"):
                log.commit()
    log.append(message(b"s.one", 2))
    log.commit()
    said = [(record.levelno, record.getMessage()) for record in caplog.records
            if record.levelno > logging.DEBUG]
    assert len([text for level, text in said if level == logging.ERROR]) == 1
    assert said[-1] == (logging.WARNING, f"{log.directory}: writes succeed again, after 5 failed")
    assert len(said) <= 3  # the error, at most one torn tail cut, the end
    assert log.write_failures == 5  # counted, all of them (STATS, the monitoring)
    assert bodies(log.read(1, 100, 1 << 20)) == [1, 2]
    store.close()


def test_a_segment_that_cannot_be_created_refuses_the_commit_only(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    log = store.open(b"s.roll", STRONG)
    n = 0
    while True:  # up to the append that starts a new segment (its file is created by the commit)
        n += 1
        log.append(message(b"s.roll", n))
        if log.segment_count > 1:
            break
        log.commit()
    with failing_opens(monkeypatch, f"{n:020d}"), pytest.raises(StoreError, match="Too many open"):
        log.commit()
    assert log.next_id == n
    assert log.segment_count == 1
    log.append(message(b"s.roll", n))  # the descriptors are back: the roll works
    log.commit()
    assert log.segment_count == 2
    assert bodies(log.read(1, 1000, 1 << 20)) == list(range(1, n + 1))
    store.close()


def test_a_log_that_cannot_be_opened_again_refuses_appends_until_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    log = store.open(b"s.broken", STRONG)
    log.append(message(b"s.broken", 1))
    log.commit()
    log.append(message(b"s.broken", 2))
    with failing_writes(monkeypatch, "s.broken"), failing_opens(monkeypatch, "s.broken"), \
            pytest.raises(StoreError):
        log.commit()
    with failing_opens(monkeypatch, "s.broken"), pytest.raises(StoreError, match="cannot be opened again"):
        log.append(message(b"s.broken", 2))
    log.append(message(b"s.broken", 2))
    log.commit()
    assert bodies(log.read(1, 10, 1 << 20)) == [1, 2]
    store.close()


def test_a_failed_fsync_stops_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    log = store.open(b"s.sync", STRONG)
    log.append(message(b"s.sync", 1))

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SyncFailed, match="fsync failed"):
        log.commit()


def test_open_files_stay_under_the_bound_and_released_logs_work_on(tmp_path: Path) -> None:
    store = FileStore(tmp_path, max_open_files=8)
    logs = [store.open(b"w.%d" % n, WEAK) for n in range(20)]
    for round_ in range(1, 4):
        for log in logs:
            log.append(message(log.topic, round_))
            log.commit()
            assert store.files.held <= 8 + 2  # the log in use may hold its own two over the bound
    assert store.files.released > 0
    for log in logs:
        assert bodies(log.read(1, 10, 1 << 20)) == [1, 2, 3]
        log.sync()
    store.close()
    again = FileStore(tmp_path)
    for n in range(20):
        assert bodies(again.open(b"w.%d" % n, WEAK).read(1, 10, 1 << 20)) == [1, 2, 3]
    again.close()


def test_a_data_directory_that_cannot_work_is_refused_in_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(StoreError, match=r"data directory .*/file/data cannot be created: .*/file is a file"):
        FileStore(plain / "data").check()
    with pytest.raises(StoreError, match=r"data directory .*/file is a file, not a directory"):
        FileStore(plain).check()
    FileStore(tmp_path / "new" / "data").check()  # creatable: fine, and nothing created
    assert not (tmp_path / "new").exists()
    if os.getuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StoreError, match="not writable"):
            FileStore(locked / "data").check()
    first = FileStore(tmp_path / "busy")
    first.open(b"s.x", STRONG)
    with pytest.raises(StoreError, match="another broker is using"):
        FileStore(tmp_path / "busy").check()
    first.close()


def test_delete_removes_the_files_at_once(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    log = store.open(b"s.gone", STRONG)
    log.append(message(b"s.gone", 1))
    log.commit()
    assert (tmp_path / directory_name(b"s.gone")).is_dir()
    assert store.delete(b"s.gone")
    assert not (tmp_path / directory_name(b"s.gone")).exists()
    assert [entry.name for entry in tmp_path.iterdir() if not entry.name.startswith(".lock")] == []
    assert not store.delete(b"s.gone")
    assert store.open(b"s.gone", STRONG).next_id == 1  # used again: a new, empty log
    store.close()


# ---------------------------------------------------------------------------------------------- the engine


def engine_with(tmp_path: Path) -> Engine:
    return Engine(RULES, FileStore(tmp_path))


def test_the_engine_takes_back_what_a_failed_commit_did_not_store(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_with(tmp_path)
    reader = Subscriber()
    engine.subscribe(reader, b"s.a")
    engine.subscribe(reader, b"s.b")
    engine.publish(b"s.a", b"one", {}, NOW)
    engine.commit()
    assert engine.failed == {}
    engine.publish(b"s.a", b"two", {}, NOW)
    engine.publish(b"s.b", b"other", {}, NOW)
    with failing_writes(monkeypatch, directory_name(b"s.a")):
        engine.commit()
    assert set(engine.failed) == {b"s.a"}
    assert "write failed" in engine.failed[b"s.a"]
    topic = engine.topics[b"s.a"]
    assert topic.next_id == 2
    assert topic.messages_in == 1
    # The delivery of "two" is withdrawn; "one" (stored) and the other topic's message stay.
    assert [(message.topic, message.body) for message in reader.pending] == [
        (b"s.a", b"one"), (b"s.b", b"other")]
    assert engine.publish(b"s.a", b"two again", {}, NOW).id == 2
    engine.commit()
    assert engine.failed == {}, "the next commit starts afresh"
    assert [m.body for m in engine.fetch(b"s.a", 1, 10, 1 << 20)[2]] == [b"one", b"two again"]
    engine.close()


def test_a_topic_whose_log_cannot_be_opened_is_refused_not_fatal(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_with(tmp_path)
    with failing_opens(monkeypatch, directory_name(b"s.new")), \
            pytest.raises(EngineError, match=r"topic 's\.new' is unavailable: its log cannot be opened"):
        engine.publish(b"s.new", b"x", {}, NOW)
    assert b"s.new" not in engine.topics
    assert engine.publish(b"s.other", b"y", {}, NOW).id == 1
    engine.close()


def test_damaged_ids_fail_fetch_and_are_skipped_by_readers(tmp_path: Path) -> None:
    engine = engine_with(tmp_path)
    for n in range(1, 61):
        engine.publish(b"s.d", b"body %d" % n, {}, NOW)
        engine.publish(b"q.d", b"job %d" % n, {}, NOW)
        engine.commit()
    engine.close()
    for name in (b"s.d", b"q.d"):
        second = sorted((tmp_path / directory_name(name)).glob("*.log"))[1]
        data = bytearray(second.read_bytes())
        data[16 + 16 + 2] ^= 0xFF  # the payload of its first record
        second.write_bytes(data)
    damaged_first = int(sorted((tmp_path / directory_name(b"s.d")).glob("*.log"))[1].stem)
    engine = engine_with(tmp_path)
    unreadable = rf"topic 's\.d': ids {damaged_first}\.\.\d+ are unreadable: segment "
    with pytest.raises(EngineError, match=unreadable):
        engine.fetch(b"s.d", damaged_first, 10, 1 << 20)
    _, _, messages = engine.fetch(b"s.d", 1, 100, 1 << 20)
    assert [m.id for m in messages] == list(range(1, damaged_first))  # a fetch stops before the damage
    (damage,) = engine.topics[b"s.d"].stats()["damaged"]
    assert damage["first_id"] == damaged_first
    # A reader replaying from the beginning gets everything else, and the skipped ids count as dropped.
    reader = Subscriber()
    engine.subscribe(reader, b"s.d", replay="beginning")
    for _ in range(10):
        engine.pump()
    got = [message.id for message in reader.pending]
    skipped = list(range(damage["first_id"], damage["last_id"] + 1))
    assert got == [n for n in range(1, 61) if n not in skipped]
    assert reader.dropped == len(skipped)
    # A queue hands out everything it can read and counts the rest as dropped.
    worker = Subscriber()
    engine.subscribe(worker, b"q.d")
    for _ in range(10):
        engine.pump()
    queue = engine.topics[b"q.d"]
    assert len(worker.pending) + queue.dropped == 60
    assert queue.dropped > 0
    engine.close()


def test_sync_failure_of_a_periodic_flush_goes_through(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_with(tmp_path)
    engine.publish(b"w.x", b"x", {}, NOW)
    engine.commit()
    broken: Callable[[int], None] = lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error"))  # noqa: E731
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(SyncFailed):
        engine.sync(Sync.WEAK)


def test_a_log_that_comes_back_holding_more_than_the_engine_thought_goes_on_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(RULES, FileStore(tmp_path, index_interval=1))  # an index entry per record
    engine.publish(b"s.r", b"one", {}, NOW)
    engine.commit()
    engine.publish(b"s.r", b"two", {}, NOW)
    # The record is written, its index entry is not, and the log cannot be opened again afterwards.
    with failing_writes(monkeypatch, ".index"), failing_opens(monkeypatch, directory_name(b"s.r")):
        engine.commit()
    assert b"s.r" in engine.failed
    topic = engine.topics[b"s.r"]
    assert topic.next_id == 2, "the engine takes back what the broken log does not hold for sure"
    assert topic.log is not None
    assert topic.log.first_id == 1
    assert topic.stats()["last_id"] == 1
    # Back: the files hold "two" after all (refused to its publisher, but stored); ids go on after it.
    assert engine.publish(b"s.r", b"three", {}, NOW).id == 3
    engine.commit()
    assert [m.body for m in engine.fetch(b"s.r", 1, 10, 1 << 20)[2]] == [b"one", b"two", b"three"]
    engine.close()
