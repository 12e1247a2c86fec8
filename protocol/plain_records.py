"""Stored records whose payload is plain, recognised in bulk with numpy: ``[unsigned timestamp, {}, bin
body]`` in msgpack, what a publish without headers stores (:mod:`protocol.records` has the record layout).

:func:`layout` looks at every record's payload at once, with lookup tables over its marker bytes: whether it
is plain (an array of three, an unsigned timestamp of any width, an empty map, a bin whose length is exactly
what is left of the record), its timestamp's marker, and where its body starts. Nothing is decoded, and a
plain payload is well-formed msgpack of the store's shape by construction, whatever its values.

Its users: the Spark source, which takes timestamps and bodies in bulk from the plain records of a reply and
decodes only the others (``pipeline.arrow``), and the store, which appends a run of records copied from a
cluster leader at once when all are plain (``broker.store.log``). Why: a msgpack decode per record was most of
what either paid per record.

:func:`uniform_layout` is the same recognition for records of one size that share one layout, without numpy:
one byte column at a time with bytes slicing; the Spark source then takes each field as a column of the
reply seen as a table of rows. :func:`uniform_run` adds the heads and CRCs: a cluster follower at 100
confirmations in flight copies runs of about a hundred records into a process that slept since the last one,
and there numpy's fixed cost per call was most of the check (docs/cluster.md, "Checking a copied run").

numpy is imported with this module, which the connector does not import (an agent that never reads records
in bulk does not wait for numpy).
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from protocol.errors import ProtocolError
from protocol.records import RECORD_HEAD_SIZE, check_crcs

ARRAY_OF_3 = 0x93
EMPTY_MAP = 0x80
#: msgpack unsigned integer markers -> bytes that follow (a positive fixint carries its value in the marker).
UINT_BYTES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
#: msgpack bin markers -> length bytes that follow.
BIN_LENGTH_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
#: The same as tables over every marker byte, so that a whole column of markers is looked up at once:
#: unsigned integer bytes (0 for a positive fixint, -1 for anything else) and bin length bytes (0: not a bin).
_UINT_WIDTH = np.full(256, -1, dtype=np.int64)
_UINT_WIDTH[:0x80] = 0
_UINT_WIDTH[list(UINT_BYTES)] = list(UINT_BYTES.values())
_BIN_LENGTH_WIDTH = np.zeros(256, dtype=np.int64)
_BIN_LENGTH_WIDTH[list(BIN_LENGTH_BYTES)] = list(BIN_LENGTH_BYTES.values())


class Layout(NamedTuple):
    """Per record: whether its payload is plain, its timestamp's msgpack marker (a positive fixint is the
    value itself), and where its body starts (meaningful where plain)."""

    plain: np.ndarray  # bool
    markers: np.ndarray  # uint8
    body_starts: np.ndarray  # int64


def layout(buffer: np.ndarray, positions: np.ndarray, ends: np.ndarray) -> Layout:
    """The :class:`Layout` of the records ``buffer[positions[i]:ends[i]]`` (``buffer`` uint8; their heads,
    ids and CRCs checked by the caller)."""
    last = len(buffer) - 1
    start = positions + RECORD_HEAD_SIZE  # each payload
    markers = buffer[np.minimum(start + 1, last)]
    width = _UINT_WIDTH[markers]
    head_at = np.minimum(start + 3 + np.maximum(width, 0), last)  # the body's bin head, after the empty map
    length_bytes = _BIN_LENGTH_WIDTH[buffer[head_at]]
    body_starts = head_at + 1 + length_bytes
    # The length after the head, big-endian: as many bytes as the widest length here are read for every
    # record (one, for bodies under 256 bytes), and each record's shifted down to its own width (the bytes
    # past a shorter length are its body's). Each byte's place is clamped on its own: those a length uses lie
    # inside the buffer whenever its record passes the other checks.
    widest = int(length_bytes.max()) if len(positions) else 0
    lengths = np.zeros(len(positions), dtype=np.int64)
    for offset in range(1, widest + 1):
        lengths = (lengths << 8) | buffer[np.minimum(head_at + offset, last)]
    lengths >>= 8 * (widest - length_bytes)
    plain = (ends - start >= 4) & (buffer[np.minimum(start, last)] == ARRAY_OF_3) & (width >= 0)
    plain &= (buffer[head_at - 1] == EMPTY_MAP) & (length_bytes > 0) & (body_starts <= ends)
    plain &= lengths == ends - body_starts
    return Layout(plain, markers, body_starts)


def all_plain(buffer: np.ndarray, positions: np.ndarray, ends: np.ndarray) -> bool:
    """Whether there are records and every one of them is plain (see :func:`layout`)."""
    return len(positions) > 0 and bool(layout(buffer, positions, ends).plain.all())


def _plain_body(payload: bytes, start: int, end: int) -> tuple[int, int] | None:
    """For one payload ``payload[start:end]``: its timestamp's width in bytes (0 for a positive fixint) and
    where its body starts, if it is plain (see :func:`layout`); None if not."""
    if end - start < 4 or payload[start] != ARRAY_OF_3:
        return None
    marker = payload[start + 1]
    width = 0 if marker < 0x80 else UINT_BYTES.get(marker)
    if width is None:
        return None
    at = start + 2 + width  # the empty map, then the body's bin head
    if at + 1 >= end or payload[at] != EMPTY_MAP:
        return None
    length_bytes = BIN_LENGTH_BYTES.get(payload[at + 1])
    if length_bytes is None:
        return None
    body = at + 2 + length_bytes
    if body > end or int.from_bytes(payload[at + 2 : body], "big") != end - body:
        return None
    return width, body


class Uniform(NamedTuple):
    """The layout every record of a run shares: its timestamp's width in bytes (0 for a positive fixint, the
    marker itself) and where its body starts, from the start of the record."""

    width: int
    body: int


def uniform_layout(payload: bytes, stride: int, count: int) -> Uniform | None:
    """The layout of the ``count`` records of ``stride`` bytes that make up ``payload``, if all are plain and
    share the first's (see :func:`uniform_run`); None otherwise. Their heads, ids and CRCs are not looked at
    beyond the length: the caller checks those."""
    shape = _plain_body(payload, RECORD_HEAD_SIZE, stride)
    if shape is None:
        return None
    width, body = shape
    shared = [0, 1, 2, 3, RECORD_HEAD_SIZE, *range(RECORD_HEAD_SIZE + 2 + width, body)]
    if width:
        shared.append(RECORD_HEAD_SIZE + 1)  # the marker of an unsigned timestamp of that width
    elif max(payload[RECORD_HEAD_SIZE + 1 :: stride]) >= 0x80:
        return None  # a positive fixint's marker is its value: any below 0x80, each its own
    for offset in shared:
        column = payload[offset::stride]
        if column.count(column[0]) != count:
            return None
    return Uniform(width, body)


def uniform_run(payload: bytes, start_id: int, count: int) -> int | None:
    """The size of each record if the ``count`` records of ``payload`` are plain (see :func:`layout`) and of
    one layout (one size, the same timestamp width and body length: what a publisher of fixed-size bodies
    stores), numbered from ``start_id``, with matching CRCs; None for anything else, including plain records
    of one size but several layouts (the caller then looks closer, and names what is wrong).

    The first record's payload is read field by field; then every byte the others must share with it
    (length, array, timestamp marker, empty map, the body's bin head) is checked a column at a time
    (``payload[k::size]``, one C loop each), the ids and CRCs come from one ``struct.iter_unpack``, and each
    record's CRC is computed over a view (:func:`protocol.records.check_crcs`): no numpy, about 0.3 us a
    record (most of it the CRCs), where the numpy checks cost 50 us and more for a hundred records. For
    thousands, :func:`protocol.crcs.uniform_positions` folds the CRCs faster."""
    size = len(payload)
    if count <= 0 or size < RECORD_HEAD_SIZE:
        return None
    stride = RECORD_HEAD_SIZE + int.from_bytes(payload[:4], "big")
    if stride * count != size or uniform_layout(payload, stride, count) is None:
        return None
    heads = list(struct.iter_unpack(f">4xIQ{stride - RECORD_HEAD_SIZE}x", payload))  # (crc, id) per record
    if list(map(itemgetter(1), heads)) != list(range(start_id, start_id + count)):
        return None
    try:
        check_crcs(payload, range(0, size, stride), range(stride, size + 1, stride),
                   list(map(itemgetter(0), heads)))
    except ProtocolError:
        return None
    return stride
