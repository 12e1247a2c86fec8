"""The ack journal of a round-robin persistent topic: which message ids its consumers have acknowledged.

``queue.acks`` is a sequence of acked inclusive id ranges, each ``u32 crc | u64 first | u64 last``. The state
it describes is a watermark (every id up to it is acked) plus the acked ids above it. This module owns that
file: buffering acks, coalescing them into ranges, replaying and repairing the file at open, and compacting
it. It does not decide when to write or fsync (the topic's log does, with the same rule as for messages) and
knows nothing about segments.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from pathlib import Path

from broker.store.journal import JournalFile
from protocol.checksum import crc32

log = logging.getLogger("mc0.store")

ACK_RANGE = struct.Struct(">QQ")  # first, last (inclusive)
ACK_RECORD = struct.Struct(">IQQ")  # crc32 of the 16 range bytes, first, last
ACK_RECORD_SIZE = ACK_RECORD.size  # 20
#: Past this size the journal is rewritten as its current state: a few ranges instead of one per commit.
COMPACT_BYTES = 1 << 20


def encode_ranges(ranges: Iterable[tuple[int, int]]) -> bytes:
    out = bytearray()
    for first, last in ranges:
        body = ACK_RANGE.pack(first, last)
        out += struct.pack(">I", crc32(body))
        out += body
    return bytes(out)


def coalesce(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ids as inclusive ranges of consecutive ids: 1, 2, 3, 7, 8 -> (1, 3), (7, 8)."""
    ranges: list[tuple[int, int]] = []
    for acked in sorted(ids):
        if ranges and acked == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], acked)
        else:
            ranges.append((acked, acked))
    return ranges


class AckJournal(JournalFile):
    """The acked ids of one topic, in memory and in ``queue.acks`` (created on the first write)."""

    what = "ack journal"

    def __init__(self, path: Path) -> None:
        super().__init__(path, COMPACT_BYTES)
        self.watermark = 0  # every id <= watermark is acked
        self.above: set[int] = set()  # acked ids > watermark + 1 (never watermark + 1: it would have moved)
        self.pending: list[int] = []  # acked since the last write
        self.pending_ranges: list[tuple[int, int]] = []  # and whole ranges (ack_through)

    # ------------------------------------------------------------------------------------------- state

    def ack(self, ids: Iterable[int], next_id: int) -> None:
        above, pending = self.above, self.pending
        for acked in ids:
            if acked >= next_id or acked < 1:
                raise ValueError(f"cannot ack id {acked}: the log holds ids below {next_id}")
            if acked <= self.watermark or acked in above:
                continue
            pending.append(acked)
            if acked == self.watermark + 1:
                self.watermark = acked
                self._advance()
            else:
                above.add(acked)

    def ack_through(self, last: int, next_id: int) -> None:
        """Every id up to ``last`` is acked (a cluster's new leader taking its queue's position from the
        cluster's state): one range, however many ids."""
        if last >= next_id:
            raise ValueError(f"cannot ack through id {last}: the log holds ids below {next_id}")
        if last > self.watermark:
            self.pending_ranges.append((self.watermark + 1, last))
            self._apply(self.watermark + 1, last)

    @property
    def unwritten(self) -> bool:
        """Acks made since the last write."""
        return bool(self.pending or self.pending_ranges)

    def _advance(self) -> None:
        above, watermark = self.above, self.watermark
        while watermark + 1 in above:
            watermark += 1
            above.discard(watermark)
        self.watermark = watermark

    def _apply(self, first: int, last: int) -> None:
        if first <= self.watermark + 1:
            if last > self.watermark:
                self.watermark = last
                self.above = {acked for acked in self.above if acked > last}
                self._advance()
        else:
            self.above.update(range(first, last + 1))

    def raise_floor(self, first_id: int) -> None:
        """Ids below the log's first id are gone (retention): they count as acked."""
        if first_id - 1 > self.watermark:
            self._apply(1, first_id - 1)

    # ------------------------------------------------------------------------------------------- files

    def open(self, first_id: int, next_id: int) -> None:
        """Replay the journal, cut a torn tail, and forget acks of ids the log no longer holds.

        After a crash the log may have lost its unsynced tail while the journal kept acks for those ids; the
        ids will be given to new messages, so those acks must go, durably: the journal is rewritten.
        """
        data = self._read_existing()
        if data is not None:
            good = 0
            reason = None
            while good + ACK_RECORD_SIZE <= len(data):
                crc, first, last = ACK_RECORD.unpack_from(data, good)
                if crc32(data[good + 4 : good + ACK_RECORD_SIZE]) != crc:
                    reason = "CRC mismatch"
                    break
                if not 1 <= first <= last:
                    reason = f"bad range [{first}, {last}]"
                    break
                self._apply(first, last)
                good += ACK_RECORD_SIZE
            self._keep(data, good, reason)
        self.raise_floor(first_id)
        if self.watermark >= next_id or any(acked >= next_id for acked in self.above):
            log.warning("%s: forgetting acks of ids >= %d, which the log no longer holds", self.path, next_id)
            self.watermark = min(self.watermark, next_id - 1)
            self.above = {acked for acked in self.above if acked < next_id}
            self.compact()

    def write(self) -> None:
        """Write the acks made since the last call as coalesced ranges (one write); compact if big."""
        if not self.unwritten:
            return
        data = encode_ranges([*self.pending_ranges, *coalesce(self.pending)])
        self.pending, self.pending_ranges = [], []
        self._append(data)
        if self.size > self.compact_bytes:
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal as its state: every id up to the watermark, then the ranges above it."""
        ranges = [(1, self.watermark)] if self.watermark else []
        ranges += coalesce(self.above)
        self._rewrite(encode_ranges(ranges))
