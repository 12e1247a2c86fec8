"""The records of a batch of plain entries, encoded in bulk: byte for byte what :meth:`SegmentLog.append`
buffers for each entry (docs/storage.md, "Records"), without a Python object or a packer call per entry.

A plain entry has a body and no headers, as nearly every entry of a ``publish_batch`` or a Spark write has.
Its record is the head (payload length, CRC-32 of the id bytes and the payload, id: ``>IIQ``) and the payload
``[timestamp, {}, body]`` in msgpack, the same timestamp for the whole batch. :func:`protocol.bulk.lay_out`
lays out the payloads after room for the heads; the lengths and ids go into the heads by index; then one
CRC-32 per record (:mod:`protocol.checksum`), over the id and payload, which lie side by side in the record.

Why: a profile of a broker storing ``publish_batch`` entries had three quarters of its time in encoding
records one by one, about 1.2 us an entry (msgpack, the CRC and the head, the buffer's bookkeeping); this
costs about 0.3 us.

numpy is loaded with the store, at start-up (about 65 ms and 7 MB): loaded on the first large batch instead,
it stalled the loop, and every connection with it, for as long.
"""

from __future__ import annotations

import msgpack
import numpy as np

from broker.store.segment import RECORD_HEAD_SIZE
from protocol.bulk import lay_out
from protocol.checksum import crc32

_TRIPLE, _EMPTY_MAP = b"\x93", b"\x80"
_ID_AND_PAYLOAD = 8  # where the CRC's input begins in a record: after the length and the CRC itself


def encode_plain(
    first_id: int, timestamp: int, data: np.ndarray, offsets: np.ndarray
) -> tuple[memoryview, list[int], list[int]]:
    """The records of the bodies ``data[offsets[i]:offsets[i + 1]]`` as ids ``first_id`` on, all with
    ``timestamp``, back to back; and where each begins and ends in them (lists: the log cuts them into
    segments with bisect)."""
    count = len(offsets) - 1
    prefix = _TRIPLE + msgpack.packb(timestamp) + _EMPTY_MAP
    out, starts, ends = lay_out(RECORD_HEAD_SIZE, prefix, data, offsets)
    if count == 0:
        return memoryview(b""), [], []
    heads = np.zeros((count, RECORD_HEAD_SIZE), dtype=np.uint8)
    heads[:, 0:4] = (ends - starts - RECORD_HEAD_SIZE).astype(">u4").view(np.uint8).reshape(count, 4)
    ids = np.arange(first_id, first_id + count, dtype=np.uint64)
    heads[:, 8:16] = ids.astype(">u8").view(np.uint8).reshape(count, 8)
    places = starts[:, None] + np.arange(RECORD_HEAD_SIZE)
    out[places] = heads
    view = memoryview(out)
    begins, finishes = starts.tolist(), ends.tolist()
    crcs = [crc32(view[begin + _ID_AND_PAYLOAD : end]) for begin, end in zip(begins, finishes, strict=True)]
    out[places[:, 4:8]] = np.array(crcs, dtype=">u4").view(np.uint8).reshape(count, 4)
    return view, begins, finishes
