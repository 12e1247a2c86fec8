"""Crash safety, proven on a real broker process: confirmed PUTs to a strong topic, SIGKILL mid-stream,
restart, and every message the broker said OK to is there exactly once, in order, with ids continuing.
Also: SIGTERM stops a broker cleanly with everything a weak topic took stored (the fsync on close is counted
in the store's unit tests; a process exit alone cannot show it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from conftest import free_port

from connector.lumberjack_client import LumberjackClient
from protocol import mc0

START_TIMEOUT = 20.0
#: PUTs in flight at once: enough that the kill lands while many are neither stored nor answered.
WINDOW = 200


def write_config(tmp_path: Path, port: int, sync: str, lumberjack: str = "off") -> Path:
    path = tmp_path / "mc0.toml"
    path.write_text(
        f'[broker]\nbind = "tcp://127.0.0.1:{port}"\ncurve = false\ndata_dir = "{tmp_path / "data"}"\n'
        f'log_level = "warning"\nsexp = "127.0.0.1:0"\nmsgq = "off"\nrstreams = "off"\n'
        f'lumberjack = "{lumberjack}"\nlumberjack_topic = "crash.logs"\n\n'
        f'[[topics]]\npattern = "crash.*"\npersistence = "persistent"\nsync = "{sync}"\n'
        "segment_bytes = 65536\n",  # several segments: recovery crosses sealed ones
        encoding="utf-8",
    )
    return path


def spawn(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "from connector.cli import main; main()", "broker", "--config", str(config)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def dealer(context: zmq.Context, port: int) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    socket.connect(f"tcp://127.0.0.1:{port}")
    return socket


def request(socket: zmq.Socket, event: mc0.Event, timeout: float = 2.0) -> mc0.Event | None:
    socket.send_multipart(mc0.encode(event))
    if not socket.poll(int(timeout * 1000)):
        return None
    return mc0.decode(socket.recv_multipart())


def connected(context: zmq.Context, port: int) -> zmq.Socket:
    """A DEALER that has CONNECTed with the ``ids`` extension (OKs carry MESSAGE-ID and DURABILITY)."""
    socket = dealer(context, port)
    reply = request(socket, mc0.Connect(ttl=None, id=b"c", extensions=frozenset({"ids"})))
    assert isinstance(reply, mc0.Ok), reply
    return socket


def wait_until_serving(context: zmq.Context, port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else "broker exited"
        socket = dealer(context, port)
        try:
            reply = request(socket, mc0.Connect(ttl=None, id=b"c"), 0.5)
        finally:
            socket.close()
        if isinstance(reply, mc0.Ok):
            return
    raise AssertionError("the broker did not start serving in time")


def read_all(context: zmq.Context, port: int, topic: bytes) -> list[tuple[int, bytes]]:
    """Every stored message of ``topic`` (id, body), replayed from the beginning."""
    socket = connected(context, port)
    try:
        reply = request(socket, mc0.Sub([topic], b"s", replay="beginning"))
        assert isinstance(reply, mc0.Ok), reply
        stored: list[tuple[int, bytes]] = []
        while socket.poll(1500):
            event = mc0.decode(socket.recv_multipart())
            assert isinstance(event, mc0.Message)
            assert event.message_id is not None
            stored.append((event.message_id, event.body))
        return stored
    finally:
        socket.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(10)


class BrokerProcess:
    """A broker in its own process on a fixed loopback port, started again on the same data directory."""

    def __init__(self, tmp_path: Path, sync: str) -> None:
        self.port = free_port()
        self.config = write_config(tmp_path, self.port, sync)
        self.context = zmq.Context()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        self.process = spawn(self.config)
        wait_until_serving(self.context, self.port, self.process)
        return self.process

    def connected(self) -> zmq.Socket:
        return connected(self.context, self.port)

    def read_all(self, topic: bytes) -> list[tuple[int, bytes]]:
        return read_all(self.context, self.port, topic)

    def close(self) -> None:
        if self.process is not None:
            stop(self.process)
        self.context.term()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[Callable[[str], BrokerProcess]]:
    made: list[BrokerProcess] = []

    def make(sync: str) -> BrokerProcess:
        made.append(BrokerProcess(tmp_path, sync))
        return made[-1]

    yield make
    for broker in made:
        broker.close()


@pytest.mark.timeout(90)
def test_every_confirmed_put_survives_sigkill_exactly_once_in_order(
    broker_process: Callable[[str], BrokerProcess],
) -> None:
    broker = broker_process("strong")
    process = broker.start()
    publisher = broker.connected()
    confirmed: dict[int, bytes] = {}  # message id -> body, from the OKs
    sent = 0
    in_flight = 0
    kill_after = 1500 + int.from_bytes(os.urandom(2), "big") % 1000  # a different moment each run
    killed = False
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        while not killed and in_flight < WINDOW:
            body = b"m%06d" % sent
            publisher.send_multipart(mc0.encode(mc0.Put(b"crash.orders", body, b"%d" % sent)))
            sent += 1
            in_flight += 1
        if not publisher.poll(200 if not killed else 500):
            if killed:
                break  # the dead broker answers nothing more
            continue
        reply = mc0.decode(publisher.recv_multipart())
        assert isinstance(reply, mc0.Ok), reply
        in_flight -= 1
        assert reply.headers[mc0.DURABILITY] == b"fsync"
        body = b"m%06d" % int(reply.id or b"0")
        confirmed[int(reply.headers[mc0.MESSAGE_ID])] = body
        if not killed and len(confirmed) >= kill_after:
            process.send_signal(signal.SIGKILL)  # mid-stream: WINDOW PUTs are in flight right now
            process.wait(10)
            killed = True
    assert killed, "the kill never happened"
    publisher.close()

    broker.start()
    stored = broker.read_all(b"crash.orders")
    ids = [message_id for message_id, _ in stored]
    bodies = [body for _, body in stored]
    assert ids == list(range(1, len(stored) + 1)), "ids are dense from 1, in order"
    assert bodies == [b"m%06d" % n for n in range(len(stored))], "stored in send order, no duplicate"
    for message_id, body in confirmed.items():
        assert stored[message_id - 1] == (message_id, body), f"confirmed message {message_id} was lost"
    assert len(stored) >= len(confirmed)

    # Ids continue after the recovered tail.
    publisher = broker.connected()
    reply = request(publisher, mc0.Put(b"crash.orders", b"after", b"x"))
    assert isinstance(reply, mc0.Ok)
    assert int(reply.headers[mc0.MESSAGE_ID]) == len(stored) + 1
    publisher.close()


@pytest.mark.timeout(60)
def test_sigterm_stops_cleanly_with_every_weak_message_stored(
    broker_process: Callable[[str], BrokerProcess],
) -> None:
    broker = broker_process("weak")
    process = broker.start()
    publisher = broker.connected()
    for n in range(500):
        publisher.send_multipart(mc0.encode(mc0.Put(b"crash.weak", b"w%d" % n)))
    reply = request(publisher, mc0.Put(b"crash.weak", b"last", b"confirm"))
    assert isinstance(reply, mc0.Ok)
    assert reply.headers[mc0.DURABILITY] == b"written"
    publisher.close()
    process.send_signal(signal.SIGTERM)
    assert process.wait(15) == 0, process.stderr.read().decode() if process.stderr else ""

    broker.start()
    stored = broker.read_all(b"crash.weak")
    assert [body for _, body in stored] == [b"w%d" % n for n in range(500)] + [b"last"]


def test_a_killed_broker_never_acked_a_lumberjack_event_it_did_not_store(tmp_path: Path) -> None:
    """Lumberjack acks promise storage: ship batches to a strong topic, SIGKILL the broker while a batch is in
    flight, restart, and find every acknowledged event stored exactly once, in order."""
    port, shipping = free_port(), free_port()
    config = write_config(tmp_path, port, "strong", lumberjack=f"127.0.0.1:{shipping}")
    context = zmq.Context()
    process = spawn(config)
    try:
        wait_until_serving(context, port, process)
        acked = 0
        batches = random.randint(3, 12)
        with LumberjackClient("127.0.0.1", shipping, timeout=10.0) as client:
            for _ in range(batches):
                client.send_batch([{"n": acked + i} for i in range(200)])
                acked += 200
            # One more batch, unacknowledged: the kill lands while it is read, stored or answered.
            numbered = [(i + 1, {"n": acked + i}) for i in range(200)]
            codec = client.codec
            client.send_bytes(codec.send_window(200) + codec.send_events(numbered, compress=True))
            time.sleep(random.uniform(0, 0.02))
            process.kill()
            process.wait(10)
        process = spawn(config)
        wait_until_serving(context, port, process)
        stored = [json.loads(body)["n"] for _, body in read_all(context, port, b"crash.logs")]
        assert stored[:acked] == list(range(acked)), "every acknowledged event, once and in order"
        assert stored == list(range(len(stored))), "and nothing twice or out of order after them"
    finally:
        stop(process)
        context.term()
