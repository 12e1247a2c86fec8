"""A cluster member that sends its clients away (an ERROR without ID naming the leader) answers, in order,
everything it took before and stores nothing more from that connection: a confirmed publish it left
unanswered goes to the leader and is confirmed there, with the blocking client and the asyncio client alike.
Two stand-ins on raw pyzmq ROUTER sockets (ephemeral loopback ports) play the old and the new leader."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import zmq

from connector import AsyncClient, Client
from protocol import mc0


class StandIn(threading.Thread):
    """A ROUTER that answers CONNECT; a PUT with an ID is confirmed (``leads``), or left unanswered while the
    client is sent away to ``leader`` (an ERROR without ID, as a member that stopped leading sends)."""

    def __init__(self, context: zmq.Context, leads: bool) -> None:
        super().__init__(daemon=True)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.leads = leads
        self.leader: str | None = None
        self.published: list[bytes] = []
        self.stop = threading.Event()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(50):
                continue
            identity, *body = self.socket.recv_multipart()
            delimiter = body[:1] == [b""]
            event = mc0.decode(body)
            reply: mc0.Event | None = None
            if type(event) is mc0.Connect:
                reply = mc0.Ok(event.id, {})
            elif type(event) is mc0.Put and event.id is not None:
                if self.leads:
                    self.published.append(event.body)
                    reply = mc0.Ok(event.id, {b"MESSAGE-ID": b"7", b"DURABILITY": b"fsync"})
                else:  # not stored, not answered: the client is sent away instead
                    assert self.leader is not None
                    reply = mc0.leader_error("this broker no longer leads the cluster", self.leader.encode(),
                                             None)
            elif getattr(event, "id", None) is not None:
                reply = mc0.Ok(event.id, {})
            if reply is not None:
                self.socket.send_multipart([identity, *mc0.encode(reply, delimiter=delimiter)])
        self.socket.close(linger=0)


@pytest.fixture
def brokers() -> Iterator[tuple[StandIn, StandIn]]:
    context = zmq.Context()
    old, new = StandIn(context, leads=False), StandIn(context, leads=True)
    old.leader = new.endpoint
    old.start()
    new.start()
    yield old, new
    for stand_in in (old, new):
        stand_in.stop.set()
        stand_in.join(5)
    context.term()


@pytest.mark.timeout(30)
def test_an_unanswered_publish_goes_to_the_leader_with_the_blocking_client(brokers) -> None:
    old, new = brokers
    with Client(f"{old.endpoint},{new.endpoint}", curve=False, timeout=10) as client:
        reply = client.publish("orders", b"once", confirm=True)
    assert reply is not None
    assert reply["MESSAGE-ID"] == "7"
    assert new.published == [b"once"]


@pytest.mark.timeout(30)
def test_an_unanswered_publish_goes_to_the_leader_with_the_asyncio_client(brokers) -> None:
    old, new = brokers

    async def main() -> dict[str, str] | None:
        async with AsyncClient(f"{old.endpoint},{new.endpoint}", curve=False, timeout=10) as client:
            return await client.publish("orders", b"once", confirm=True)

    reply = asyncio.run(main())
    assert reply is not None
    assert reply["MESSAGE-ID"] == "7"
    assert new.published == [b"once"]
