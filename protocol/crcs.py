"""The CRCs of many stored records of one size, checked at once: one CRC-32 (:mod:`protocol.checksum`) over
all their bytes against the stored CRCs combined, instead of one Python call per record.

Each record carries the CRC-32 of its id bytes and payload (:mod:`protocol.records`). CRC-32 composes:
``crc(a + b) = A(len(b)) . crc(a) xor crc(b)``, where ``A(n)`` is the GF(2)-linear map "shift by n zero
bytes" (what zlib's ``crc32_combine`` applies). So the stored CRCs of records of one size fold, pairwise in a
tree with numpy, into the CRC their bytes would have back to back, which one CRC-32 of those bytes
(gathered with one strided copy) must equal. A record whose bytes do not match its CRC changes that CRC
exactly as it changes its own (the same error caught the same way), and several bad records go unnoticed
only if their errors cancel, which a 32-bit CRC leaves to chance about once in 4 billion: the check Kafka
consumers make, one CRC per record batch. When the sums differ, the records are checked one by one, so the
error still names the record.

:func:`uniform_positions` checks the rest of such a run in bulk too (every length and id where it must be).

Why: the Spark source checked each record with a Python loop, about 0.7 us a record, two thirds of what
reading a record cost the executor (bench/spark.py's profile); this costs about 0.1 us. A cluster follower
checks every record it copies the same way (``broker.store.log``).

This module knows CRC-32 and numpy, nothing about Spark or the broker.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from protocol import records
from protocol.checksum import crc32

#: Bytes of a record head before what its CRC covers (payload length and the CRC itself).
_UNCOVERED = 8
#: From how many records the CRCs are folded (:func:`combine`): below it, one ``crc32`` call per record costs
#: less than the fold's numpy steps (about 0.2 us a record against 28 us for 16 records, 66 for 100; 93 for
#: 1,000 where the loop takes 176).
FOLD_FROM = 384
_BIT_VALUES = np.uint32(1) << np.arange(32, dtype=np.uint32)


def _tables(columns: np.ndarray) -> np.ndarray:
    """The 4 x 256 lookup tables of a 32 x 32 GF(2) map given by its ``columns`` (the image of each bit):
    table k, entry v, is the image of byte value v in byte k."""
    tables = np.zeros((4, 256), dtype=np.uint32)
    values = np.arange(256)
    for byte in range(4):
        for bit in range(8):
            tables[byte, (values >> bit) & 1 == 1] ^= columns[8 * byte + bit]
    return tables


def _octets(values: np.ndarray) -> np.ndarray:
    """uint32 ``values`` as rows of their four bytes, lowest first (what :func:`_apply` takes)."""
    return np.ascontiguousarray(values, dtype="<u4").view(np.uint8).reshape(-1, 4)


def _apply(tables: np.ndarray, octets: np.ndarray) -> np.ndarray:
    """The map of ``tables`` applied to each of the uint32s whose bytes, lowest first, are the rows of
    ``octets``. Indexing by the bytes themselves saves the shifts and masks of taking them out of the
    integers: a quarter of the fold's time (0.32 ms for 10,000 CRCs where it took 0.44)."""
    return (tables[0][octets[:, 0]] ^ tables[1][octets[:, 1]]
            ^ tables[2][octets[:, 2]] ^ tables[3][octets[:, 3]])


@lru_cache(maxsize=64)
def _shift_tables(length: int, levels: int) -> tuple[np.ndarray, ...]:
    """Tables of ``A(length * 2**j)`` for j in ``range(levels)``: what the tree fold applies at level j."""
    # A(n) . c = crc32(n zero bytes, starting from c) xor crc32(n zero bytes, starting from 0): zlib's
    # pre- and post-inversion cancel, leaving the linear part.
    zeros = bytes(length)
    base = crc32(zeros, 0)
    columns = np.array([crc32(zeros, int(bit)) ^ base for bit in _BIT_VALUES], dtype=np.uint32)
    out = []
    for _ in range(levels):
        out.append(_tables(columns))
        columns = _apply(out[-1], _octets(columns))  # A(2n) = A(n) . A(n)
    return tuple(out)


def combine(crcs: np.ndarray, length: int) -> int:
    """The CRC-32 of records of ``length`` bytes each, back to back, from their own ``crcs``."""
    count = len(crcs)
    if count == 0:
        return 0
    levels = (count - 1).bit_length()
    # Padded in front with the CRC of nothing (0): combining 0 with c gives c, and every right-hand operand
    # of the fold is then a whole block of length * 2**level bytes, so one map serves each level.
    folded = np.zeros(1 << levels, dtype="<u4")
    folded[len(folded) - count:] = crcs
    for tables in _shift_tables(length, levels):
        left = folded.view(np.uint8).reshape(-1, 2, 4)[:, 0]  # the bytes of every other CRC
        folded = (_apply(tables, left) ^ folded[1::2]).astype("<u4", copy=False)
    return int(folded[0])


def check_uniform(buffer: np.ndarray, payload: bytes, stride: int, count: int, stored: np.ndarray) -> None:
    """Check the CRCs of ``count`` records of ``stride`` bytes each at the start of ``buffer`` (a uint8 view
    of ``payload``), whose stored CRCs are ``stored``; ProtocolError naming the first bad record."""
    if count == 0:
        return
    starts, ends = range(0, count * stride, stride), range(stride, (count + 1) * stride, stride)
    if count < FOLD_FROM:
        records.check_crcs(payload, starts, ends, stored.tolist())
        return
    length = stride - _UNCOVERED
    covered = buffer[: stride * count].reshape(count, stride)[:, _UNCOVERED:]
    if crc32(covered.tobytes()) == combine(stored.astype(np.uint32), length):
        return
    # One by one: the error names the first bad record (each record's own CRC has the last word).
    records.check_crcs(payload, starts, ends, stored.tolist())


def uniform_positions(payload: bytes, buffer: np.ndarray, start_id: int, count: int,
                      check_crc: bool = True) -> np.ndarray | None:
    """Where the ``count`` records of ``payload`` (ids ``start_id`` on; ``buffer`` a uint8 view of it) start,
    if they are all the size of the first (the common case: fixed-size bodies), checked in bulk: every length
    and id where it must be, and the CRCs all at once (:func:`check_uniform`, ProtocolError naming a bad one)
    unless ``check_crc`` is false. None if they are not all one size, or the payload is anything else: the
    caller then walks them one by one (:func:`protocol.records.walk`), which finds and names what is wrong."""
    head_size = records.RECORD_HEAD_SIZE
    if count == 0 or len(payload) < head_size:
        return None
    stride = head_size + int.from_bytes(payload[:4], "big")
    if stride * count != len(payload):
        return None
    heads = buffer[: stride * count].reshape(count, stride)[:, :head_size]  # a view: one row per record
    lengths = heads[:, 0:4].copy().view(">u4").ravel()
    ids = heads[:, 8:16].copy().view(">u8").ravel()
    if not ((lengths == stride - head_size).all()
            and (ids == np.arange(start_id, start_id + count, dtype=np.uint64)).all()):
        return None
    if check_crc:
        check_uniform(buffer, payload, stride, count, heads[:, 4:8].copy().view(">u4").ravel())
    return np.arange(count, dtype=np.int64) * stride
