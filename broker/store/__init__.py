"""The interface between the engine and durable storage.

The engine calls a :class:`Store` to open one :class:`TopicLog` per persistent topic; the log owns the bytes
on disk. This module only states the contract; the implementation lives beside it: ``files.py``
(:class:`~broker.store.files.FileStore`, the data directory and topic meta files), ``log.py`` (the segmented
log of one topic), ``segment.py`` (record, segment and index layouts) and ``acks.py`` (the ack journal of
round-robin topics). ``docs/storage.md`` describes the files. Transient topics never touch a store.

A store failure raises :class:`StoreError` and fails the request that needed it (a file that will not open or
be written, a damaged record: :class:`DamagedRange`); the log puts itself back in the state its files are in,
and the broker goes on. Only :class:`SyncFailed` stops the broker: after a failed fsync the kernel may have
dropped data already acknowledged, and nothing can be promised any more.

This module must not import the engine at run time (the engine imports it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from broker.engine import Message
    from broker.producers import ProducerWindow
    from broker.topics import TopicSpec

#: Lineage entries kept in a log's identity: enough for every unclean restart a reader could sleep through.
MAX_LINEAGE = 16


class LogIdentity(NamedTuple):
    """Which log a message id belongs to (docs/storage.md, "Log identity").

    Within one ``incarnation`` an id names one message forever (or a message retention removed). A log that
    is created — a new topic, or a topic whose files were lost — gets a fresh incarnation and no lineage: its
    ids say nothing about any earlier log's. A log that may have lost a tail it had already handed out (an
    unsynced tail after the machine went down) gets a fresh incarnation whose ``lineage`` records the one
    before it and ``until``, the first id the two do not share: a reader of the old incarnation at a position
    up to ``until`` may go on reading there; one past it read messages that are gone, and its ids will be
    given to new ones. Like a Kafka leader epoch with its start offset, and meant to grow into one."""

    incarnation: str  # 32 lowercase hex digits
    lineage: tuple[tuple[str, int], ...] = ()  # (earlier incarnation, until), oldest first

    @classmethod
    def fresh(cls) -> LogIdentity:
        return cls(uuid.uuid4().hex)

    def successor(self, until: int) -> LogIdentity:
        """A new incarnation sharing ids below ``until`` with this one."""
        lineage = (*self.lineage, (self.incarnation, until))[-MAX_LINEAGE:]
        return LogIdentity(uuid.uuid4().hex, lineage)

    def held_from(self, next_id: int) -> dict[str, int]:
        """incarnation -> the id below which a log of this identity ending at ``next_id`` holds that
        incarnation's messages: its own identity's up to ``next_id``, each earlier one's up to the first
        ``until`` from there on."""
        held = {self.incarnation: next_id}
        below = next_id
        for incarnation, until in reversed(self.lineage):
            below = min(below, until)
            held.setdefault(incarnation, below)
        return held

    def resume_point(self, incarnation: str, position: int) -> int | None:
        """Where a reader that stood at ``position`` (the next id it wanted) in ``incarnation`` goes on in
        this log: the same position, or the first id the logs do not share if it is lower. None if
        ``incarnation`` is not this log's nor an ancestor it remembers (read this log from its beginning)."""
        if incarnation == self.incarnation:
            return position
        for index, (earlier, _) in enumerate(self.lineage):
            if earlier == incarnation:
                return min(position, *(until for _, until in self.lineage[index:]))
        return None

    def shared_until(self, next_id: int, other: LogIdentity, other_next_id: int) -> int | None:
        """The first id at which a log of this identity ending at ``next_id`` may differ from one of
        ``other`` ending at ``other_next_id``: where the two part after the latest incarnation both descend
        from (within one incarnation an id names one message). None if they descend from none in common."""
        theirs = other.held_from(other_next_id)
        shared = [min(below, theirs[incarnation]) for incarnation, below in self.held_from(next_id).items()
                  if incarnation in theirs]
        return max(shared) if shared else None

    def resume_point_from(self, reader: LogIdentity, position: int) -> int | None:
        """:meth:`resume_point` for a reader whose identity this log's lineage need not remember, given
        with its own lineage (a cluster's epoch whose leader died before it wrote anything: no log recorded
        it, but the cluster did). None if the two logs share nothing."""
        return self.shared_until(position, reader, position)


class StoredTopic(NamedTuple):
    """A persistent topic found in the store: its exact name, its settings, and its stable topic id (None
    until the engine has given it one)."""

    name: bytes
    spec: TopicSpec
    topic_id: int | None = None


class StoreError(Exception):
    """The store could not do what one request asked (a file that will not open or be written, a damaged
    record, a bad meta file): that request fails, the broker goes on."""


class SyncFailed(StoreError):
    """An fsync failed: data already acknowledged may be gone. The broker stops (see the module docstring)."""


class DamagedRange(StoreError):
    """Stored messages ``first_id`` .. ``last_id`` of a topic cannot be read: a record of ``segment`` is
    damaged. Reads of other ids go on; ``resume_id`` is the next readable id after the range."""

    def __init__(self, topic: bytes, segment: str, first_id: int, last_id: int, reason: str) -> None:
        self.topic = topic
        self.segment = segment
        self.first_id = first_id
        self.last_id = last_id
        self.reason = reason
        name = topic.decode("utf-8", "replace")
        super().__init__(f"topic {name!r}: ids {first_id}..{last_id} are unreadable: segment {segment} is "
                         f"damaged ({reason}); `mc0 verify` and `mc0 repair` check and mend the data "
                         "directory with the broker stopped")

    @property
    def resume_id(self) -> int:
        return self.last_id + 1

    def describe(self) -> dict[str, object]:
        """For STATS: where, which ids, why."""
        return {"segment": self.segment, "first_id": self.first_id, "last_id": self.last_id,
                "error": self.reason}


class TopicLog(Protocol):
    """The append-only log of one persistent topic (and, for round-robin topics, its acked ids)."""

    spec: TopicSpec
    #: Which log this is (set by the store when it opens the log).
    identity: LogIdentity
    #: What idempotent publishers stored (kept with the log, so it survives a restart).
    producers: ProducerWindow
    #: fsyncs of segment files so far (the benchmark's "messages per fsync").
    fsyncs: int
    #: Commits whose write failed so far (a full disk): STATS and the monitoring show them.
    write_failures: int
    #: Bytes recovery cut off a torn tail when the log was opened (0 normally).
    truncated_bytes: int

    @property
    def first_id(self) -> int:
        """The oldest id still stored (equal to ``next_id`` when the log is empty)."""
        ...

    @property
    def next_id(self) -> int:
        """The id the next appended message must carry; stable across restarts."""
        ...

    @property
    def bytes_on_disk(self) -> int: ...

    @property
    def segment_count(self) -> int: ...

    @property
    def dirty(self) -> bool:
        """Something appended or acked and not yet written, or written and not yet fsynced."""
        ...

    def append(self, message: Message) -> None:
        """Append (buffered, ``message.id`` must be ``next_id``); durability comes from :meth:`commit`."""
        ...

    def append_batch(
        self, first_id: int, timestamp: int, items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]]
    ) -> int:
        """Append ``(topic, body, headers)`` entries as ids ``first_id`` on (``next_id``), as :meth:`append`
        would each; returns how many: all, or those before a StoreError stopped it (raised only when it
        stopped the first entry, or when it is a SyncFailed)."""
        ...

    def append_records(self, records: bytes, start_id: int, count: int) -> None:
        """Append records another log numbered (a cluster's copy), from ``start_id`` = ``next_id``, each
        checked."""
        ...

    def truncate(self, from_id: int) -> int:
        """Cut the suffix from ``from_id`` on, durably; returns how many messages went."""
        ...

    def restart_at(self, first_id: int) -> int:
        """Drop every message, durably, and go on at ``first_id`` (past ``next_id``); returns how many
        went."""
        ...

    def commit(self) -> None:
        """Write what was appended and acked; for strong topics also fsync (group commit, once per turn)."""
        ...

    def sync(self) -> None:
        """Write anything buffered and fsync everything written since the last fsync; no-op when clean."""
        ...

    def write_ahead(self) -> None:
        """Write what is buffered, without the fsync the next :meth:`commit` does (a cluster's leader lets its
        followers read it meanwhile)."""
        ...

    def read(self, start_id: int, max_messages: int, max_bytes: int) -> list[Message]:
        """Written messages from ``start_id`` on, bounded by count and body bytes (at least one if any)."""
        ...

    def read_records(
        self, start_id: int, max_messages: int, max_bytes: int
    ) -> tuple[int, int, bytes | memoryview]:
        """Written records from ``start_id`` (or the first stored) on, as they lie in the log, undecoded:
        ``(first id, count, bytes)``, bounded by count and record bytes (at least one record if any). The
        bytes may be a read-only view of a buffer the log fills again once nothing holds the view."""
        ...

    def find_time(self, timestamp_ms: int) -> int:
        """The first written id stored at or after ``timestamp_ms`` (``next_id`` if none is)."""
        ...

    def enforce_retention(self, now_ms: int, keep_from: int | None = None) -> int:
        """Delete whole sealed segments past the topic's retention, oldest first, but none holding
        ``keep_from`` or a later id; returns how many."""
        ...

    def ack(self, ids: Iterable[int]) -> None:
        """Record acked ids (round-robin topics); durable like messages, at the next commit."""
        ...

    def ack_through(self, last: int) -> None:
        """Record every id up to ``last`` as acked, as :meth:`ack` does, however many they are."""
        ...

    @property
    def acked_watermark(self) -> int:
        """Every id up to this one is acked (0: none); ids below ``first_id`` count as acked."""
        ...

    @property
    def acked_above(self) -> set[int]:
        """Acked ids above the watermark (the live set: read it, never change it)."""
        ...

    def verify(self) -> None:
        """Check every stored record; StoreError at the first bad one."""
        ...

    @property
    def damaged(self) -> list[DamagedRange]:
        """The ranges of ids known to be unreadable, oldest first (empty for a sound log)."""
        ...

    def close(self) -> None: ...


class Store(Protocol):
    """Opens the logs of persistent topics under one data directory."""

    def existing(self) -> list[StoredTopic]:
        """Topics found on disk with the spec and topic id stored with them, sorted by name."""
        ...

    def open(self, topic: bytes, spec: TopicSpec, topic_id: int | None = None,
             identity: LogIdentity | None = None) -> TopicLog:
        """Create or open and recover a topic's log, recording ``topic_id`` with it when one is given; the
        same object if already open. A log created now takes ``identity`` when one is given (a cluster
        follower's copy of its leader's log), a fresh one otherwise."""
        ...

    def make_ahead(self, topic: bytes, spec: TopicSpec, topic_id: int | None, identity: LogIdentity,
                   done: Callable[[], None]) -> bool:
        """Start making new topic ``topic``'s log in the background, for :meth:`open` with the same settings
        to take; ``done()`` is called from another thread when it is made. False if nothing is made ahead."""
        ...

    def made(self, topic: bytes) -> bool:
        """Whether opening ``topic`` would not wait for its log being made ahead."""
        ...

    def forget_made(self, topic: bytes) -> None:
        """What is made ahead for ``topic`` will not be opened: let it go."""
        ...

    def delete(self, topic: bytes) -> bool:
        """Remove a topic's log and files (closing the log if open); False if it has none."""
        ...

    def sync_created(self) -> None:
        """Make the topics created since the last call durable (before anything written to them is
        confirmed)."""
        ...

    def commit_many(self, logs: Sequence[TopicLog]) -> dict[int, StoreError]:
        """Commit each of ``logs`` (the turn's group commit, :meth:`TopicLog.commit`); the positions of
        those whose commit failed, and why. SyncFailed is raised."""
        ...

    def close(self) -> None: ...
