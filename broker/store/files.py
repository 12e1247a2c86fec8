"""The file-backed store: a data directory holding one directory per persistent topic.

:class:`FileStore` is the :class:`broker.store.Store` the broker runs with. It owns the data directory's
layout: how a topic name (any non-empty byte string) becomes a safe directory name, the ``topic.json`` meta
file that records the exact name and the topic's settings, creating a topic directory atomically, and the
lock that keeps a second broker out of a data directory in use. What lives inside a topic directory is
:mod:`broker.store.log`'s business.

The data directory is created, and locked, only when the first persistent topic is opened (or found): a broker
with transient topics only never touches the disk. :meth:`FileStore.check` says at start, in one line, whether
the directory can be used at all.

Open files are bounded: the store keeps at most ``max_open_files`` descriptors open across all its logs, and
lets go of those of the logs used least recently (:meth:`SegmentLog.release`) to stay under it. A topic whose
log cannot be opened fails the request that needed it; the failure is remembered for ``RETRY_OPEN`` seconds,
so that a crowd of requests for a topic whose files are damaged does not read them again each time.

A folder in the data directory that is not a topic directory (no ``topic.json``, or a name the encoding cannot
produce) is skipped with a warning; so is a topic directory that cannot be read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from broker.histogram import FSYNC_SECONDS, Histogram
from broker.store import LogIdentity, StoredTopic, StoreError, SyncFailed
from broker.store.buffers import ReadBuffers
from broker.store.log import SegmentLog
from broker.store.making import Maker
from broker.store.segment import Segment, fsync, fsync_directory, open_file, write_all
from broker.topics import MAX_TOPIC_ID, Delivery, Persistence, Sync, TopicSpec

log = logging.getLogger("mc0.store")

META_FILE = "topic.json"
META_FORMAT = 1
#: Longer encoded names become a hash: 200 leaves room under the usual 255-byte limit for a file name.
MAX_DIRECTORY_NAME = 200
#: A directory being created is first built under this prefix (a leading "." never starts a topic directory).
NEW_PREFIX = ".new-"
#: Held with flock() while a broker uses the directory: two brokers appending to one log would corrupt it.
#: While held it also says "in use since boot <id>"; a clean stop empties it, so a start that finds it full
#: knows the last broker stopped uncleanly, and whether the machine restarted since.
LOCK_FILE = ".lock"
#: The kernel's id of the current boot (Linux); elsewhere every unclean stop counts as a possible restart.
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_INCARNATION = re.compile(r"[0-9a-f]{32}")
#: A deleted topic's directory is renamed with this prefix first (hidden: never a topic), then removed.
DELETED_PREFIX = ".deleted-"
#: Seconds a failure to open a topic's log is given again without trying (its files are not read again).
RETRY_OPEN = 5.0
#: Descriptors the store keeps open at most when nothing else is said (the broker sets it from its limit).
DEFAULT_MAX_OPEN_FILES = 1024
#: A turn that commits at least this many strong logs fsyncs them at once, in this many threads at most
#: (below it, one after another: measured alone on ext4, 2 files took 0.23 ms in turn and 0.34 at once,
#: 8 files 0.86 and 0.70).
FSYNC_TOGETHER_FROM = 8
FSYNC_THREADS = 8

_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
#: Every name directory_name() can produce (never one starting with "."). Anything else in the data
#: directory, such as the "lost+found" of a dedicated file system, is not ours and is left alone.
_TOPIC_DIRECTORY = re.compile(r"(?:[A-Za-z0-9_-]|%[0-9A-F]{2})(?:[A-Za-z0-9._-]|%[0-9A-F]{2})*|~[0-9a-f]{64}")
_SPEC_FIELDS = (
    "delivery",
    "persistence",
    "sync",
    "max_backlog",
    "retention_bytes",
    "retention_seconds",
    "segment_bytes",
    "element_size",
)


def directory_name(topic: bytes) -> str:
    """The topic's directory: unsafe bytes (and a leading ``.``) as ``%XX``, or a hash if that is too long."""
    if not topic:
        raise ValueError("topic names must not be empty")
    parts = [
        chr(byte) if byte in _SAFE_BYTES and not (index == 0 and byte == 0x2E) else f"%{byte:02X}"
        for index, byte in enumerate(topic)
    ]
    name = "".join(parts)
    if len(name) > MAX_DIRECTORY_NAME:
        return "~" + hashlib.sha256(topic).hexdigest()
    return name


def spec_to_json(spec: TopicSpec) -> dict[str, Any]:
    return {
        "delivery": spec.delivery.value,
        "persistence": spec.persistence.value,
        "sync": None if spec.sync is None else spec.sync.value,
        "max_backlog": spec.max_backlog,
        "retention_bytes": spec.retention_bytes,
        "retention_seconds": spec.retention_seconds,
        "segment_bytes": spec.segment_bytes,
        "element_size": spec.element_size,
    }


def spec_from_json(value: Any) -> TopicSpec:
    """The inverse of :func:`spec_to_json`; ValueError (or TypeError) for anything it would not write."""
    # element_size came later: a meta file written before it has none, and means 0.
    value = {"element_size": 0, **value} if isinstance(value, dict) else value
    if not isinstance(value, dict) or set(value) != set(_SPEC_FIELDS):
        raise ValueError(f"spec must be an object with exactly {', '.join(_SPEC_FIELDS)}")
    for name in ("max_backlog", "segment_bytes", "element_size"):
        if not isinstance(value[name], int) or isinstance(value[name], bool):
            raise ValueError(f"{name} must be an integer")
    if value["retention_bytes"] is not None and (
        not isinstance(value["retention_bytes"], int) or isinstance(value["retention_bytes"], bool)
    ):
        raise ValueError("retention_bytes must be an integer or null")
    seconds = value["retention_seconds"]
    if seconds is not None and (not isinstance(seconds, int | float) or isinstance(seconds, bool)):
        raise ValueError("retention_seconds must be a number or null")
    return TopicSpec(
        delivery=Delivery(value["delivery"]),
        persistence=Persistence(value["persistence"]),
        sync=None if value["sync"] is None else Sync(value["sync"]),
        max_backlog=value["max_backlog"],
        retention_bytes=value["retention_bytes"],
        retention_seconds=value["retention_seconds"],
        segment_bytes=value["segment_bytes"],
        element_size=value["element_size"],
    )


def encode_meta(topic: bytes, spec: TopicSpec, topic_id: int | None = None,
                identity: LogIdentity | None = None, lost: list[tuple[int, int]] | None = None) -> bytes:
    meta: dict[str, Any] = {"format": META_FORMAT, "name_hex": topic.hex()}
    # name_hex alone is the truth; "name" is only there for people reading the file.
    with contextlib.suppress(UnicodeDecodeError):
        meta["name"] = topic.decode("utf-8")
    if topic_id is not None:
        meta["topic_id"] = topic_id
    if identity is not None:
        meta["incarnation"] = identity.incarnation
        if identity.lineage:
            meta["lineage"] = [{"incarnation": old, "until": until} for old, until in identity.lineage]
    meta["spec"] = spec_to_json(spec)
    if lost:
        meta["lost"] = [list(ids) for ids in lost]
    return (json.dumps(meta, indent=2) + "\n").encode()


def _identity_from_json(meta: dict[str, Any]) -> LogIdentity | None:
    """The log identity a meta file records (None in files written before identities were)."""
    incarnation = meta.get("incarnation")
    if incarnation is None:
        return None
    if not isinstance(incarnation, str) or not _INCARNATION.fullmatch(incarnation):
        raise ValueError("incarnation must be 32 lowercase hex digits")
    lineage = meta.get("lineage", [])
    if not isinstance(lineage, list):
        raise ValueError("lineage must be a list")
    entries = []
    for entry in lineage:
        if (not isinstance(entry, dict) or set(entry) != {"incarnation", "until"}
                or not isinstance(entry["incarnation"], str)
                or not _INCARNATION.fullmatch(entry["incarnation"])
                or type(entry["until"]) is not int or entry["until"] < 1):
            raise ValueError("each lineage entry must be {incarnation: 32 hex digits, until: an id}")
        entries.append((entry["incarnation"], entry["until"]))
    return LogIdentity(incarnation, tuple(entries))


def _lost_from_json(meta: dict[str, Any]) -> list[tuple[int, int]]:
    """The id ranges ``mc0 repair`` took out of a topic's log (``lost`` in its meta file; none if absent)."""
    lost = meta.get("lost", [])
    if not isinstance(lost, list):
        raise ValueError("lost must be a list")
    ranges = []
    for entry in lost:
        if (not isinstance(entry, list) or len(entry) != 2 or any(type(value) is not int for value in entry)
                or not 1 <= entry[0] <= entry[1]):
            raise ValueError("each lost entry must be [first id, last id]")
        ranges.append((entry[0], entry[1]))
    return ranges


class TopicMeta(NamedTuple):
    """What a topic directory's meta file records."""

    stored: StoredTopic  # the exact name, spec and topic id (None if not yet recorded)
    identity: LogIdentity | None  # None in files written before identities were
    lost: list[tuple[int, int]]  # id ranges ``mc0 repair`` took out of the log, first and last id


def read_meta(directory: Path) -> StoredTopic:
    """The exact topic name, spec and topic id (None if not yet recorded) from a topic directory's meta file;
    StoreError if missing or garbled."""
    return read_topic_meta(directory).stored


def read_topic_meta(directory: Path) -> TopicMeta:
    """Everything a topic directory's meta file records; StoreError if missing or garbled."""
    path = directory / META_FILE
    try:
        meta = json.loads(path.read_bytes())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        if meta.get("format") != META_FORMAT:
            raise ValueError(f"unknown format {meta.get('format')!r}")
        name_hex = meta["name_hex"]
        if not isinstance(name_hex, str):
            raise ValueError("name_hex must be a string")
        topic = bytes.fromhex(name_hex)
        if not topic:
            raise ValueError("empty topic name")
        spec = spec_from_json(meta["spec"])
        if not spec.persistent:
            raise ValueError("the spec is not persistent")
        # Absent in files written before topic ids were recorded: the engine gives one and it is written.
        topic_id = meta.get("topic_id")
        if topic_id is not None and (type(topic_id) is not int or not 1 <= topic_id <= MAX_TOPIC_ID):
            raise ValueError(f"topic_id must be an integer from 1 to {MAX_TOPIC_ID}")
        identity = _identity_from_json(meta)
        lost = _lost_from_json(meta)
    except FileNotFoundError:
        raise StoreError(f"{path}: missing: {directory} is not a topic directory") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise StoreError(f"{path}: unreadable topic meta file: {exc!r}") from None
    return TopicMeta(StoredTopic(topic, spec, topic_id), identity, lost)


def boot_id() -> str | None:
    """This boot's id, or None where the system does not say."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def write_file_atomically(path: Path, data: bytes) -> None:
    """tmp + fsync + rename + fsync of the directory: after a crash, the old content or the new."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_all(fd, data, tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        raise StoreError(f"{path}: cannot write: {exc}") from exc
    fsync_directory(path.parent)


class OpenFiles:
    """The logs that hold files open, least recently used first, and the bound on their descriptors."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.logs: OrderedDict[SegmentLog, None] = OrderedDict()
        self.released = 0  # times a log let go of its files to keep the bound (a figure for STATS)

    @property
    def held(self) -> int:
        return sum(log.open_files for log in self.logs)

    def use(self, used: SegmentLog) -> None:
        """``used`` is about to touch its files: it becomes the most recent, and the least recently used
        others let go of theirs while the store holds more than the bound (``used`` may then go a few
        descriptors over it, for this call)."""
        logs = self.logs
        logs[used] = None
        logs.move_to_end(used)
        if len(logs) * 2 <= self.limit:
            return  # cannot be over: a log holds about two descriptors between calls
        held = self.held
        while held >= self.limit and len(logs) > 1:
            oldest = next(iter(logs))
            held -= oldest.open_files
            del logs[oldest]
            oldest.release()
            self.released += 1

    def forget(self, closed: SegmentLog) -> None:
        self.logs.pop(closed, None)


class FileStore:
    """Persistent topics under ``root``, one :class:`SegmentLog` per topic, opened at most once each."""

    def __init__(self, root: Path, *, index_interval: int = 4096,
                 max_open_files: int = DEFAULT_MAX_OPEN_FILES) -> None:
        if index_interval < 1:
            raise ValueError("index_interval must be at least 1")
        if max_open_files < 4:
            raise ValueError("max_open_files must be at least 4")
        self.root = Path(root)
        self.index_interval = index_interval
        # Every log's segment fsyncs, timed (one histogram for the whole store: what the monitoring shows).
        self.fsync_seconds = Histogram(FSYNC_SECONDS)
        self.read_buffers = ReadBuffers()  # shared by the logs' range reads (broker.store.buffers)
        self.files = OpenFiles(max_open_files)
        self._logs: dict[bytes, SegmentLog] = {}
        self._failed: dict[bytes, tuple[float, StoreError]] = {}  # recent failures to open, by topic
        self._created_unsynced = False  # topic directories made since the data directory's last fsync
        self._fsync_pool: ThreadPoolExecutor | None = None  # made by the first commit of many strong logs
        self.maker = Maker(self.root, self._build_directory)  # new topics' directories made ahead
        self._lock_fd: int | None = None
        # Set when the data directory is claimed: did the last broker stop uncleanly, and on this boot?
        self.unclean = False
        self.same_boot = True
        # The directory is claimed and let go of again while the broker runs (it holds the lock only while
        # logs are open): only the first claim reads what the last broker left.
        self._inspected = False

    def check(self) -> None:
        """Refuse, in one line, a data directory that cannot work: a path through a file, a folder this
        process may not write in, or one another broker holds. Creates nothing."""
        root = self.root
        existing = root
        while not existing.exists():
            if existing.parent == existing:
                break
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            where = "is a file" if existing == root else f"cannot be created: {existing} is a file"
            raise StoreError(f"data directory {root} {where}, not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            what = "" if existing == root else f"cannot be created: {existing} "
            raise StoreError(f"data directory {root} {what}is not writable by this process "
                             f"(user id {os.getuid()})")
        if existing == root:
            self._claim()
            self._release_if_idle()

    def lock(self) -> None:
        """Hold the data directory's lock (StoreError if a broker holds it); the offline tools' way in."""
        self._claim()

    def unlock(self) -> None:
        self._release_if_idle()

    def _claim(self) -> None:
        """Create the data directory if needed and lock it for this process (once)."""
        if self._lock_fd is not None:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = open_file(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise StoreError(f"{self.root}: cannot create the data directory: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"{self.root}: another broker is using this data directory") from None
        self._lock_fd = fd
        self._mark_in_use(fd)

    def _mark_in_use(self, fd: int) -> None:
        """Read what the last broker left in the lock file, then say "in use since this boot" (fsynced: it
        must be on disk before anything this broker writes and hands out)."""
        path = self.root / LOCK_FILE
        current = boot_id()
        if self._inspected:
            previous = []  # this store claimed the directory before: what the file says is its own
        else:
            try:
                previous = os.pread(fd, 256, 0).decode("ascii", "replace").split()
            except OSError as exc:
                raise StoreError(f"{path}: cannot read: {exc}") from exc
            self._inspected = True
        if previous:
            self.unclean = True
            self.same_boot = current is not None and previous[-1] == current
            log.warning("%s: the last broker did not stop cleanly (%s)", self.root,
                        "same boot" if self.same_boot else "the machine may have restarted since")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"boot {current or 'unknown'}\n".encode(), 0)
        except OSError as exc:
            raise StoreError(f"{path}: cannot write: {exc}") from exc
        fsync(fd, path)

    def _release_if_idle(self, clean: bool = False) -> None:
        if self._lock_fd is not None and not self._logs and not self.maker:
            if clean:  # every log is written, fsynced and closed: the next start need not doubt any of them
                with contextlib.suppress(OSError):
                    os.ftruncate(self._lock_fd, 0)
                    os.fsync(self._lock_fd)
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def existing(self) -> list[StoredTopic]:
        """Topics found on disk, with the spec and topic id their meta file records, sorted by name (none when
        the data directory does not exist yet)."""
        if not self.root.exists():
            return []
        self._claim()
        try:
            return self._existing()
        except BaseException:
            self._release_if_idle()  # a refused start must not keep the directory locked
            raise

    def _existing(self) -> list[StoredTopic]:
        found = []
        try:
            entries = sorted(os.scandir(self.root), key=lambda entry: entry.name)
        except OSError as exc:
            raise StoreError(f"{self.root}: cannot list: {exc}") from exc
        for entry in entries:
            # Leading-dot names are topic directories still being created or deleted (directory_name encodes
            # a leading "."): a creation or deletion a stop cut short is finished by removing them. Names it
            # cannot produce and plain files are not ours.
            if entry.name.startswith((DELETED_PREFIX, NEW_PREFIX)):
                if not self.maker.holds(Path(entry.path)):
                    self._remove_deleted(Path(entry.path))
                continue
            if not _TOPIC_DIRECTORY.fullmatch(entry.name) or not entry.is_dir():
                continue
            try:
                stored = read_meta(Path(entry.path))
            except StoreError as exc:
                log.warning("%s: skipped, not a topic directory (%s)", entry.path, exc)
                continue
            if directory_name(stored.name) != entry.name:
                log.warning("%s: skipped: it holds topic %r, whose directory is %s", entry.path, stored.name,
                            directory_name(stored.name))
                continue
            found.append(stored)
        found.sort(key=lambda item: item.name)
        return found

    def open(self, topic: bytes, spec: TopicSpec, topic_id: int | None = None,
             identity: LogIdentity | None = None) -> SegmentLog:
        """The log of ``topic``: created if new, recovered if it exists. The same object on every call.

        If the meta file records other settings than ``spec`` (the configuration changed), or another
        ``topic_id`` than a given one, it is rewritten: the configuration in force wins, and the engine owns
        topic ids. Within one process the first open's spec stays. StoreError if the log cannot be opened
        (logged once; the same error again, without touching the files, for ``RETRY_OPEN`` seconds).
        """
        opened = self._logs.get(topic)
        if opened is not None:
            return opened
        if not spec.persistent:
            raise ValueError(f"topic {topic!r} is not persistent: it has no log")
        failed = self._failed.get(topic)
        if failed is not None:
            if time.monotonic() - failed[0] < RETRY_OPEN:
                raise failed[1]
            del self._failed[topic]
        self._claim()
        try:
            opened = self._open(topic, spec, topic_id, identity)
        except SyncFailed:
            self._release_if_idle()
            raise
        except StoreError as error:
            self._release_if_idle()
            if len(self._failed) >= 1024:  # bounded: the oldest failure is forgotten (and tried again)
                del self._failed[next(iter(self._failed))]
            self._failed[topic] = (time.monotonic(), error)
            log.error("topic %r cannot be opened: %s", topic.decode("utf-8", "replace"), error)
            raise
        except BaseException:
            self._release_if_idle()
            raise
        self.files.use(opened)
        return opened

    def _open(self, topic: bytes, spec: TopicSpec, topic_id: int | None,
              given: LogIdentity | None) -> SegmentLog:
        directory = self.root / directory_name(topic)
        created = not directory.is_dir()
        identity: LogIdentity | None
        if created:
            lost: list[tuple[int, int]] = []
            ahead = self.maker.take(topic, spec, topic_id, given)
            if ahead is not None:
                identity = ahead.identity
                self._rename_created(ahead.path, directory)
            else:
                identity = given or LogIdentity.fresh()
                self._create_directory(directory, topic, spec, topic_id, identity)
            recorded = (spec, topic_id, identity)
        else:
            self.maker.discard(topic)  # made ahead all the same (a topic found unavailable at start): unused
            stored, identity, lost = read_topic_meta(directory)
            if stored.name != topic:
                raise StoreError(f"{directory}: holds topic {stored.name!r}, not {topic!r}")
            if topic_id is None:
                topic_id = stored.topic_id
            recorded = (stored.spec, stored.topic_id, identity)
        segment_log = SegmentLog(topic, directory, spec, index_interval=self.index_interval, lost=lost,
                                 fsync_seconds=self.fsync_seconds, on_use=self.files.use,
                                 read_buffers=self.read_buffers)
        if created:
            segment_log.created = False  # created with its identity just now
        try:
            identity = self._identity(segment_log, identity)
            if recorded != (spec, topic_id, identity):
                meta = encode_meta(topic, spec, topic_id, identity, lost)
                write_file_atomically(directory / META_FILE, meta)
        except BaseException:
            segment_log.close()
            raise
        segment_log.identity = identity
        self._logs[topic] = segment_log
        return segment_log

    def set_identity(self, topic: bytes, identity: LogIdentity) -> None:
        """Give an open topic's log another identity: a cluster's new epoch, or the identity of the leader a
        follower copies. The log answers with it at once; its meta file records it (atomically) before
        anything else is written to the log, or at close, not now: a take-over gives every persistent topic a
        new identity, and writing them all at once (two fsyncs each) made it grow with the topics, 0.5 s for
        500 on each broker. Until then the files hold a prefix of both identities' logs (the new one's lineage
        says so), so a broker that stops before it is recorded comes back under the old one with nothing
        misnamed; what only the new one may claim, the messages written next, waits for the record."""
        segment_log = self._logs.get(topic)
        if segment_log is None:
            raise StoreError(f"topic {topic!r} has no open log")
        if segment_log.identity == identity:
            return
        if not all(_INCARNATION.fullmatch(incarnation) for incarnation in
                   (identity.incarnation, *(old for old, _ in identity.lineage))):
            # Written, it would make the topic's meta file unreadable, and the broker unable to open it.
            raise StoreError(f"topic {topic!r}: {identity.incarnation!r} is not a log identity (32 lowercase "
                             "hex digits): not recorded")
        segment_log.identity = identity
        segment_log.identity_owed = partial(self._record_identity, segment_log)

    @staticmethod
    def _record_identity(segment_log: SegmentLog) -> None:
        directory = segment_log.directory
        stored, _, lost = read_topic_meta(directory)
        write_file_atomically(directory / META_FILE, encode_meta(
            segment_log.topic, segment_log.spec, stored.topic_id, segment_log.identity, lost))

    def _identity(self, segment_log: SegmentLog, identity: LogIdentity | None) -> LogIdentity:
        """Which log this is now (docs/storage.md, "Log identity"): a new incarnation for a log created with
        no segments (new, or its files lost) or without a recorded identity (older files); a successor
        sharing the recovered ids for a log that may have lost a tail it handed out (not strong, last stop
        unclean, the machine restarted since)."""
        if identity is None or segment_log.created:
            if identity is not None:
                log.warning("%s: no segments found: a new log, with a new incarnation", segment_log.directory)
            return LogIdentity.fresh()
        if self.unclean and segment_log.spec.sync is not Sync.STRONG:
            segment_log.make_durable()
            if not self.same_boot:
                log.warning("%s: may have lost an unsynced tail in a machine restart: ids from %d on start a "
                            "new incarnation", segment_log.directory, segment_log.next_id)
                return identity.successor(segment_log.next_id)
        return identity

    def make_ahead(self, topic: bytes, spec: TopicSpec, topic_id: int | None, identity: LogIdentity,
                   done: Callable[[], None]) -> bool:
        """Start making the directory of new topic ``topic`` in a maker thread (:mod:`broker.store.making`),
        for :meth:`open` to take: ``done()`` is called from that thread when it is made (or failed). False
        if it is not made ahead: it is open, or as many as the bound allows are being made. (Whether its
        directory exists is not asked: a lookup in the data directory waits for the makers' creations in it.
        The engine asks only for topics it lacks; one whose directory exists all the same, one that could not
        be opened at start, is opened from it, and what was made ahead is removed.)"""
        if topic in self._logs or not spec.persistent:
            return False
        self._claim()
        started = self.maker.start(topic, spec, topic_id, identity, done)
        if not started:
            self._release_if_idle()
        return started

    def made(self, topic: bytes) -> bool:
        """Whether opening ``topic`` would not wait for a directory being made ahead."""
        return self.maker.ready(topic)

    def forget_made(self, topic: bytes) -> None:
        """The directory made ahead for ``topic`` will not be opened: removed (and its place in the bound)."""
        self.maker.discard(topic)
        self._release_if_idle()

    def _create_directory(
        self, directory: Path, topic: bytes, spec: TopicSpec, topic_id: int | None, identity: LogIdentity
    ) -> None:
        """Build the topic directory, its meta file and first segment, under a hidden name, then rename it:
        it appears whole or not at all. The rename is made durable by :meth:`sync_created`, once for every
        topic a turn made (an fsync of the data directory each cost a tenth of a topic's making)."""
        new = self.root / (NEW_PREFIX + directory.name)
        try:
            if new.exists():
                shutil.rmtree(new)  # left by a failed creation
        except OSError as exc:
            raise StoreError(f"{new}: cannot create the topic directory: {exc}") from exc
        self._build_directory(new, topic, spec, topic_id, identity)
        self._rename_created(new, directory)

    def _build_directory(
        self, new: Path, topic: bytes, spec: TopicSpec, topic_id: int | None, identity: LogIdentity
    ) -> None:
        """The topic directory's content, under the hidden name ``new``, fsynced: its meta file and first
        segment, then the directory itself."""
        try:
            new.mkdir()
            fd = open_file(new / META_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                write_all(fd, encode_meta(topic, spec, topic_id, identity), new / META_FILE)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"{new}: cannot create the topic directory: {exc}") from exc
        Segment(new, 1).create_empty()  # in the same directory fsync: none of its own once renamed
        fsync_directory(new)

    def _rename_created(self, new: Path, directory: Path) -> None:
        try:
            os.rename(new, directory)
        except OSError as exc:
            raise StoreError(f"{directory}: cannot create the topic directory: {exc}") from exc
        self._created_unsynced = True

    def sync_created(self) -> None:
        """Make the topic directories created since the last call durable: one fsync of the data directory.
        The engine calls it before each commit, so before anything written to them is confirmed."""
        if self._created_unsynced:
            fsync_directory(self.root)
            self._created_unsynced = False

    def commit_many(self, logs: Sequence[SegmentLog]) -> dict[int, StoreError]:
        """The engine's group commit: each log committed as :meth:`SegmentLog.commit` does it, but with many
        strong logs, their writes first, one log after another, then their fsyncs at once, in threads
        (``os.fsync`` lets go of the interpreter): fsyncs of different files on one file system share the
        journal's commits. Measured on ext4, 32 files: 3.7 ms in turn, 2.4 at once; with two other
        processes doing the same, 6.8 and 3.1 (200 files: 20.9 and 11.2). Returns the positions in ``logs``
        of those whose commit failed and why; SyncFailed is raised once every fsync has ended."""
        failed: dict[int, StoreError] = {}
        strong = sum(1 for segment_log in logs if segment_log.spec.sync is Sync.STRONG)
        together = strong >= FSYNC_TOGETHER_FROM
        for position, segment_log in enumerate(logs):
            try:
                if together:
                    segment_log.write_ahead()
                else:
                    segment_log.commit()
            except SyncFailed:
                raise
            except StoreError as error:
                failed[position] = error
        if together:
            if self._fsync_pool is None:
                self._fsync_pool = ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="mc0-fsync")
            fsyncs = {position: self._fsync_pool.submit(segment_log.finish_commit)
                      for position, segment_log in enumerate(logs)
                      if position not in failed and segment_log.spec.sync is Sync.STRONG}
            lost: SyncFailed | None = None
            for position, fsynced in fsyncs.items():
                try:
                    fsynced.result()
                except SyncFailed as error:
                    lost = lost or error
                except StoreError as error:
                    failed[position] = error
            if lost is not None:
                raise lost
        return failed

    def delete(self, topic: bytes) -> bool:
        """Remove a topic's log and directory; False if it has none. The directory is first renamed to a
        hidden name (durably), so a crash halfway leaves no half topic: the rest goes at the next start."""
        log = self._logs.pop(topic, None)
        self._failed.pop(topic, None)
        if log is not None:
            self.files.forget(log)
            log.close()
        directory = self.root / directory_name(topic)
        if not directory.is_dir():
            self._release_if_idle()
            return log is not None
        doomed = self.root / f"{DELETED_PREFIX}{directory.name}.{time.time_ns():x}"
        try:
            os.rename(directory, doomed)
        except OSError as exc:
            raise StoreError(f"{directory}: cannot delete: {exc}") from exc
        fsync_directory(self.root)
        self._remove_deleted(doomed)
        self._release_if_idle()
        return True

    def _remove_deleted(self, doomed: Path) -> None:
        try:
            shutil.rmtree(doomed)
        except OSError as exc:
            log.warning("%s: could not remove a deleted topic's files: %s", doomed, exc)

    def close(self) -> None:
        """Close every open log (write, fsync, close). Trying them all, failures are logged; a failed fsync is
        raised after that (SyncFailed: data may be lost), any other failure raised last."""
        failure: StoreError | None = None
        if self._fsync_pool is not None:
            self._fsync_pool.shutdown()
            self._fsync_pool = None
        self.maker.close()
        try:
            self.sync_created()
        except SyncFailed as exc:
            log.error("%s", exc)
            failure = exc
        for topic_log in self._logs.values():
            try:
                topic_log.close()
            except SyncFailed as exc:
                log.error("%s", exc)
                if not isinstance(failure, SyncFailed):
                    failure = exc
            except StoreError as exc:
                log.error("%s", exc)
                failure = failure or exc
        self._logs.clear()
        self.files.logs.clear()
        self._release_if_idle(clean=failure is None)
        if failure is not None:
            raise failure
