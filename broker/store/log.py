"""The log of one persistent topic: a chain of segments, group commit, reads by id, retention, and acks.

:class:`SegmentLog` is what the engine holds for a persistent topic (the :class:`broker.store.TopicLog`
contract). It owns the policy: appends go to an in-memory buffer, :meth:`~SegmentLog.commit` writes a
loop turn's worth with one write and (for strong topics) one fsync, a full segment is sealed and a new one
started, retention deletes whole sealed segments, reads seek by index and keep a cursor for sequential
readers. The byte layouts are :mod:`broker.store.segment`'s and :mod:`broker.store.acks`'s; the topic
directory and its meta file belong to :mod:`broker.store.files`.

When something goes wrong the log keeps to what its files say:

* a write, or a file that will not open, fails the commit (StoreError): the log fsyncs what it had written,
  lets go of its files and reads its state back from them (recovery cuts a half-written record), so the
  messages of the failed commit are gone and were never acknowledged; the engine takes them back. If even
  that fails the log stays unusable, and says why, until a later call manages to open it again;
* a damaged record fails reads of a range of ids only (:class:`~broker.store.DamagedRange`): from the bad
  record to the next index entry that reads, or to the end of its segment. The log remembers the range, so
  later reads skip it at once, and logs it once. A sealed segment found damaged when the log is opened is
  the same: the log opens, and reads of that range fail;
* ids missing between two segments (``mc0 repair`` took them out, listed in ``lost``) are skipped by reads
  as retention's are; a gap nobody recorded is a damaged range;
* an fsync failure is :class:`~broker.store.SyncFailed`, and stops the broker.

The log holds at most a few files open (the active segment, its index, the ack journal, a few sealed
segments for readers); :meth:`SegmentLog.release` lets go of all of them, and the next call opens what it
needs again. ``on_use`` tells the store each time the log is about to touch its files, so that it can keep
the whole store's open files under a bound by releasing the logs used least recently.
"""

from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from time import perf_counter

import msgpack
import numpy as np

from broker.engine import Message
from broker.histogram import FSYNC_SECONDS, Histogram
from broker.store import DamagedRange, LogIdentity, StoreError, SyncFailed
from broker.store.acks import AckJournal
from broker.store.batch import encode_plain
from broker.store.buffers import ReadBuffers
from broker.store.pending import PendingBytes
from broker.store.producers import ProducerJournal
from broker.store.segment import (
    NO_ENTRY,
    RECORD_HEAD,
    RECORD_HEAD_SIZE,
    SEGMENT_HEADER_SIZE,
    Corrupt,
    Segment,
    decode_payload,
    encode_segment_header,
    fsync,
    fsync_directory,
    list_directory,
    open_file,
    parse_segment_file_name,
    pread_exact,
)
from broker.topics import Sync, TopicSpec
from protocol.bodies import TopicBodies
from protocol.checksum import crc32
from protocol.crcs import FOLD_FROM, uniform_positions
from protocol.errors import ProtocolError
from protocol.plain_records import all_plain, uniform_run
from protocol.records import walk

log = logging.getLogger("mc0.store")

#: A read fetches at least this much per pread, so a replay costs one syscall per ~10,000 small records.
READ_CHUNK = 1 << 20
#: ...and at most this much (plus one record if a single record is bigger), whatever max_bytes says.
MAX_READ_CHUNK = 16 << 20
#: Sealed segments kept open (fd and loaded index) for readers; the rest are reopened on demand. A replay
#: needs one or two at a time; the bound keeps many topics with many segments under the fd limit.
MAX_OPEN_SEALED = 8
#: Batches of at least this many entries without headers are encoded in bulk (broker/store/batch.py): below
#: it, numpy's fixed cost per batch (about 80 us) is more than the one-by-one encoding saves. Measured on
#: 100-byte bodies: 1.9 us a record in bulk against 0.9 one by one at 64 records, even at 256, 0.65 against
#: 0.95 at 1,024; a window of 100 confirmed publishes cost the broker 9.2 us a message in bulk, 5.4 without.
BULK_MIN = 256
#: Records copied from a cluster leader are checked as a run (SegmentLog._append_run): by byte columns from
#: COPY_UNIFORM_MIN records of one layout on, with numpy from COPY_BULK_MIN on. Below each, its fixed cost
#: (about 8 us a run for the columns, 35 for numpy) is more than the one-by-one loop's 1.8-2.4 us a record.
#: Measured appending runs of 100-byte records: by columns 2.30 us a record at 4, 1.60 at 6, 0.41 at 100;
#: one by one 1.84, 1.92 and 0.67 (numpy from 64 on).
COPY_UNIFORM_MIN = 6
COPY_BULK_MIN = 32
#: Messages per read while find_time() looks through one index interval (a few dozen usually).
READ_CHUNK_MESSAGES = 4096
#: Read positions remembered for sequential readers (each may hold a chunk of up to MAX_READ_CHUNK).
MAX_CURSORS = 4
#: Taken around the fsync-time histogram: FileStore.commit_many fsyncs several logs at once.
_OBSERVING = threading.Lock()
#: The ack journal, beside the segments.
ACK_FILE = "queue.acks"

_unpack_head = RECORD_HEAD.unpack_from
_pack_head = RECORD_HEAD.pack
_unpackb = msgpack.unpackb


def _record_head(message_id: int, payload: bytes) -> bytes:
    """The head of the record of ``payload`` with id ``message_id``: its length, the CRC-32 of the id bytes
    and the payload, and the id (docs/storage.md, "Records")."""
    return _pack_head(len(payload), crc32(payload, crc32(message_id.to_bytes(8, "big"))), message_id)


class SegmentLog:
    """The on-disk log of one topic. Single-threaded: the broker's loop is the only caller."""

    def __init__(
        self,
        topic: bytes,
        directory: Path,
        spec: TopicSpec,
        *,
        index_interval: int = 4096,
        fsync_seconds: Histogram | None = None,
        lost: Iterable[tuple[int, int]] = (),
        on_use: Callable[[SegmentLog], None] | None = None,
        read_buffers: ReadBuffers | None = None,
    ) -> None:
        if index_interval < 1:
            raise ValueError("index_interval must be at least 1")
        self.topic = topic
        self.directory = directory
        self.spec = spec
        self.index_interval = index_interval
        self.fsyncs = 0  # fsyncs of .log files (the benchmark's "messages per fsync")
        # ... and how long each took (the store shares one histogram among its logs).
        self.fsync_seconds = fsync_seconds if fsync_seconds is not None else Histogram(FSYNC_SECONDS)
        self.truncated_bytes = 0
        self.lost = sorted(lost)  # id ranges mc0 repair took out: gaps between segments that are no damage
        self.on_use = on_use
        # Range reads fill kept buffers (the store shares them among its logs): see broker.store.buffers.
        self.read_buffers = read_buffers if read_buffers is not None else ReadBuffers()
        self._strong = spec.sync is Sync.STRONG
        self._segment_bytes = spec.segment_bytes
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.identity = LogIdentity.fresh()  # the store sets the one recorded with the log
        # Set by the store when ``identity`` changed and its meta file does not say so yet: it records it, and
        # runs before anything else is written to this log (its records must never sit under the identity
        # they replaced), or at close.
        self.identity_owed: Callable[[], None] | None = None
        self.created = False  # no segment was found at open: a new log (or one whose files were lost)
        self._closed = False
        self._failure: StoreError | None = None  # why the log could not be opened again after a failure
        # Writes that failed in a row (a full disk): the first is logged as an error, the others only
        # counted, and the next write that succeeds says how many there were.
        self._failed_writes = 0
        self.write_failures = 0  # all of them, for STATS and the monitoring (a full disk shows there too)
        self._known_first = 1  # first_id while the log has no segments in hand (see _reopen)
        self._reset()
        self._open()

    def _reset(self) -> None:
        """The in-memory state of a log with no files open (before _open reads it from the files)."""
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # parallel to _segments, for bisect
        self._sealing: list[Segment] = []  # rolled over by append(), written and sealed by the next write
        self._unsynced: list[Segment] = []  # written since their last fsync
        self._open_sealed: OrderedDict[Segment, None] = OrderedDict()  # LRU: sealed segments open for reads
        self._dir_dirty = False  # a file was created since the directory's last fsync
        self._buf = PendingBytes()  # appended to the active segment, not yet written
        self._active_size = 0  # size of the active segment including the buffer
        self._last_entry = NO_ENTRY  # position of the active segment's newest index entry
        self._next_id = 1
        self._written_next_id = 1  # readers see ids below this
        self._last_timestamp = 0
        self._bytes_on_disk = 0
        # Where recent reads stopped, by the id they would read next: segment, chunk, its position, offset.
        # Several, because the engine interleaves readers (a queue's dispatch, a redelivery, catching-up
        # subscribers); each continues without a seek.
        self._cursors: dict[int, tuple[Segment, bytes, int, int]] = {}
        # Where the last write's first record lies (segment, id, byte position): a reader that keeps up (a
        # cluster's follower, a tailing FETCH) starts there, and finds it without walking record heads.
        self._tail: tuple[Segment, int, int] | None = None
        # The last chunk read (segment, chunk, file position): a seek that lands inside it needs no pread.
        self._last_chunk: tuple[Segment, bytes, int] | None = None
        self._acks = AckJournal(self.directory / ACK_FILE)
        self.producers = ProducerJournal(self.directory)
        # Only a strong topic fsyncs at every commit: only its files gain by writing inside reserved space.
        self._acks.reserving = self.producers.reserving = self._strong
        # Damaged records by where they are (segment, byte position, id), with why; and gaps between segments
        # nobody recorded as lost (first id, last id, the segment before).
        self._damage: dict[tuple[Segment, int], tuple[int, str]] = {}
        self._gaps: list[tuple[int, int, Segment]] = []

    # ------------------------------------------------------------------------------------------ opening

    def _open(self) -> None:
        bases = []
        index_files = set()
        try:
            names = list_directory(self.directory)
        except OSError as exc:
            raise StoreError(f"{self.directory}: cannot list: {exc}") from exc
        for name in names:
            base = parse_segment_file_name(name)
            if base is not None:
                bases.append(base)
            elif name.endswith(".index"):
                index_files.add(name)
            elif name.endswith(".tmp"):
                (self.directory / name).unlink(missing_ok=True)  # an interrupted atomic rewrite
        bases.sort()
        if not bases:
            self.created = True
            bases = [1]
            Segment(self.directory, 1).create_empty()
            fsync_directory(self.directory)
        segments = [Segment(self.directory, base) for base in bases]
        for name in index_files - {segment.index_path.name for segment in segments}:
            (self.directory / name).unlink(missing_ok=True)  # retention deleted its .log, then we crashed
        try:
            # Check every sealed segment before touching anything. A damaged one is remembered, not fatal:
            # reads of its bad range fail, the rest of the log serves (see the module docstring).
            damaged = []
            for segment, following in pairwise(segments):
                corrupt = segment.check_sealed(following.base - 1, self.index_interval)
                if corrupt is not None:
                    damaged.append(corrupt)
            active = segments[-1]
            self.truncated_bytes, self._last_entry = active.recover_active(self.index_interval,
                                                                           quiet=self._failed_writes > 1)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        for corrupt in damaged:
            self._remember_damage(corrupt)
        for segment, following in pairwise(segments):
            first, last = segment.last_id + 1, following.base - 1
            if first <= last and not self._is_lost(first, last):
                self._gaps.append((first, last, segment))
                log.error("%s: ids %d..%d are missing between %s and %s: reads of them fail; `mc0 verify` "
                          "and `mc0 repair` check and mend the data directory with the broker stopped",
                          self.directory, first, last, segment.path.name, following.path.name)
        self._segments = segments
        self._bases = bases
        self._active_size = active.size
        self._next_id = self._written_next_id = active.last_id + 1
        self._last_timestamp = active.last_timestamp
        self._bytes_on_disk = sum(segment.size for segment in segments)
        try:
            self._acks.open(self.first_id, self._next_id)
            self.producers.open(self._next_id)
        except BaseException:
            self._acks.close()
            self.producers.close()
            active.close()
            raise

    # ------------------------------------------------------------------------------------------- status

    @property
    def first_id(self) -> int:
        # A log that could not be opened again has no segments in hand: what it held last is still the answer.
        return self._segments[0].base if self._segments else self._known_first

    @property
    def next_id(self) -> int:
        return self._next_id

    @property
    def bytes_on_disk(self) -> int:
        """Bytes written to the .log files (indexes and the ack journal not counted)."""
        return self._bytes_on_disk

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def dirty(self) -> bool:
        """Anything not yet written and fsynced."""
        return bool(self._buf or self._sealing or self._acks.unwritten or self.producers.pending
                    or self._unsynced_files())

    @property
    def acked_watermark(self) -> int:
        return self._acks.watermark

    @property
    def acked_above(self) -> set[int]:
        """The live set, not a copy (the engine asks on every dispatch): read it, never change it."""
        return self._acks.above

    def __repr__(self) -> str:
        return f"SegmentLog({self.topic!r}, ids {self.first_id}..{self._next_id - 1})"

    @property
    def damaged(self) -> list[DamagedRange]:
        """Every range of ids known to be unreadable, oldest first."""
        ranges = [self._damaged_range(segment, position) for segment, position in self._damage]
        ranges += [DamagedRange(self.topic, segment.path.name, first, last, "ids missing between segments")
                   for first, last, segment in self._gaps]
        return sorted(ranges, key=lambda damage: damage.first_id)

    @property
    def open_files(self) -> int:
        """Descriptors the log holds now."""
        held = {*self._open_sealed, *self._sealing}
        if self._segments:
            held.add(self._segments[-1])
        return sum(segment.open_files for segment in held) + self._acks.open_files + self.producers.open_files

    def _unsynced_files(self) -> bool:
        """Something written (or a file created) since its last fsync."""
        acks, producers = self._acks, self.producers
        return bool(self._unsynced or self._dir_dirty or acks.unsynced or acks.created or producers.unsynced
                    or producers.created)

    # ------------------------------------------------------------------------------------ files and failures

    def _use(self) -> None:
        """About to touch the files: refused if the log is closed or broken, announced to the store."""
        if self._closed:
            raise StoreError(f"{self.directory}: the log is closed")
        if self._failure is not None:
            self._reopen()
        if self.on_use is not None:
            self.on_use(self)

    def release(self) -> None:
        """Let go of every file: fsync what was written and not yet fsynced (a later fsync on a new descriptor
        might not hear of an error on the old one), then close. The next call opens what it needs again."""
        if self._closed or self._failure is not None:
            return
        self._trim()
        if self._unsynced_files():
            self._fsync_written()
        self._let_go()

    def _trim(self) -> None:
        """Before the files are let go: the active segment and the journals end at their last record again,
        so that a log at rest has no reserved space (:func:`broker.store.segment.reserve_ahead`). Not worth
        an fsync of its own: after a crash, recovery cuts that space as it finds it."""
        if self._segments:
            self._segments[-1].trim()
        self._acks.trim()
        self.producers.trim()

    def _forget_places(self) -> None:
        """Forget where readers were (cursors, the start of the last write, the last chunk read): after
        anything that moves or drops the bytes those places point into."""
        self._cursors.clear()
        self._tail = None
        self._last_chunk = None

    def _let_go(self) -> None:
        self._forget_places()
        for segment in (*self._open_sealed, *self._sealing, *self._segments[-1:]):
            segment.close()
            segment.forget_index()
        self._open_sealed.clear()
        self._acks.close()
        self.producers.close()

    def _recover(self, error: StoreError) -> None:
        """After a failed write or open: fsync what the files hold, close them, and read the state back from
        them; what was only in memory (the failed commit's messages and acks) is gone."""
        self._failed_writes += 1
        self.write_failures += 1
        log.log(logging.ERROR if self._failed_writes == 1 else logging.DEBUG,
                "%s: %s; the log is read back from its files, the messages of this commit are refused (said "
                "once: the next write that succeeds says how many failed)", self.directory, error)
        try:
            if self._unsynced_files():
                self._fsync_written()
        finally:
            self._close_all()
        self._failure = error
        self._reopen()

    def _close_all(self) -> None:
        for segment in {*self._segments, *self._sealing, *self._open_sealed}:
            try:
                segment.close()
            except StoreError as exc:
                log.warning("%s", exc)
        for journal in (self._acks, self.producers):
            try:
                journal.close()
            except StoreError as exc:
                log.warning("%s", exc)

    def _reopen(self) -> None:
        """Read the log's state back from its files (recovery). If that fails, the log stays broken, with
        what it had written as its ids: nothing past them was ever stored, and nothing below them is given
        again."""
        first = self._segments[0].base if self._segments else self._known_first
        written, timestamp = self._written_next_id, self._last_timestamp
        self._reset()
        try:
            self._open()
        except SyncFailed:
            raise
        except StoreError as error:
            self._close_all()
            self._reset()
            self._known_first = first
            self._next_id = self._written_next_id = written
            self._last_timestamp = timestamp
            self._failure = error
            raise StoreError(f"{self.directory}: the log cannot be opened again: {error}") from None
        self._failure = None

    # ------------------------------------------------------------------------------------------ writing

    def append(self, message: Message) -> None:
        """Encode one message into the buffer. Nothing touches the disk until commit() or sync()."""
        if self._failure is not None:
            self._reopen()  # StoreError again if it still cannot be: this publish fails
        message_id = message.id
        if message_id != self._next_id:
            raise StoreError(f"{self.directory}: append of id {message_id}, the log expects {self._next_id}")
        payload = self._pack([message.timestamp, message.headers, message.body])
        self._add_record(message_id, _record_head(message_id, payload), payload, message.timestamp)

    def append_batch(
        self, first_id: int, timestamp: int, items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]]
    ) -> int:
        """Encode ``(topic, body, headers)`` entries as ids ``first_id`` on (which must be this log's next
        id), all with ``timestamp``: what :meth:`append` does for each, without a message object per entry.
        Returns how many were appended: all of them, or those before a StoreError stopped it. That error is
        raised only when it stopped the first entry, or when it is a SyncFailed."""
        if self._failure is not None:
            self._reopen()
        if first_id != self._next_id:
            raise StoreError(f"{self.directory}: append of id {first_id}, the log expects {self._next_id}")
        if len(items) >= BULK_MIN:
            if type(items) is not TopicBodies and all(headers == {} for _, _, headers in items):
                items = TopicBodies.of(items[0][0], [body for _, body, _ in items])
            if type(items) is TopicBodies:  # no headers by construction, the bodies in one buffer
                return self._append_plain(first_id, timestamp, *items.columns())
        pack = self._pack
        add = self._add_record
        message_id = first_id
        for _, body, headers in items:
            payload = pack([timestamp, headers, body])
            try:
                add(message_id, _record_head(message_id, payload), payload, timestamp)
            except SyncFailed:
                raise
            except StoreError:
                if message_id == first_id:
                    raise
                break
            message_id += 1
        return message_id - first_id

    def _append_plain(self, first_id: int, timestamp: int, data: np.ndarray, offsets: np.ndarray) -> int:
        """:meth:`append_batch` of entries without headers, the bodies ``data[offsets[i]:offsets[i + 1]]``:
        the records encoded in bulk (:mod:`broker.store.batch`), then placed as :meth:`_place` says."""
        out, starts, ends = encode_plain(first_id, timestamp, data, offsets)
        return self._place(first_id, out, starts, ends, lambda _index: timestamp, owned=True)

    def _place(self, first_id: int, out: memoryview, starts: Sequence[int], ends: Sequence[int],
               timestamp_of: Callable[[int], int], owned: bool) -> int:
        """Buffer encoded records ``out[starts[i]:ends[i]]`` (ids ``first_id`` on) at the end of the log, cut
        where :meth:`_add_record` would roll the segment, with the index entries it would make;
        ``timestamp_of(i)`` is record i's timestamp (asked for the last record of each segment). ``owned``:
        ``out`` is handed over without a copy (it must not change until written); otherwise copied. Returns
        how many were placed: all of them, or those before a failed roll (raised if it stopped the first)."""
        count = len(starts)
        done = 0
        while done < count:
            if self._active_size >= self._segment_bytes:
                try:
                    self._roll()
                except StoreError:
                    if done == 0:
                        raise
                    return done
            # Record i lies at base + starts[i] in the active segment; it stays in this one if it starts
            # below the segment's size (the one at ``done`` always does: the roll just made room).
            base = self._active_size - starts[done]
            stop = min(count, max(done + 1, bisect_left(starts, self._segment_bytes - base)))
            active = self._segments[-1]
            last_entry = self._last_entry
            index = done
            while True:  # an index entry at the first record at least index_interval past the last one
                index = max(index, bisect_left(starts, last_entry + self.index_interval - base, done, stop))
                if index >= stop:
                    break
                last_entry = base + starts[index]
                active.ids.append(first_id + index)  # type: ignore[union-attr]
                active.positions.append(last_entry)  # type: ignore[union-attr]
                index += 1
            self._last_entry = last_entry
            if owned:
                self._buf.hand_over(out[starts[done] : ends[stop - 1]])
            else:
                self._buf.tail += out[starts[done] : ends[stop - 1]]
            self._active_size = base + ends[stop - 1]
            self._next_id = first_id + stop  # before a roll: the next segment begins at this id
            self._last_timestamp = timestamp_of(stop - 1)
            done = stop
        return count

    def _add_record(self, message_id: int, head: bytes, payload: bytes | memoryview, timestamp: int) -> None:
        """Buffer one encoded record at the end of the log (rolling and indexing as the format says)."""
        if self._active_size >= self._segment_bytes:
            self._roll()
        position = self._active_size
        if position - self._last_entry >= self.index_interval:
            active = self._segments[-1]
            active.ids.append(message_id)  # type: ignore[union-attr]
            active.positions.append(position)  # type: ignore[union-attr]
            self._last_entry = position
        buf = self._buf.tail
        buf += head
        buf += payload
        self._active_size = position + RECORD_HEAD_SIZE + len(payload)
        self._next_id = message_id + 1
        self._last_timestamp = timestamp

    def append_records(self, records: bytes, start_id: int, count: int) -> None:
        """Append ``count`` records numbered by another log (a cluster leader's), exactly as they lie in
        ``records`` (docs/storage.md, "Records"): ids from ``start_id``, which must be this log's next id.
        Every record is checked first (length, id, CRC, payload shape): StoreError and nothing appended if
        one is not what it claims. Buffered like :meth:`append`; durable at the next commit."""
        if self._failure is not None:
            self._reopen()
        if start_id != self._next_id:
            raise StoreError(f"{self.directory}: records from id {start_id}, the log expects {self._next_id}")
        if count >= COPY_UNIFORM_MIN and self._append_run(records, start_id, count):
            return
        view = memoryview(records)
        checked: list[tuple[int, bytes, memoryview, int]] = []
        position = 0
        for record_id in range(start_id, start_id + count):
            if position + RECORD_HEAD_SIZE > len(records):
                raise StoreError(f"{self.directory}: replicated records end inside record {record_id}")
            length, crc, found = _unpack_head(records, position)
            end = position + RECORD_HEAD_SIZE + length
            if found != record_id or end > len(records):
                raise StoreError(f"{self.directory}: replicated record at byte {position} has id {found}, "
                                 f"expected {record_id}")
            if crc32(view[position + 8 : end]) != crc:
                raise StoreError(f"{self.directory}: replicated record {record_id} fails its CRC")
            try:
                timestamp, _, _ = decode_payload(view[position + RECORD_HEAD_SIZE : end])
            except ValueError as error:
                raise StoreError(f"{self.directory}: replicated record {record_id}: {error}") from None
            checked.append((record_id, records[position : position + RECORD_HEAD_SIZE],
                            view[position + RECORD_HEAD_SIZE : end], timestamp))
            position = end
        if position != len(records):
            raise StoreError(f"{self.directory}: {len(records) - position} bytes after the last replicated "
                             "record")
        for record_id, head, payload, timestamp in checked:
            self._add_record(record_id, head, payload, timestamp)

    def _append_run(self, records: bytes, start_id: int, count: int) -> bool:
        """:meth:`append_records` checked in bulk, then placed with one copy. A run shorter than
        :data:`protocol.crcs.FOLD_FROM` of records of one size (the common case) is checked by byte columns
        without numpy (:func:`protocol.plain_records.uniform_run`); a longer one, or records of several sizes
        from :data:`COPY_BULK_MIN` on, with numpy: lengths, ids and CRCs all at once for one size
        (:func:`protocol.crcs.uniform_positions`) or in one walk over the heads
        (:func:`protocol.records.walk`), then every payload's shape without decoding it
        (:func:`protocol.plain_records.all_plain`). False, with nothing appended, for records with headers,
        that fail a check, or too few for the numpy checks to pay: the caller checks them one by one, and its
        error names the record."""
        stride = uniform_run(records, start_id, count) if count < FOLD_FROM else None
        starts: Sequence[int]
        finishes: Sequence[int]
        if stride is not None:
            starts, finishes = range(0, len(records), stride), range(stride, len(records) + 1, stride)
        elif count < COPY_BULK_MIN:
            return False
        else:
            buffer = np.frombuffer(records, dtype=np.uint8)
            try:
                positions = uniform_positions(records, buffer, start_id, count)
                if positions is None:
                    positions = np.frombuffer(walk(records, start_id, count), dtype=np.int64)
            except ProtocolError:
                return False
            ends = np.empty_like(positions)
            ends[:-1] = positions[1:]
            ends[-1] = len(records)
            if not all_plain(buffer, positions, ends):
                return False
            starts, finishes = positions.tolist(), ends.tolist()
        view = memoryview(records)

        def timestamp_of(index: int) -> int:
            return decode_payload(view[starts[index] + RECORD_HEAD_SIZE : finishes[index]])[0]

        self._place(start_id, view, starts, finishes, timestamp_of, owned=False)
        return True

    def truncate(self, from_id: int) -> int:
        """Cut the log's suffix from ``from_id`` on, durably (files cut or deleted and fsynced, with their
        directory, before this returns), then read the log's state back from its files, as at a start; returns
        how many messages went. The ids cut may be given to other messages only under a new log identity: the
        caller's business (a cluster's new epoch)."""
        if from_id >= self._next_id:
            return 0
        cut = self._next_id - max(from_id, self.first_id)
        self._cut(from_id, from_id)
        log.warning("%s: %d messages from id %d cut: they were not on a majority of the cluster",
                    self.directory, cut, from_id)
        return cut

    def restart_at(self, first_id: int) -> int:
        """Drop every message, durably, and go on at ``first_id``, past this log's next id: a cluster's copy
        whose leader's retention removed the messages between; returns how many messages went."""
        if first_id <= self._next_id:
            raise StoreError(f"{self.directory}: a log restarts past its next id {self._next_id}, not at "
                             f"{first_id}")
        dropped = self._next_id - self.first_id
        self._cut(0, first_id)
        return dropped

    def _cut(self, from_id: int, go_on_at: int) -> None:
        """Delete or cut the segments from ``from_id`` on and fsync them and the directory; with nothing
        left, an empty segment goes on at ``go_on_at``. Then the state is read back from the files."""
        self._use()
        self._record_identity()
        self.sync()  # what is buffered goes to the files first: one state to cut, the files'
        self._forget_places()
        kept = 0
        try:
            for segment in reversed(self._segments):
                if segment.base >= from_id:
                    segment.delete()
                    continue
                kept += 1
                if segment.last_id >= from_id:
                    self._readable(segment)
                    position = self._record_position(segment, from_id)
                    try:
                        os.truncate(segment.path, position)
                        segment.index_path.unlink(missing_ok=True)  # rebuilt from the log when it opens
                    except OSError as exc:
                        raise StoreError(f"{segment.path}: cannot truncate: {exc}") from exc
                    fd = open_file(segment.path, os.O_RDONLY)
                    try:
                        fsync(fd, segment.path)
                    finally:
                        os.close(fd)
                break
            if not kept:
                Segment(self.directory, go_on_at).create_empty()  # everything went: go on there
            fsync_directory(self.directory)
        finally:
            self._close_all()
            self._open_sealed.clear()
        self._reset()
        self._open()

    def _roll(self) -> None:
        """Start a new segment at the next id; the full one is sealed by the next write."""
        if self._closed:
            raise StoreError(f"{self.directory}: the log is closed")
        full = self._segments[-1]
        full.pending = self._buf
        full.last_id = self._next_id - 1
        full.last_timestamp = self._last_timestamp
        self._sealing.append(full)
        segment = Segment(self.directory, self._next_id)
        self._segments.append(segment)
        self._bases.append(segment.base)
        self._buf = PendingBytes(encode_segment_header(segment.base))  # the new file's first write
        self._active_size = SEGMENT_HEADER_SIZE
        self._last_entry = NO_ENTRY

    def _write_to(self, segment: Segment, data: PendingBytes) -> None:
        if segment.fd is None or segment.index_fd is None:
            if segment.size:
                segment.open_active()  # released earlier to keep few files open
            else:
                segment.create()
                self._dir_dirty = True
        segment.append(data, self._strong)
        self._bytes_on_disk += len(data)
        segment.write_new_index_entries()
        if segment not in self._unsynced:
            self._unsynced.append(segment)

    def _write(self) -> None:
        """Write everything buffered: full segments first (sealing them), then the active one, then acks."""
        if self._closed:
            raise StoreError(f"{self.directory}: the log is closed")
        self._record_identity()
        producers = self.producers
        if producers.pending:
            # Before the messages they describe: a message on disk must never lack its producer record, or a
            # retried batch would store it twice. A strong topic fsyncs the record first, so that even a
            # power loss cannot keep the messages and lose the record.
            producers.write()
            if self._strong:
                producers.fsync()
        for segment in self._sealing:
            if segment.pending:
                self._write_to(segment, segment.pending)
            segment.pending = None
            self._seal(segment)
        self._sealing.clear()
        if self._buf:
            active = self._segments[-1]
            first = active.last_id + 1
            self._write_to(active, self._buf)
            # A new segment's first write begins with its header: its first record lies just after.
            self._tail = (active, first, max(active.size - len(self._buf), SEGMENT_HEADER_SIZE))
            self._buf = PendingBytes()
            active.last_id = self._next_id - 1
            active.last_timestamp = self._last_timestamp
        self._written_next_id = self._next_id
        self._acks.write()

    def _record_identity(self) -> None:
        """The store's record of a new identity, if one is owed: before this log's files change again. Kept
        owed when it fails (StoreError), so that the write it came before fails too, and the next one tries
        again."""
        if self.identity_owed is not None:
            self.identity_owed()
            self.identity_owed = None

    def _seal(self, segment: Segment) -> None:
        """Make a full segment durable with its index before anything lands in the next one."""
        # Always, not only if written since the last fsync: a segment recovered at open may hold bytes a
        # crashed process wrote and nobody fsynced. Its file ends at its last record again first.
        segment.trim()
        self._fsync_segment(segment)
        if segment in self._unsynced:
            self._unsynced.remove(segment)
        if segment.index_fd is not None:
            fsync(segment.index_fd, segment.index_path)
            os.close(segment.index_fd)
            segment.index_fd = None
        if self._dir_dirty:
            # The sealed file's name must be durable before its successor's: a crash must never leave a later
            # segment without an earlier one (that would read as a broken chain).
            fsync_directory(self.directory)
            self._dir_dirty = False
        segment.sealed = True
        self._remember_open(segment)

    def _fsync_segment(self, segment: Segment) -> None:
        """fsync one segment file, counted and timed (a perf_counter pair costs nothing next to an fsync)."""
        assert segment.fd is not None
        started = perf_counter()
        fsync(segment.fd, segment.path)
        with _OBSERVING:  # the store's histogram, shared by logs fsynced at once in threads
            self.fsync_seconds.observe(perf_counter() - started)
        self.fsyncs += 1

    def _fsync_written(self) -> None:
        for segment in self._unsynced:
            self._fsync_segment(segment)
        self._unsynced.clear()
        acks = self._acks
        acks.fsync()
        if self._dir_dirty or acks.created:
            fsync_directory(self.directory)
            self._dir_dirty = acks.created = False
        self.producers.fsync()
        self.producers.compact_if_big()  # everything it describes is fsynced now

    def commit(self) -> None:
        """Group commit of one loop turn: one write, and for strong topics the fsyncs it needs.

        StoreError if the write fails: the log is then back to what its files hold (see the module
        docstring), so ``next_id`` may be lower than before the appends of this turn."""
        if not (self._buf or self._sealing or self._acks.unwritten or self.producers.pending) and not (
            self._strong and self._unsynced_files()
        ):
            return
        self._mending(self._commit)

    def _commit(self) -> None:
        if self._buf or self._sealing or self._acks.unwritten or self.producers.pending:
            self._write()
        if self._strong and self._unsynced_files():
            self._fsync_written()

    def finish_commit(self) -> None:
        """The fsyncs of :meth:`commit` after :meth:`write_ahead` wrote everything (a strong topic's; nothing
        for the others). It touches this log's own files and state only, not the store's list of logs
        holding files open, so the store runs several logs' at once, in threads (FileStore.commit_many); a
        failure other than a failed fsync reads the log back from its files, as a failed commit does."""
        if self._strong and self._unsynced_files():
            self._mend(self._fsync_written)

    def write_ahead(self) -> None:
        """Write what is buffered without fsyncing it (readers see it); the next :meth:`commit` fsyncs. A
        failure is the commit's: the log is back to what its files hold (StoreError)."""
        if self._buf or self._sealing or self._acks.unwritten or self.producers.pending:
            self._mending(self._write)

    def make_durable(self) -> None:
        """fsync the active segment whatever this process wrote: after an unclean stop its bytes may be the
        crashed process's, in the page cache only, and readers must not be handed what a power loss takes."""
        active = self._segments[-1]
        if active.fd is not None:
            fsync(active.fd, active.path)
            self.fsyncs += 1

    def sync(self) -> None:
        """Write anything buffered, then fsync everything written since the last fsync; no-op when clean."""
        if not self.dirty:
            return
        self._mending(self._sync)

    def _sync(self) -> None:
        self._write()
        self._fsync_written()

    def _mending(self, step: Callable[[], None]) -> None:
        """Run a step that writes: if it fails (a fsync apart), the log reads itself back from its files and
        the failure goes to the caller (see the module docstring)."""
        self._use()
        self._mend(step)

    def _mend(self, step: Callable[[], None]) -> None:
        """:meth:`_mending` without telling the store the log is in use (a step run in one of its threads)."""
        try:
            step()
        except SyncFailed:
            raise
        except StoreError as error:
            self._recover(error)
            raise
        if self._failed_writes:
            log.warning("%s: writes succeed again, after %d failed", self.directory, self._failed_writes)
            self._failed_writes = 0

    def close(self) -> None:
        """Write, fsync and close every file. Idempotent."""
        if self._closed:
            return
        try:
            if self._failure is None:
                self._record_identity()
                self._trim()
                self.sync()
        finally:
            self._closed = True
            self._forget_places()
            self._close_all()
            self._open_sealed.clear()

    # ------------------------------------------------------------------------------------------- acks

    def ack(self, ids: Iterable[int]) -> None:
        """Record acked ids; durable at the next commit() under the topic's sync rule."""
        self._acks.ack(ids, self._next_id)

    def ack_through(self, last: int) -> None:
        """Record every id up to ``last`` as acked, as :meth:`ack` does."""
        self._acks.ack_through(last, self._next_id)

    # ---------------------------------------------------------------------------------------- retention

    def enforce_retention(self, now_ms: int, keep_from: int | None = None) -> int:
        """Delete whole sealed segments, oldest first, while over the byte budget or older than allowed, but
        none holding ``keep_from`` or a later id (a cluster leader's messages not yet on a majority)."""
        retention_bytes = self.spec.retention_bytes
        retention_seconds = self.spec.retention_seconds
        if retention_bytes is None and retention_seconds is None:
            return 0
        cutoff = None if retention_seconds is None else now_ms - retention_seconds * 1000
        segments = self._segments
        if len(segments) < 2:
            return 0
        self._use()
        deleted = 0
        while len(segments) > 1 and segments[0].sealed:
            oldest = segments[0]
            over_budget = retention_bytes is not None and self._bytes_on_disk > retention_bytes
            too_old = cutoff is not None and oldest.last_timestamp < cutoff
            if not (over_budget or too_old) or (keep_from is not None and oldest.last_id >= keep_from):
                break
            self._open_sealed.pop(oldest, None)
            oldest.delete()
            # Each deletion is durable before the next: after a crash the segments gone are always the
            # oldest ones, never an older one back without a newer one (that would read as a broken chain).
            fsync_directory(self.directory)
            del segments[0]
            del self._bases[0]
            self._bytes_on_disk -= oldest.size
            deleted += 1
            if self._damage or self._gaps:
                self._damage = {key: value for key, value in self._damage.items() if key[0] is not oldest}
                self._gaps = [gap for gap in self._gaps if gap[2] is not oldest]
            log.info("%s: retention deleted %s", self.directory, oldest.path.name)
        if deleted:
            self._cursors = {key: value for key, value in self._cursors.items() if not value[0].deleted}
            if self._last_chunk is not None and self._last_chunk[0].deleted:
                self._last_chunk = None
            self._acks.raise_floor(self.first_id)
        return deleted

    # ------------------------------------------------------------------------------------------ reading

    def _remember_open(self, segment: Segment) -> None:
        """Keep a sealed segment open for readers, closing the least recently used beyond the limit."""
        cache = self._open_sealed
        cache[segment] = None
        cache.move_to_end(segment)
        while len(cache) > MAX_OPEN_SEALED:
            evicted, _ = cache.popitem(last=False)
            evicted.close()
            evicted.forget_index()

    def _readable(self, segment: Segment) -> None:
        """Make sure a segment's fd and index are there for reading."""
        if segment.sealed:
            if segment.fd is None:
                segment.open_for_reading()
            self._remember_open(segment)
            if segment.ids is None:
                segment.load_index(self.index_interval)
        elif segment.fd is None and segment.size:
            segment.open_active()  # released earlier to keep few files open

    def _corrupt(self, segment: Segment, position: int, record_id: int, why: str) -> Corrupt:
        return Corrupt(segment, position, record_id, why)

    # ---------------------------------------------------------------------------------------- damage

    def _remember_damage(self, corrupt: Corrupt) -> None:
        """A damaged record: reads of its range fail from now on (said once, in the log)."""
        key = (corrupt.segment, corrupt.position)
        if key in self._damage:
            return
        self._damage[key] = (corrupt.record_id, corrupt.reason)
        log.error("%s", self._damaged_range(corrupt.segment, corrupt.position))

    def _damaged_range(self, segment: Segment, position: int) -> DamagedRange:
        """The ids a damaged record makes unreadable: from it to the next index entry past it (reads resume
        there), or to the end of its segment."""
        first, reason = self._damage[(segment, position)]
        end = segment.last_id + 1 if segment.sealed else self._written_next_id
        if segment.ids is not None and segment.positions is not None:
            entry = bisect_right(segment.positions, position)
            if entry < len(segment.ids) and first < segment.ids[entry] < end:
                end = segment.ids[entry]
        return DamagedRange(self.topic, segment.path.name, first, max(first, end - 1),
                            f"byte {position}: {reason}")

    def _is_lost(self, first: int, last: int) -> bool:
        return any(low <= first and last <= high for low, high in self.lost)

    def _holes(self) -> list[tuple[int, int, DamagedRange | None]]:
        """Ids a read cannot return, oldest first: damaged ranges (with their error) and lost ones (None)."""
        holes: list[tuple[int, int, DamagedRange | None]] = [
            (damage.first_id, damage.last_id, damage) for damage in self.damaged
        ]
        holes += [(low, high, None) for low, high in self.lost]
        holes.sort(key=lambda hole: hole[0])
        return holes

    def read(self, start_id: int, max_messages: int, max_bytes: int) -> list[Message]:
        """Written messages from ``start_id`` (or the first stored) on, in order.

        At most ``max_messages``, and bodies totalling at most ``max_bytes``: the message that would go past
        it is left for the next read, unless it is the first, which is always returned. A read that starts
        where an earlier one stopped continues from its cached chunk and file position; any other read seeks
        by the index.
        """
        self._use()
        first_id = self._segments[0].base
        if start_id < first_id:
            start_id = first_id
        if start_id >= self._written_next_id or max_messages <= 0:
            return []
        # Ids are consecutive, so the count bound is an id bound: one comparison per record for both.
        stop_id = min(self._written_next_id, start_id + max_messages)
        if self._damage or self._gaps or self.lost:
            for low, high, damage in self._holes():
                if high < start_id:
                    continue
                if low <= start_id:
                    if damage is not None:
                        raise damage
                    start_id = high + 1  # lost: skipped as retention's are
                    if start_id >= self._written_next_id:
                        return []
                    stop_id = min(self._written_next_id, start_id + max_messages)
                    continue
                stop_id = min(stop_id, low)  # the read stops before the hole
                break
        out: list[Message] = []
        try:
            self._read_into(out, start_id, stop_id, max_bytes)
        except Corrupt as corrupt:
            self._forget_places()
            self._remember_damage(corrupt)
            if out:
                return out
            damage = self._damaged_range(corrupt.segment, corrupt.position)
            if damage.first_id <= start_id:
                raise damage from None
            return self.read(start_id, max_messages, max_bytes)  # stops before the hole now
        except StoreError:
            self._forget_places()
            raise
        return out

    def _read_into(self, out: list[Message], start_id: int, stop_id: int, max_bytes: int) -> None:
        """The read loop of :meth:`read`: messages ``start_id`` .. ``stop_id - 1`` appended to ``out``."""
        cursor = self._cursors.pop(start_id, None)
        if cursor is not None and not cursor[0].deleted:
            segment, chunk, chunk_start, offset = cursor
            self._readable(segment)
            expected, seek_position = start_id, -1
        else:
            segment, chunk, chunk_start, offset, expected, seek_position = self._seek(start_id)
        chunk_size = min(max(max_bytes, READ_CHUNK), MAX_READ_CHUNK)
        topic = self.topic
        append = out.append
        unpack_head, unpackb, message_type = _unpack_head, _unpackb, Message
        total = 0
        chunk_length = len(chunk)
        while True:
            # The hot loop: 16 is RECORD_HEAD_SIZE, spelled out because a constant is cheaper than a global.
            if offset + 16 <= chunk_length:
                length, crc, record_id = unpack_head(chunk, offset)
                end = offset + 16 + length
                if end <= chunk_length:
                    if record_id != expected:
                        if chunk_start + offset == seek_position:
                            # The index entry we seeked by is wrong (derived data): rebuild it and retry.
                            segment.rebuild_index(self.index_interval)
                            self._forget_places()
                            del out[:]
                            return self._read_into(out, start_id, stop_id, max_bytes)
                        raise self._corrupt(segment, chunk_start + offset, expected,
                                            f"record has id {record_id}, expected {expected}")
                    if record_id < start_id:  # between the index entry we seeked to and the id asked for
                        offset = end
                        expected += 1
                        continue
                    # Bytes slices, not memoryview slices: for ~100-byte records the copy is cheaper than
                    # exporting a buffer, for zlib and for msgpack alike.
                    if crc32(chunk[offset + 8 : end]) != crc:
                        raise self._corrupt(segment, chunk_start + offset, record_id,
                                            f"CRC mismatch in record {record_id}")
                    try:
                        timestamp, headers, body = unpackb(chunk[offset + 16 : end])
                    except Exception as exc:  # msgpack and unpacking raise several types; all mean corruption
                        raise self._corrupt(segment, chunk_start + offset, record_id,
                                            f"record {record_id} does not decode ({exc!r})") from None
                    total += len(body)
                    if total > max_bytes and out:
                        break  # this one is for the next read
                    append(message_type(topic, record_id, body, headers, timestamp))
                    offset = end
                    expected += 1
                    if expected >= stop_id:
                        break
                    continue
                need = 16 + length
            else:
                need = 16
            # The chunk holds no further whole record: fetch more (from the next segment if this one is done).
            position = chunk_start + offset
            segment, chunk, chunk_start = self._next_chunk(segment, position, need, expected, chunk_size)
            offset, chunk_length = 0, len(chunk)
        cursors = self._cursors
        cursors[expected] = (segment, chunk, chunk_start, offset)
        if len(cursors) > MAX_CURSORS:
            del cursors[next(iter(cursors))]  # the oldest

    def _seek(self, start_id: int) -> tuple[Segment, bytes, int, int, int, int]:
        """Where to start reading ``start_id``: the segment, and its newest index entry at or before the id.

        Returns ``(segment, chunk, chunk position, offset, entry id, entry position)``; the chunk is the last
        one read if the entry lies inside it, else empty (the read loop fetches it).
        """
        segment = self._segments[bisect_right(self._bases, start_id) - 1]
        self._readable(segment)
        ids, positions = segment.ids, segment.positions
        assert ids is not None
        assert positions is not None
        entry = bisect_right(ids, start_id) - 1
        if entry < 0:
            raise self._corrupt(segment, SEGMENT_HEADER_SIZE, segment.base,
                                "no index entry for the first record")
        entry_id, position = ids[entry], positions[entry]
        last = self._last_chunk
        if last is not None and last[0] is segment and 0 <= position - last[2] < len(last[1]):
            return segment, last[1], last[2], position - last[2], entry_id, position
        return segment, b"", position, 0, entry_id, position

    def _next_chunk(
        self, segment: Segment, position: int, need: int, expected: int, chunk_size: int
    ) -> tuple[Segment, bytes, int]:
        """pread the bytes from ``position`` on (at least ``need``), moving to the next segment at the end."""
        if position >= segment.size:
            following = self._segments[bisect_right(self._bases, expected) - 1]
            if following is segment or following.base != expected:
                raise self._corrupt(segment, position, expected, f"no segment holds id {expected}")
            segment = following
            self._readable(segment)
            position, need = SEGMENT_HEADER_SIZE, RECORD_HEAD_SIZE
        available = segment.size - position
        if available < need:
            raise self._corrupt(segment, position, expected,
                                f"record cut short ({available} of {need} bytes)")
        assert segment.fd is not None
        chunk = pread_exact(segment.fd, min(max(chunk_size, need), available), position, segment.path)
        if len(chunk) < need:
            raise self._corrupt(segment, position, expected, "the file is shorter than the log says")
        self._last_chunk = (segment, chunk, position)
        return segment, chunk, position

    # ------------------------------------------------------------------------------ raw ranges and time

    def read_records(
        self, start_id: int, max_messages: int, max_bytes: int
    ) -> tuple[int, int, bytes | memoryview]:
        """Written records from ``start_id`` (or the first stored) on, as they lie in the log: ``(first id,
        count, bytes)``. No record is decoded or checked here: the reader checks each record's CRC.

        One segment at most, ``max_messages`` records at most, and at most ``max_bytes`` of records (heads
        included), except that the first record is always returned. The cuts come from the sparse index plus
        a walk over at most one index interval of record heads at each end, so the cost does not grow with
        the number of records returned: one read, into a buffer kept for the next (a read-only view of it,
        :mod:`broker.store.buffers`)."""
        if self._closed:
            raise StoreError(f"{self.directory}: the log is closed")
        start_id = max(start_id, self._segments[0].base)
        if start_id >= self._written_next_id or max_messages <= 0:
            return start_id, 0, b""
        segment = self._segments[bisect_right(self._bases, start_id) - 1]
        self._readable(segment)
        stop_id = min(self._written_next_id, start_id + max_messages, segment.last_id + 1)
        begin = self._record_position(segment, start_id)
        end = self._record_position(segment, stop_id)
        limit = begin + max(0, max_bytes)
        if end > limit:
            ids, positions = segment.ids, segment.positions
            assert ids is not None
            assert positions is not None
            entry = bisect_right(positions, limit) - 1
            if entry >= 0 and ids[entry] > start_id:
                stop_id, end = ids[entry], positions[entry]
            else:  # no index entry inside the budget: it spans less than one index interval
                stop_id, end = self._walk_heads(segment, begin, start_id, limit)
        assert segment.fd is not None
        data = self.read_buffers.read(segment.fd, end - begin, begin, segment.path)
        if len(data) != end - begin:
            raise self._corrupt(segment, begin + len(data), "the file is shorter than the log says")
        return start_id, stop_id - start_id, data

    def _record_position(self, segment: Segment, record_id: int, retried: bool = False) -> int:
        """The byte position of ``record_id``'s record in ``segment`` (the written end for the id after its
        last): from the index entry at or before it, walking record heads."""
        if record_id > segment.last_id:
            return segment.size
        tail = self._tail
        if tail is not None and tail[0] is segment and tail[1] == record_id:
            return tail[2]
        ids, positions = segment.ids, segment.positions
        assert ids is not None
        assert positions is not None
        entry = bisect_right(ids, record_id) - 1
        if entry < 0:
            raise self._corrupt(segment, SEGMENT_HEADER_SIZE, "no index entry for the first record")
        for position, found, _ in self._heads(segment, positions[entry], ids[entry], stale_entry=not retried):
            if found is None:
                # The index entry we started from is wrong (derived data): rebuild it and try once more.
                segment.rebuild_index(self.index_interval)
                self._forget_places()
                return self._record_position(segment, record_id, retried=True)
            if found == record_id:
                return position
        raise self._corrupt(segment, segment.size, f"no record {record_id} before the end of the segment")

    def _walk_heads(self, segment: Segment, begin: int, start_id: int, limit: int) -> tuple[int, int]:
        """From the record of ``start_id`` at ``begin``: the id and position where the records that fit below
        byte ``limit`` end (at least one record)."""
        for position, found, length in self._heads(segment, begin, start_id):
            if position + RECORD_HEAD_SIZE + length > limit and found > start_id:
                return found, position
        return segment.last_id + 1, segment.size

    def _heads(
        self, segment: Segment, position: int, current: int, stale_entry: bool = False
    ) -> Iterator[tuple[int, int | None, int]]:
        """``(position, id, payload length)`` of each written record of ``segment`` from ``position`` (which
        holds ``current``) on, checking that ids follow each other. Reads about one index interval at once,
        then a head at a time (records may be large). With ``stale_entry``, a first head that is not
        ``current`` yields ``(position, None, 0)`` once instead of raising: the index entry was wrong."""
        assert segment.fd is not None
        chunk_start = position
        chunk = pread_exact(segment.fd, min(segment.size - position, self.index_interval + (64 << 10)),
                            position, segment.path)
        while position < segment.size:
            offset = position - chunk_start
            if offset + RECORD_HEAD_SIZE <= len(chunk):
                length, _, found = _unpack_head(chunk, offset)
            else:
                head = pread_exact(segment.fd, RECORD_HEAD_SIZE, position, segment.path)
                if len(head) < RECORD_HEAD_SIZE:
                    raise self._corrupt(segment, position, f"record head of id {current} cut short")
                length, _, found = _unpack_head(head, 0)
            if found != current:
                if stale_entry:
                    yield position, None, 0
                    return
                raise self._corrupt(segment, position, f"record has id {found}, expected {current}")
            stale_entry = False
            yield position, found, length
            position += RECORD_HEAD_SIZE + length
            current += 1

    def find_time(self, timestamp_ms: int) -> int:
        """The first written id whose timestamp is at or after ``timestamp_ms``; ``next_id`` if none is.

        A search, not a scan: the first segment whose newest record is at or after the time (segments are in
        time order as they are in id order), a binary search over its index entries' records, then a read of
        at most one index interval. Timestamps are the broker's clock when it took each message; were that
        clock ever stepped back, the answer is one of the ids where the log crosses the time."""
        if self._closed:
            raise StoreError(f"{self.directory}: the log is closed")
        for segment in self._segments:
            if segment.last_id >= segment.base and segment.last_timestamp >= timestamp_ms:
                break
        else:
            return self._written_next_id
        self._readable(segment)
        ids, positions = segment.ids, segment.positions
        assert ids is not None
        assert positions is not None
        size = segment.size
        high = bisect_right(positions, size - 1) - 1  # entries of written records only
        if high < 0:
            return self._written_next_id
        low = 0
        if segment.timestamp_at(positions[0], size) < timestamp_ms:
            # Invariant: the record of entry `low` is older than the time; find the last such entry.
            while low < high:
                middle = (low + high + 1) // 2
                if segment.timestamp_at(positions[middle], size) < timestamp_ms:
                    low = middle
                else:
                    high = middle - 1
        position = ids[low]
        while position < self._written_next_id:
            messages = self.read(position, READ_CHUNK_MESSAGES, READ_CHUNK)
            if not messages:
                break
            for message in messages:
                if message.timestamp >= timestamp_ms:
                    return message.id
            position = messages[-1].id + 1
        return self._written_next_id

    def verify(self) -> None:
        """Scan every written record of every segment (CRC, ids, payload); StoreError at the first bad one."""
        for segment, following in zip(self._segments, [*self._segments[1:], None], strict=True):
            if segment.size == 0:  # a rolled segment whose file is not written yet
                continue
            self._readable(segment)
            scan = segment.scan(
                SEGMENT_HEADER_SIZE, segment.base, segment.size, self.index_interval, decode=True
            )
            if scan.error is not None:
                raise self._corrupt(segment, scan.end, scan.next_id, scan.error)
            if following is not None and following.size and scan.next_id != following.base:
                why = f"ends before id {scan.next_id}, the next segment starts at {following.base}"
                raise self._corrupt(segment, scan.end, scan.next_id, why)
