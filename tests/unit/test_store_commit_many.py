"""The turn's group commit over many logs (FileStore.commit_many): with many strong logs their fsyncs run at
once in threads, each log still committed whole or taken back alone; a failed fsync stops the broker as
ever, once the others have ended. Files are real, in a temporary directory."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from conftest import failing_writes

from broker.engine import Engine, Message
from broker.store import SyncFailed
from broker.store.files import FSYNC_TOGETHER_FROM, FileStore
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec

STRONG = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)
WEAK = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)


def fsynced_by(monkeypatch: pytest.MonkeyPatch, fail: str | None = None) -> list[tuple[str, str]]:
    """Record (thread name, file path) for every fsync; one whose path contains ``fail`` fails with EIO."""
    calls: list[tuple[str, str]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append((threading.current_thread().name, path))
        if fail is not None and fail in path:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def appended(store: FileStore, names: list[bytes], spec: TopicSpec = STRONG) -> list:
    logs = []
    for name in names:
        log = store.open(name, spec)
        log.append(Message(name, log.next_id, b"body of " + name, {}, 1000))
        logs.append(log)
    return logs


def names(count: int) -> list[bytes]:
    return [b"t%02d" % n for n in range(count)]


def test_many_strong_logs_are_fsynced_at_once_and_all_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    logs = appended(store, names(FSYNC_TOGETHER_FROM + 4))
    calls = fsynced_by(monkeypatch)
    assert store.commit_many(logs) == {}
    segment_fsyncs = [(thread, path) for thread, path in calls if path.endswith(".log")]
    assert len(segment_fsyncs) == len(logs)  # each log's segment, once
    assert all(thread.startswith("mc0-fsync") for thread, _ in segment_fsyncs)
    assert all(not log.dirty for log in logs)
    store.close()
    again = FileStore(tmp_path)
    for name in names(FSYNC_TOGETHER_FROM + 4):
        assert [m.body for m in again.open(name, STRONG).read(1, 10, 1 << 20)] == [b"body of " + name]
    again.close()


def test_a_few_strong_logs_and_weak_ones_commit_in_turn_on_the_callers_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    logs = appended(store, names(FSYNC_TOGETHER_FROM - 1))
    logs += appended(store, [b"w%02d" % n for n in range(10)], WEAK)
    calls = fsynced_by(monkeypatch)
    assert store.commit_many(logs) == {}
    segment_fsyncs = [thread for thread, path in calls if path.endswith(".log")]
    assert segment_fsyncs == [threading.current_thread().name] * (FSYNC_TOGETHER_FROM - 1)  # weak: no fsync
    assert all(not log.dirty or log.spec.sync is Sync.WEAK for log in logs)
    store.close()


def test_a_log_whose_write_fails_is_reported_alone_and_the_others_are_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    logs = appended(store, names(FSYNC_TOGETHER_FROM + 2))
    with failing_writes(monkeypatch, f"{tmp_path}/t03/"):
        failed = store.commit_many(logs)
    assert list(failed) == [3]
    assert "No space left on device" in str(failed[3])
    assert logs[3].next_id == 1  # read back from its files: the message was never stored
    assert all(log.next_id == 2 and not log.dirty for position, log in enumerate(logs) if position != 3)
    store.close()


def test_a_failed_fsync_is_raised_after_every_other_fsync_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    logs = appended(store, names(FSYNC_TOGETHER_FROM + 2))
    calls = fsynced_by(monkeypatch, fail="/t05/")
    with pytest.raises(SyncFailed, match="fsync failed"):
        store.commit_many(logs)
    fsynced = {Path(path).parent.name for _, path in calls if path.endswith(".log")}
    assert fsynced == {name.decode() for name in names(FSYNC_TOGETHER_FROM + 2)}  # none left half done


def test_an_engine_turn_over_many_strong_topics_commits_them_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    engine = Engine(TopicRules([TopicRule("t*", STRONG)]), store)
    for name in names(FSYNC_TOGETHER_FROM * 2):
        engine.publish(name, b"x", {}, 1000)
    calls = fsynced_by(monkeypatch)
    with failing_writes(monkeypatch, f"{tmp_path}/t07/"):
        assert engine.commit() == FSYNC_TOGETHER_FROM * 2
    assert list(engine.failed) == [b"t07"]  # taken back alone
    assert engine.topics[b"t07"].next_id == 1
    assert engine.topics[b"t08"].next_id == 2
    assert engine.last_commit_messages == FSYNC_TOGETHER_FROM * 2 - 1
    assert any(thread.startswith("mc0-fsync") for thread, path in calls if path.endswith(".log"))
    store.close()
