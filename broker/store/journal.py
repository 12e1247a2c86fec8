"""The file under a topic's journals (acks, producers): an append-only file of CRC-checked records beside the
segments.

:class:`JournalFile` owns the descriptor and what every journal does with it alike: open and read it whole at
start, cut a torn tail durably, append (creating the file on the first write, or reopening it after the store
let it go) inside space reserved ahead of its records as a segment does
(:func:`broker.store.segment.reserve_ahead`: an fsync that need not commit a new file length is cheaper),
fsync, and rewrite it atomically as a compact state. What the records mean, and when to write or fsync, belong
to the journals (:mod:`broker.store.acks`, :mod:`broker.store.producers`) and the log.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from broker.store import StoreError
from broker.store.segment import (
    cut,
    fsync,
    open_file,
    pread_exact,
    replace_file,
    reserve_ahead,
    write_all,
    written_length,
)

log = logging.getLogger("mc0.store")


class JournalFile:
    """One journal's file: ``size`` bytes of good records (``reserved``: the file's length, ``size`` or more),
    ``unsynced`` after a write until the fsync, and ``created`` while the file's name is new since the last
    fsync of its directory."""

    #: What the journal is called in the log's warnings.
    what = "journal"
    #: Whether appends go inside space reserved ahead of the records (set by the log: strong topics only).
    reserving = False

    def __init__(self, path: Path, compact_bytes: int) -> None:
        self.path = path
        self.compact_bytes = compact_bytes  # past this size the journal is rewritten as its state
        self.size = 0
        self.reserved = 0
        self.unsynced = False
        self.created = False
        self._fd: int | None = None

    def _read_existing(self) -> bytes | None:
        """Open the file, keep it open for appends, and return its bytes; None when there is no file."""
        try:
            fd = open_file(self.path, os.O_RDWR)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        self._fd = fd
        self.reserved = os.fstat(fd).st_size
        return pread_exact(fd, self.reserved, 0, self.path)

    def _keep(self, data: bytes, good: int, reason: str | None = None) -> None:
        """Keep the first ``good`` bytes of the file, whose bytes :meth:`_read_existing` returned as ``data``:
        a torn tail is cut, durably, and logged (the space reserved after the records without a word)."""
        if good < len(data):
            assert self._fd is not None  # read by _read_existing
            torn = written_length(memoryview(data)[good:], len(data))
            cut(self._fd, good, self.path)
            fsync(self._fd, self.path)
            if torn:
                log.warning("%s: recovery truncated %d bytes of torn %s tail at byte %d (%s)", self.path,
                            torn, self.what, good, reason or "incomplete record")
        self.size = self.reserved = good

    def _append(self, data: bytes | bytearray) -> None:
        """One write of ``data`` at the end, creating the file if there is none (or reopening it after the
        store let it go)."""
        if self._fd is None:
            try:
                self.created = not self.path.exists()
                self._fd = open_file(self.path, os.O_RDWR | os.O_CREAT)
                self.reserved = os.fstat(self._fd).st_size
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        end = self.size + len(data)
        if end > self.reserved:
            self.reserved = reserve_ahead(self._fd, end, self.path) if self.reserving else end
        write_all(self._fd, data, self.path, self.size)
        self.size = end
        self.unsynced = True

    def trim(self) -> None:
        """End the file at its last record again, cutting the space reserved after it (before the file is let
        go). Durable with the next fsync; a crash before it leaves zero bytes that recovery cuts again."""
        if self._fd is not None and self.reserved > self.size:
            cut(self._fd, self.size, self.path)
            self.reserved = self.size

    def _rewrite(self, data: bytes) -> None:
        """Replace the file by ``data``, atomically: tmp file, fsync, rename, fsync the directory."""
        fd = replace_file(self.path, data)
        self.close()
        self._fd = fd
        self.size = self.reserved = len(data)
        self.unsynced = False
        self.created = False

    def fsync(self) -> None:
        if self.unsynced and self._fd is not None:
            fsync(self._fd, self.path)
        self.unsynced = False

    @property
    def open_files(self) -> int:
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as exc:
                raise StoreError(f"{self.path}: close failed: {exc}") from exc
