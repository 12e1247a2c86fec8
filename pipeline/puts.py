"""A PUTS batch of one topic straight from slices of an Arrow column of bodies: the columns of extension
``columns`` (:class:`protocol.bodies.TopicBodies`), taken from the Arrow buffers without a Python object per
row.

An Arrow ``binary`` array already is what that PUTS sends: the bodies back to back in its data buffer, and
where each ends in its offsets buffer. The slices a write task gathers for one batch are joined (one copy of
their bodies), and their offsets become the lengths frame.

Why: the sink turned each row into a Python bytes object and a tuple (``to_pylist``, then the connector's
checks and msgpack), about 1.2 us a row on the executor in one process (bench/spark.py's profile), as much as
Spark's whole share of a write; and the broker then decoded every msgpack entry back into a tuple, about half
of what storing a row cost it.

This module knows Arrow, nothing about Spark or the broker.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from protocol.bodies import TopicBodies


def topic_bodies(topic: bytes, values: Sequence[pa.Array]) -> TopicBodies:
    """The bodies of ``values`` (``binary`` arrays without nulls, in order) as one batch of ``topic``."""
    column = pa.concat_arrays(list(values)) if len(values) != 1 else values[0]
    count = len(column)
    _, offset_buffer, data_buffer = column.buffers()
    if count == 0 or data_buffer is None:
        return TopicBodies(topic, b"", np.zeros(count + 1, dtype=np.int64))
    offsets = np.frombuffer(offset_buffer, dtype=np.int32, count=count + 1,
                            offset=4 * column.offset).astype(np.int64)
    first = int(offsets[0])
    data = data_buffer.slice(first, int(offsets[-1]) - first).to_pybytes()
    return TopicBodies(topic, data, offsets - first)
