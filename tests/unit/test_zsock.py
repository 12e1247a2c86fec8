"""Frame-set I/O without pyzmq's convenience layer (``connector.zsock``): frame sets arrive whole and in
order, a large ``bytes`` payload (sent without a copy) arrives intact, and a large mutable buffer is copied
when sent, so changing it afterwards changes nothing that was sent; a ROUTER's message comes with its identity
frame, whose metadata says who sent it; the pending events say what the socket can do now."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from connector.zsock import (
    POLLIN,
    POLLOUT,
    ZERO_COPY_MIN,
    pending_events,
    readable,
    recv_frames,
    recv_routed,
    send_frames,
    send_to,
)


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    left, right = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    left.bind("inproc://zsock-test")
    right.connect("inproc://zsock-test")
    yield left, right
    left.close(linger=0)
    right.close(linger=0)
    context.term()


def receive(socket: zmq.Socket) -> list[bytes]:
    assert socket.poll(5000), "nothing arrived"
    assert readable(socket)
    return recv_frames(socket)


def test_frame_sets_arrive_whole_and_in_order(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    left, right = pair
    assert not readable(right)
    send_frames(left, [b"", b"PUT", b"TOPIC", b"t", b"", b"body"])
    send_frames(left, [b"one"])
    send_to(left, b"identity", [b"", b"OK"])
    assert receive(right) == [b"", b"PUT", b"TOPIC", b"t", b"", b"body"]
    assert receive(right) == [b"one"]
    assert receive(right) == [b"identity", b"", b"OK"]
    assert not readable(right)


def test_pending_events_say_what_the_socket_can_do_now(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    left, right = pair
    assert pending_events(right) == POLLOUT  # connected, room to send, nothing to read
    send_frames(left, [b"ping"])
    assert right.poll(5000)
    assert pending_events(right) == POLLIN | POLLOUT
    assert recv_frames(right) == [b"ping"]
    assert pending_events(right) == POLLOUT


def test_a_large_payload_arrives_intact_and_a_mutable_one_is_copied(
    pair: tuple[zmq.Socket, zmq.Socket],
) -> None:
    left, right = pair
    large = bytes(range(256)) * (4 * ZERO_COPY_MIN // 256)  # sent without a copy
    send_frames(left, [b"", b"OK", large])
    assert receive(right) == [b"", b"OK", large]
    mutable = bytearray(large)
    send_frames(left, [b"", mutable])  # not bytes: copied, whatever its size
    mutable[:] = bytes(len(mutable))
    assert receive(right) == [b"", large]


def test_a_routed_message_comes_with_its_identity_frame() -> None:
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.setsockopt(zmq.IDENTITY, b"peer-1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        send_frames(dealer, [b"", b"FETCH", b"ID", b"1"])
        assert router.poll(5000), "nothing arrived"
        frames, identity = recv_routed(router)
        assert frames == [b"peer-1", b"", b"FETCH", b"ID", b"1"]
        assert identity.bytes == b"peer-1"
        assert identity.get("Peer-Address") == "127.0.0.1"  # the frame's metadata: who sent the message
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        context.term()
