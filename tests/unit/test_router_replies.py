"""The router shell's reply rules when a client's pipe is full, driven through a fake socket (no network).

An OK or ERROR that meets a full pipe must wait in order and go out once there is room; a client that lets
too many pile up is dropped rather than buffered forever.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq
import zmq.asyncio

from broker import router as router_module
from broker.engine import Engine
from broker.hub import Hub
from broker.router import RouterShell


class FullPipe:
    """Stands in for the ROUTER: refuses every send while ``full`` is set, records what went out."""

    def __init__(self) -> None:
        self.full = False
        self.sent: list[list[bytes]] = []

    def transmit(self, identity: bytes, frames: list[bytes]) -> None:
        if self.full:
            raise zmq.Again()
        self.sent.append([identity, *frames])


@pytest.fixture
def shell() -> Iterator[tuple[RouterShell, FullPipe]]:
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    hub = Hub(Engine(), monotonic=lambda: 0.0, wall_ms=lambda: 0)
    shell = RouterShell(hub, socket)
    hub.add(shell)
    pipe = FullPipe()
    shell.transmit = pipe.transmit  # type: ignore[method-assign]
    yield shell, pipe
    socket.close(linger=0)
    context.term()


def command(identity: bytes, *frames: bytes) -> list[bytes]:
    return [identity, b"", *frames]


def test_a_reply_that_meets_a_full_pipe_is_sent_later_in_order(shell: tuple[RouterShell, FullPipe]) -> None:
    router, pipe = shell
    pipe.full = True
    for n in (b"1", b"2", b"3"):
        router.handle(command(b"peer", b"NOOP", b"ID", n), 0.0, 0)
    router.hub.flush(0.0)
    assert pipe.sent == []
    assert router.hub.retry > 0, "the loop must come back to retry"
    pipe.full = False
    router.handle(command(b"peer", b"NOOP", b"ID", b"4"), 0.0, 0)
    router.hub.flush(0.0)
    assert [frames[-1] for frames in pipe.sent] == [b"1", b"2", b"3", b"4"]
    assert router.stalled == set()


def test_a_client_that_never_reads_its_replies_is_dropped(
    shell: tuple[RouterShell, FullPipe], monkeypatch: pytest.MonkeyPatch
) -> None:
    router, pipe = shell
    monkeypatch.setattr(router_module, "MAX_STALLED_REPLIES", 5)
    router.handle(command(b"peer", b"SUB", b"ID", b"s", b"", b"t"), 0.0, 0)
    router.hub.flush(0.0)
    assert router.engine.topics[b"t"].subscribers
    pipe.full = True
    for n in range(6):
        router.handle(command(b"peer", b"NOOP", b"ID", b"%d" % n), 0.0, 0)
    router.hub.flush(0.0)
    assert b"peer" not in router.sessions.by_identity
    assert not router.engine.topics[b"t"].subscribers, "a dropped client keeps no subscription"
