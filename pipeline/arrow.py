"""Stored records (the payload of a ``FETCH ... FORMAT records``) turned into an Arrow record batch, in bulk.

The broker sends a range of a topic's log as it lies on disk (:mod:`protocol.records`): ``head | msgpack
[timestamp, headers, body]`` per record. Two ways to the columns, neither with a Python object per row:

* records of one size and one layout (what a publisher of fixed-size bodies stores, checked a byte column at
  a time by :func:`protocol.plain_records.uniform_layout`): the reply is a table with one record per row, and
  each field is a column of it, taken with one strided copy;
* anything else: one Python loop finds where each record starts (and checks its id and CRC), then numpy over
  the whole payload reads the timestamps where msgpack put them and cuts the bodies out with one mask. A
  record whose header map is not empty, or whose timestamp is encoded unusually, is decoded one by one (its
  key and headers are per-row data anyway); the others never are.

The profile that made this so (bench/spark.py, docs/pipeline.md): decoding each record into a message object
and building the columns from Python lists cost about 5 us a row on the executor; the second way costs about
0.11 us with the CRCs checked in bulk and 0.07 without, the first 0.08 and 0.045 (10,000 rows of 100 bytes).

This module knows the record layout and Arrow, nothing about Spark or the broker.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack
import numpy as np
import pyarrow as pa

from protocol import crcs, plain_records, records
from protocol.records import RECORD_HEAD_SIZE

#: The reserved header that carries a Kafka-style message key (docs/pipeline.md, "key").
KEY_HEADER = b"KEY"

#: What a field not asked for holds.
_NO_BYTES = np.empty(0, dtype=np.uint8)

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def _big_endian(buffer: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """The unsigned big-endian integers of ``width`` bytes (1, 2, 4 or 8) at ``positions`` of ``buffer``, as
    uint64: one gather of their bytes, read as integers of that width."""
    gathered = buffer[positions[:, None] + np.arange(width)]  # one row of ``width`` bytes per integer
    return gathered.view(f">u{width}").ravel().astype(np.uint64)


def _bodies(
    buffer: np.ndarray, positions: np.ndarray, starts: np.ndarray, ends: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """The bodies, back to back. Records of one layout (every body at the same offset in records of one
    size): one strided copy. Otherwise one mask over the payload, built from the alternating run lengths of
    what is not a body and what is."""
    count = len(starts)
    if count == 0:
        return np.empty(0, dtype=np.uint8)
    offset, length = int(starts[0] - positions[0]), int(lengths[0])
    stride = int(ends[0] - positions[0])
    one_size = count == 1 or bool((np.diff(positions) == stride).all())
    if one_size and bool((starts - positions == offset).all()) and bool((lengths == length).all()):
        view = np.lib.stride_tricks.as_strided(buffer[int(positions[0]) + offset:], shape=(count, length),
                                               strides=(stride, 1))
        return view.copy().ravel()
    runs = np.empty(2 * count, dtype=np.int64)
    runs[0::2] = starts - np.concatenate(([0], ends[:-1]))
    runs[1::2] = lengths
    kinds = np.zeros(2 * count, dtype=np.bool_)
    kinds[1::2] = True
    mask = np.repeat(kinds, runs)
    return buffer[: len(mask)][mask]


class Fields(NamedTuple):
    """What the columns are built from, per record of a batch: the timestamps (ms, uint64), the bodies back
    to back with their offsets, and the keys and headers (None when every record is plain: no headers)."""

    timestamps: np.ndarray
    offsets: np.ndarray  # int32, count + 1
    bodies: np.ndarray  # uint8
    keys: list[bytes | None] | None
    headers: list[list[tuple[str, bytes]]] | None


def to_batch(
    payload: bytes,
    start_id: int,
    count: int,
    topic: str,
    schema: pa.Schema,
    *,
    stop_id: int | None = None,
    check_crc: bool = True,
) -> pa.RecordBatch:
    """The columns ``schema`` names (of ``key, value, topic, id, timestamp, headers``, in its order) for
    records ``start_id`` .. ``start_id + count - 1`` of ``payload``, cut at ``stop_id`` (exclusive) when
    given; a column not asked for is not built."""
    buffer = np.frombuffer(payload, dtype=np.uint8)
    positions = crcs.uniform_positions(payload, buffer, start_id, count, check_crc)
    shape = None
    if positions is not None:  # records of one size: of one layout too, as a publisher of fixed bodies stores
        shape = plain_records.uniform_layout(payload, len(payload) // count, count)
    else:  # records of several sizes: walk them one by one
        positions = np.frombuffer(records.walk(payload, start_id, count, check_crc=check_crc), dtype=np.int64)
    total = count
    if stop_id is not None and start_id + count > stop_id:
        count = max(0, stop_id - start_id)
    names = schema.names  # the columns asked for (all of them unless the read was given a schema)
    if shape is not None:
        fields = _uniform_fields(buffer, total, count, shape, names)
    else:
        fields = _walked_fields(payload, buffer, positions, start_id, count, names)
    timestamps, offsets, bodies, keys, headers = fields

    columns: dict[str, Any] = {}
    if "value" in names:
        columns["value"] = pa.Array.from_buffers(pa.binary(), count,
                                                 [None, pa.py_buffer(offsets), pa.py_buffer(bodies)])
    if "key" in names:
        columns["key"] = pa.array(keys, pa.binary()) if keys is not None else pa.nulls(count, pa.binary())
    if "topic" in names:
        columns["topic"] = (pa.repeat(pa.scalar(topic, pa.string()), count) if count
                            else pa.array([], pa.string()))
    if "id" in names:
        columns["id"] = pa.array(np.arange(start_id, start_id + count, dtype=np.int64))
    if "timestamp" in names:
        micros = (timestamps.astype(np.int64) * 1000).astype(np.int64)
        columns["timestamp"] = pa.Array.from_buffers(schema.field("timestamp").type, count,
                                                     [None, pa.py_buffer(micros)])
    if "headers" in names:
        if headers is None:
            columns["headers"] = pa.ListArray.from_arrays(
                pa.array(np.zeros(count + 1, dtype=np.int32)), pa.array([], HEADER_TYPE.value_type))
        else:
            columns["headers"] = pa.array(headers, HEADER_TYPE)
    return pa.RecordBatch.from_arrays([columns[name] for name in names], schema=schema)


def _uniform_fields(buffer: np.ndarray, total: int, count: int, shape: plain_records.Uniform,
                    names: list[str]) -> Fields:
    """The fields of the first ``count`` of ``total`` plain records of one layout (``shape``) that make up
    ``buffer``, for the columns ``names``: each field a column of the records seen as rows, one strided copy
    each, nothing per record."""
    rows = buffer.reshape(total, len(buffer) // total)[:count]
    width, body = shape
    if "timestamp" not in names:
        stamps = np.zeros(count, dtype=np.uint64)
    elif width == 0:  # a positive fixint: the marker is the value
        stamps = rows[:, RECORD_HEAD_SIZE + 1].astype(np.uint64)
    else:  # the bytes after the marker, big-endian
        at = RECORD_HEAD_SIZE + 2
        stamps = rows[:, at : at + width].copy().view(f">u{width}").ravel().astype(np.uint64)
    length = rows.shape[1] - body
    offsets = np.arange(0, (count + 1) * length, length, dtype=np.int32)
    bodies = rows[:, body:].copy().ravel() if "value" in names else _NO_BYTES
    return Fields(stamps, offsets, bodies, None, None)


def _walked_fields(payload: bytes, buffer: np.ndarray, positions: np.ndarray, start_id: int, count: int,
                   names: list[str]) -> Fields:
    """The fields of the first ``count`` records of ``payload`` (``buffer`` a uint8 view of it), which
    start at ``positions``: the plain ones read where msgpack put each field, the others decoded one by
    one."""
    ends = np.empty(len(positions), dtype=np.int64)
    ends[:-1] = positions[1:]
    if len(positions):
        ends[-1] = len(payload)
    positions, ends = positions[:count], ends[:count]

    # Where msgpack put each field, for the common shape [uint timestamp, {}, bin body].
    start = positions + RECORD_HEAD_SIZE
    usual, marker, body_starts = plain_records.layout(buffer, positions, ends)
    stamps = marker.astype(np.uint64)  # the fixint case: the marker is the value
    for code, width in plain_records.UINT_BYTES.items() if "timestamp" in names else ():
        chosen = usual & (marker == code)
        if chosen.any():
            stamps[chosen] = _big_endian(buffer, start[chosen] + 2, width)

    keys: list[bytes | None] | None = None
    headers: list[list[tuple[str, bytes]]] | None = None
    unusual = np.flatnonzero(~usual)
    if len(unusual):
        keys = [None] * count
        headers = [[] for _ in range(count)]
        for index in unusual.tolist():
            record_id = start_id + index
            try:
                timestamp, message_headers, body = msgpack.unpackb(payload[start[index] : ends[index]])
            except Exception as exc:  # msgpack and unpacking raise several types; all mean a bad record
                raise records.ProtocolError(f"record {record_id} does not decode ({exc!r})") from None
            stamps[index] = timestamp
            body_starts[index] = ends[index] - len(body)  # the body is the array's last element
            keys[index] = message_headers.get(KEY_HEADER)
            headers[index] = [(name.decode("utf-8", "surrogateescape"), value)
                              for name, value in message_headers.items() if name != KEY_HEADER]
    if "value" not in names:
        return Fields(stamps, _NO_BYTES, _NO_BYTES, keys, headers)
    lengths = ends - body_starts
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return Fields(stamps, offsets, _bodies(buffer, positions, body_starts, ends, lengths), keys, headers)
