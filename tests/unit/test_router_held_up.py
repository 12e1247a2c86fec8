"""A heartbeat turn that comes late (the loop was held up longer than a tick: a long turn, a slow disk) drops
no client: what the clients sent meanwhile has not been read yet. The next turn, on time, judges them."""

from __future__ import annotations

import zmq
import zmq.asyncio

from broker.engine import Engine
from broker.hub import Hub
from broker.router import RouterShell
from protocol import mc0


def test_a_late_heartbeat_turn_drops_nobody_and_the_next_one_judges() -> None:
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    clock = [0.0]
    hub = Hub(Engine(), monotonic=lambda: clock[0], wall_ms=lambda: 0)
    router = RouterShell(hub, socket)
    hub.add(router)
    router.transmit = lambda identity, frames: None  # type: ignore[method-assign]
    try:
        router.handle([b"peer", *mc0.encode(mc0.Connect(ttl=1000, id=b"c"))], 0.0, 0)
        assert b"peer" in router.sessions.by_identity
        router._heartbeat_due = 0.25  # as run() sets it: a tick after the start
        clock[0] = 5.0  # the loop was held up for seconds: past 1.05 x the TTL since the client was heard
        router._heartbeat_turn()
        assert b"peer" in router.sessions.by_identity, "dropped for a silence the broker caused"
        clock[0] = 5.0 + router.tick  # on time: the client really said nothing since
        router._heartbeat_turn()
        assert b"peer" not in router.sessions.by_identity
        assert router.counters["expired"] == 1
    finally:
        socket.close(linger=0)
        context.term()
