"""Frame-set I/O on a pyzmq socket without pyzmq's convenience layer, for the hot paths of the broker and the
clients.

pyzmq's ``Socket.send_multipart`` checks every frame's type and builds a new ``IntFlag`` (``zmq.SNDMORE |
flags``) for every frame but the last; ``recv_multipart`` asks ``getsockopt(zmq.RCVMORE)`` through the same
enum machinery. On the broker's turn that cost more than the sends themselves (a profile at 1,000 msg/s showed
120,000 enum constructions for 5,000 messages). These helpers call the Cython socket methods directly with
plain int flags. They take bytes frames only, and never block.

ZeroMQ sends a multipart message atomically: a full pipe (``zmq.Again``) is reported on the first frame, so a
frame set either goes out whole or not at all, as with ``send_multipart``.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

_Socket = zmq.backend.Socket  # the Cython class every pyzmq socket (sugar, asyncio, shadow) derives from
_send = _Socket.send
_recv = _Socket.recv
_get = _Socket.get

NOBLOCK = int(zmq.NOBLOCK)
SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
# A plain int: Socket.get turns any option into a SocketOption, and with pyzmq 27 that costs about 0.5 us more
# for the enum member than for its int (1.6 against 1.1 us a readable(), measured; the broker asks three times
# a turn, the clients once a read).
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)

Again = zmq.Again

#: Payload frames at least this long are handed to libzmq without a copy (pyzmq keeps the object alive until
#: libzmq has sent it). Measured: a copying send of a 1.4 MB records reply cost the sending thread 300-500 us,
#: a send without the copy 5-10 us, and a broker answering the range reads of 1,000,000 stored messages spent
#: 0.18-0.24 CPU-s before, 0.10-0.14 after. This is pyzmq's own threshold (``zmq.COPY_THRESHOLD``), below
#: which it copies anyway. Only bytes and read-only memoryviews go without a copy: nothing may change the
#: bytes while libzmq sends them, and bytes cannot change, while a read-only view is how its owner promises
#: it will not (the store's read buffers: broker.store.buffers). A writable view (a receive buffer, say) is
#: copied.
ZERO_COPY_MIN = zmq.COPY_THRESHOLD


def send_frames(socket: zmq.Socket, frames: Sequence[bytes | memoryview]) -> None:
    """Send ``frames`` as one message without blocking; ``zmq.Again`` if the peer's pipe is full. A large
    last frame (a payload) of ``bytes``, or a read-only memoryview, leaves without a copy: see
    :data:`ZERO_COPY_MIN`."""
    last = len(frames) - 1
    for index in range(last):
        _send(socket, frames[index], SNDMORE_NOBLOCK)
    final = frames[last]
    if len(final) >= ZERO_COPY_MIN and (type(final) is bytes
                                        or (type(final) is memoryview and final.readonly)):
        _send(socket, final, NOBLOCK, False)
    else:
        _send(socket, final, NOBLOCK)


def send_to(socket: zmq.Socket, identity: bytes, frames: Sequence[bytes | memoryview]) -> None:
    """:func:`send_frames` on a ROUTER, with the peer's ``identity`` frame in front (no list is built)."""
    _send(socket, identity, SNDMORE_NOBLOCK)
    send_frames(socket, frames)


def recv_frames(socket: zmq.Socket) -> list[bytes]:
    """One whole message without blocking; ``zmq.Again`` if none is waiting."""
    return recv_routed(socket)[0]


def recv_routed(socket: zmq.Socket) -> tuple[list[bytes], zmq.Frame]:
    """:func:`recv_frames`, with the first frame itself as well: on a ROUTER that is the identity frame, whose
    metadata says who sent the message (``User-Id``: the peer's CURVE key, as the ZAP handler admitted it)."""
    # A Frame says whether more follow without a getsockopt(RCVMORE), which costs a SocketOption enum each
    # time: about a microsecond less per frame, measured.
    first = frame = _recv(socket, NOBLOCK, False)
    frames = [first.bytes]
    while frame.more:
        frame = _recv(socket, NOBLOCK, False)
        frames.append(frame.bytes)
    return frames, first


def pending_events(socket: zmq.Socket) -> int:
    """The socket's ``ZMQ_EVENTS`` (its POLLIN and POLLOUT bits). Asking re-arms ``zmq.FD``, as for
    :func:`readable`."""
    return _get(socket, EVENTS)  # type: ignore[no-any-return]


def readable(socket: zmq.Socket) -> bool:
    """Whether a message waits. Also what re-arms ``zmq.FD``: that descriptor is edge-triggered, and a caller
    woken by it must act on this answer (read until False, or come back) or it may never be woken again."""
    return bool(_get(socket, EVENTS) & POLLIN)
