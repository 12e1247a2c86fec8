"""PUTS entries of one topic without headers, as two columns: the bodies back to back, and where each ends.

This is the payload of extension ``columns`` (docs/mc0.md): ``PUTS TOPIC t ... '' lengths bodies``, each
body's length a 4-byte big-endian integer in the first frame, the bodies back to back in the second. Nothing
is made per entry to send it or to take it in: the Spark sink hands over an Arrow column's buffers, and the
broker's store lays the records out from the two columns in bulk (:mod:`broker.store.batch`).

Entry by entry, a :class:`TopicBodies` reads as the list of ``(topic, body, headers)`` tuples a msgpack PUTS
decodes to, so every path of the broker that takes entries one at a time (a topic with readers online, a
``CONFIRM each``) takes these unchanged.

Why: a broker storing the Spark sink's 2,000-entry batches spent about half of its time in decoding the
msgpack entries into tuples and walking them (the entries' checks, their topics, their bodies), measured with
cProfile, where the store's own bulk work on the same rows is a fraction of a microsecond each.

numpy is loaded when a batch is first made or taken in, not with this module: the connector imports it, and
an agent or a CLI command that never sends a large batch should not wait for numpy's import (about 60 ms
here, measured with ``-X importtime``). The broker has it loaded from start-up (the store uses it).

This module knows the two frames and numpy, nothing about sockets or the broker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    import numpy as np

#: Shared by every header-less PUTS entry; treated as read-only everywhere.
NO_HEADERS: dict[bytes, bytes] = {}

_LENGTH = ">u4"  # each body's length on the wire


class TopicBodies(Sequence[tuple[bytes, bytes, dict[bytes, bytes]]]):
    """Entries of ``topic`` without headers: entry ``i``'s body is ``data[offsets[i]:offsets[i + 1]]``.

    ``offsets`` (int64, one more than there are entries) need not start at 0: a slice of a batch shares its
    data."""

    __slots__ = ("data", "offsets", "topic")

    def __init__(self, topic: bytes, data: bytes, offsets: np.ndarray) -> None:
        self.topic = topic
        self.data = data
        self.offsets = offsets

    @classmethod
    def decode(cls, topic: bytes, lengths: bytes, data: bytes) -> TopicBodies:
        """The entries of the two frames; ValueError saying what is wrong with them."""
        import numpy as np

        if len(lengths) % 4:
            raise ValueError(f"the lengths frame has {len(lengths)} bytes, not a multiple of 4")
        offsets = np.zeros(len(lengths) // 4 + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(lengths, dtype=_LENGTH), out=offsets[1:])
        if int(offsets[-1]) != len(data):
            raise ValueError(f"the lengths add up to {int(offsets[-1])} bytes, the bodies frame has "
                             f"{len(data)}")
        return cls(topic, data, offsets)

    @classmethod
    def of(cls, topic: bytes, bodies: Sequence[bytes]) -> TopicBodies:
        """``bodies`` (bytes each) as one batch of ``topic``."""
        import numpy as np

        offsets = np.zeros(len(bodies) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, bodies), dtype=np.int64, count=len(bodies)), out=offsets[1:])
        return cls(topic, b"".join(bodies), offsets)

    def lengths(self) -> bytes:
        """The first frame: each body's length, 4 bytes big-endian."""
        import numpy as np

        return np.diff(self.offsets).astype(_LENGTH).tobytes()

    def payload(self) -> bytes:
        """The second frame: the bodies back to back."""
        start, end = int(self.offsets[0]), int(self.offsets[-1])
        return self.data if start == 0 and end == len(self.data) else self.data[start:end]

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """The bodies as a uint8 array and the offsets into it: what the store's bulk encoder takes."""
        import numpy as np

        return np.frombuffer(self.data, dtype=np.uint8), self.offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> tuple[bytes, bytes, dict[bytes, bytes]]: ...

    @overload
    def __getitem__(self, index: slice) -> TopicBodies: ...

    def __getitem__(self, index: int | slice) -> tuple[bytes, bytes, dict[bytes, bytes]] | TopicBodies:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("TopicBodies slices take no step")
            return TopicBodies(self.topic, self.data, self.offsets[start : max(start, stop) + 1])
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("TopicBodies index out of range")
        return self.topic, self.data[int(self.offsets[index]) : int(self.offsets[index + 1])], NO_HEADERS

    def __iter__(self) -> Iterator[tuple[bytes, bytes, dict[bytes, bytes]]]:
        topic, data = self.topic, self.data
        for start, end in pairwise(self.offsets.tolist()):
            yield topic, data[start:end], NO_HEADERS

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TopicBodies):
            return (self.topic == other.topic and self.lengths() == other.lengths()
                    and self.payload() == other.payload())
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, compared by value like a list

    def __repr__(self) -> str:
        return f"TopicBodies({self.topic!r}, {len(self)} entries, {len(self.payload())} bytes)"


def entry_topics(items: Sequence[tuple[bytes, bytes, dict[bytes, bytes]]]) -> set[bytes]:
    """The topics a batch of PUTS entries names."""
    if type(items) is TopicBodies:
        return {items.topic} if len(items) else set()
    return {item[0] for item in items}
