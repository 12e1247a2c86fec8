"""Bytes appended to a segment and not yet written: small records copied into one buffer, the records of a
bulk-encoded batch kept where the encoder made them, and all of it written with ``writev``.

The log used to copy everything into one ``bytearray``. A loop turn that takes several batches of a
pipelining publisher (a Spark write task keeps four in flight, and there are two tasks) grew that buffer past
a MiB, and the broker gives every allocation of a MiB or more pages of its own
(:func:`broker.server.return_large_frees`), each faulted in, the kernel zeroing it first, as the buffer grew,
and unmapped once written. Measured, the log alone storing 2,000-row batches of 100-byte bodies eight to a
turn: 29,000-42,000 page faults per million rows and 0.46-0.69 us a row; kept where they were encoded, no
faults and 0.36-0.56 us (one batch a turn, which never grew the buffer that far: 0.37 us either way).

A batch's records (:func:`broker.store.batch.encode_plain`, about 240 KB for 2,000 rows of 100 bytes) are a
heap allocation the encoder made anyway: :meth:`PendingBytes.hand_over` keeps a view of them, and the write
gathers the pieces in one system call.

Single-threaded, as the store is: the broker's loop is the only caller.
"""

from __future__ import annotations

from pathlib import Path

from broker.store.segment import write_gathered


class PendingBytes:
    """Bytes to be written at the end of a file, in order: :attr:`tail` takes copies (``tail += record``, a
    record at a time, as cheap as a bytearray is), :meth:`hand_over` keeps a buffer nobody will change
    again."""

    __slots__ = ("_before_tail", "_pieces", "tail")

    def __init__(self, first: bytes = b"") -> None:
        self.tail = bytearray(first)  # where copied bytes go: the last piece
        self._pieces: list[bytearray | memoryview] = [self.tail]
        self._before_tail = 0  # bytes in the pieces before the tail

    def hand_over(self, data: memoryview) -> None:
        """Append ``data`` without a copy: its owner gives it up (it must not change until written)."""
        data = data.cast("B")
        if not data.nbytes:
            return
        self._before_tail += len(self.tail) + data.nbytes
        self._pieces.append(data)
        self.tail = bytearray()
        self._pieces.append(self.tail)

    def __len__(self) -> int:
        return self._before_tail + len(self.tail)

    def __bool__(self) -> bool:
        return bool(self._before_tail or self.tail)

    def __bytes__(self) -> bytes:
        return b"".join(self._pieces)

    def write(self, fd: int, path: Path, offset: int) -> None:
        """Write every byte at byte ``offset`` of the file: one ``pwritev`` in the normal case
        (:func:`broker.store.segment.write_gathered`)."""
        write_gathered(fd, self._pieces, path, offset)
