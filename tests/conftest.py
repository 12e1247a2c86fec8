"""Shared fixtures: an in-process broker on an ephemeral loopback port, and raw ZeroMQ DEALER peers.

``start_broker(...)`` runs :func:`broker.server.serve` on its own asyncio loop in a background thread and
returns the running :class:`broker.server.Broker` (``broker.endpoint`` is the resolved
``tcp://127.0.0.1:PORT``). Every broker a test starts is stopped at teardown through its loop
(``loop.call_soon_threadsafe(broker.stop)``) and its thread joined; an exception that ended the broker's loop
fails the test.

``dealer(endpoint, ...)`` opens a plain pyzmq DEALER (never the project's connector) wrapped in :class:`Peer`,
whose every receive goes through ``poll`` with a timeout, so no test can hang on a silent broker. Replies are
parsed here by a few lines of independent code (:func:`parse`), not by the codec under test.

``spark`` is one SparkSession for every test that asks for it (the pipeline's). It lives here, not in a
``conftest.py`` of the pipeline's folder: the test folders are not packages, so a second ``conftest``
module would replace this one in ``sys.modules``, and the tests that import helpers from it (``from
conftest import``) would then fail to import whenever both folders are collected in one command.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from zmq.utils.monitor import recv_monitor_message

from broker.config import BrokerConfig
from broker.server import Broker, ensure_keys, loop_factory, serve
from broker.topics import TopicRule
from connector import AsyncClient, Client, Message
from connector import keys as key_files

#: Loopback only, port chosen by the kernel.
LOOPBACK = "tcp://127.0.0.1:*"
#: A TCP gateway on loopback, port chosen by the kernel.
GATEWAY_LOOPBACK = "127.0.0.1:0"
#: BrokerConfig settings that keep a test broker's gateways and monitoring endpoint off the fixed default
#: ports (two brokers, or a broker running on the machine, would collide there).
FREE_GATEWAY_PORTS = {name: GATEWAY_LOOPBACK for name in ("sexp", "msgq", "rstreams", "lumberjack", "http")}
#: How long a receive waits for something that should arrive (generous: a loaded CI machine is slow).
RECV_TIMEOUT = 2.0
#: How long we listen to be sure that nothing more arrives.
QUIET = 0.15
#: How long starting or stopping a broker may take at most.
LIFECYCLE_TIMEOUT = 10.0

FrameLike = bytes | str | int


def to_frame(value: FrameLike) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, int):
        return b"%d" % value
    return value.encode()


# ------------------------------------------------------------------------------------------------- the broker


class BrokerThread:
    """One broker serving on its own asyncio loop in a daemon thread."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name="mc0-test-broker", daemon=True)

    def _main(self) -> None:
        try:
            # The loop production runs on (uvloop where installed), so the tests exercise it.
            with asyncio.Runner(loop_factory=loop_factory(self.config.event_loop)) as runner:
                runner.run(serve(self.config, self._on_ready))
        except BaseException as error:  # reported to the test at start or teardown
            self.error = error
        finally:
            self.ready.set()

    def _on_ready(self, broker: Broker) -> None:
        self.broker = broker
        self.loop = asyncio.get_running_loop()
        self.ready.set()

    def start(self) -> Broker:
        self.thread.start()
        if not self.ready.wait(LIFECYCLE_TIMEOUT):
            raise TimeoutError("the broker did not report ready in time")
        if self.broker is None:
            raise RuntimeError("the broker stopped before it was ready") from self.error
        return self.broker

    def stop(self) -> None:
        if self.broker is not None and self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended (the broker crashed)
                self.loop.call_soon_threadsafe(self.broker.stop)
        self.thread.join(LIFECYCLE_TIMEOUT)
        if self.thread.is_alive():
            raise TimeoutError("the broker thread did not stop in time")
        if self.error is not None:
            raise RuntimeError("the broker's loop ended with an exception") from self.error


BrokerFactory = Callable[..., Broker]


#: Set (to ``zeromq`` or ``native``), the mc0 engine of every broker ``start_broker`` makes unless a test
#: names one: ``MC0_TEST_ENGINE=native pytest tests/integration`` runs those tests against the native
#: engine, and :func:`each_engine` runs a test against both.
ENGINE_VARIABLE = "MC0_TEST_ENGINE"


@pytest.fixture(params=["zeromq", "native"])
def each_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Use in ``pytestmark = pytest.mark.usefixtures("each_engine")``: every test of the module runs once with
    libzmq's ROUTER and once with the native engine serving the mc0 port."""
    monkeypatch.setenv(ENGINE_VARIABLE, request.param)
    return str(request.param)


@pytest.fixture(params=["auto", "zeromq"])
def each_wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Use in ``pytestmark = pytest.mark.usefixtures("each_wire")``: every test of the module runs once with
    the clients' native wire (their default, ``auto``, on tcp:// endpoints) and once through libzmq."""
    import connector.native

    monkeypatch.setattr(connector.native, "DEFAULT_WIRE", request.param)
    return str(request.param)


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[BrokerFactory]:
    """A factory starting brokers on ``tcp://127.0.0.1:*``; all are stopped at teardown.

    Keyword arguments: ``curve`` (default off), ``allow_any_client``, ``keys_dir`` (default ``tmp_path/keys``;
    with CURVE on, missing keys are created there the way the broker does on first run), ``topics`` (a tuple
    of :class:`TopicRule`), ``data_dir`` (default ``tmp_path/data``, shared by every broker of the test, so a
    second broker restarts on the first one's logs), ``bind`` (default a free loopback port), ``sexp``,
    ``msgq``, ``rstreams``, ``lumberjack`` and ``http`` (the monitoring endpoint) (default a free loopback
    port each; ``"off"`` turns one off), and any other :class:`BrokerConfig` field (its default otherwise:
    the heartbeat tick among them, as users get it).
    """
    running: list[BrokerThread] = []

    def start(
        *,
        curve: bool = False,
        allow_any_client: bool = False,
        keys_dir: Path | None = None,
        topics: tuple[TopicRule, ...] = (),
        data_dir: Path | None = None,
        bind: str = LOOPBACK,
        sexp: str = GATEWAY_LOOPBACK,
        msgq: str = GATEWAY_LOOPBACK,
        rstreams: str = GATEWAY_LOOPBACK,
        lumberjack: str = GATEWAY_LOOPBACK,
        http: str = GATEWAY_LOOPBACK,
        **overrides: Any,
    ) -> Broker:
        if "mc0_engine" not in overrides and os.environ.get(ENGINE_VARIABLE):
            overrides["mc0_engine"] = os.environ[ENGINE_VARIABLE]  # tests run against either engine
        config = BrokerConfig(
            bind=bind,
            sexp=sexp,
            msgq=msgq,
            rstreams=rstreams,
            lumberjack=lumberjack,
            http=http,
            data_dir=data_dir if data_dir is not None else tmp_path / "data",
            keys_dir=keys_dir if keys_dir is not None else tmp_path / "keys",
            curve=curve,
            allow_any_client=allow_any_client,
            topics=topics,
            **overrides,
        )
        ensure_keys(config)
        runner = BrokerThread(config)
        running.append(runner)
        return runner.start()

    yield start
    errors: list[BaseException] = []
    for runner in reversed(running):
        try:
            runner.stop()
        except BaseException as error:
            errors.append(error)
    if errors:
        raise errors[0]


@pytest.fixture
def broker(start_broker: BrokerFactory) -> Broker:
    """A plaintext broker with default settings."""
    return start_broker()


# -------------------------------------------------------------------------------------------------- the peers


@dataclass
class Reply:
    """One frame set from the broker, split the mc0 way (after the delimiter, if any)."""

    frames: list[bytes]
    verb: bytes
    headers: dict[bytes, bytes] = field(default_factory=dict)
    positional: list[bytes] | None = None  # None: there was no empty key frame

    @property
    def body(self) -> bytes | None:
        return self.positional[0] if self.positional else None

    def header(self, key: FrameLike) -> bytes | None:
        return self.headers.get(to_frame(key))


def parse(frames: list[bytes]) -> Reply:
    """Verb, key/value pairs up to an empty key frame, then the positional frames (no delimiter expected)."""
    assert frames, "an empty frame set"
    reply = Reply(list(frames), frames[0])
    index = 1
    while index < len(frames):
        key = frames[index]
        if key == b"":
            reply.positional = frames[index + 1 :]
            break
        assert index + 1 < len(frames), f"header {key!r} without a value in {frames!r}"
        assert key not in reply.headers, f"header {key!r} twice in {frames!r}"
        reply.headers[key] = frames[index + 1]
        index += 2
    return reply


class Peer:
    """A raw DEALER speaking mc0 by hand. ``delimiter`` says whether it frames with the empty delimiter."""

    def __init__(
        self, socket: zmq.Socket, *, delimiter: bool = True, monitor: zmq.Socket | None = None
    ) -> None:
        self.socket = socket
        self.delimiter = delimiter
        self.monitor = monitor
        self._ids = 0

    # --- raw frames

    def send_raw(self, *frames: FrameLike) -> None:
        """Send one frame set, waiting up to RECV_TIMEOUT for room when the pipe to the broker is full
        (a fast test publisher can outrun the broker for a moment). Still no room: ``zmq.Again``, as a
        non-blocking send says it, which fails any test that meant to send and tells a refused peer's test
        (no pipe left after a failed handshake) what it expects to hear."""
        if not self.socket.poll(int(RECV_TIMEOUT * 1000), zmq.POLLOUT):
            raise zmq.Again(msg=f"no room to send within {RECV_TIMEOUT} s")
        self.socket.send_multipart([to_frame(f) for f in frames], zmq.NOBLOCK)

    def send(self, *frames: FrameLike) -> None:
        """One command, with the empty delimiter in front when this peer uses it."""
        if self.delimiter:
            self.send_raw(b"", *frames)
        else:
            self.send_raw(*frames)

    def poll_raw(self, timeout: float) -> list[bytes] | None:
        """The next frame set, or None if nothing arrives within ``timeout`` seconds."""
        if not self.socket.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        return self.socket.recv_multipart(zmq.NOBLOCK)

    def recv_raw(self, timeout: float = RECV_TIMEOUT) -> list[bytes]:
        frames = self.poll_raw(timeout)
        if frames is None:
            raise AssertionError(f"nothing arrived within {timeout} s")
        return frames

    # --- parsed replies

    def _strip(self, frames: list[bytes]) -> Reply:
        if self.delimiter:
            assert frames[:1] == [b""], f"expected the empty delimiter first: {frames!r}"
            return parse(frames[1:])
        assert frames[:1] != [b""], f"no delimiter expected for this peer: {frames!r}"
        return parse(frames)

    def poll(self, timeout: float) -> Reply | None:
        frames = self.poll_raw(timeout)
        return None if frames is None else self._strip(frames)

    def recv(self, timeout: float = RECV_TIMEOUT) -> Reply:
        return self._strip(self.recv_raw(timeout))

    def recv_skipping_noop(self, timeout: float = RECV_TIMEOUT) -> Reply:
        """The next frame set that is not a heartbeat NOOP."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.recv(max(0.0, deadline - time.monotonic()))
            if reply.verb != b"NOOP":
                return reply

    def expect_silence(self, within: float = QUIET) -> None:
        frames = self.poll_raw(within)
        assert frames is None, f"expected nothing, got {frames!r}"

    def drain(self, within: float = QUIET) -> list[Reply]:
        """Everything that arrives until the line stays quiet for ``within`` seconds."""
        out: list[Reply] = []
        while (reply := self.poll(within)) is not None:
            out.append(reply)
        return out

    # --- commands

    def next_id(self) -> bytes:
        self._ids += 1
        return b"c%d" % self._ids

    def request(self, *frames: FrameLike, quiet: float = 0.0) -> Reply:
        """Send one command and take its one reply; with ``quiet``, also check that nothing follows it."""
        self.send(*frames)
        reply = self.recv()
        if quiet:
            self.expect_silence(quiet)
        return reply

    def ok(self, verb: FrameLike, *rest: FrameLike) -> Reply:
        """Send ``verb ID <fresh> rest...`` and assert the broker answers OK with that ID."""
        command_id = self.next_id()
        reply = self.request(verb, b"ID", command_id, *rest)
        assert reply.verb == b"OK", reply.frames
        assert reply.header("ID") == command_id, reply.frames
        return reply

    def connect(
        self, ttl: int | None = None, version: FrameLike = "0.2", extensions: str | None = None
    ) -> Reply:
        frames: list[FrameLike] = ["VERSION", version]
        if ttl is not None:
            frames += ["TTL", ttl]
        if extensions is not None:
            frames += ["EXTENSIONS", extensions]
        return self.ok("CONNECT", *frames)

    def negotiate(self, *extensions: str) -> Reply:
        """CONNECT asking for ``extensions``, and check that the broker granted exactly those."""
        reply = self.connect(extensions=" ".join(extensions))
        assert set((reply.header("EXTENSIONS") or b"").decode().split()) == set(extensions), reply.frames
        return reply

    def sub(self, *topics: FrameLike) -> Reply:
        return self.ok("SUB", "", *topics)

    def unsub(self, *topics: FrameLike) -> Reply:
        return self.ok("UNSUB", "", *topics)

    def put(self, topic: FrameLike, body: FrameLike, headers: dict[str, FrameLike] | None = None) -> None:
        """Fire-and-forget PUT (no ID, so no reply)."""
        frames: list[FrameLike] = ["PUT", "TOPIC", topic]
        for key, value in (headers or {}).items():
            frames += [key, value]
        self.send(*frames, "", body)

    def stats(self) -> dict[str, Any]:
        reply = self.ok("STATS")
        assert reply.body is not None, reply.frames
        return json.loads(reply.body)

    # --- socket events (only for a peer made with ``monitor=...``)

    def next_event(self, timeout: float = RECV_TIMEOUT) -> dict[str, Any] | None:
        """The next monitor event (``{"event": zmq.EVENT_..., "value": ..., "endpoint": ...}``) or None."""
        assert self.monitor is not None, "this peer was made without monitor=..."
        if not self.monitor.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        return recv_monitor_message(self.monitor)

    def events(self, seconds: float) -> list[int]:
        """The kinds of every monitor event during ``seconds``."""
        out: list[int] = []
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            event = self.next_event(left)
            if event is not None:
                out.append(event["event"])
        return out

    def close(self) -> None:
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
        self.socket.close(linger=0)


DealerFactory = Callable[..., Peer]


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def dealer(zmq_context: zmq.Context) -> Iterator[DealerFactory]:
    """A factory of raw DEALER peers connected to ``endpoint``; all are closed at teardown.

    ``dealer(endpoint, delimiter=True, server_key=None, public_key=None, secret_key=None, identity=None,
    monitor=0, options=None)``: the three keys (Z85) make it a CURVE client pinned to ``server_key``;
    ``monitor`` is a mask of ``zmq.EVENT_*`` watched from before the connect (see :meth:`Peer.next_event`);
    ``options`` maps ``zmq`` socket options (``zmq.RCVHWM``, ...) to values set before the connect.
    """
    peers: list[Peer] = []

    def make(
        endpoint: str,
        *,
        delimiter: bool = True,
        server_key: bytes | None = None,
        public_key: bytes | None = None,
        secret_key: bytes | None = None,
        identity: bytes | None = None,
        monitor: int = 0,
        options: dict[int, int] | None = None,
    ) -> Peer:
        socket = zmq_context.socket(zmq.DEALER)
        socket.linger = 0
        for option, value in (options or {}).items():
            socket.setsockopt(option, value)
        if identity is not None:
            socket.identity = identity
        curve = (server_key, public_key, secret_key)
        if any(key is not None for key in curve):
            assert all(key is not None for key in curve), "CURVE needs the server key and the client's pair"
            socket.curve_serverkey = server_key
            socket.curve_publickey = public_key
            socket.curve_secretkey = secret_key
        monitor_socket = socket.get_monitor_socket(monitor) if monitor else None
        socket.connect(endpoint)
        peer = Peer(socket, delimiter=delimiter, monitor=monitor_socket)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.close()


# ------------------------------------------------------------------------------------- raw gateway peers


class RawStream:
    """A plain TCP socket to a gateway, for tests that write and read a dialect's bytes with code of their own
    (never the codec under test). Subclasses parse; this keeps the bytes and the deadlines."""

    def __init__(self, address: tuple[str, int], timeout: float = RECV_TIMEOUT) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.buffer = b""

    def _fill(self, size: int, deadline: float) -> bool:
        """Read until ``size`` bytes are buffered; False if the deadline came first. EOFError when closed."""
        while len(self.buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            if not data:
                raise EOFError("the broker closed the connection")
            self.buffer += data
        return True

    def closed_within(self, seconds: float) -> bool:
        """True if the broker closes the connection within ``seconds`` (what it sends first is dropped)."""
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                self._fill(len(self.buffer) + 1, deadline)
                self.buffer = b""
        except (EOFError, ConnectionResetError):
            return True
        return False

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------------------------- shared helpers

#: Seconds a test waits for messages that should arrive at once; generous for a loaded 2-core machine.
ARRIVAL = 5.0


#: Every sample of a /metrics page, by sample name and label set.
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def metric_samples(text: str) -> Samples:
    """A /metrics page read by prometheus-client's own parser."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def metric_value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get(name, {}).get(frozenset(labels.items()))


def free_port() -> int:
    """A loopback port nobody listens on right now (for tests that must know the port before binding)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def receive_all(client: Client, count: int, timeout: float = ARRIVAL) -> list[Message]:
    """Exactly ``count`` messages from a blocking client, or fail once ``timeout`` seconds have passed."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(out)} of {count} messages arrived"
        message = client.receive(timeout=remaining)
        if message is not None:
            out.append(message)
    return out


async def receive_all_async(client: AsyncClient, count: int, within: float = ARRIVAL) -> list[Message]:
    """:func:`receive_all` for an asyncio client."""
    out: list[Message] = []
    deadline = time.monotonic() + within
    while len(out) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(out)} of {count} messages arrived"
        message = await client.receive(timeout=remaining)
        if message is not None:
            out.append(message)
    return out


@pytest.fixture
def restartable() -> Iterator[list[BrokerThread]]:
    """Brokers a test starts and stops itself (to restart one on the same port); stopped at teardown."""
    running: list[BrokerThread] = []
    yield running
    for runner in reversed(running):
        if runner.thread.is_alive():
            runner.stop()


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    """A keys folder with the broker pair and the default client admitted (as ``mc0 keys generate``)."""
    folder = tmp_path / "keys"
    key_files.generate(folder)
    return folder


@pytest.fixture
def curve_broker(start_broker: BrokerFactory, keys_dir: Path) -> Broker:
    """A broker with CURVE on, admitting the clients of ``keys_dir``."""
    return start_broker(curve=True, keys_dir=keys_dir)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for the session: ``local[2,4]`` (two threads, and a failed task is tried again up to
    four times, as on a cluster: the exactly-once sink is tested against retries), no UI, the driver bound to
    loopback, the mc0 data source registered. Spark starts once (a JVM takes seconds), when a test first asks
    for it, and stops at the end of the session. Python workers inherit this process's environment, so they
    import this checkout's packages."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run the same interpreter (and its packages)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pipeline.source import register

    session = (
        SparkSession.builder.master("local[2,4]").appName("mc0-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    register(session)
    yield session
    session.stop()


def fd_path(fd: int) -> str:
    """The path of this process's descriptor ``fd`` ("" when it has none)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@contextlib.contextmanager
def failing_writes(monkeypatch: pytest.MonkeyPatch, match: str, code: int = errno.ENOSPC) -> Iterator[None]:
    """os.write, os.writev and os.pwritev fail with ``code`` for files whose path contains ``match`` (a full
    disk, for one topic), until the block ends."""
    real, real_writev, real_pwritev = os.write, os.writev, os.pwritev

    def refuse(fd: int) -> None:
        if match in fd_path(fd):
            raise OSError(code, os.strerror(code))

    def write(fd: int, data: bytes) -> int:
        refuse(fd)
        return real(fd, data)

    def writev(fd: int, buffers: list[memoryview]) -> int:
        refuse(fd)
        return real_writev(fd, buffers)

    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        refuse(fd)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "writev", writev)
    monkeypatch.setattr(os, "pwritev", pwritev)
    try:
        yield
    finally:
        monkeypatch.setattr(os, "write", real)
        monkeypatch.setattr(os, "writev", real_writev)
        monkeypatch.setattr(os, "pwritev", real_pwritev)
