"""New topic directories made ahead, in threads, while the loop goes on.

A new persistent topic costs a directory, a meta file and a first segment, each fsynced: about a millisecond
alone on ext4, several with other brokers fsyncing on the same disk, most of it waiting for the file system's
journal (creating a file waits for a journal commit under way as an fsync does). A client naming hundreds of
new topics at once had the loop pay that for each, a few a turn, every other client waiting out each turn's
share. :class:`Maker` builds such directories in its own threads (``os.open``, ``os.fsync`` and ``mkdir`` let
go of the interpreter) under hidden names, whole and fsynced; the store takes one when the topic is opened,
and only renames it. What it made and nobody took (the client went away, the topic was made another way) is
removed; what a crash leaves is removed at the next start (:data:`AHEAD_PREFIX`): it was never a topic.

Owns: its threads, the directories it is making or has made until one is taken or discarded, and their
bound. It knows nothing of logs: the store says how a directory is built (``build``). Its threads are not the
store's fsync threads (FileStore.commit_many): a turn's commit, which the loop waits for, must never queue
behind directories being made.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from broker.store import LogIdentity
from broker.store.segment import without_descriptor_retries
from broker.topics import TopicSpec

log = logging.getLogger("mc0.store")

#: Directories made ahead are built under this prefix and a number (a topic directory never starts with ".").
AHEAD_PREFIX = ".new-."
#: Threads that make directories. Measured on ext4 (200 topics, alone): one after another 1.0-1.1 ms a topic,
#: 2 threads 0.7-0.9, 4 threads 0.54-0.64, 8 threads 0.67-0.94 (their fsyncs queue on one journal). With a
#: client's 500 new topics and another client's strong publishes, 2 threads made them as fast as 4 (1.1-1.4 s
#: against 1.2-1.25) and held the other client's publishes less (p90 5-6 ms against 15-19): every fsync on
#: the file system waits for the journal the makers keep busy.
MAKER_THREADS = 2
#: Directories made ahead and not yet taken, at most (each holds three small files).
MAKE_AHEAD = 64

#: How a directory is built: (where, topic, spec, topic id, identity); it raises what the store raises.
Build = Callable[[Path, bytes, TopicSpec, "int | None", LogIdentity], None]


@dataclass(frozen=True)
class Ahead:
    """One directory being made, or made, for ``topic``, with what it was made with."""

    spec: TopicSpec
    topic_id: int | None
    identity: LogIdentity
    path: Path
    made: Future[None]


class Maker:
    """Makes topic directories ahead of their opening (see the module's docstring)."""

    def __init__(self, root: Path, build: Build, limit: int = MAKE_AHEAD) -> None:
        self.root = root
        self.build = build
        self.limit = limit
        self._pool: ThreadPoolExecutor | None = None  # started by the first directory made ahead
        self._ahead: dict[bytes, Ahead] = {}
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._ahead)

    def start(self, topic: bytes, spec: TopicSpec, topic_id: int | None, identity: LogIdentity,
              done: Callable[[], None]) -> bool:
        """Start making ``topic``'s directory; ``done()`` is called, from a maker thread, once it is made or
        has failed. False if as many as the bound allows are ahead already (or this one is)."""
        if topic in self._ahead or len(self._ahead) >= self.limit:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MAKER_THREADS, thread_name_prefix="mc0-make",
                                            initializer=without_descriptor_retries)
        path = self.root / f"{AHEAD_PREFIX}{next(self._numbers)}"
        made = self._pool.submit(self._make, path, topic, spec, topic_id, identity)
        self._ahead[topic] = Ahead(spec, topic_id, identity, path, made)
        made.add_done_callback(lambda _: done())
        return True

    def _make(self, path: Path, topic: bytes, spec: TopicSpec, topic_id: int | None,
              identity: LogIdentity) -> None:
        try:
            self.build(path, topic, spec, topic_id, identity)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise

    def holds(self, path: Path) -> bool:
        """Whether ``path`` is a directory this maker is making, or made and keeps."""
        return any(ahead.path == path for ahead in self._ahead.values())

    def ready(self, topic: bytes) -> bool:
        """Whether opening ``topic`` would not wait for a maker thread: none is making it, or it is made."""
        ahead = self._ahead.get(topic)
        return ahead is None or ahead.made.done()

    def take(self, topic: bytes, spec: TopicSpec, topic_id: int | None,
             identity: LogIdentity | None) -> Ahead | None:
        """The directory made ahead for ``topic`` with these settings (``identity`` None: any), whole and
        fsynced, for the store to rename into place; None if there is none, or it failed (the store then
        makes it itself, and reports what fails). Waits for a maker thread already making it; one that has
        not started is cancelled."""
        ahead = self._ahead.pop(topic, None)
        if ahead is None:
            return None
        if ahead.made.cancel():
            return None
        try:
            ahead.made.result()
        except Exception as error:  # made again on the loop, which reports it once
            log.debug("topic %r: made ahead, failed: %s", topic, error)
            return None
        if (ahead.spec, ahead.topic_id) != (spec, topic_id) or identity not in (None, ahead.identity):
            self._remove(ahead)
            return None
        return ahead

    def discard(self, topic: bytes) -> None:
        """Forget what is made ahead for ``topic``, if anything: its directory is removed (by a maker thread,
        once it is made)."""
        ahead = self._ahead.pop(topic, None)
        if ahead is not None:
            self._remove(ahead)

    def _remove(self, ahead: Ahead) -> None:
        if not ahead.made.cancel():
            assert self._pool is not None
            self._pool.submit(_remove_when_made, ahead)

    def close(self) -> None:
        """Remove every directory made ahead and not taken, and stop the threads (waiting for them)."""
        for topic in list(self._ahead):
            self.discard(topic)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _remove_when_made(ahead: Ahead) -> None:
    """In a maker thread: the directory is made (a pool runs tasks in order, so its making started first)."""
    try:
        ahead.made.result()
    except Exception:  # a failed making removed its own directory
        return
    try:
        shutil.rmtree(ahead.path)
    except OSError as exc:
        log.warning("%s: could not remove a topic directory made ahead and not used: %s", ahead.path, exc)
