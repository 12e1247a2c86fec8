"""Topic names in byte order, for paging through a great many of them (STATS, ``mc0 topics``).

:class:`SortedNames` keeps the names in sorted chunks of at most ``CHUNK`` names (the layout of the
``sortedcontainers`` package, cut down to what paging needs): adding or removing a name costs a binary search
and a short list operation whatever the order names come in, and a page of ``n`` names after a cursor costs a
binary search and ``n`` steps. It knows nothing of topics beyond their names.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator

#: Names per chunk: a list operation on 512 pointers is a fraction of a microsecond; a chunk is split when it
#: reaches twice this.
CHUNK = 512


class SortedNames:
    """A sorted set of byte strings, in chunks."""

    def __init__(self) -> None:
        self._chunks: list[list[bytes]] = []
        self._lasts: list[bytes] = []  # the last name of each chunk, for the binary search
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, name: bytes) -> bool:
        index = bisect_left(self._lasts, name)
        if index == len(self._chunks):
            return False
        chunk = self._chunks[index]
        position = bisect_left(chunk, name)
        return position < len(chunk) and chunk[position] == name

    def add(self, name: bytes) -> None:
        if name in self:
            return
        chunks, lasts = self._chunks, self._lasts
        self._count += 1
        if not chunks:
            chunks.append([name])
            lasts.append(name)
            return
        index = min(bisect_left(lasts, name), len(chunks) - 1)
        chunk = chunks[index]
        insort(chunk, name)
        lasts[index] = chunk[-1]
        if len(chunk) >= 2 * CHUNK:
            chunks[index : index + 1] = [chunk[:CHUNK], chunk[CHUNK:]]
            lasts[index : index + 1] = [chunk[CHUNK - 1], chunk[-1]]

    def discard(self, name: bytes) -> None:
        chunks, lasts = self._chunks, self._lasts
        index = bisect_left(lasts, name)
        if index == len(chunks):
            return
        chunk = chunks[index]
        position = bisect_left(chunk, name)
        if position == len(chunk) or chunk[position] != name:
            return
        del chunk[position]
        self._count -= 1
        if chunk:
            lasts[index] = chunk[-1]
        else:
            del chunks[index]
            del lasts[index]

    def after(self, cursor: bytes | None, prefix: bytes = b"") -> Iterator[bytes]:
        """Names greater than ``cursor`` (all when None) that start with ``prefix``, in order."""
        if cursor is None or cursor < prefix:
            low, find = prefix, bisect_left  # from the prefix itself, included
        else:
            low, find = cursor, bisect_right  # after the cursor
        chunks = self._chunks
        first = find(self._lasts, low)
        for number in range(first, len(chunks)):
            chunk = chunks[number]
            for name in chunk[find(chunk, low):] if number == first else chunk:
                if not name.startswith(prefix):
                    return  # sorted: once past the prefix's names, none come back
                yield name
