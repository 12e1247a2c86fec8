"""Buffers that range reads fill again and again: the stored bytes of a ``FETCH ... FORMAT records`` reply.

A large range read was a fresh allocation each time. The broker gives every allocation of a MiB or more pages
of its own, unmapped when freed (:func:`broker.server.return_large_frees`: so that a few huge messages do
not leave it larger for good), so each reply of a MiB or more was mapped, faulted in a page at a time as
``pread`` filled it (the kernel zeroing each page first), and unmapped again once libzmq had sent it.
Measured: reading 1,000,000 stored 100-byte messages in ranges of 10,000 cost the broker 31,500 page faults
and 0.09-0.12 CPU-s, nearly all of it in the kernel; the same reads into kept pages, 0 faults and 0.04-0.06
CPU-s.

:class:`ReadBuffers` keeps a few buffers and lends them out as read-only memoryviews. libzmq sends such a
view without a copy (:mod:`connector.zsock`), and pyzmq holds on to it until libzmq is done with the bytes.
A memoryview, and every view cut from it, holds a reference to the bytearray under it (CPython), and nothing
but this pool ever holds the bytearray itself: so a buffer is lent again only when the pool's reference is
the only one left, which is when nobody can see its bytes any more. Bounded: at most :data:`COUNT` buffers
of at most :data:`LARGEST` bytes each. A read that is larger, or that finds every buffer still on its way to
a client, gets bytes of its own, as before.

Single-threaded, as the store is: the broker's loop is the only caller.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from broker.store import StoreError
from broker.store.segment import pread_exact

#: Buffers kept: replies to a few clients reading at once (each has one range in flight, often two).
COUNT = 4
#: The largest buffer kept, and so the most this keeps in all: COUNT x LARGEST (16 MiB). A larger read
#: (up to a FETCH's 16 MiB cap) gets bytes of its own.
LARGEST = 4 << 20
#: Reads shorter than this get bytes of their own: the heap serves them without a page of their own.
SMALLEST = 64 << 10
#: A new buffer's size: the read's, rounded up to this, so that a little more next time fits too.
GRAIN = 256 << 10


class ReadBuffers:
    """Up to :data:`COUNT` reusable buffers for range reads (see the module's docstring)."""

    def __init__(self, count: int = COUNT, largest: int = LARGEST) -> None:
        self.count = count
        self.largest = largest
        self._buffers: list[bytearray] = []
        self.reused = 0  # reads that filled a buffer kept from an earlier one (the tests read it)

    def read(self, fd: int, size: int, offset: int, path: Path) -> bytes | memoryview:
        """``size`` bytes of ``fd`` at ``offset`` (fewer only at the end of the file): a read-only view of
        a kept buffer when one is free, else bytes. OSError becomes StoreError."""
        buffer = self._lend(size) if SMALLEST <= size <= self.largest else None
        if buffer is None:
            return pread_exact(fd, size, offset, path)
        view = memoryview(buffer)
        done = 0
        try:
            while done < size:  # a short read is legal for preadv; only the end of the file stops us
                got = os.preadv(fd, [view[done:size]], offset + done)
                if not got:
                    break
                done += got
        except OSError as exc:
            raise StoreError(f"{path}: cannot read at byte {offset}: {exc}") from exc
        return view[:done].toreadonly()

    def _lend(self, size: int) -> bytearray | None:
        """A kept buffer of at least ``size`` bytes that nobody holds, made if there is room; else None."""
        buffers = self._buffers
        smaller = -1
        for index in range(len(buffers)):
            # Two references: the list's and this call's argument. A third is a view still out there.
            if sys.getrefcount(buffers[index]) == 2:
                if len(buffers[index]) >= size:
                    self.reused += 1
                    return buffers[index]
                smaller = index
        fresh = bytearray(min(self.largest, -(-size // GRAIN) * GRAIN))
        if len(buffers) < self.count:
            buffers.append(fresh)
        elif smaller >= 0:  # the free ones are all too small: one of them makes room
            buffers[smaller] = fresh
        else:
            return None
        return fresh
