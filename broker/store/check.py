"""Checking and mending a data directory offline: ``mc0 verify`` and ``mc0 repair``.

Owns: reading every record of every segment of every topic (length, id, CRC, payload), the chain of segments
and the meta files, and saying what is wrong in terms a person can act on; and the repair: a damaged segment
is moved whole (with its index) to ``<data dir>/.quarantine/<topic directory>/<time>/``, every good record it
held is written back into new segments, so nothing readable is lost, and the ids that could not be read are
recorded as ``lost`` in the topic's ``topic.json`` (the broker then skips them as it skips what retention
deleted). Records are found again after a damaged one by their ids: the next id expected, or one a little
further on, whose record is whole and passes its CRC.

It never runs beside a broker: it takes the data directory's lock, and refuses in one line when a broker
holds it. A torn tail of a topic's last segment (a crash during a write) is only reported: the broker cuts it
when it opens the topic, as it cuts the space it had reserved after the records (zero bytes, not reported).
Index files are derived data: a bad one is reported and rebuilt by the broker.
"""

from __future__ import annotations

import os
import struct
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from broker.store import StoreError
from broker.store.files import (
    META_FILE,
    FileStore,
    encode_meta,
    read_topic_meta,
    write_file_atomically,
)
from broker.store.segment import (
    INDEX_ENTRY_SIZE,
    MAGIC,
    NO_ENTRY,
    RECORD_HEAD,
    RECORD_HEAD_SIZE,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    decode_index,
    decode_payload,
    encode_index,
    encode_segment_header,
    fsync_directory,
    index_file_name,
    parse_segment_file_name,
    segment_file_name,
    written_length,
)
from protocol.checksum import crc32

#: Where repair puts damaged segments, inside the data directory (a leading dot: never read as a topic).
QUARANTINE = ".quarantine"
#: Ids looked for after a damaged record before the rest of its segment counts as unreadable.
RESYNC_IDS = 4096
#: Index entries every this many bytes in the segments repair writes (the store's default).
INDEX_INTERVAL = 4096

_ID = struct.Struct(">Q")


@dataclass
class Run:
    """Records of consecutive ids that read well: ids ``first`` .. ``last``, bytes ``start`` .. ``end``."""

    first: int
    last: int
    start: int
    end: int


@dataclass
class Damage:
    """Ids ``first`` .. ``last`` that cannot be read (``last`` None: to the end of the segment)."""

    first: int
    last: int | None
    position: int
    reason: str


@dataclass
class SegmentReport:
    path: Path
    base: int
    records: int = 0
    runs: list[Run] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    torn_tail: int = 0  # bytes after the last good record of the last segment, with nothing good after them
    index_problem: str | None = None


@dataclass
class TopicReport:
    directory: Path
    name: bytes | None = None
    segments: list[SegmentReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # damage, one line each
    notes: list[str] = field(default_factory=list)  # what the broker mends by itself (torn tails, indexes)
    unrepairable: str | None = None


# ------------------------------------------------------------------------------------------------ reading


def _record(data: bytes, position: int, expected: int) -> tuple[int, str | None]:
    """The length of the record at ``position`` if it is whole, carries ``expected``, passes its CRC and
    decodes; else (0, why)."""
    if position + RECORD_HEAD_SIZE > len(data):
        return 0, f"incomplete record header ({len(data) - position} bytes)"
    length, crc, record_id = RECORD_HEAD.unpack_from(data, position)
    end = position + RECORD_HEAD_SIZE + length
    if end > len(data):
        return 0, f"incomplete record (payload of {length} bytes, {len(data) - position - 16} left)"
    if record_id != expected:
        return 0, f"record has id {record_id}, expected {expected}"
    if crc32(data[position + 8 : end]) != crc:
        return 0, f"CRC mismatch in record {record_id}"
    try:
        decode_payload(data[position + RECORD_HEAD_SIZE : end])
    except ValueError as error:
        return 0, f"record {record_id}: {error}"
    return RECORD_HEAD_SIZE + length, None


def _resync(
    data: bytes, start: int, limit: int, first_id: int, last_id: int | None
) -> tuple[int, int] | None:
    """The first good record from byte ``start`` on, ending before ``limit``, with an id from ``first_id`` (up
    to ``last_id``, and at most RESYNC_IDS further): ``(position, id)``, or None."""
    top = first_id + RESYNC_IDS if last_id is None else min(last_id, first_id + RESYNC_IDS)
    for candidate in range(first_id, top + 1):
        pattern = _ID.pack(candidate)
        found = data.find(pattern, start + 8, limit)
        while found >= 0:
            position = found - 8
            if _record(data, position, candidate)[0]:
                return position, candidate
            found = data.find(pattern, found + 1, limit)
    return None


def survey_segment(path: Path, base: int, last_id: int | None, last: bool) -> SegmentReport:
    """Every record of one segment file: the runs that read well and the damaged ranges between them.
    ``last_id`` is the id the segment must end with (the next segment's base - 1; None for the last one)."""
    report = SegmentReport(path, base)
    data = path.read_bytes()
    if len(data) < SEGMENT_HEADER_SIZE:
        reason = f"segment header is cut short ({len(data)} of 16 bytes)"
        report.damage.append(Damage(base, last_id, 0, reason))
        return report
    # A good record's payload starts with a msgpack array marker, never a zero byte, so no good record's id
    # lies in the zero bytes that end a file (the space a broker reserved ahead of its records, a MiB of it):
    # searches for records stop before them.
    limit = len(data.rstrip(b"\0"))
    magic, header_base = SEGMENT_HEADER.unpack_from(data)
    position, expected = SEGMENT_HEADER_SIZE, base
    if magic != MAGIC or header_base != base:
        why = f"not an mc0 segment (magic {magic!r})" if magic != MAGIC else (
            f"header says base id {header_base}, the file name says {base}")
        found = _resync(data, SEGMENT_HEADER_SIZE - 8, limit, base, last_id)
        report.damage.append(Damage(base, None if found is None else found[1] - 1, 0, why))
        if found is None:
            return report
        position, expected = found
    run: Run | None = None
    while position < len(data):
        length, why = _record(data, position, expected)
        if length:
            if run is None:
                run = Run(expected, expected, position, position)
                report.runs.append(run)
            run.last, run.end = expected, position + length
            report.records += 1
            position += length
            expected += 1
            if last_id is not None and expected > last_id:
                break
            continue
        run = None
        found = _resync(data, position + 1, limit, expected, last_id)
        if found is None and last:
            # Nothing good after it: the broker cuts it at open (and the space it reserved, without a word).
            report.torn_tail = written_length(memoryview(data)[position:], len(data))
            break
        if found is None:
            report.damage.append(Damage(expected, last_id, position, why or "unreadable"))
            break
        report.damage.append(Damage(expected, found[1] - 1, position, why or "unreadable"))
        position, expected = found
    if last_id is not None and position >= len(data) and expected <= last_id and not report.damage:
        ended = report.runs[-1].last if report.runs else base - 1
        report.damage.append(Damage(ended + 1, last_id, len(data),
                                    f"segment ends at id {ended}, the next segment starts at {last_id + 1}"))
    report.index_problem = _index_problem(path, report)
    return report


def _index_problem(path: Path, report: SegmentReport) -> str | None:
    index = path.with_name(index_file_name(report.base))
    try:
        data = index.read_bytes()
    except FileNotFoundError:
        return "index missing (the broker rebuilds it)"
    if len(data) % INDEX_ENTRY_SIZE:
        return "index has a partial entry (the broker rebuilds it)"
    ids, positions = decode_index(data)
    starts = {run.first: run.start for run in report.runs}
    if ids and (ids[0] != report.base or positions[0] != SEGMENT_HEADER_SIZE) and starts.get(report.base):
        return "index does not start at the first record (the broker rebuilds it)"
    return None


def survey_topic(directory: Path) -> TopicReport:
    report = TopicReport(directory)
    try:
        meta = read_topic_meta(directory)
    except StoreError as error:
        report.unrepairable = str(error)
        report.problems.append(f"{directory.name}: {error}")
        return report
    report.name = meta.stored.name
    lost = meta.lost
    bases = sorted(base for base in (parse_segment_file_name(entry) for entry in os.listdir(directory))
                   if base is not None)
    shown = repr(report.name.decode("utf-8", "replace"))
    for number, base in enumerate(bases):
        following = bases[number + 1] if number + 1 < len(bases) else None
        last_id = None if following is None else following - 1
        segment = survey_segment(directory / segment_file_name(base), base, last_id, following is None)
        report.segments.append(segment)
        for damage in segment.damage:
            if last_id is not None and damage.first > last_id:
                continue
            upto = "the end of the segment" if damage.last is None else str(damage.last)
            if damage.last is not None and any(low <= damage.first and damage.last <= high
                                               for low, high in lost):
                continue  # a gap repair recorded
            report.problems.append(f"topic {shown}: {segment.path.name}: ids {damage.first}..{upto} "
                                   f"unreadable (byte {damage.position}: {damage.reason})")
        if segment.torn_tail:
            report.notes.append(f"topic {shown}: {segment.path.name}: a torn tail of {segment.torn_tail} "
                                "bytes (the broker cuts it when it opens the topic)")
        if segment.index_problem:
            report.notes.append(f"topic {shown}: {segment.path.name}: {segment.index_problem}")
    return report


def topic_directories(root: Path) -> Iterator[Path]:
    for entry in sorted(os.scandir(root), key=lambda entry: entry.name):
        if entry.is_dir() and not entry.name.startswith(".") and (Path(entry.path) / META_FILE).exists():
            yield Path(entry.path)


# ------------------------------------------------------------------------------------------------ the tools


@dataclass
class Summary:
    topics: int = 0
    segments: int = 0
    records: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)

    def add(self, report: TopicReport) -> None:
        self.topics += 1
        self.segments += len(report.segments)
        self.records += sum(segment.records for segment in report.segments)
        self.problems += report.problems
        self.notes += report.notes


def _locked(root: Path) -> FileStore:
    """The data directory's lock, or one line saying a broker holds it."""
    if not root.is_dir():
        raise StoreError(f"{root}: no such data directory")
    store = FileStore(root)
    try:
        store.lock()  # the broker's own lock: a running broker keeps us out, and we keep it out
    except StoreError:
        raise StoreError(f"{root}: a broker is using this data directory: stop it first (mc0 verify and mc0 "
                         "repair work on a data directory offline)") from None
    return store


def verify(root: Path) -> Summary:
    """Check every topic of the data directory; the problems found, one line each."""
    store = _locked(root)
    try:
        summary = Summary()
        for directory in topic_directories(root):
            summary.add(survey_topic(directory))
        return summary
    finally:
        store.unlock()


def repair(root: Path) -> Summary:
    """Quarantine every damaged segment and write its good records back (see the module docstring)."""
    store = _locked(root)
    try:
        summary = Summary()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for directory in topic_directories(root):
            report = survey_topic(directory)
            summary.add(report)
            if report.unrepairable is not None:
                summary.repaired.append(f"{directory.name}: not repaired: {report.unrepairable}")
                continue
            summary.repaired += _repair_topic(root, directory, report, stamp)
        return summary
    finally:
        store.unlock()


def _repair_topic(root: Path, directory: Path, report: TopicReport, stamp: str) -> list[str]:
    done: list[str] = []
    meta = read_topic_meta(directory)
    lost = list(meta.lost)
    quarantine = root / QUARANTINE / directory.name / stamp
    for number, segment in enumerate(report.segments):
        if not segment.damage:
            continue
        following = report.segments[number + 1].base if number + 1 < len(report.segments) else None
        quarantine.mkdir(parents=True, exist_ok=True)
        data = segment.path.read_bytes()
        index = segment.path.with_name(index_file_name(segment.base))
        os.replace(segment.path, quarantine / segment.path.name)
        if index.exists():
            os.replace(index, quarantine / index.name)
        for run in segment.runs:
            _write_segment(directory, run, data)
        if following is None and not segment.runs:
            # The last segment held nothing readable: an empty one in its place, so ids go on from its base.
            _write_segment(directory, Run(segment.base, segment.base - 1, 0, 0), data)
        kept = sum(run.last - run.first + 1 for run in segment.runs)
        for damage in segment.damage:
            last = damage.last
            if last is None:
                last = following - 1 if following is not None else damage.first - 1
            if last >= damage.first:
                lost.append((damage.first, last))
        done.append(f"{directory.name}: {segment.path.name} quarantined in {quarantine.relative_to(root)}; "
                    f"{kept} good records written back")
    if done:
        # The identity stays: every id still names the message it named, some of them now lost.
        stored = meta.stored
        write_file_atomically(directory / META_FILE, encode_meta(stored.name, stored.spec, stored.topic_id,
                                                                 meta.identity, _merged(lost)))
        fsync_directory(directory)
    return done


def _write_segment(directory: Path, run: Run, data: bytes) -> None:
    """A segment holding ``run``'s records as they were, with its index."""
    body = data[run.start : run.end]
    path = directory / segment_file_name(run.first)
    ids, positions = [], []
    last_entry, position, record_id = NO_ENTRY, SEGMENT_HEADER_SIZE, run.first
    offset = 0
    while offset < len(body):
        (length,) = struct.unpack_from(">I", body, offset)
        if position - last_entry >= INDEX_INTERVAL:
            ids.append(record_id)
            positions.append(position)
            last_entry = position
        step = RECORD_HEAD_SIZE + length
        offset += step
        position += step
        record_id += 1
    for target, content in ((path, encode_segment_header(run.first) + body),
                            (path.with_name(index_file_name(run.first)),
                             encode_index(array("Q", ids), array("Q", positions)))):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged
