"""Confirmed publishes a cluster member refused while several were in flight (a leader handing over, or one
that knows no leader yet) are sent again in the order they were published, by both clients. Against a
scripted ROUTER on loopback that grants ``confirms``: on its first connection it holds the publishes it is
sent (PUTS CONFIRM each, or a PUT alone) until three have come, then refuses them all with RETRY-AFTER, and
any that follow there too, as a leader handing over does; on the next it stores each entry, numbering them
in the order they arrive."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from scripted_router import LoopbackRouter

from connector import AsyncClient, Client
from protocol import mc0

pytestmark = pytest.mark.timeout(30)

REFUSAL = "this broker hands the cluster over: send it again in a moment"
#: PUTS commands held on the first connection before they are all refused together.
HELD = 3


class RefusingMember(LoopbackRouter):
    """Refuses the first connection's publishes with RETRY-AFTER, the first HELD together; stores what comes
    on the next connections."""

    def __init__(self) -> None:
        self.stored: list[bytes] = []  # bodies, in the order they were stored
        super().__init__()

    def _serve(self) -> None:
        router = self.router
        held: list[bytes | None] = []
        held_enough = False
        refusing: bytes | None = None  # the identity of the first connection to send a PUTS
        while not self.stop.is_set():
            if not router.poll(50):
                continue
            identity, *frames = router.recv_multipart()
            event = mc0.decode(frames)
            if isinstance(event, mc0.Connect):
                reply: mc0.Ok | mc0.Error = mc0.Ok(event.id, {mc0.EXTENSIONS: mc0.EXT_CONFIRMS.encode()})
            elif isinstance(event, mc0.Puts | mc0.Put):
                if refusing is None:
                    refusing = identity
                if identity == refusing:  # held until HELD came, then refused, and all that follows at once
                    held.append(event.id)
                    if held_enough or len(held) >= HELD:
                        held_enough = True
                        for command_id in held:
                            refusal = mc0.leader_error(REFUSAL, None, command_id, retry_ms=20)
                            router.send_multipart([identity, *mc0.encode(refusal)])
                        held.clear()
                    continue
                if isinstance(event, mc0.Put):  # a publish alone (the client sends the first so)
                    self.stored.append(event.body)
                    stored = b"%d" % len(self.stored)
                    reply = mc0.Ok(event.id, {b"MESSAGE-ID": stored, b"DURABILITY": b"fsync"})
                else:
                    results = []
                    for _topic, body, _headers in event.items:
                        self.stored.append(body)
                        results.append((len(self.stored), "fsync"))
                    reply = mc0.confirms_ok(event.id, results)  # type: ignore[arg-type] - it has an ID
            elif getattr(event, "id", None) is not None:
                reply = mc0.Ok(event.id)  # type: ignore[attr-defined]
            else:
                continue
            router.send_multipart([identity, *mc0.encode(reply)])


@pytest.fixture
def member() -> Iterator[RefusingMember]:
    made = RefusingMember()
    yield made
    made.close()


BODIES = [b"m%02d" % n for n in range(30)]


def test_the_blocking_client_sends_refused_confirms_again_in_order(member: RefusingMember) -> None:
    with Client(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=10, wire="zeromq") as client:
        handles = []
        for part in range(HELD):  # one PUTS CONFIRM each per part: each waits for the one before to leave
            handles += [client.publish_async("t", body) for body in BODIES[part * 10:(part + 1) * 10]]
            client.flush(timeout=5)
        ids = [int(handle.result(10)["MESSAGE-ID"]) for handle in handles]
    assert member.stored == BODIES
    assert ids == list(range(1, len(BODIES) + 1))


def test_the_asyncio_client_sends_refused_confirms_again_in_order(member: RefusingMember) -> None:
    async def run() -> list[int]:
        async with AsyncClient(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=10,
                               wire="zeromq") as client:
            handles = []
            for part in range(HELD):
                for body in BODIES[part * 10:(part + 1) * 10]:
                    handles.append(await client.publish_async("t", body))
                await asyncio.sleep(0.05)  # the part leaves on its own PUTS
            return [int((await handle)["MESSAGE-ID"]) for handle in handles]

    ids = asyncio.run(run())
    assert member.stored == BODIES
    assert ids == list(range(1, len(BODIES) + 1))
