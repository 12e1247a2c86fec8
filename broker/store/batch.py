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


#: msgpack's unsigned integer markers and the bytes that follow each (a positive fixint is its own value).
_UINT_BYTES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_BIN_HEADS = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def plain_run(buffer: np.ndarray, stride: int, count: int) -> bool:
    """Whether ``count`` records of ``stride`` bytes each, back to back in ``buffer`` (uint8; lengths, ids
    and CRCs already checked), all hold a plain payload laid out as the first one's: ``[unsigned timestamp,
    {}, bin body]`` with the timestamp's marker and the body's head and length the same in every record. Such
    payloads are well-formed msgpack of the store's shape by construction, whatever their timestamps; False
    for anything else (headers, another layout), which the caller then decodes record by record.

    Why: a cluster follower checks every record it copies, and decoding each payload with msgpack was half of
    its 1.8-2.5 us a record."""
    if count == 0 or stride < RECORD_HEAD_SIZE + 4:
        return False
    payload = RECORD_HEAD_SIZE
    marker = int(buffer[payload + 1])
    width = _UINT_BYTES.get(marker, 0 if marker < 0x80 else -1)
    if width < 0 or buffer[payload] != _TRIPLE[0]:
        return False
    head_at = payload + 2 + width  # the empty map, then the body's bin head
    if head_at + 2 > stride or buffer[head_at] != _EMPTY_MAP[0]:
        return False
    length_bytes = _BIN_HEADS.get(int(buffer[head_at + 1]), 0)
    body_at = head_at + 2 + length_bytes
    if not length_bytes or body_at > stride:
        return False
    if int.from_bytes(buffer[head_at + 2 : body_at].tobytes(), "big") != stride - body_at:
        return False
    rows = buffer[: stride * count].reshape(count, stride)
    if width == 0:
        same_marker = bool((rows[:, payload + 1] < 0x80).all())
    else:
        same_marker = bool((rows[:, payload + 1] == marker).all())
    return (same_marker and bool((rows[:, payload] == _TRIPLE[0]).all())
            and bool((rows[:, head_at:body_at] == rows[0, head_at:body_at]).all()))
