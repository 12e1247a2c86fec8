"""Stored records (the payload of a ``FETCH ... FORMAT records``) turned into an Arrow record batch, in bulk.

The broker sends a range of a topic's log as it lies on disk (:mod:`protocol.records`): ``head | msgpack
[timestamp, headers, body]`` per record. One Python loop finds where each record starts (and checks its id and
CRC); everything else is numpy over the whole payload at once: the timestamps are read where msgpack put them,
the bodies are cut out with one mask, and the columns are built from those buffers without a Python object per
row. A record whose header map is not empty, or whose timestamp is encoded unusually, is decoded one by one
(its key and headers are per-row data anyway); the others never are.

The profile that made this so (bench/spark.py, docs/pipeline.md): decoding each record into a message object
and building the columns from Python lists cost about 5 us a row on the executor; this costs about 0.4 us
with the CRCs checked and 0.25 us without (the CRCs cost 0.7 us a row more while they were checked one record
at a time).

This module knows the record layout and Arrow, nothing about Spark or the broker.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from protocol import crcs, plain_records, records

#: The reserved header that carries a Kafka-style message key (docs/pipeline.md, "key").
KEY_HEADER = b"KEY"

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
    if positions is None:  # records of several sizes: walk them one by one
        positions = np.frombuffer(records.walk(payload, start_id, count, check_crc=check_crc), dtype=np.int64)
    if stop_id is not None and start_id + count > stop_id:
        count = max(0, stop_id - start_id)
    ends = np.empty(len(positions), dtype=np.int64)
    ends[:-1] = positions[1:]
    if len(positions):
        ends[-1] = len(payload)
    positions, ends = positions[:count], ends[:count]

    # Where msgpack put each field, for the common shape [uint timestamp, {}, bin body].
    start = positions + 16
    usual, marker, body_starts = plain_records.layout(buffer, positions, ends)

    names = schema.names  # the columns asked for (all of them unless the read was given a schema)
    timestamps = marker.astype(np.uint64)  # the fixint case: the marker is the value
    for code, width in plain_records.UINT_BYTES.items() if "timestamp" in names else ():
        chosen = usual & (marker == code)
        if chosen.any():
            timestamps[chosen] = _big_endian(buffer, start[chosen] + 2, width)

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
            timestamps[index] = timestamp
            body_starts[index] = ends[index] - len(body)  # the body is the array's last element
            keys[index] = message_headers.get(KEY_HEADER)
            headers[index] = [(name.decode("utf-8", "surrogateescape"), value)
                              for name, value in message_headers.items() if name != KEY_HEADER]

    columns: dict[str, Any] = {}
    if "value" in names:
        lengths = ends - body_starts
        offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        bodies = _bodies(buffer, positions, body_starts, ends, lengths)
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
