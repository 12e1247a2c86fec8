"""A cluster member's link to another broker on the broker's own ZMTP DEALER (connector/zmtp_dealer.py,
``NativeLink``): answered by a broker under either engine, plaintext and CURVE (libzmq's ROUTER checks our
client side of CurveZMQ), waiting for a broker that is not up yet, failing at once what a lost connection
will never answer, and trying again after a peer that breaks ZMTP."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from conftest import free_endpoint

from broker.cluster.link import LinkError, NativeLink, ZmqLink, open_link
from connector import keys as key_files
from protocol import mc0

pytestmark = pytest.mark.timeout(60)


class Peer:
    """A libzmq ROUTER in a thread standing in for another broker: it answers each request with OK and its
    ID (or keeps it unanswered with ``answer=False``) until :meth:`close`."""

    def __init__(self, endpoint: str, answer: bool = True) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind(endpoint)
        self.answer = answer
        self.requests: list[mc0.Event] = []
        self.received = threading.Event()  # set at the first request
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if not self.socket.poll(20):
                continue
            identity, *frames = self.socket.recv_multipart()
            event = mc0.decode(frames)
            self.requests.append(event)
            self.received.set()
            if self.answer:
                self.socket.send_multipart([identity, *mc0.encode(mc0.Ok(getattr(event, "id", None)))])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    started: list[Peer] = []
    yield started
    for peer in started:
        if not peer.stopping.is_set():
            peer.close()


def native_link(endpoint: str, keys_dir: Path | None = None) -> NativeLink:
    link = open_link(zmq.Context.instance(), endpoint, keys_dir)
    assert isinstance(link, NativeLink)
    return link


async def noop(link: NativeLink, within: float = 5.0) -> mc0.Ok | mc0.Error:
    try:
        return await link.request(mc0.Noop(), within)
    finally:
        link.close()


@pytest.mark.parametrize("engine", ["native", "zeromq"])
def test_a_broker_under_either_engine_answers_a_native_link(start_broker, engine) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(mc0_engine=engine)
    answer = asyncio.run(noop(native_link(broker.endpoint)))
    assert isinstance(answer, mc0.Ok)


@pytest.mark.parametrize("engine", ["native", "zeromq"])
def test_a_native_link_speaks_curve_to_either_engine(start_broker, keys_dir, engine) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(curve=True, allow_any_client=True, keys_dir=keys_dir, mc0_engine=engine)
    answer = asyncio.run(noop(native_link(broker.endpoint, keys_dir)))
    assert isinstance(answer, mc0.Ok)


def test_a_native_link_pinned_to_another_broker_key_gets_no_answer(start_broker, keys_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    broker = start_broker(curve=True, allow_any_client=True, keys_dir=keys_dir)
    other = tmp_path / "other-keys"
    key_files.generate(other)  # another broker pair: the HELLO does not open on this broker
    with pytest.raises(LinkError, match=r"no answer from .* within 1s"):
        asyncio.run(noop(native_link(broker.endpoint, other), within=1.0))


def test_a_request_waits_for_a_broker_that_comes_up_later(peers) -> None:  # type: ignore[no-untyped-def]
    endpoint = free_endpoint()

    async def scenario() -> mc0.Ok | mc0.Error:
        link = native_link(endpoint)
        asked = asyncio.ensure_future(noop(link, within=10.0))
        await asyncio.sleep(0.3)  # refused connects meanwhile, tried again every 20-200 ms
        assert not asked.done()
        peers.append(Peer(endpoint))
        return await asked

    assert isinstance(asyncio.run(scenario()), mc0.Ok)
    assert len(peers[0].requests) == 1  # sent once, when the connection was up


def test_a_lost_connection_fails_what_it_carried_at_once(peers) -> None:  # type: ignore[no-untyped-def]
    endpoint = free_endpoint()
    peer = Peer(endpoint, answer=False)
    peers.append(peer)

    async def scenario() -> float:
        link = native_link(endpoint)
        asked = asyncio.ensure_future(link.request(mc0.Noop(), 30.0))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, peer.received.wait, 10)
        started = loop.time()
        await loop.run_in_executor(None, peer.close)  # its connections close with it
        with pytest.raises(LinkError, match="lost before it answered"):
            await asked
        link.close()
        return loop.time() - started

    assert asyncio.run(scenario()) < 5.0  # not the request's 30 s


def test_a_peer_that_breaks_zmtp_is_dropped_and_tried_again() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(5)
        while len(accepted) < 2:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(connection)
            connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # not a ZMTP greeting

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    try:
        with pytest.raises(LinkError, match="no answer"):
            asyncio.run(noop(native_link(f"tcp://127.0.0.1:{port}"), within=2.0))
        thread.join(5)
        assert len(accepted) == 2  # closed on the bad greeting, and connected again
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


def test_open_link_takes_libzmq_where_the_native_link_cannot_go(tmp_path) -> None:  # type: ignore[no-untyped-def]
    context = zmq.Context()
    try:
        endpoint = free_endpoint()  # nothing listens there: the libzmq links only try to connect
        links = [open_link(context, endpoint, None, "auto"),
                 open_link(context, endpoint, None, "zeromq"),
                 open_link(context, f"ipc://{tmp_path}/broker.sock", None, "native"),
                 open_link(context, endpoint.replace("tcp://", "tcp://lo;"), None, "auto")]
        assert [type(link) for link in links] == [NativeLink, ZmqLink, ZmqLink, ZmqLink]
        for link in links:
            link.close()
    finally:
        context.term()
