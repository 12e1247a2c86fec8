"""PUTS entries packed from an Arrow column in bulk (``pipeline.puts``): byte for byte what msgpack writes for
the same entries, for bodies of one size and of many, at every bin length boundary, for sliced columns and
topics of any length; and what the broker decodes from them is the bodies, in order."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.puts import pack_bodies
from protocol import mc0

BOUNDARIES = [0, 1, 255, 256, 65_535, 65_536, 70_000]


def reference(topic: bytes, bodies: list[bytes]) -> bytes:
    return mc0.pack_put_items([(topic, body, mc0.NO_HEADERS) for body in bodies])


@pytest.mark.parametrize("topic", [b"t", b"bench.sink", b"x" * 300])
@pytest.mark.parametrize("bodies", [
    [b"x" * 100] * 2000,  # one size: the strided path
    [b""] * 3,
    [b"a" * size for size in BOUNDARIES],  # every bin head width
    [bytes([n % 256]) * random.Random(n).randrange(300) for n in range(1000)],
    [b"one"],
    [b"b" * 70_000] * 3,  # one size, bin32 heads
])
def test_the_packed_entries_are_what_msgpack_writes(topic: bytes, bodies: list[bytes]) -> None:
    column = pa.array(bodies, pa.binary())
    for start, stop in ((0, len(bodies)), (1, len(bodies)), (0, len(bodies) // 2)):
        part = column.slice(start, stop - start)
        packed = mc0.PackedItems.join([pack_bodies(topic, part)], len(part))
        assert packed.payload == reference(topic, bodies[start:stop])


def test_parts_join_into_one_payload_the_broker_reads() -> None:
    column = pa.array([b"%d" % n * (n % 7) for n in range(40)], pa.binary())
    parts = [pack_bodies(b"t", column.slice(0, 15)), pack_bodies(b"t", column.slice(15, 25))]
    puts = mc0.Puts(mc0.PackedItems.join(parts, 40), id=b"1", producer=b"p", sequence=0)
    decoded = mc0.decode(mc0.encode(puts))
    assert isinstance(decoded, mc0.Puts)
    expected = [(b"t", body) for body in column.to_pylist()]
    assert [(topic, body) for topic, body, _ in decoded.items] == expected
    assert decoded.producer == b"p"
    assert pack_bodies(b"t", column.slice(0, 0)) == b""
