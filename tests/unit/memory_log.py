"""An in-memory stand-in for the store (broker/store/), for engine tests: a :class:`MemoryLog` per topic that
behaves like the segmented log as the engine sees it, and a :class:`MemoryStore` that keeps those logs across
a simulated restart (a new :class:`~broker.engine.Engine` over the same store).

What it promises, as the real log does: :meth:`MemoryLog.read` returns only messages appended before the
last :meth:`MemoryLog.commit` (the engine must never deliver from the log what is not yet durable), bounded by
count and bytes but at least one message when any is readable; acks are kept as a set, exposed as a watermark
(every id up to it acked or gone) and the acked ids above it. Retention is whatever the test says: set
:attr:`MemoryLog.retain_from` and the next :meth:`MemoryLog.enforce_retention` forgets everything older.

It counts what a test wants to check: commits, syncs, fsyncs, reads, ack calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from broker.engine import FIRST_MESSAGE_ID, Message
from broker.producers import ProducerWindow
from broker.store import LogIdentity, StoredTopic, StoreError, SyncFailed
from broker.topics import Sync, TopicSpec


class MemoryLog:
    """One topic's log: a list of messages, a committed prefix, and an ack set."""

    def __init__(self, spec: TopicSpec, next_id: int = FIRST_MESSAGE_ID) -> None:
        self.spec = spec
        self.messages: list[Message] = []  # stored, oldest first (committed or not)
        self.committed = 0  # how many of ``messages`` were appended before the last commit()
        self._first_id = next_id  # the oldest stored id, or next_id while the log is empty
        self._next_id = next_id
        self.acked: set[int] = set()
        self.identity = LogIdentity.fresh()
        self.producers = ProducerWindow()
        self.ack_calls: list[list[int]] = []
        self.reads: list[tuple[int, int, int]] = []  # (start_id, max_messages, max_bytes) per read()
        self.commits = 0
        self.syncs = 0
        self.fsyncs = 0  # strong commits and sync() calls
        self.write_failures = 0  # it never fails a write
        self.retain_from: int | None = None  # the next enforce_retention() drops ids below this
        self.truncated_bytes = 0  # recovery never cuts anything here
        self.acks_committed = 0  # ack ids written by commit()
        self._acks_pending = 0  # ack ids recorded since the last commit()
        self.closed = False

    # ----------------------------------------------------------------------------------------- positions

    @property
    def first_id(self) -> int:
        return self._first_id

    @property
    def next_id(self) -> int:
        return self._next_id

    @property
    def appended(self) -> list[Message]:
        return list(self.messages)

    @property
    def committed_ids(self) -> list[int]:
        return [message.id for message in self.messages[: self.committed]]

    # -------------------------------------------------------------------------------------- append, read

    def append(self, message: Message) -> None:
        assert message.id == self._next_id, f"id {message.id} appended where {self._next_id} was due"
        self.messages.append(message)
        self._next_id = message.id + 1

    def append_batch(self, first_id: int, timestamp: int,
                     items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]]) -> int:
        for index, (topic, body, headers) in enumerate(items):
            try:
                self.append(Message(topic, first_id + index, body, headers, timestamp))
            except StoreError:
                if index == 0:
                    raise
                return index
        return len(items)

    @property
    def dirty(self) -> bool:
        return self.committed < len(self.messages) or self._acks_pending > 0

    def commit(self) -> None:
        self.committed = len(self.messages)
        self.acks_committed += self._acks_pending
        self._acks_pending = 0
        self.commits += 1
        if self.spec.sync is Sync.STRONG:
            self.fsyncs += 1

    def write_ahead(self) -> None:
        self.committed = len(self.messages)  # readable now; commit() counts the fsync

    def read(self, start_id: int, max_messages: int, max_bytes: int) -> list[Message]:
        self.reads.append((start_id, max_messages, max_bytes))
        out: list[Message] = []
        size = 0
        for message in self.messages[: self.committed]:
            if message.id < start_id:
                continue
            if len(out) >= max_messages or (out and size + len(message.body) > max_bytes):
                break
            out.append(message)
            size += len(message.body)
        return out

    def find_time(self, timestamp_ms: int) -> int:
        committed = self.messages[: self.committed]
        return next((m.id for m in committed if m.timestamp >= timestamp_ms), self._first_id + len(committed))

    # ------------------------------------------------------------------------------------------------ acks

    def ack(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        self.ack_calls.append(ids)
        self.acked.update(ids)
        self._acks_pending += len(ids)

    def ack_through(self, last: int) -> None:
        self.ack(range(self.acked_watermark + 1, last + 1))

    @property
    def acked_watermark(self) -> int:
        """Every id up to here is acked (or was removed by retention)."""
        watermark = self._first_id - 1
        while watermark + 1 in self.acked:
            watermark += 1
        return watermark

    @property
    def acked_above(self) -> set[int]:
        watermark = self.acked_watermark
        return {acked for acked in self.acked if acked > watermark}

    # -------------------------------------------------------------------------------- disk housekeeping

    @property
    def bytes_on_disk(self) -> int:
        return sum(len(message.body) for message in self.messages[: self.committed])

    @property
    def segment_count(self) -> int:
        return 1 if self.messages else 0

    def sync(self) -> None:
        self.syncs += 1
        self.fsyncs += 1

    def enforce_retention(self, now_ms: int, keep_from: int | None = None) -> int:
        """Forget every message below :attr:`retain_from` (and below ``keep_from``); one "segment" removed if
        anything went."""
        if self.retain_from is None:
            return 0
        until = self.retain_from if keep_from is None else min(self.retain_from, keep_from)
        if until <= self._first_id:
            return 0
        self.drop_before(until)
        return 1

    def drop_before(self, message_id: int) -> None:
        """What retention does to the log: the oldest messages are gone, ``first_id`` moves up."""
        gone = sum(1 for message in self.messages if message.id < message_id)
        self.messages = self.messages[gone:]
        self.committed = max(0, self.committed - gone)
        self._first_id = min(max(self._first_id, message_id), self._next_id)

    @property
    def damaged(self) -> list:
        return []

    def verify(self) -> None:
        ids = [message.id for message in self.messages]
        assert ids == list(range(self._first_id, self._next_id)), ids

    def close(self) -> None:
        self.closed = True


class MemoryStore:
    """Opens :class:`MemoryLog`\\ s and keeps them (with their specs) for the next engine: a restart."""

    def __init__(self, next_id: int = FIRST_MESSAGE_ID) -> None:
        self.logs: dict[bytes, MemoryLog] = {}
        self.specs: dict[bytes, TopicSpec] = {}
        self.topic_ids: dict[bytes, int] = {}
        self.next_id = next_id  # where a new log's ids start (as if older segments had been deleted)
        self.closed = False

    def existing(self) -> list[StoredTopic]:
        return [StoredTopic(name, spec, self.topic_ids.get(name))
                for name, spec in sorted(self.specs.items())]

    def open(self, topic: bytes, spec: TopicSpec, topic_id: int | None = None,
             identity: LogIdentity | None = None) -> MemoryLog:
        log = self.logs.get(topic)
        if log is None:
            log = self.logs[topic] = MemoryLog(spec, self.next_id)
            if identity is not None:
                log.identity = identity
        log.spec = spec
        log.closed = False
        self.specs[topic] = spec
        if topic_id is not None:
            self.topic_ids[topic] = topic_id
        return log

    def make_ahead(self, topic: bytes, spec: TopicSpec, topic_id: int | None, identity: LogIdentity,
                   done: Callable[[], None]) -> bool:
        return False  # a memory log costs nothing to make

    def made(self, topic: bytes) -> bool:
        return True

    def forget_made(self, topic: bytes) -> None:
        pass

    def sync_created(self) -> None:
        pass  # nothing to make durable

    def commit_many(self, logs: Sequence[MemoryLog]) -> dict[int, StoreError]:
        failed: dict[int, StoreError] = {}
        for position, log in enumerate(logs):
            try:
                log.commit()
            except SyncFailed:
                raise
            except StoreError as error:
                failed[position] = error
        return failed

    def delete(self, topic: bytes) -> bool:
        self.specs.pop(topic, None)
        self.topic_ids.pop(topic, None)
        return self.logs.pop(topic, None) is not None

    def close(self) -> None:
        self.closed = True
        for log in self.logs.values():
            log.close()
