"""New topics' directories made ahead in the store's threads (broker.store.making) and taken when the topic is
opened: by whom they are made, what opening takes and what it refuses, what is removed, the bound, and the
engine's side (kept topic ids, readiness, a creation that does not take what was made)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker.engine import Engine, EngineError
from broker.store import LogIdentity, StoreError
from broker.store.files import NEW_PREFIX, FileStore, read_topic_meta
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec

STRONG = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)
WEAK = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)


def hidden(root: Path) -> list[str]:
    """Directories under construction or made ahead and not taken."""
    return sorted(entry.name for entry in root.iterdir() if entry.name.startswith(NEW_PREFIX))


def built_by(monkeypatch: pytest.MonkeyPatch, store: FileStore) -> list[str]:
    """The names of the threads that build topic directories, in order."""
    threads: list[str] = []
    build = store._build_directory

    def recorded(*args: object) -> None:
        threads.append(threading.current_thread().name)
        build(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_build_directory", recorded)
    store.maker.build = recorded
    return threads


def wait_made(store: FileStore, *topics: bytes) -> None:
    deadline = time.monotonic() + 10
    while not all(store.made(topic) for topic in topics):
        assert time.monotonic() < deadline, "not made in 10 s"
        time.sleep(0.001)


def test_a_directory_made_ahead_in_a_thread_is_what_open_takes(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    threads = built_by(monkeypatch, store)
    identity = LogIdentity.fresh()
    called: list[str] = []
    assert store.make_ahead(b"t", STRONG, 7, identity, lambda: called.append(threading.current_thread().name))
    wait_made(store, b"t")
    assert hidden(tmp_path) == [f"{NEW_PREFIX}.0"], "made under a hidden name, not yet a topic"
    assert not (tmp_path / "t").exists()
    assert store.existing() == [], "and not taken for a leftover"
    log = store.open(b"t", STRONG, 7)
    assert log.identity == identity
    assert threads == ["mc0-make_0"], "built once, in a maker thread, not again by open"
    assert [name[:8] for name in called] == ["mc0-make"], "done() is called once, from the maker thread"
    stored, recorded_identity, _ = read_topic_meta(tmp_path / "t")
    assert (stored.name, stored.spec, stored.topic_id, recorded_identity) == (b"t", STRONG, 7, identity)
    assert hidden(tmp_path) == []
    store.close()
    assert [(found.name, found.topic_id) for found in FileStore(tmp_path).existing()] == [(b"t", 7)]


def test_open_with_other_settings_makes_the_topic_itself_and_removes_what_was_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    threads = built_by(monkeypatch, store)
    for topic in (b"spec", b"id", b"identity"):
        assert store.make_ahead(topic, STRONG, 1, LogIdentity.fresh(), lambda: None)
    wait_made(store, b"spec", b"id", b"identity")
    given = LogIdentity.fresh()
    assert read_topic_meta(store.open(b"spec", WEAK, 1).directory)[0].spec == WEAK
    assert read_topic_meta(store.open(b"id", STRONG, 2).directory)[0].topic_id == 2
    assert store.open(b"identity", STRONG, 1, given).identity == given
    assert threads[3:] == ["MainThread"] * 3, "each made again by open"
    store.close()
    assert hidden(tmp_path) == [], "what was made ahead is removed"


def test_forgotten_and_untaken_directories_are_removed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for topic in (b"a", b"b"):
        assert store.make_ahead(topic, STRONG, 1, LogIdentity.fresh(), lambda: None)
    store.forget_made(b"a")
    assert store.made(b"a"), "nothing is being made for it any more"
    assert len(store.maker) == 1
    store.close()
    assert hidden(tmp_path) == []
    assert FileStore(tmp_path).existing() == []


def test_what_is_made_ahead_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)
    store.maker.limit = 2
    assert store.make_ahead(b"a", STRONG, 1, LogIdentity.fresh(), lambda: None)
    assert not store.make_ahead(b"a", STRONG, 1, LogIdentity.fresh(), lambda: None), "once"
    assert store.make_ahead(b"b", STRONG, 2, LogIdentity.fresh(), lambda: None)
    assert not store.make_ahead(b"c", STRONG, 3, LogIdentity.fresh(), lambda: None)
    store.open(b"a", STRONG, 1)
    assert store.make_ahead(b"c", STRONG, 3, LogIdentity.fresh(), lambda: None), "taking one makes room"
    assert not store.make_ahead(b"a", STRONG, 1, LogIdentity.fresh(), lambda: None), "it exists"
    store.close()


def test_a_failed_making_leaves_nothing_and_open_makes_the_topic_or_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    build = store._build_directory
    failures = iter([True, True])

    def failing(new: Path, *args: object) -> None:
        if next(failures, False):
            new.mkdir()
            raise StoreError(f"{new}: no space left on device")
        build(new, *args)  # type: ignore[arg-type]

    store.maker.build = failing
    assert store.make_ahead(b"t", STRONG, 1, LogIdentity.fresh(), lambda: None)
    wait_made(store, b"t")
    assert hidden(tmp_path) == [], "a failed making removes its directory"
    monkeypatch.setattr(store, "_build_directory", failing)
    with pytest.raises(StoreError, match="no space left"):
        store.open(b"t", STRONG, 1)  # made again on the loop, which fails as the disk does
    assert store.open(b"u", STRONG, 2).next_id == 1
    store.close()


def test_a_start_removes_what_a_stop_left_half_made(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.open(b"kept", STRONG, 1)
    store.close()
    for name in (f"{NEW_PREFIX}.3", f"{NEW_PREFIX}kept", f"{NEW_PREFIX}other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "topic.json").write_text("{}")
    assert [found.name for found in FileStore(tmp_path).existing()] == [b"kept"]
    assert hidden(tmp_path) == []


def test_the_engine_keeps_a_topic_id_for_a_log_made_ahead_and_its_creation_takes_it(tmp_path: Path) -> None:
    rules = TopicRules([TopicRule("log.*", STRONG)])
    engine = Engine(rules, FileStore(tmp_path), max_topics=3)
    done = threading.Event()
    engine.make_ahead(b"log.a", done.set)
    engine.make_ahead(b"plain", done.set)  # transient: nothing to make
    engine.make_ahead(b"log.b", lambda: None)
    engine.make_ahead(b"log.c", lambda: None)
    engine.make_ahead(b"log.d", lambda: None)  # max_topics: 3 topics at most, made or being made
    assert done.wait(10)
    assert sorted(engine._logs_ahead) == [b"log.a", b"log.b", b"log.c"]
    assert engine.ready(b"plain")
    assert engine.ready(b"log.d")
    engine.topic(b"plain")
    assert engine.topics[b"plain"].topic_id == 4, "ids kept for the logs made ahead are not given again"
    wait_made(engine.store, b"log.a", b"log.b")  # type: ignore[arg-type]
    assert engine.topic(b"log.b").topic_id == 2
    engine.forget_ahead([b"log.a", b"log.c"])
    assert engine.topic(b"log.a").topic_id == 5, "forgotten: made when created, with a new id"
    with pytest.raises(EngineError, match="max_topics"):
        engine.topic(b"log.d")
    engine.close()
    assert hidden(tmp_path) == []


def test_descriptors_run_out_in_a_maker_thread_it_fails_without_the_loops_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's reaction to running out of descriptors acts on the loop's doors: a maker thread does not
    call it, its making fails, and the loop makes the topic (with the retries) when it is opened."""
    from broker.store import segment

    called: list[str] = []
    monkeypatch.setattr(segment, "when_out_of_descriptors", lambda: called.append("loop"))
    real_open = segment.os.open

    def out_in_threads(path: object, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        if threading.current_thread().name.startswith("mc0-make") and str(path).endswith("topic.json"):
            raise OSError(24, "Too many open files")
        return real_open(path, flags, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(segment.os, "open", out_in_threads)
    store = FileStore(tmp_path)
    assert store.make_ahead(b"t", STRONG, 1, LogIdentity.fresh(), lambda: None)
    wait_made(store, b"t")
    assert called == []
    assert store.open(b"t", STRONG, 1).next_id == 1
    store.close()
    assert hidden(tmp_path) == []
