"""The ack journal of a round-robin persistent topic: which message ids its consumers have acknowledged.

``queue.acks`` is a sequence of acked inclusive id ranges, each ``u32 crc | u64 first | u64 last``. The state
it describes is a watermark (every id up to it is acked) plus the acked ids above it. This module owns that
file: buffering acks, coalescing them into ranges, replaying and repairing the file at open, and compacting
it. It does not decide when to write or fsync (the topic's log does, with the same rule as for messages) and
knows nothing about segments.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

from broker.store import StoreError
from broker.store.segment import fsync, open_file, pread_exact, replace_file, write_all

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
        out += struct.pack(">I", zlib.crc32(body))
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


class AckJournal:
    """The acked ids of one topic, in memory and in ``queue.acks`` (created on the first write)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.watermark = 0  # every id <= watermark is acked
        self.above: set[int] = set()  # acked ids > watermark + 1 (never watermark + 1: it would have moved)
        self.pending: list[int] = []  # acked since the last write
        self.unsynced = False  # written since the last fsync
        self.created = False  # the file was created since the last directory fsync
        self.size = 0
        self.compact_bytes = COMPACT_BYTES
        self._fd: int | None = None

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
        try:
            fd = open_file(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            fd = None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        if fd is not None:
            self._fd = fd
            size = os.fstat(fd).st_size
            data = pread_exact(fd, size, 0, self.path)
            good = 0
            reason = None
            while good + ACK_RECORD_SIZE <= len(data):
                crc, first, last = ACK_RECORD.unpack_from(data, good)
                if zlib.crc32(data[good + 4 : good + ACK_RECORD_SIZE]) != crc:
                    reason = "CRC mismatch"
                    break
                if not 1 <= first <= last:
                    reason = f"bad range [{first}, {last}]"
                    break
                self._apply(first, last)
                good += ACK_RECORD_SIZE
            if good < size:
                try:
                    os.ftruncate(fd, good)
                except OSError as exc:
                    raise StoreError(f"{self.path}: cannot truncate: {exc}") from exc
                fsync(fd, self.path)
                log.warning(
                    "%s: recovery truncated %d bytes of torn ack journal tail at byte %d (%s)",
                    self.path,
                    size - good,
                    good,
                    reason or "incomplete record",
                )
            self.size = good
        self.raise_floor(first_id)
        if self.watermark >= next_id or any(acked >= next_id for acked in self.above):
            log.warning("%s: forgetting acks of ids >= %d, which the log no longer holds", self.path, next_id)
            self.watermark = min(self.watermark, next_id - 1)
            self.above = {acked for acked in self.above if acked < next_id}
            self.compact()

    def write(self) -> None:
        """Write the acks made since the last call as coalesced ranges (one os.write); compact if big."""
        if not self.pending:
            return
        data = encode_ranges(coalesce(self.pending))
        self.pending = []
        if self._fd is None:
            try:
                self._fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot create: {exc}") from exc
            self.created = True
        write_all(self._fd, data, self.path)
        self.size += len(data)
        self.unsynced = True
        if self.size > self.compact_bytes:
            self.compact()

    def fsync(self) -> None:
        if self.unsynced and self._fd is not None:
            fsync(self._fd, self.path)
        self.unsynced = False

    def compact(self) -> None:
        """Rewrite the journal as its state, atomically: tmp file, fsync, rename, fsync the directory."""
        ranges = [(1, self.watermark)] if self.watermark else []
        ranges += coalesce(self.above)
        data = encode_ranges(ranges)
        fd = replace_file(self.path, data)
        self.close()
        self._fd = fd
        self.size = len(data)
        self.unsynced = False
        self.created = False

    @property
    def open_files(self) -> int:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as exc:
                raise StoreError(f"{self.path}: close failed: {exc}") from exc
