"""Batches of entries without headers are encoded in bulk (``broker/store/batch.py``, through
``SegmentLog.append_batch``): the records are byte for byte the ones one ``append`` each would write, and the
log cuts them into the same segments with the same index entries, whatever the body sizes (every msgpack bin
width), the segment size and the index interval, and wherever the previous appends left the log."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import msgpack
import pytest

from broker.engine import Message
from broker.store import log as log_module
from broker.store.batch import encode_plain
from broker.store.log import SegmentLog
from broker.store.segment import RECORD_HEAD
from broker.topics import Persistence, Sync, TopicSpec
from protocol.bodies import TopicBodies

NOW = 1_700_000_000_123
TOPIC = b"bulk.t"


def one_by_one_record(message_id: int, timestamp: int, body: bytes) -> bytes:
    payload = msgpack.packb([timestamp, {}, body], use_bin_type=True)
    crc = zlib.crc32(payload, zlib.crc32(message_id.to_bytes(8, "big")))
    return RECORD_HEAD.pack(len(payload), crc, message_id) + payload


@pytest.mark.parametrize("sizes", [[100] * 300, [0] * 70, [255, 256, 65535, 65536, 70_000, 3, 0] * 10,
                                   [random.Random(7).randrange(0, 600) for _ in range(500)]])
def test_records_are_what_one_append_each_writes(sizes: list[int]) -> None:
    bodies = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    out, starts, ends = encode_plain(41, NOW, *TopicBodies.of(TOPIC, bodies).columns())
    expected = [one_by_one_record(41 + n, NOW, body) for n, body in enumerate(bodies)]
    assert bytes(out) == b"".join(expected)
    assert [end - start for start, end in zip(starts, ends, strict=True)] == [len(r) for r in expected]
    assert starts[0] == 0
    assert ends[-1] == len(out)


def write_log(root: Path, batches: list[list[bytes]], *, segment_bytes: int, index_interval: int,
              bulk: bool, as_columns: bool = False, commit_every: int = 1) -> list[Message]:
    """Append the batches (through append_batch when ``bulk``, else one append each), commit, close, and read
    everything back from a fresh open. ``as_columns``: each batch a slice of a larger :class:`TopicBodies`
    (what a batch is after an idempotent PUTS's duplicates were skipped). ``commit_every``: batches a commit
    writes (a loop turn that took several PUTS)."""
    spec = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.ASYNC, segment_bytes=segment_bytes)
    root.mkdir()
    log = SegmentLog(TOPIC, root, spec, index_interval=index_interval)
    next_id = 1
    for number, batch in enumerate(batches, 1):
        if bulk and as_columns:
            whole = TopicBodies.of(TOPIC, [b"before", *batch, b"after"])
            assert log.append_batch(next_id, NOW, whole[1:-1]) == len(batch)
        elif bulk:
            assert log.append_batch(next_id, NOW, [(TOPIC, body, {}) for body in batch]) == len(batch)
        else:
            for offset, body in enumerate(batch):
                log.append(Message(TOPIC, next_id + offset, body, {}, NOW))
        next_id += len(batch)
        if number % commit_every == 0:
            log.commit()
    log.commit()
    log.close()
    log = SegmentLog(TOPIC, root, spec, index_interval=index_interval)
    try:
        return log.read(1, 1 << 30, 1 << 40)
    finally:
        log.close()


@pytest.mark.parametrize("commit_every", [1, 5])
@pytest.mark.parametrize("as_columns", [False, True])
@pytest.mark.parametrize(("segment_bytes", "index_interval"), [(1024, 64), (4096, 1), (1 << 20, 4096),
                                                               (1024, 10_000)])
def test_the_log_files_are_the_same_as_one_append_each(
    tmp_path: Path, segment_bytes: int, index_interval: int, as_columns: bool, commit_every: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_module, "BULK_MIN", 2)  # every batch but the single entries in bulk
    randomly = random.Random(segment_bytes + index_interval)
    batches = [[bytes([randomly.randrange(256)]) * randomly.randrange(0, 300)
                for _ in range(randomly.choice([1, 5, 64, 65, 200, 1000]))] for _ in range(12)]
    batches.append([b"x" * 70_000] * 64)  # bin32 bodies, each past a small segment's size
    bulk = write_log(tmp_path / "bulk", batches, segment_bytes=segment_bytes, index_interval=index_interval,
                     bulk=True, as_columns=as_columns, commit_every=commit_every)
    single = write_log(tmp_path / "single", batches, segment_bytes=segment_bytes,
                       index_interval=index_interval, bulk=False)
    assert [m.body for m in bulk] == [body for batch in batches for body in batch]
    assert [(m.id, m.timestamp, m.headers) for m in bulk] == [(m.id, m.timestamp, m.headers) for m in single]
    directory = tmp_path / "bulk"
    names = sorted(path.name for path in directory.iterdir() if path.suffix in (".log", ".index"))
    assert names == sorted(path.name for path in (tmp_path / "single").iterdir()
                           if path.suffix in (".log", ".index"))
    if segment_bytes < 1 << 20:
        assert len(names) > 10, "the batches crossed many segments"
    for name in names:
        assert (directory / name).read_bytes() == \
            (tmp_path / "single" / name).read_bytes(), name


def test_small_batches_and_entries_with_headers_go_one_by_one(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.ASYNC)
    log = SegmentLog(TOPIC, tmp_path, spec)
    taken: list[int] = []
    real = log._append_plain  # which path a batch takes is what this test is about

    def spy(first_id: int, timestamp: int, data: object, offsets: list[int]) -> int:
        taken.append(len(offsets) - 1)
        return real(first_id, timestamp, data, offsets)

    monkeypatch.setattr(log, "_append_plain", spy)
    small = log_module.BULK_MIN - 1
    assert log.append_batch(1, NOW, [(TOPIC, b"a", {})] * small) == small
    with_headers = [(TOPIC, b"b", {})] * 99 + [(TOPIC, b"c", {b"K": b"v"})]
    assert log.append_batch(1 + small, NOW, with_headers) == 100
    large = log_module.BULK_MIN
    assert log.append_batch(101 + small, NOW, [(TOPIC, b"d", {})] * large) == large
    # One topic's bodies as columns: in bulk from their buffer when large, one by one when small.
    assert log.append_batch(101 + small + large, NOW, TopicBodies.of(TOPIC, [b"e"] * small)) == small
    assert log.append_batch(101 + 2 * small + large, NOW, TopicBodies.of(TOPIC, [b"f"] * large)) == large
    assert taken == [log_module.BULK_MIN, log_module.BULK_MIN]
    log.commit()
    messages = log.read(1, 1 << 20, 1 << 30)
    assert [m.body for m in messages] == ([b"a"] * small + [b"b"] * 99 + [b"c"] + [b"d"] * large
                                          + [b"e"] * small + [b"f"] * large)
    assert messages[small + 99].headers == {b"K": b"v"}
    log.close()
