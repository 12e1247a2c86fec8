"""Idempotent publishing: which sequence numbers each producer has already stored in a topic.

A publisher that names itself (``PRODUCER``) and numbers its messages (``SEQUENCE``, per producer and topic)
can send a batch again after a lost answer, a reconnect or a broker restart: the entries the topic already
holds are not stored twice. :class:`ProducerWindow` is that memory for one topic: the highest sequence each
producer stored (and the id it got), for the most recently active :data:`MAX_PRODUCERS` producers — the
*window*. A producer that fell out of the window is a stranger again: its next batch is stored whole.

A producer the window knows must go on without a gap (:meth:`ProducerWindow.gap`): its next batch begins at
most one past the highest sequence it stored. Otherwise a batch refused on its way (a failed write) followed
by a later one that was stored would leave the refused batch's numbers below the highest, and its retry would
be skipped as a duplicate: lost. Kafka refuses an out-of-order sequence for the same reason.

Pure state, no I/O and no clock. A persistent topic's log keeps its window in a journal beside the segments
(:mod:`broker.store.producers`), so that it survives a restart; a transient topic's window lives and dies with
the broker, as its messages do. This module must not know which of the two it is.
"""

from __future__ import annotations

#: Producers remembered per topic (docs/configuration.md, "Limits"). A Spark write names one producer per
#: task and micro-batch, and a retried task or a replayed micro-batch comes back within minutes: ten thousand
#: covers hours of a busy query while keeping each topic's window to about a megabyte.
MAX_PRODUCERS = 10_000


class ProducerWindow:
    """Producer -> (highest sequence stored, id of that message), oldest activity first."""

    def __init__(self, limit: int = MAX_PRODUCERS) -> None:
        if limit < 1:
            raise ValueError("a producer window holds at least one producer")
        self.limit = limit
        self.last: dict[bytes, tuple[int, int]] = {}
        self.evicted = 0  # producers forgotten to keep the window bounded

    def __len__(self) -> int:
        return len(self.last)

    def duplicates(self, producer: bytes, sequence: int, count: int) -> int:
        """How many of ``count`` entries numbered from ``sequence`` this producer has stored already: always a
        prefix, because a producer's sequences only grow."""
        entry = self.last.get(producer)
        if entry is None:
            return 0
        return max(0, min(count, entry[0] - sequence + 1))

    def gap(self, producer: bytes, sequence: int) -> int | None:
        """The sequence this producer must send next if a batch numbered from ``sequence`` would leave a gap
        after what it stored; None when the batch may be taken (it follows on, overlaps what was stored, or
        the producer is a stranger)."""
        entry = self.last.get(producer)
        if entry is None or sequence <= entry[0] + 1:
            return None
        return entry[0] + 1

    def record(self, producer: bytes, last_sequence: int, first_id: int, count: int) -> None:
        """The producer stored ``count`` entries, the last numbered ``last_sequence``, ids ``first_id`` on."""
        last = self.last
        last.pop(producer, None)  # re-inserted at the end: the most recently active
        last[producer] = (last_sequence, first_id + count - 1)
        while len(last) > self.limit:
            del last[next(iter(last))]
            self.evicted += 1
