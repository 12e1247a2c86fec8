"""The producer journal of a persistent topic: its :class:`~broker.producers.ProducerWindow`, kept on disk.

``producers.journal`` is a sequence of records, each saying "producer P stored COUNT entries, the last with
sequence S, at ids FIRST.. FIRST+COUNT-1":

    u32 crc | u8 producer length | producer | u64 last sequence | u64 first id | u32 count

(big-endian; the crc is CRC-32 of everything after it). It is written by the same commit as the messages and
**before** them (for strong topics also fsynced before them), so that messages on disk always have their
journal record: after a crash the records are replayed, those whose ids the log no longer holds are dropped
or shortened, and a retried batch finds exactly what was stored. Past :data:`COMPACT_BYTES` the journal is
rewritten as the window (one record per producer) once what it describes is fsynced.

This module owns that file; when to write and fsync is the log's business (:mod:`broker.store.log`).
"""

from __future__ import annotations

import logging
import struct
from bisect import bisect_left
from pathlib import Path

from broker.producers import MAX_PRODUCERS, ProducerWindow
from broker.store.journal import JournalFile
from broker.store.segment import fsync_directory
from protocol.checksum import crc32

log = logging.getLogger("mc0.store")

JOURNAL_FILE = "producers.journal"
_TAIL = struct.Struct(">QQI")  # last sequence, first id, count
_CRC = struct.Struct(">I")
#: Past this size the journal is rewritten as the window: at most MAX_PRODUCERS records of ~30 bytes.
COMPACT_BYTES = 4 << 20
#: Batches remembered in memory, by id, for a cluster's followers (:meth:`ProducerJournal.entries`): about
#: 10 MB at most per topic with idempotent publishers; a follower further behind gets the window instead.
MAX_HISTORY = 100_000

#: One stored idempotent batch: first id, count, producer, last sequence.
Entry = tuple[int, int, bytes, int]


def encode_record(producer: bytes, last_sequence: int, first_id: int, count: int) -> bytes:
    body = bytes([len(producer)]) + producer + _TAIL.pack(last_sequence, first_id, count)
    return _CRC.pack(crc32(body)) + body


class ProducerJournal(ProducerWindow, JournalFile):
    """A topic's producer window, recorded in ``producers.journal`` (created by the first write)."""

    what = "producer journal"

    def __init__(self, directory: Path, limit: int = MAX_PRODUCERS) -> None:
        ProducerWindow.__init__(self, limit)
        JournalFile.__init__(self, directory / JOURNAL_FILE, COMPACT_BYTES)
        self.pending = bytearray()  # records made since the last write
        # The batches stored, in id order (ids never overlap): what a cluster's follower copies with the
        # records they describe (entries()). Bounded: the oldest half goes past MAX_HISTORY.
        self.history: list[Entry] = []
        self._history_ids: list[int] = []

    def record(self, producer: bytes, last_sequence: int, first_id: int, count: int) -> None:
        super().record(producer, last_sequence, first_id, count)
        self.pending += encode_record(producer, last_sequence, first_id, count)
        self._remember(first_id, count, producer, last_sequence)

    def _remember(self, first_id: int, count: int, producer: bytes, last_sequence: int) -> None:
        if self._history_ids and first_id <= self._history_ids[-1]:
            index = bisect_left(self._history_ids, first_id)  # a replicated batch again: replaces its entry
            del self.history[index:], self._history_ids[index:]
        self.history.append((first_id, count, producer, last_sequence))
        self._history_ids.append(first_id)
        if len(self.history) > MAX_HISTORY:
            del self.history[: MAX_HISTORY // 2], self._history_ids[: MAX_HISTORY // 2]

    def entries(self, start: int, stop: int) -> list[Entry]:
        """The batches that stored ids in ``[start, stop)``, in id order (a batch may begin before ``start``
        or end after ``stop``: the caller cuts it). Ids older than the history are answered with the window:
        each producer's last batch, as one entry of its last id."""
        ids = self._history_ids
        if not ids or start < ids[0]:
            window = [(last_id, 1, producer, sequence) for producer, (sequence, last_id) in self.last.items()
                      if start <= last_id < stop]
            window.sort()
            return window + [entry for entry in self.history if entry[0] < stop and entry[0] >= start
                             and entry not in window]
        index = max(0, bisect_left(ids, start) - 1)
        out = []
        for entry in self.history[index:]:
            if entry[0] >= stop:
                break
            if entry[0] + entry[1] > start:
                out.append(entry)
        return out

    # ------------------------------------------------------------------------------------------- files

    def open(self, next_id: int) -> None:
        """Replay the journal: cut a torn tail, and forget what the log no longer holds (ids >= ``next_id``,
        lost with an unsynced tail)."""
        data = self._read_existing()
        if data is None:
            return
        good, dropped = 0, 0
        replayed: dict[int, Entry] = {}
        while good + 5 <= len(data):
            length = data[good + 4]
            end = good + 5 + length + _TAIL.size
            if end > len(data) or crc32(data[good + 4 : end]) != _CRC.unpack_from(data, good)[0]:
                break
            producer = data[good + 5 : good + 5 + length]
            last_sequence, first_id, count = _TAIL.unpack_from(data, good + 5 + length)
            lost = first_id + count - next_id
            if lost >= count:
                dropped += 1  # none of these messages survived: the producer's earlier record stands
            else:
                if lost > 0:
                    last_sequence, count = last_sequence - lost, count - lost
                    dropped += 1
                ProducerWindow.record(self, producer, last_sequence, first_id, count)
                replayed[first_id] = (first_id, count, producer, last_sequence)  # a later one replaces it
            good = end
        self.history = sorted(replayed.values())[-MAX_HISTORY:]
        self._history_ids = [entry[0] for entry in self.history]
        self._keep(data, good)
        if dropped:
            log.warning("%s: %d producer records refer to messages the log no longer holds (ids >= %d): "
                        "forgotten", self.path, dropped, next_id)
            self.compact()
        elif self.size > self.compact_bytes:
            self.compact()

    def write(self) -> None:
        """Write the records made since the last call (one write)."""
        if not self.pending:
            return
        data, self.pending = self.pending, bytearray()
        self._append(data)

    def fsync(self) -> None:
        super().fsync()
        if self.created:
            fsync_directory(self.path.parent)
            self.created = False

    def compact_if_big(self) -> None:
        """Call once everything the journal describes is fsynced in the log."""
        if self.size > self.compact_bytes and not self.pending:
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal as the window: one record per producer."""
        data = b"".join(encode_record(producer, sequence, last_id, 1)
                        for producer, (sequence, last_id) in self.last.items())
        self.history = sorted((last_id, 1, producer, sequence)
                              for producer, (sequence, last_id) in self.last.items())
        self._history_ids = [entry[0] for entry in self.history]
        self._rewrite(data)
