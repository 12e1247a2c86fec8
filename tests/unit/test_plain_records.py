"""Plain stored records recognised without decoding them (``protocol.plain_records``): a run of records of
one size and layout checked by byte columns (:func:`uniform_run`) says yes only when the record-by-record
reading would (one size, consecutive ids, good CRCs, every payload ``[unsigned timestamp, {}, bin body]``),
and does for runs of one layout, whatever the timestamps' and bodies' widths; no to every way a record can be
something else."""

from __future__ import annotations

import random
import struct
import zlib

import msgpack
import numpy as np
import pytest

from protocol import plain_records, records
from protocol.errors import ProtocolError


def stored(record_id: int, payload: bytes) -> bytes:
    """One record as the store lays it out (docs/storage.md, "Records"), built by a few independent lines."""
    crc = zlib.crc32(record_id.to_bytes(8, "big") + payload)
    return struct.pack(">IIQ", len(payload), crc, record_id) + payload


def plain(record_id: int, timestamp: int, body: bytes) -> bytes:
    return stored(record_id, msgpack.packb([timestamp, {}, body], use_bin_type=True))


def run(count: int, timestamp: int = 1_700_000_000_000, body: int = 100, first: int = 5) -> bytes:
    """``count`` plain records of one size: bodies and timestamps differ, their widths do not."""
    return b"".join(plain(n, timestamp + n % 7, bytes([n % 251]) * body) for n in range(first, first + count))


def record_by_record(payload: bytes, start_id: int, count: int) -> bool:
    """The reading :func:`plain_records.uniform_run` must agree with: every record walked and checked, then
    decoded, and all of one size."""
    try:
        positions = list(records.walk(payload, start_id, count))
        decoded = records.decode(payload, start_id, count)
    except ProtocolError:
        return False
    sizes = {end - start for start, end in zip(positions, [*positions[1:], len(payload)], strict=True)}
    return len(sizes) == 1 and all(
        isinstance(record.timestamp, int) and record.timestamp >= 0 and record.headers == {}
        and isinstance(record.body, bytes) for record in decoded)


@pytest.mark.parametrize("timestamp", [0, 100, 200, 60_000, 4_000_000_000, 1_700_000_000_000],
                         ids=["fixint-0", "fixint", "uint8", "uint16", "uint32", "uint64"])
@pytest.mark.parametrize("body", [0, 100, 255, 256, 70_000],
                         ids=["empty", "bin8", "bin8-max", "bin16", "bin32"])
@pytest.mark.parametrize("count", [1, 6, 100])
def test_a_run_of_one_size_is_recognised(timestamp: int, body: int, count: int) -> None:
    payload = run(count, timestamp, body)
    assert record_by_record(payload, 5, count)
    assert plain_records.uniform_run(payload, 5, count) == len(payload) // count


def test_fixint_timestamps_may_all_differ() -> None:
    payload = b"".join(plain(n, n, b"x" * 10) for n in range(1, 101))  # every marker its own value
    assert plain_records.uniform_run(payload, 1, 100) == len(payload) // 100


def with_record(payload: bytes, index: int, replacement: bytes) -> bytes:
    size = len(payload) // 10
    return payload[: index * size] + replacement + payload[(index + 1) * size :]


def flipped(payload: bytes, at: int) -> bytes:
    return payload[:at] + bytes([payload[at] ^ 1]) + payload[at + 1 :]


# Each of ten records of 129 bytes (a uint64 timestamp, a 100-byte body) with one of them, the eighth, made
# something else of the same size where it can be: the run is not recognised.
SIZE = 129
NOT_RECOGNISED = {
    "a wrong id": lambda data: with_record(data, 7, plain(99, 1_700_000_000_000, bytes(100))),
    "a flipped bit in a body": lambda data: flipped(data, 7 * SIZE + 60),
    "a flipped bit in an id": lambda data: flipped(data, 7 * SIZE + 15),
    "a flipped CRC": lambda data: flipped(data, 7 * SIZE + 5),
    "headers": lambda data: with_record(data, 7, stored(12, msgpack.packb(
        [1_700_000_000_000, {b"k": b"v"}, bytes(94)], use_bin_type=True))),
    "a text body": lambda data: with_record(data, 7, stored(12, msgpack.packb(
        [1_700_000_000_000, {}, "z" * 100], use_bin_type=True))),
    "a negative timestamp": lambda data: with_record(data, 7, stored(12, msgpack.packb(
        [-1_700_000_000_000, {}, bytes(100)], use_bin_type=True))),
    "a float timestamp": lambda data: with_record(data, 7, stored(12, msgpack.packb(
        [1.5, {}, bytes(100)], use_bin_type=True))),
    "an array of four": lambda data: with_record(data, 7, stored(12, msgpack.packb(
        [1_700_000_000_000, {}, bytes(99), 1], use_bin_type=True))),
    "a bin 16 head on a short body": lambda data: with_record(data, 7, stored(12, bytes([0x93, 0xCF])
                                                                           + bytes(8) + b"\x80\xc5\x00\x64"
                                                                           + bytes(99))),
    "a body one byte short of its record": lambda data: with_record(data, 7, stored(12, bytes([0x93, 0xCF])
                                                                                 + bytes(8) + b"\x80\xc4\x65"
                                                                                 + bytes(100))),
}


@pytest.mark.parametrize("damage", NOT_RECOGNISED.values(), ids=NOT_RECOGNISED.keys())
def test_a_run_with_one_record_of_another_kind_is_not_recognised(damage) -> None:
    data = run(10)
    assert len(data) == 10 * SIZE
    changed = damage(data)
    assert len(changed) == len(data)  # the same size: only the columns and CRCs can tell
    assert not record_by_record(changed, 5, 10)
    assert plain_records.uniform_run(changed, 5, 10) is None


def test_plain_records_of_one_size_and_another_layout_are_left_to_a_closer_look() -> None:
    """A record whose timestamp is narrower and whose body is longer by as much is plain and of the same size,
    but its bytes are not where the others' are: not recognised, which only sends the run to the check that
    finds each record's fields (the store's numpy one, or one by one)."""
    data = run(10)
    for other in (plain(12, 4_000_000_000, bytes(104)), plain(12, 7, bytes(108))):
        changed = with_record(data, 7, other)
        assert len(changed) == len(data)
        assert record_by_record(changed, 5, 10)
        assert plain_records.uniform_run(changed, 5, 10) is None


def test_what_is_not_one_size_or_not_whole_is_not_recognised() -> None:
    data = run(10)
    assert plain_records.uniform_run(data, 6, 10) is None  # the ids start elsewhere
    assert plain_records.uniform_run(data, 5, 9) is None  # a record more than said
    assert plain_records.uniform_run(data[:-1], 5, 10) is None
    assert plain_records.uniform_run(data + run(1, first=15, body=50), 5, 11) is None
    assert plain_records.uniform_run(b"", 5, 0) is None
    assert plain_records.uniform_run(data[:10], 5, 1) is None


def test_it_agrees_with_the_record_by_record_reading_on_random_runs() -> None:
    """Runs of one layout with random bytes changed here and there (kept to one size, so that only the byte
    columns and the CRCs can tell): what the columns recognise, the record-by-record reading accepts, and
    numpy's layout calls plain; an unchanged run is always recognised."""
    generator = random.Random(41)
    said = {True: 0, False: 0}
    for _ in range(400):
        count = generator.choice([1, 2, 7, 30])
        original = run(count, generator.choice([3, 200, 1_700_000_000_000]), generator.choice([0, 5, 300]))
        data = bytearray(original)
        for _ in range(generator.choice([0, 0, 1, 2])):
            data[generator.randrange(len(data))] = generator.randrange(256)
        payload = bytes(data)
        recognised = plain_records.uniform_run(payload, 5, count) is not None
        said[recognised] += 1
        if recognised:
            assert record_by_record(payload, 5, count)
            stride = len(payload) // count
            positions = np.arange(count, dtype=np.int64) * stride
            buffer = np.frombuffer(payload, dtype=np.uint8)
            assert plain_records.all_plain(buffer, positions, positions + stride)
        elif payload == original:
            pytest.fail("an unchanged run was not recognised")
    assert said[True] > 50  # both answers were exercised
    assert said[False] > 50
