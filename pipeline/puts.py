"""PUTS entries packed from an Arrow column of bodies, in bulk: the bytes msgpack would write for
``[[topic, body], ...]``, built with numpy without a Python object per row.

Each entry is ``0x92`` (an array of two), the topic as msgpack bin (the same bytes for every entry), and the
body as bin, laid out by :func:`protocol.bulk.lay_out` straight from the Arrow buffers.

Why: the sink turned each row into a Python bytes object and a tuple (``to_pylist``, then the connector's
checks and msgpack), about 1.2 us a row on the executor in one process (bench/spark.py's profile), as much as
Spark's whole share of a write; this costs about 0.1 us.

This module knows msgpack's layout and Arrow, nothing about Spark or the broker.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa

from protocol.bulk import lay_out

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
    prefix = bytes([_PAIR]) + msgpack.packb(topic, use_bin_type=True)
    return lay_out(0, prefix, data, offsets).out.tobytes()
