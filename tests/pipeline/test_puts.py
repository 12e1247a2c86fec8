"""One topic's bodies taken from slices of an Arrow column (``pipeline.puts``) as the two frames of a
``PUTS TOPIC`` (extension ``columns``): the bodies in order whatever the slices, their sizes (every msgpack
bin width the store writes) and where they start in their column's buffers; and what the broker decodes from
the frames is those bodies, with the producer and sequence the batch was sent with."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.puts import topic_bodies
from protocol import mc0
from protocol.bodies import NO_HEADERS

BOUNDARIES = [0, 1, 255, 256, 65_535, 65_536, 70_000]


@pytest.mark.parametrize("bodies", [
    [b"x" * 100] * 2000,
    [b""] * 3,
    [b"a" * size for size in BOUNDARIES],
    [bytes([n % 256]) * random.Random(n).randrange(300) for n in range(1000)],
    [b"one"],
    [b"b" * 70_000] * 3,
])
def test_the_bodies_of_any_slices_in_order(bodies: list[bytes]) -> None:
    column = pa.array(bodies, pa.binary())
    half = len(bodies) // 2
    cases = [([column], bodies), ([column.slice(1)], bodies[1:]), ([column.slice(0, half)], bodies[:half]),
             ([column.slice(0, half), column.slice(half)], bodies)]
    for slices, expected in cases:
        batch = topic_bodies(b"t", slices)
        assert list(batch) == [(b"t", body, NO_HEADERS) for body in expected]
        assert batch.payload() == b"".join(expected)


def test_the_frames_decode_to_the_rows_with_the_producer() -> None:
    column = pa.array([b"%d" % n * (n % 7) for n in range(40)], pa.binary())
    batch = topic_bodies(b"t", [column.slice(0, 15), column.slice(15, 25)])
    frames = mc0.encode(mc0.Puts(batch, id=b"1", producer=b"p", sequence=0))
    assert frames[:4] == [b"", b"PUTS", mc0.TOPIC, b"t"]
    decoded = mc0.decode(frames)
    assert isinstance(decoded, mc0.Puts)
    expected = [(b"t", body) for body in column.to_pylist()]
    assert [(topic, body) for topic, body, _ in decoded.items] == expected
    assert (decoded.producer, decoded.sequence, decoded.id) == (b"p", 0, b"1")


def test_no_rows() -> None:
    empty = pa.array([], pa.binary())
    assert len(topic_bodies(b"t", [empty])) == 0
    assert len(topic_bodies(b"t", [pa.array([b"a", b"b"], pa.binary()).slice(2)])) == 0
