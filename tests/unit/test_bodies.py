"""One topic's PUTS bodies as columns (``protocol/bodies.py``): entry by entry the same as the msgpack entries
(indexing, negative indexes, slices that share the data, iteration), the two frames and back, what is wrong
with malformed frames, and the codec's PUTS with TOPIC."""

from __future__ import annotations

import subprocess
import sys

import pytest

from protocol import ProtocolError, mc0
from protocol.bodies import NO_HEADERS, TopicBodies, entry_topics

BODIES = [b"", b"a", b"bb", b"x" * 300, b"ccc"]


def test_entries_read_as_the_tuples_of_a_msgpack_puts() -> None:
    batch = TopicBodies.of(b"t", BODIES)
    expected = [(b"t", body, NO_HEADERS) for body in BODIES]
    assert len(batch) == len(BODIES)
    assert list(batch) == expected
    assert [batch[i] for i in range(len(BODIES))] == expected
    assert batch[-1] == (b"t", b"ccc", NO_HEADERS)
    with pytest.raises(IndexError):
        batch[len(BODIES)]
    assert batch == expected
    assert entry_topics(batch) == {b"t"}
    assert entry_topics(TopicBodies.of(b"t", [])) == set()


@pytest.mark.parametrize(("start", "stop"), [(0, 5), (1, 4), (2, None), (None, -1), (4, 2), (5, 5)])
def test_a_slice_is_the_same_entries_sharing_the_data(start: int | None, stop: int | None) -> None:
    batch = TopicBodies.of(b"t", BODIES)
    part = batch[start:stop]
    assert isinstance(part, TopicBodies)
    assert part.data is batch.data
    assert list(part) == list(batch)[start:stop]
    assert part.payload() == b"".join(BODIES[start:stop])
    assert TopicBodies.decode(b"t", part.lengths(), part.payload()) == part


def test_the_frames_decode_back() -> None:
    batch = TopicBodies.of(b"t", BODIES)
    assert batch.lengths() == b"".join(len(body).to_bytes(4, "big") for body in BODIES)
    again = TopicBodies.decode(b"t", batch.lengths(), batch.payload())
    assert list(again) == list(batch)
    data, offsets = again.columns()
    assert offsets.tolist() == [0, 0, 1, 3, 303, 306]
    assert data.tobytes() == b"".join(BODIES)


@pytest.mark.parametrize(
    ("lengths", "data", "message"),
    [(b"\x00\x00\x01", b"a", "not a multiple of 4"), (b"\x00\x00\x00\x02", b"a", "add up to 2 bytes"),
     (b"\x00\x00\x00\x01" * 2, b"abc", "the bodies frame has 3")],
)
def test_malformed_frames_say_what_is_wrong(lengths: bytes, data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TopicBodies.decode(b"t", lengths, data)


def test_the_codec_round_trips_a_puts_with_topic() -> None:
    puts = mc0.Puts(TopicBodies.of(b"t", BODIES), id=b"i1", confirm_each=True)
    decoded = mc0.decode(mc0.encode(puts))
    assert isinstance(decoded, mc0.Puts)
    assert isinstance(decoded.items, TopicBodies)
    assert (decoded.id, decoded.confirm_each, list(decoded.items)) == (b"i1", True, list(puts.items))
    with pytest.raises(ProtocolError, match="needs two frames"):
        mc0.decode([b"PUTS", b"TOPIC", b"t", b"", b"x"])


def test_importing_the_connector_leaves_numpy_for_the_first_batch() -> None:
    """An agent or a CLI command that never sends a large batch does not pay numpy's import."""
    check = ("import sys, connector; from protocol.bodies import TopicBodies; "
             "assert 'numpy' not in sys.modules; "
             "TopicBodies.of(b't', [b'a']).lengths(); assert 'numpy' in sys.modules")
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)
