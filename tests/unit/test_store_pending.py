"""Bytes a log has appended and not yet written (:mod:`broker.store.pending`): copied records and handed-over
batches come out in order at the offset given, in one ``pwritev`` when the system takes it all, and whole when
it takes only part or when there are more pieces than one call carries."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import numpy as np
import pytest

from broker.store import StoreError
from broker.store import segment as segment_module
from broker.store.pending import PendingBytes


def written(tmp_path: Path, pending: PendingBytes) -> bytes:
    """The file after ``pending`` was written at byte 7 of it, after ``before|``, with the descriptor's own
    position left at 0 (a segment's writes say where they go)."""
    path = tmp_path / "segment"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"before|")
        os.lseek(fd, 0, os.SEEK_SET)
        pending.write(fd, path, 7)
    finally:
        os.close(fd)
    return path.read_bytes()


def mixed() -> tuple[PendingBytes, bytes]:
    """Copied records around handed-over batches, as a loop turn of single publishes and PUTS leaves them."""
    pending = PendingBytes(b"HEAD")
    expected = b"HEAD"
    for n in range(20):
        record = bytes([65 + n]) * (n + 1)
        pending.tail += record
        expected += record
        if n % 3 == 0:
            batch = np.frombuffer(os.urandom(100 + n), dtype=np.uint8).copy()
            pending.hand_over(memoryview(batch)[n:])
            expected += batch[n:].tobytes()
    return pending, expected


def counted_writevs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many buffers each ``os.pwritev`` call is given, from now on."""
    calls: list[int] = []
    real = os.pwritev

    def counting(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", counting)
    return calls


def test_pieces_come_out_in_order_with_one_writev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pending, expected = mixed()
    calls = counted_writevs(monkeypatch)
    assert len(pending) == len(expected)
    assert bytes(pending) == expected
    assert written(tmp_path, pending) == b"before|" + expected
    assert len(calls) == 1


def test_a_handed_over_buffer_is_not_copied(tmp_path: Path) -> None:
    batch = bytearray(b"0123456789")
    pending = PendingBytes()
    pending.hand_over(memoryview(batch))
    batch[0:1] = b"X"  # what is written is the owner's bytes themselves, as they are when written
    assert written(tmp_path, pending) == b"before|X123456789"


def test_a_partial_write_goes_on_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pending, expected = mixed()
    real = os.pwritev
    calls = 0

    def stingy(fd: int, buffers: list[memoryview], offset: int) -> int:
        nonlocal calls
        calls += 1
        first = bytes(next(buffer for buffer in buffers if len(buffer)))
        return real(fd, [first[:7]], offset)  # the kernel takes at most 7 bytes of the first piece

    monkeypatch.setattr(os, "pwritev", stingy)
    assert written(tmp_path, pending) == b"before|" + expected
    assert calls > len(expected) // 7


def test_more_pieces_than_one_call_carries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment_module, "IOV_MAX", 3)
    pending, expected = mixed()
    sizes = counted_writevs(monkeypatch)
    assert written(tmp_path, pending) == b"before|" + expected
    assert max(sizes) == 3
    assert len(sizes) > 4


def test_a_view_of_wider_items_counts_its_bytes(tmp_path: Path) -> None:
    ids = array("Q", [1, 2, 3])
    pending = PendingBytes(b"<")
    pending.hand_over(memoryview(ids))
    pending.hand_over(memoryview(b""))  # nothing: no piece
    pending.tail += b">"
    assert len(pending) == 1 + 24 + 1
    assert written(tmp_path, pending) == b"before|<" + ids.tobytes() + b">"


def test_empty_and_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not PendingBytes()
    assert PendingBytes(b"x")
    handed = PendingBytes()
    handed.hand_over(memoryview(b"y"))
    assert handed
    assert written(tmp_path, PendingBytes()) == b"before|"

    def full(fd: int, buffers: list[memoryview], offset: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    with pytest.raises(StoreError, match=r"segment: write failed: .*No space left"):
        written(tmp_path, PendingBytes(b"data"))


def test_without_an_offset_the_descriptors_position_is_used(tmp_path: Path) -> None:
    """The journals append through the same loop, at their descriptor's position (``O_APPEND``)."""
    path = tmp_path / "journal"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        segment_module.write_all(fd, b"one|", path)
        segment_module.write_gathered(fd, [b"two", memoryview(b"|three")], path)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"one|two|three"
