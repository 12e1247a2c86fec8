"""Stored records as they travel in the reply to a ``FETCH ... FORMAT records`` (docs/mc0.md): the bytes of a
topic's log, copied by the broker without decoding them, read here by the client.

A record is ``u32 payload length | u32 crc | u64 id | payload``, big-endian, where the crc is CRC-32 of the id
bytes and the payload, and the payload is the msgpack array ``[timestamp-ms, headers, body]``. That is the
store's own layout (docs/storage.md, "Records"); the broker module that writes it is ``broker.store.segment``,
which this module must not import (clients do not ship the broker). A reply's records are back to back, ids
consecutive from the reply's ``START-ID``, exactly ``COUNT`` of them.

:func:`walk` is the one loop over records a client needs: it finds where each record starts and checks
lengths, ids and CRCs, and nothing else, so that a reader can then take the columns it wants in bulk (the
Spark source does, with numpy). :func:`decode` is the plain reading, one tuple per record. Malformed records
raise :class:`ProtocolError`: a broker must never send them, and a client must not guess.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import msgpack

from protocol.checksum import crc32
from protocol.errors import ProtocolError

RECORD_HEAD = struct.Struct(">IIQ")  # payload length, crc32(id bytes + payload), id
RECORD_HEAD_SIZE = RECORD_HEAD.size  # 16


class Record(NamedTuple):
    id: int
    timestamp: int
    headers: dict[bytes, bytes]
    body: bytes


def walk(payload: bytes, start_id: int, count: int, *, check_crc: bool = True) -> array:
    """The byte position of each of the ``count`` records in ``payload`` (ids ``start_id`` on), checked: whole
    records back to back, consecutive ids, matching CRCs (unless ``check_crc`` is false), nothing left over.

    This is the only per-record Python work a records reply needs: about 0.3 us a record, and as much again
    for its CRC."""
    positions = array("q", bytes(8 * count))
    unpack = RECORD_HEAD.unpack_from
    size = len(payload)
    position = 0
    expected = start_id
    for index in range(count):
        if position + 16 > size:
            raise ProtocolError(f"records reply ends inside record {expected} (byte {position} of {size})")
        length, crc, record_id = unpack(payload, position)
        end = position + 16 + length
        if record_id != expected or end > size:
            raise ProtocolError(f"records reply: record at byte {position} has id {record_id} and length "
                                f"{length}; expected id {expected} within {size} bytes")
        if check_crc and crc32(payload[position + 8 : end]) != crc:
            raise ProtocolError(f"records reply: CRC mismatch in record {record_id}")
        positions[index] = position
        position = end
        expected += 1
    if position != size:
        raise ProtocolError(f"records reply holds {size - position} bytes after its {count} records")
    return positions


def check_crcs(payload: bytes, positions: Sequence[int], ends: Sequence[int], stored: Sequence[int]) -> None:
    """Each record's CRC (of its id bytes and payload, ``positions[i] + 8`` up to ``ends[i]``) against the one
    stored in its head: for readers that found the positions in bulk (:func:`walk` checks as it goes). Each
    over a view of its bytes, not a copy."""
    view = memoryview(payload)
    for position, end, crc in zip(positions, ends, stored, strict=True):
        if crc32(view[position + 8 : end]) != crc:
            raise ProtocolError(f"records reply: CRC mismatch in the record at byte {position}")


def decode(payload: bytes, start_id: int, count: int, *, check_crc: bool = True) -> list[Record]:
    """Every record of a records reply, decoded."""
    out = []
    for position in walk(payload, start_id, count, check_crc=check_crc):
        length, _, record_id = RECORD_HEAD.unpack_from(payload, position)
        try:
            timestamp, headers, body = msgpack.unpackb(payload[position + 16 : position + 16 + length])
        except Exception as exc:  # msgpack and unpacking raise several types; all mean a malformed record
            raise ProtocolError(f"records reply: record {record_id} does not decode ({exc!r})") from None
        out.append(Record(record_id, timestamp, headers, body))
    return out
