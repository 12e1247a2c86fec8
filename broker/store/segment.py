"""One segment of a topic's log: the record layout, the segment file, its sparse index, and their checks.

A segment is ``<base id>.log`` (a 16-byte header, then records) plus ``<base id>.index`` (sparse entries
``id -> byte position``). This module owns those bytes: encoding the header, scanning records with their CRCs,
loading, checking and rebuilding an index, recovering a torn tail, and the space reserved ahead of the
active segment's records (:meth:`Segment.append`). It does not know about topics, message objects, acks,
retention or when to fsync: that is :mod:`broker.store.log`. ``docs/storage.md`` describes the same bytes for
other programs.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import lt
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgpack

from broker.store import StoreError, SyncFailed
from protocol.checksum import crc32

if TYPE_CHECKING:
    from broker.store.pending import PendingBytes

log = logging.getLogger("mc0.store")

MAGIC = b"MC0LOG\x00\x01"  # "MC0LOG", a zero, then the format version 1
SEGMENT_HEADER = struct.Struct(">8sQ")  # magic, base id
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 16
RECORD_HEAD = struct.Struct(">IIQ")  # payload length, crc32(id bytes + payload), id
RECORD_HEAD_SIZE = RECORD_HEAD.size  # 16
INDEX_ENTRY = struct.Struct(">QQ")  # id, byte position of its record in the .log
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 16

#: Scans read this much per pread: enough that syscalls vanish from the profile, little enough to not matter.
SCAN_CHUNK = 4 << 20
#: An appended file (a segment, a journal) is made longer ahead of its records to a multiple of this (see
#: :func:`reserve_ahead`); recovery takes zero bytes at the end of a file of such a length for that space.
RESERVE_STEP = 1 << 20
#: "No index entry yet in this segment": far enough back that the first record always gets one.
NO_ENTRY = -(1 << 62)
#: Index files are big-endian on disk; ``array('Q')`` is native.
_SWAP = sys.byteorder == "little"

_unpack_head = RECORD_HEAD.unpack_from

T = TypeVar("T")


def segment_file_name(base: int) -> str:
    return f"{base:020d}.log"


def index_file_name(base: int) -> str:
    return f"{base:020d}.index"


def parse_segment_file_name(name: str) -> int | None:
    """The base id of a file called ``<20 digits>.log``, None for any other name."""
    stem, dot, suffix = name.partition(".")
    if dot and suffix == "log" and len(stem) == 20 and stem.isdigit() and stem.isascii():
        return int(stem)
    return None


def encode_segment_header(base: int) -> bytes:
    return SEGMENT_HEADER.pack(MAGIC, base)


def decode_payload(payload: bytes | memoryview) -> tuple[int, dict[bytes, bytes], bytes]:
    """``[timestamp_ms, headers, body]`` checked for shape and types; ValueError if it is anything else."""
    try:
        value = msgpack.unpackb(payload)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"payload is not msgpack ({exc})") from None
    if not (isinstance(value, list) and len(value) == 3):
        raise ValueError("payload is not a 3-element array")
    timestamp, headers, body = value
    if not (isinstance(timestamp, int) and isinstance(headers, dict) and isinstance(body, bytes)):
        raise ValueError("payload fields have the wrong types")
    if not all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in headers.items()):
        raise ValueError("payload headers are not bytes -> bytes")
    return timestamp, headers, body


#: Called when a file cannot be opened for want of descriptors (EMFILE, ENFILE), before the retries: the
#: broker sets it to stop its doors accepting, which frees descriptors (broker.descriptors). None: no retry.
when_out_of_descriptors: Callable[[], None] | None = None
#: Retries after that, and the pause before each: the descriptors freed are closed by other threads
#: (libzmq's), a few milliseconds later. At most 50 ms of the loop, only when the process is out of them.
RETRIES = 5
RETRY_PAUSE = 0.01


#: Threads other than the loop's (the store's makers) do not call :data:`when_out_of_descriptors`, which acts
#: on the loop's doors: they fail, and the loop tries again.
_thread = threading.local()


def without_descriptor_retries() -> None:
    """In the calling thread, a call that finds no descriptor left fails at once (no retries)."""
    _thread.no_retries = True


def _with_descriptors(call: Callable[[], T]) -> T:
    """``call()`` (a system call that needs a descriptor), tried again after :data:`when_out_of_descriptors`
    when none was left."""
    try:
        return call()
    except OSError as error:
        if (error.errno not in (errno.EMFILE, errno.ENFILE) or when_out_of_descriptors is None
                or getattr(_thread, "no_retries", False)):
            raise
        when_out_of_descriptors()
        for _ in range(RETRIES - 1):
            time.sleep(RETRY_PAUSE)
            try:
                return call()
            except OSError as again:
                if again.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
        time.sleep(RETRY_PAUSE)
        return call()


def open_file(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open``, tried again when no descriptor was left (see :func:`_with_descriptors`)."""
    return _with_descriptors(lambda: os.open(path, flags, mode))


def list_directory(path: Path) -> list[str]:
    """``os.listdir`` (which needs a descriptor too), tried again like :func:`open_file`."""
    return _with_descriptors(lambda: os.listdir(path))


def pread_exact(fd: int, size: int, offset: int, path: Path) -> bytes:
    """``size`` bytes at ``offset`` (fewer only at the end of the file); OSError becomes StoreError."""
    try:
        data = os.pread(fd, size, offset)
        while len(data) < size:  # a short read is legal for pread; only end of file stops us
            more = os.pread(fd, size - len(data), offset + len(data))
            if not more:
                break
            data += more
    except OSError as exc:
        raise StoreError(f"{path}: cannot read at byte {offset}: {exc}") from exc
    return data


#: The most pieces one ``writev`` takes (POSIX's IOV_MAX; Linux's is 1024).
IOV_MAX = os.sysconf("SC_IOV_MAX")


def write_all(fd: int, data: bytes | bytearray | memoryview, path: Path, offset: int | None = None) -> None:
    """Write all of ``data`` (:func:`write_gathered` of one piece)."""
    write_gathered(fd, [data], path, offset)


def write_gathered(
    fd: int, pieces: Sequence[bytes | bytearray | memoryview], path: Path, offset: int | None = None
) -> None:
    """Write ``pieces`` back to back at byte ``offset`` of the file, or at ``fd``'s position without one: one
    ``pwritev`` (``writev``) in the normal case, going on where the kernel stopped if it took only part.
    StoreError if the system refuses (how much was written is then unknown: a log reads its state back from
    the file)."""
    views = [view for view in map(memoryview, pieces) if view.nbytes]
    first = 0  # views before this are written
    try:
        while first < len(views):
            batch = views[first : first + IOV_MAX]
            if offset is None:
                written = os.writev(fd, batch)
            else:
                written = os.pwritev(fd, batch, offset)
                offset += written
            while first < len(views) and written >= views[first].nbytes:
                written -= views[first].nbytes
                first += 1
            if written:
                views[first] = views[first].cast("B")[written:]
    except OSError as exc:
        raise StoreError(f"{path}: write failed: {exc}") from exc


def fsync(fd: int, path: Path) -> None:
    """fsync, or SyncFailed: what was written may be lost, and the broker must stop (see broker.store)."""
    try:
        os.fsync(fd)
    except OSError as exc:
        raise SyncFailed(f"{path}: fsync failed: {exc}") from exc


def reserve_ahead(fd: int, end: int, path: Path) -> int:
    """Before a write that ends at byte ``end``, past the end of the file: make the file longer, to the next
    multiple of :data:`RESERVE_STEP` past ``end``. Returns the file's length then (``end`` where the file
    system cannot: the write makes the file that long itself).

    Why: an fsync after a write that made a file longer must also commit its new length (the file system's
    journal), one after a write inside the file's length need not. Measured on ext4, a 150-byte record written
    and fsynced took 125-170 us appended, 85-120 us inside a longer file (sparse or allocated alike), and a
    strong topic's commit of one record 148-165 us against 108-110. The length is set with ``ftruncate``: a
    hole, no disk space taken. Readers of the file stop at the end of its records; :func:`written_length`
    tells the zero bytes after them from a torn write, and :func:`cut` ends the file at its records again."""
    ahead = (end + RESERVE_STEP) // RESERVE_STEP * RESERVE_STEP
    try:
        os.ftruncate(fd, ahead)
    except OSError as exc:
        log.debug("%s: cannot make the file %d bytes long: %s", path, ahead, exc)
        return end
    return ahead


def cut(fd: int, size: int, path: Path) -> None:
    """Truncate the file to ``size`` bytes (StoreError if the system refuses); the caller fsyncs."""
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        raise StoreError(f"{path}: cannot truncate to {size} bytes: {exc}") from exc


def written_length(tail: bytes | bytearray | memoryview, file_size: int) -> int:
    """How many of ``tail``, the bytes after a file's good records up to its end (``file_size`` bytes long),
    were written: all of them, unless the length is a multiple of :data:`RESERVE_STEP`, where the zero bytes
    at the end are space :func:`reserve_ahead` made, not a torn write. (A torn piece's own last zero bytes
    cannot be told from them.)"""
    if file_size % RESERVE_STEP:
        return len(tail)
    return len(bytes(tail).rstrip(b"\0"))


def replace_file(path: Path, data: bytes) -> int:
    """Replace ``path`` with ``data`` atomically (tmp file, fsync, rename, fsync of the directory), and return
    a descriptor of the new file open for writing (the journals go on writing to it, after ``data``)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = open_file(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            write_all(fd, data, tmp, 0)
            fsync(fd, tmp)
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            raise
    except OSError as exc:
        raise StoreError(f"{path}: cannot rewrite: {exc}") from exc
    fsync_directory(path.parent)
    return fd


def fsync_directory(path: Path) -> None:
    """Make file creations, renames and deletions inside ``path`` durable. Not getting a descriptor for the
    directory is a StoreError (this request fails); a failed fsync is SyncFailed."""
    try:
        fd = open_file(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise StoreError(f"{path}: cannot open the directory to fsync it: {exc}") from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise SyncFailed(f"{path}: fsync of the directory failed: {exc}") from exc
    finally:
        os.close(fd)


def encode_index(ids: array, positions: array, start: int = 0) -> bytes:
    """Index entries ``start..`` as big-endian ``u64 id | u64 position`` pairs."""
    pairs = array("Q", bytes(16 * (len(ids) - start)))
    pairs[0::2] = ids[start:]
    pairs[1::2] = positions[start:]
    if _SWAP:
        pairs.byteswap()
    return pairs.tobytes()


def decode_index(data: bytes) -> tuple[array, array]:
    pairs = array("Q")
    pairs.frombytes(data[: len(data) - len(data) % INDEX_ENTRY_SIZE])
    if _SWAP:
        pairs.byteswap()
    return pairs[0::2], pairs[1::2]


class Corrupt(StoreError):
    """A record of a segment is not what the format says it must be (damaged data, not a failed call):
    ``record_id`` is the id that should be at byte ``position``."""

    def __init__(self, segment: Segment, position: int, record_id: int, reason: str) -> None:
        self.segment = segment
        self.position = position
        self.record_id = record_id
        self.reason = reason
        super().__init__(f"{segment.path}: byte {position}: {reason}")


@dataclass(slots=True)
class Scan:
    """What a scan of records found: where the good records end and why it stopped there."""

    end: int  # byte position after the last good record
    next_id: int  # id after the last good record
    last_position: int  # byte position of the last good record, -1 if none
    ids: array = field(default_factory=lambda: array("Q"))  # index entries the scan would write
    positions: array = field(default_factory=lambda: array("Q"))
    error: str | None = None  # why the scan stopped before its limit; None if it reached it cleanly


class Segment:
    """One ``.log`` file and its index. The log above decides when to write, fsync, seal and delete.

    ``size`` counts bytes written to the file (what readers may see); ``reserved`` is the file's length while
    the segment is active, ``size`` or more (:meth:`append`); ``fd`` is open read-write while the segment is
    active, read-only (and only while cached by the log) once sealed. ``ids``/``positions`` are the sparse
    index in memory, None for a sealed segment whose index has not been loaded.
    """

    __slots__ = (
        "base",
        "deleted",
        "fd",
        "ids",
        "index_fd",
        "index_path",
        "index_written",
        "last_id",
        "last_timestamp",
        "path",
        "pending",
        "positions",
        "reserved",
        "sealed",
        "size",
    )

    def __init__(self, directory: Path, base: int) -> None:
        self.base = base
        self.path = directory / segment_file_name(base)
        self.index_path = directory / index_file_name(base)
        self.fd: int | None = None
        self.index_fd: int | None = None
        self.size = 0
        self.reserved = 0
        self.ids: array | None = array("Q")
        self.positions: array | None = array("Q")
        self.index_written = 0  # entries already in the .index file
        self.last_id = base - 1
        self.last_timestamp = 0  # of the last record: retention by age compares it
        self.sealed = False
        self.deleted = False
        self.pending: PendingBytes | None = None  # bytes appended before a roll and not yet written

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, size={self.size}, sealed={self.sealed})"

    # ------------------------------------------------------------------------------------------- files

    def create(self) -> None:
        """Create the files of a new segment (the header is the first bytes the log writes into it)."""
        try:
            self.fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            self.index_fd = open_file(
                self.index_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644
            )
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create segment: {exc}") from exc

    def create_empty(self) -> None:
        """Create the segment with its header only, fsynced, and close it (a new topic's first segment)."""
        self.create()
        assert self.fd is not None
        write_all(self.fd, encode_segment_header(self.base), self.path, 0)
        fsync(self.fd, self.path)
        self.close()

    def open_for_reading(self) -> None:
        if self.fd is None:
            try:
                self.fd = open_file(self.path, os.O_RDONLY)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot open segment: {exc}") from exc

    def open_active(self) -> None:
        """Open again the files of the active segment after the log let them go (to keep few files open)."""
        try:
            if self.fd is None:
                self.fd = open_file(self.path, os.O_RDWR)
                self.reserved = self.file_size()
            if self.index_fd is None:
                self.index_fd = open_file(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open segment: {exc}") from exc

    @property
    def open_files(self) -> int:
        return (self.fd is not None) + (self.index_fd is not None)

    def append(self, data: PendingBytes, reserving: bool) -> None:
        """Write ``data`` after the last record of the open active segment; with ``reserving`` (a topic that
        fsyncs every commit), inside space reserved ahead of it (:func:`reserve_ahead`), which :meth:`trim`
        cuts off when the segment is sealed or the log lets the file go."""
        assert self.fd is not None
        end = self.size + len(data)
        if end > self.reserved:
            self.reserved = reserve_ahead(self.fd, end, self.path) if reserving else end
        data.write(self.fd, self.path, self.size)
        self.size = end

    def trim(self) -> None:
        """End the file at its last record again, cutting the space reserved after it. Durable with the next
        fsync; a crash before it leaves zero bytes that recovery cuts again."""
        if self.fd is not None and self.reserved > self.size:
            cut(self.fd, self.size, self.path)
            self.reserved = self.size

    def close(self) -> None:
        for name in ("fd", "index_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError as exc:
                    raise StoreError(f"{self.path}: close failed: {exc}") from exc

    def forget_index(self) -> None:
        """Drop the in-memory index of a sealed segment (it is reloaded from its file when needed)."""
        if self.sealed:
            self.ids = self.positions = None

    def delete(self) -> None:
        """Remove the files (retention). The .log goes first: an orphan .index is cleaned up at open."""
        self.close()
        self.deleted = True
        for path in (self.path, self.index_path):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise StoreError(f"{path}: cannot delete: {exc}") from exc

    def read_header(self) -> None:
        """Check magic and base id; Corrupt if they do not match the file name."""
        assert self.fd is not None
        header = pread_exact(self.fd, SEGMENT_HEADER_SIZE, 0, self.path)
        if len(header) < SEGMENT_HEADER_SIZE:
            raise Corrupt(self, 0, self.base, f"segment header is cut short ({len(header)} of 16 bytes)")
        magic, base = SEGMENT_HEADER.unpack(header)
        if magic != MAGIC:
            raise Corrupt(self, 0, self.base, f"not an mc0 segment (magic {magic!r})")
        if base != self.base:
            raise Corrupt(self, 0, self.base, f"header says base id {base}, the file name says {self.base}")

    def file_size(self) -> int:
        assert self.fd is not None
        try:
            return os.fstat(self.fd).st_size
        except OSError as exc:
            raise StoreError(f"{self.path}: stat failed: {exc}") from exc

    # ----------------------------------------------------------------------------------------- records

    def scan(
        self,
        start: int,
        expected_id: int,
        limit: int,
        index_interval: int,
        last_entry: int = NO_ENTRY,
        decode: bool = False,
    ) -> Scan:
        """Check records from byte ``start`` (which holds ``expected_id``) up to byte ``limit``.

        Stops at the first record that is incomplete, has the wrong id or fails its CRC (and, with ``decode``,
        whose payload is not a well-formed message), and says why in ``error``. Collects the index entries the
        append path would have written after ``last_entry`` (the position of the previous entry).
        """
        assert self.fd is not None
        result = Scan(start, expected_id, -1)
        ids, positions = result.ids, result.positions
        position, next_id, last_position, error = start, expected_id, -1, None
        chunk, chunk_start = b"", start
        view = memoryview(chunk)
        while position < limit:
            if limit - position < RECORD_HEAD_SIZE:
                error = f"incomplete record header ({limit - position} bytes)"
                break
            offset = position - chunk_start
            if offset + RECORD_HEAD_SIZE > len(chunk):
                chunk = pread_exact(self.fd, min(SCAN_CHUNK, limit - position), position, self.path)
                chunk_start, offset, view = position, 0, memoryview(chunk)
                if len(chunk) < RECORD_HEAD_SIZE:
                    error = "file ends inside a record header"
                    break
            length, crc, record_id = _unpack_head(chunk, offset)
            end = position + RECORD_HEAD_SIZE + length
            if end > limit:
                error = f"incomplete record (payload of {length} bytes, {limit - position - 16} left)"
                break
            if offset + RECORD_HEAD_SIZE + length > len(chunk):
                size = max(SCAN_CHUNK, RECORD_HEAD_SIZE + length)
                chunk = pread_exact(self.fd, min(size, limit - position), position, self.path)
                chunk_start, offset, view = position, 0, memoryview(chunk)
                if len(chunk) < RECORD_HEAD_SIZE + length:
                    error = "file ends inside a record"
                    break
            if record_id != next_id:
                error = f"record has id {record_id}, expected {next_id}"
                break
            if crc32(view[offset + 8 : offset + RECORD_HEAD_SIZE + length]) != crc:
                error = f"CRC mismatch in record {record_id}"
                break
            if decode:
                try:
                    decode_payload(view[offset + RECORD_HEAD_SIZE : offset + RECORD_HEAD_SIZE + length])
                except ValueError as exc:
                    error = f"record {record_id}: {exc}"
                    break
            if position - last_entry >= index_interval:
                ids.append(record_id)
                positions.append(position)
                last_entry = position
            last_position = position
            next_id += 1
            position = end
        result.end, result.next_id, result.error = position, next_id, error
        result.last_position = last_position
        return result

    def record_at(self, position: int, size_limit: int) -> tuple[int, bytes] | None:
        """``(id, payload)`` of a complete, CRC-valid record at ``position``, or None."""
        assert self.fd is not None
        if position + RECORD_HEAD_SIZE > size_limit:
            return None
        head = pread_exact(self.fd, RECORD_HEAD_SIZE, position, self.path)
        length, crc, record_id = RECORD_HEAD.unpack(head)
        if position + RECORD_HEAD_SIZE + length > size_limit:
            return None
        payload = pread_exact(self.fd, length, position + RECORD_HEAD_SIZE, self.path)
        if len(payload) < length or crc32(payload, crc32(head[8:])) != crc:
            return None
        return record_id, payload

    def timestamp_at(self, position: int, size_limit: int) -> int:
        record = self.record_at(position, size_limit)
        if record is None:
            raise StoreError(f"{self.path}: byte {position}: the last record is unreadable")
        try:
            return decode_payload(record[1])[0]
        except ValueError as exc:
            raise StoreError(f"{self.path}: byte {position}: {exc}") from None

    # ------------------------------------------------------------------------------------------- index

    def read_index_file(self) -> bytes | None:
        try:
            return self.index_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.index_path}: cannot read: {exc}") from exc

    def index_is_sane(self, ids: array, positions: array, size: int) -> bool:
        """The cheap structural checks: first entry is the first record, ids and positions increase."""
        if not ids or ids[0] != self.base or positions[0] != SEGMENT_HEADER_SIZE:
            return False
        if positions[-1] >= size or ids[-1] > self.last_id:
            return False
        return all(map(lt, ids, ids[1:])) and all(map(lt, positions, positions[1:]))

    def write_index_file(self) -> None:
        """Rewrite the whole index file from memory (it is derived data: a torn rewrite is rebuilt again)."""
        assert self.ids is not None
        assert self.positions is not None
        try:
            fd = open_file(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                write_all(fd, encode_index(self.ids, self.positions), self.index_path)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"{self.index_path}: cannot write: {exc}") from exc
        self.index_written = len(self.ids)

    def write_new_index_entries(self) -> None:
        """Append the entries made since the last call to the open index file of an unsealed segment."""
        assert self.ids is not None
        assert self.positions is not None
        assert self.index_fd is not None
        if self.index_written < len(self.ids):
            entries = encode_index(self.ids, self.positions, self.index_written)
            write_all(self.index_fd, entries, self.index_path)
            self.index_written = len(self.ids)

    def rebuild_index(self, index_interval: int) -> None:
        """Scan the written part of the segment and rewrite its index; a bad record there is corruption.

        Entries already made for bytes not yet written (an active segment's buffer) are kept after the
        rebuilt ones: their positions are right, only the file under them is still to come. A bad record
        stops the scan: the index then covers the records before it (kept in memory, not written), and
        Corrupt names it.
        """
        scan = self.scan(SEGMENT_HEADER_SIZE, self.base, self.size, index_interval)
        if scan.error is not None:
            if scan.ids:
                self.ids, self.positions = scan.ids, scan.positions
            raise Corrupt(self, scan.end, scan.next_id, f"corrupt segment: {scan.error}")
        log.warning("%s: index rebuilt from the segment (%d entries)", self.index_path, len(scan.ids))
        if self.ids is not None and self.positions is not None:
            for entry_id, position in zip(self.ids, self.positions, strict=True):
                if position >= self.size:
                    scan.ids.append(entry_id)
                    scan.positions.append(position)
        self.ids, self.positions = scan.ids, scan.positions
        self.write_index_file()

    def load_index(self, index_interval: int) -> None:
        """Load a sealed segment's index into memory, rebuilding it if it fails the structural checks."""
        data = self.read_index_file()
        size = self.size
        if data is not None and len(data) % INDEX_ENTRY_SIZE == 0:
            ids, positions = decode_index(data)
            if self.index_is_sane(ids, positions, size):
                self.ids, self.positions = ids, positions
                self.index_written = len(ids)
                return
        self.rebuild_index(index_interval)

    # ----------------------------------------------------------------------------------------- opening

    def check_sealed(self, expected_last_id: int, index_interval: int) -> Corrupt | None:
        """The cheap open-time check of a sealed segment: header, last index entry, tail.

        The tail from the last index entry to the end of the file is scanned (about ``index_interval`` bytes);
        it must be whole records ending exactly at the end of the file. Returns None when it is, else a
        Corrupt naming the first bad record found (the segment reads up to it). ``last_id`` becomes the last
        record's id; the log compares it with ``expected_last_id`` (the next segment's base - 1). A file that
        cannot be opened or read raises StoreError.
        """
        self.open_for_reading()
        try:
            return self._check_sealed(expected_last_id, index_interval)
        finally:
            self.forget_index()
            self.close()  # the log reopens sealed segments for reading on demand

    def _check_sealed(self, expected_last_id: int, index_interval: int) -> Corrupt | None:
        self.size = size = self.file_size()
        self.sealed = True
        # What retention by age compares, until the last record is read: the file's own time.
        self.last_id = expected_last_id
        try:
            self.last_timestamp = int(self.path.stat().st_mtime * 1000)
        except OSError:
            self.last_timestamp = 0
        try:
            self.read_header()
        except Corrupt as corrupt:
            return corrupt
        start, start_id = None, 0
        data = self.read_index_file()
        if data and len(data) % INDEX_ENTRY_SIZE == 0:
            last_id, last_position = INDEX_ENTRY.unpack_from(data, len(data) - INDEX_ENTRY_SIZE)
            if self.base <= last_id and SEGMENT_HEADER_SIZE <= last_position < size:
                record = self.record_at(last_position, size)
                if record is not None and record[0] == last_id:
                    start, start_id = last_position, last_id
        if start is None:
            log.warning("%s: index missing or inconsistent, rebuilding it from the segment", self.index_path)
            scan = self.scan(SEGMENT_HEADER_SIZE, self.base, size, index_interval)
            if scan.error is None:
                self.ids, self.positions = scan.ids, scan.positions
                self.write_index_file()
        else:
            scan = self.scan(start, start_id, size, index_interval, last_entry=start)
            if scan.error is None and scan.ids:
                # The index stops short of the tail (should not happen once fsynced at sealing): extend it.
                assert data is not None
                self.ids, self.positions = decode_index(data)
                self.ids.extend(scan.ids)
                self.positions.extend(scan.positions)
                self.write_index_file()
        if scan.error is not None:
            return Corrupt(self, scan.end, scan.next_id, f"corrupt sealed segment: {scan.error}")
        if scan.last_position < 0:
            return Corrupt(self, SEGMENT_HEADER_SIZE, self.base, "sealed segment holds no records")
        try:
            self.last_timestamp = self.timestamp_at(scan.last_position, size)
        except StoreError as exc:
            return Corrupt(self, scan.last_position, scan.next_id - 1, str(exc))
        self.last_id = scan.next_id - 1
        return None

    def recover_active(self, index_interval: int, *, quiet: bool = False) -> tuple[int, int]:
        """Open the last segment read-write and cut a torn tail. Returns ``(bytes removed, last entry pos)``.

        The scan starts at the newest index entry that points at a complete, CRC-valid record with that id
        (or at the first record) and stops at the first record that is incomplete, fails its CRC or has the
        wrong id; the file is truncated there and fsynced, with a warning if anything but the space
        :meth:`append` reserved was cut (:func:`written_length`; a debug line if ``quiet``: the log is
        recovering from a failed write again, and said so the first time). A header shorter than 16 bytes is a
        crash while creating the segment, and so is a file of nothing but zero bytes: the file is reset to a
        fresh header.
        """
        try:
            self.fd = open_file(self.path, os.O_RDWR)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open segment: {exc}") from exc
        size = self.file_size()
        if size < SEGMENT_HEADER_SIZE or self._all_zeros(size):
            # Some file systems, after a crash, show a file's new length before its data: zeros where a
            # header (and records) were being written. Nothing in it was ever fsynced, so nothing is lost.
            cut(self.fd, 0, self.path)
            write_all(self.fd, encode_segment_header(self.base), self.path, 0)
            fsync(self.fd, self.path)
            if size:
                log.warning("%s: torn segment (%d bytes) replaced by a fresh header", self.path, size)
            self.size = self.reserved = SEGMENT_HEADER_SIZE
            self.ids, self.positions = array("Q"), array("Q")
            self.write_index_file()
            self._open_index_for_append()
            return size, NO_ENTRY
        self.read_header()
        data = self.read_index_file() or b""
        ids, positions = decode_index(data)
        keep, start, start_id, last_entry = 0, SEGMENT_HEADER_SIZE, self.base, NO_ENTRY
        for k in range(len(ids) - 1, -1, -1):
            if ids[k] < self.base or not SEGMENT_HEADER_SIZE <= positions[k] < size:
                continue
            record = self.record_at(positions[k], size)
            if record is not None and record[0] == ids[k]:
                keep, start, start_id, last_entry = k + 1, positions[k], ids[k], positions[k]
                break
        scan = self.scan(start, start_id, size, index_interval, last_entry=last_entry)
        removed = 0
        if scan.error is not None:
            removed = written_length(pread_exact(self.fd, size - scan.end, scan.end, self.path), size)
            cut(self.fd, scan.end, self.path)
            fsync(self.fd, self.path)
            if removed:
                log.log(
                    logging.DEBUG if quiet else logging.WARNING,
                    "%s: recovery truncated %d bytes of torn tail at byte %d (%s)",
                    self.path,
                    removed,
                    scan.end,
                    scan.error,
                )
        self.size = self.reserved = scan.end
        self.last_id = scan.next_id - 1
        self.ids, self.positions = ids[:keep], positions[:keep]
        self.ids.extend(scan.ids)
        self.positions.extend(scan.positions)
        if keep and not self.index_is_sane(self.ids, self.positions, self.size):
            # The kept prefix is out of order: garbage that happened to verify. Start over from the top.
            full = self.scan(SEGMENT_HEADER_SIZE, self.base, self.size, index_interval)
            self.ids, self.positions = full.ids, full.positions
        if scan.last_position >= 0:
            self.last_timestamp = self.timestamp_at(scan.last_position, self.size)
            last_entry = self.positions[-1]
        else:
            last_entry = NO_ENTRY
        if encode_index(self.ids, self.positions) != data:
            self.write_index_file()
        else:
            self.index_written = len(self.ids)
        self._open_index_for_append()
        return removed, last_entry

    def _all_zeros(self, size: int) -> bool:
        """True if the file is nothing but zero bytes (checked only when the header is not a header)."""
        assert self.fd is not None
        if pread_exact(self.fd, 8, 0, self.path) == MAGIC:
            return False
        position = 0
        while position < size:
            chunk = pread_exact(self.fd, min(SCAN_CHUNK, size - position), position, self.path)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            position += len(chunk)
        return True

    def _open_index_for_append(self) -> None:
        try:
            self.index_fd = open_file(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise StoreError(f"{self.index_path}: cannot open: {exc}") from exc
