"""PUTS entries packed from an Arrow column of bodies, in bulk: the bytes msgpack would write for
``[[topic, body], ...]``, built with numpy without a Python object per row.

Each entry is ``0x92`` (an array of two), the topic as msgpack bin (the same bytes for every entry), and the
body as bin: ``0xc4`` and a one-byte length below 256 bytes, ``0xc5`` and two bytes below 64 KiB, ``0xc6``
and four otherwise. The constant part and the length heads are written where they go by index; the bodies
are copied in one strided copy when they are all one size, and through one mask otherwise (as
:mod:`pipeline.arrow` cuts them out of a records reply, the other way round).

Why: the sink turned each row into a Python bytes object and a tuple (``to_pylist``, then the connector's
checks and msgpack), about 1.2 us a row on the executor in one process (bench/spark.py's profile), as much as
Spark's whole share of a write; this costs about 0.1 us.

This module knows msgpack's layout and Arrow, nothing about Spark or the broker.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa

_BIN8, _BIN16, _BIN32 = 0xC4, 0xC5, 0xC6
_PAIR = 0x92


def pack_bodies(topic: bytes, values: pa.Array) -> bytes:
    """The entries ``[topic, body]`` for each body of ``values`` (a ``binary`` array without nulls), packed
    back to back: the part of a PUTS payload after its array head (:meth:`protocol.mc0.PackedItems.join`)."""
    count = len(values)
    if count == 0:
        return b""
    _, offset_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int32, count=count + 1,
                            offset=4 * values.offset).astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    prefix = np.frombuffer(bytes([_PAIR]) + msgpack.packb(topic, use_bin_type=True), dtype=np.uint8)
    heads = np.where(lengths < 1 << 8, 2, np.where(lengths < 1 << 16, 3, 5))
    sizes = len(prefix) + heads + lengths
    ends = np.cumsum(sizes)
    starts = ends - sizes
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    at = starts + len(prefix)  # where each body's bin head goes
    bodies = data[int(offsets[0]) : int(offsets[-1])]
    if (sizes == sizes[0]).all():
        # One size: every entry is the same layout at a fixed stride, so each part is one strided copy.
        stride, length, head = int(sizes[0]), int(lengths[0]), int(heads[0])
        rows = np.lib.stride_tricks.as_strided(out, shape=(count, stride), strides=(stride, 1))
        rows[:, : len(prefix)] = prefix
        rows[:, len(prefix) : len(prefix) + head] = np.frombuffer(_bin_head(length), dtype=np.uint8)
        rows[:, len(prefix) + head :] = bodies.reshape(count, length)
        return out.tobytes()
    out[starts[:, None] + np.arange(len(prefix))] = prefix
    out[at] = np.where(heads == 2, _BIN8, np.where(heads == 3, _BIN16, _BIN32))
    for width in (1, 2, 4):
        chosen = heads == width + 1
        if chosen.any():
            for byte in range(width):  # big-endian length bytes after the marker
                shift = 8 * (width - 1 - byte)
                out[at[chosen] + 1 + byte] = (lengths[chosen] >> shift) & 0xFF
    body_at = at + heads
    runs = np.empty(2 * count, dtype=np.int64)  # alternating: what is not a body, then a body
    runs[0::2] = body_at - np.concatenate(([0], body_at[:-1] + lengths[:-1]))
    runs[1::2] = lengths
    kinds = np.zeros(2 * count, dtype=np.bool_)
    kinds[1::2] = True
    mask = np.repeat(kinds, runs)
    out[: len(mask)][mask] = bodies
    return out.tobytes()


def _bin_head(length: int) -> bytes:
    if length < 1 << 8:
        return bytes([_BIN8, length])
    if length < 1 << 16:
        return bytes([_BIN16]) + length.to_bytes(2, "big")
    return bytes([_BIN32]) + length.to_bytes(4, "big")
