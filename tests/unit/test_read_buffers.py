"""The store's kept read buffers (:mod:`broker.store.buffers`): a buffer is lent again only once nothing can
see its bytes (a view, a slice of one, libzmq still holding it), the pool stays within its bounds, and reads
through it return the file's bytes, as ``pread`` did."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.engine import Message
from broker.store import StoreError
from broker.store.buffers import COUNT, LARGEST, SMALLEST, ReadBuffers
from broker.store.log import SegmentLog
from broker.topics import Persistence, TopicSpec
from connector import zsock
from protocol import records

SIZE = 1 << 20  # a range read's size, as a Spark task's 10,000 stored messages of 100 bytes make


@pytest.fixture
def data(tmp_path: Path) -> Iterator[tuple[int, bytes, Path]]:
    """A file of distinct bytes, open for reading."""
    path = tmp_path / "data"
    content = os.urandom(3 * LARGEST)
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    yield fd, content, path
    os.close(fd)


def test_a_read_is_a_read_only_view_of_the_files_bytes(data: tuple[int, bytes, Path]) -> None:
    fd, content, path = data
    pool = ReadBuffers()
    view = pool.read(fd, SIZE, 12345, path)
    assert isinstance(view, memoryview)
    assert view.readonly
    assert bytes(view) == content[12345:12345 + SIZE]
    with pytest.raises(TypeError):
        view[0] = 0  # type: ignore[index]


def test_a_buffer_is_lent_again_only_when_no_view_of_it_is_left(data: tuple[int, bytes, Path]) -> None:
    fd, content, path = data
    pool = ReadBuffers()
    first = pool.read(fd, SIZE, 0, path)
    piece = first[100:200]  # a slice holds the buffer as its view does
    del first
    second = pool.read(fd, SIZE, SIZE, path)
    assert pool.reused == 0
    assert bytes(piece) == content[100:200]  # not overwritten by the second read
    assert bytes(second) == content[SIZE:2 * SIZE]
    del piece
    third = pool.read(fd, SIZE, 2 * SIZE, path)
    assert pool.reused == 1  # the first buffer, free again
    assert bytes(third) == content[2 * SIZE:3 * SIZE]
    assert bytes(second) == content[SIZE:2 * SIZE]


def test_the_pool_is_bounded_and_then_reads_get_bytes_of_their_own(data: tuple[int, bytes, Path]) -> None:
    fd, content, path = data
    pool = ReadBuffers()
    held = [pool.read(fd, SIZE, n * 1000, path) for n in range(COUNT)]
    assert all(isinstance(view, memoryview) for view in held)
    extra = pool.read(fd, SIZE, 7, path)
    assert type(extra) is bytes
    assert extra == content[7:7 + SIZE]
    for n, view in enumerate(held):
        assert bytes(view) == content[n * 1000:n * 1000 + SIZE]
    # Too small or too large for a kept buffer: bytes, as pread gives.
    assert type(pool.read(fd, SMALLEST - 1, 0, path)) is bytes
    assert type(pool.read(fd, LARGEST + 1, 0, path)) is bytes
    del held
    assert isinstance(pool.read(fd, LARGEST, 0, path), memoryview)  # a free one made room for a larger read


def test_a_read_past_the_end_is_short_and_a_bad_descriptor_a_store_error(
    data: tuple[int, bytes, Path],
) -> None:
    fd, content, path = data
    pool = ReadBuffers()
    tail = pool.read(fd, SIZE, len(content) - 1000, path)
    assert bytes(tail) == content[-1000:]
    closed = os.open(path, os.O_RDONLY)
    os.close(closed)
    with pytest.raises(StoreError, match="cannot read at byte 0"):
        pool.read(closed, SIZE, 0, path)


def test_libzmq_holding_a_sent_view_keeps_its_buffer_from_being_lent(data: tuple[int, bytes, Path]) -> None:
    """Over inproc, libzmq hands the very bytes to the receiver: while the receiver holds the frame, libzmq
    has not let go of them, and the pool must not fill that buffer again."""
    fd, content, path = data
    pool = ReadBuffers(count=1)
    context = zmq.Context()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        receiver.bind("inproc://buffers")
        sender.connect("inproc://buffers")
        view = pool.read(fd, SIZE, 0, path)
        zsock.send_frames(sender, [b"head", view])
        del view
        head, frame = receiver.recv(copy=False), receiver.recv(copy=False)
        assert head.bytes == b"head"
        assert type(pool.read(fd, SIZE, SIZE, path)) is bytes  # the one buffer is still libzmq's
        assert frame.buffer == content[:SIZE]  # sent without a copy, and untouched
        del frame
        deadline = time.monotonic() + 10
        while pool.reused == 0 and time.monotonic() < deadline:  # pyzmq lets go from a thread of its own
            again = pool.read(fd, SIZE, SIZE, path)
            time.sleep(0.01)
        assert pool.reused == 1
        assert bytes(again) == content[SIZE:2 * SIZE]
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()


def test_a_writable_view_is_copied_when_sent() -> None:
    """Only bytes and read-only views leave without a copy: a writable one may change after the send."""
    context = zmq.Context()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        receiver.bind("inproc://copied")
        sender.connect("inproc://copied")
        buffer = bytearray(b"a" * SIZE)
        zsock.send_frames(sender, [memoryview(buffer)])
        buffer[:] = b"b" * SIZE
        assert receiver.recv() == b"a" * SIZE
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()


def test_range_reads_of_a_log_stay_right_while_earlier_ones_are_held(tmp_path: Path) -> None:
    spec = TopicSpec(persistence=Persistence.PERSISTENT)
    log = SegmentLog(b"t", tmp_path, spec)
    try:
        for message_id in range(1, 30_001):
            log.append(Message(b"t", message_id, b"%08d" % message_id * 12, {}, 1000 + message_id))
        log.commit()
        held = []
        for start in range(1, 30_001, 6000):
            first, count, data = log.read_records(start, 6000, 16 << 20)
            assert len(data) >= SMALLEST  # large enough to come from a kept buffer
            held.append((first, count, data))
        def check(first: int, count: int, data: bytes | memoryview) -> None:
            bodies = [record.body for record in records.decode(data, first, count)]
            assert bodies == [b"%08d" % n * 12 for n in range(first, first + count)]

        for read in held:
            check(*read)
        assert log.read_buffers.reused == 0
        del held, read
        for start in range(1, 30_001, 6000):
            check(*log.read_records(start, 6000, 16 << 20))
        assert log.read_buffers.reused == 5  # each read filled a buffer the one before had let go
    finally:
        log.close()
