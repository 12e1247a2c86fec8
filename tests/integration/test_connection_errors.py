"""What a person hears when a client cannot reach the broker, and how fast; what the broker logs about the
keys it refuses; a key admitted on a running broker; and a subscriber that notices a broker restart at once.

Every case runs a real broker (in-process, loopback, CURVE on where the case needs it) and every client: the
blocking ``Client`` and the asyncio ``AsyncClient`` on its native wire and through libzmq. The clients'
timeout is 5 s; each error must come well before it, from what the connection's events say (libzmq's
monitor, or the native wire's own).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq
from click.testing import CliRunner
from conftest import FREE_GATEWAY_PORTS, BrokerThread, free_port

from broker.config import BrokerConfig
from broker.server import ensure_keys
from connector import AsyncClient, Client, ConnectorError, Credentials
from connector import keys as key_files
from connector.cli import main
from connector.connection import STALLED_FOR

if TYPE_CHECKING:
    from conftest import BrokerFactory

pytestmark = pytest.mark.timeout(30)

#: How soon an error must come when libzmq tells us what is wrong (the issue's "within a second", plus slack
#: for a loaded machine).
PROMPT = 2.0


def connect(kind: str, endpoint: str, credentials: Credentials | None) -> None:
    """Connect with a client of ``kind`` (timeout 5 s): the tests expect it to raise."""
    wire = "zeromq" if kind.endswith("-zeromq") else "auto"  # the native wire, or through libzmq
    if kind.startswith("sync"):
        Client(endpoint, credentials=credentials, curve=credentials is not None, timeout=5.0,
               wire=wire).close()
    else:
        async def main() -> None:
            client = AsyncClient(endpoint, credentials=credentials, curve=credentials is not None,
                                 timeout=5.0, wire=wire)
            await client.connect()
            await client.close()

        asyncio.run(main())


def failing_within(
    seconds: float, kind: str, endpoint: str, credentials: Credentials | None
) -> ConnectorError:
    """The ConnectorError connecting raises, which must come within ``seconds``."""
    start = time.monotonic()
    with pytest.raises(ConnectorError) as raised:
        connect(kind, endpoint, credentials)
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"the error came after {elapsed:.2f} s: {raised.value}"
    return raised.value


def stranger(keys_dir: Path, dash: bool = False) -> Credentials:
    """A client pinned to the broker's real key, with a key pair the broker never admitted.

    Z85 keys start with ``-`` one time in 85, and the command that admits such a key needs ``--`` before it:
    ``dash`` says which of the two kinds to draw, so neither case depends on the luck of the draw.
    """
    while True:
        public, secret = zmq.curve_keypair()
        if public.startswith(b"-") == dash:
            return Credentials(key_files.broker_public(keys_dir), public, secret)


@pytest.fixture(params=["sync", "sync-zeromq", "async", "async-zeromq"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("dash", [False, True], ids=["plain-key", "dash-key"])
def test_a_refused_key_is_named_with_the_command_that_admits_it(
    kind: str, dash: bool, start_broker: BrokerFactory, keys_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = start_broker(curve=True, keys_dir=keys_dir)
    credentials = stranger(keys_dir, dash)
    key = credentials.public.decode()
    # A key that starts with a dash would read as an option: the command puts `--` before it.
    command = f"mc0 keys admit NAME -- {key}" if dash else f"mc0 keys admit NAME {key}"
    with caplog.at_level(logging.WARNING, logger="mc0.auth"):
        refused = failing_within(PROMPT, kind, broker.endpoint, credentials)
    assert str(refused) == (f"the broker at {broker.endpoint} refused this client's key {key} (ZAP status "
                                  f"400): admit it on the broker with `{command}`")
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [f"refused a CURVE client: its key {key} is not in {keys_dir / 'allowed'}; to admit "
                        f"it, run `{command}` beside the broker's keys folder"]


def test_the_same_refused_key_is_logged_once_a_minute(
    start_broker: BrokerFactory, keys_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = start_broker(curve=True, keys_dir=keys_dir)
    credentials = stranger(keys_dir)
    with caplog.at_level(logging.WARNING, logger="mc0.auth"):
        for _ in range(3):
            with pytest.raises(ConnectorError, match="refused this client's key"):
                connect("sync", broker.endpoint, credentials)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_wrong_pinned_broker_key_is_told_apart(
    kind: str, start_broker: BrokerFactory, keys_dir: Path
) -> None:
    broker = start_broker(curve=True, keys_dir=keys_dir)
    real = Credentials.from_dir(keys_dir)
    wrong_server, _ = zmq.curve_keypair()
    error = failing_within(PROMPT, kind, broker.endpoint, Credentials(wrong_server, real.public, real.secret))
    assert "the broker.key this client pins is most likely not that broker's key" in str(error)


def test_curve_on_the_client_only(kind: str, start_broker: BrokerFactory, keys_dir: Path) -> None:
    broker = start_broker(curve=False)
    error = failing_within(PROMPT, kind, broker.endpoint, Credentials.from_dir(keys_dir))
    assert "does not speak CURVE (it runs with --no-curve)" in str(error)


def test_curve_on_the_broker_only(kind: str, start_broker: BrokerFactory, keys_dir: Path) -> None:
    broker = start_broker(curve=True, keys_dir=keys_dir)
    error = failing_within(PROMPT, kind, broker.endpoint, None)
    assert "requires CURVE: give this client the keys folder" in str(error)


def test_nothing_listening_is_said_within_the_second(kind: str) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    error = failing_within(PROMPT, kind, endpoint, None)
    assert str(error).startswith(f"nothing is listening at {endpoint}: start the broker")


@pytest.fixture
def stalled() -> Iterator[str]:
    """An endpoint whose kernel accepts connections that nothing ever reads (a listening socket never
    accepted from): what a frozen or hung broker looks like to a client."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"


def test_a_broker_that_never_completes_the_handshake_is_said_so(kind: str, stalled: str) -> None:
    """One broker: the client waits its timeout (5 s) for it, then says what it saw."""
    error = failing_within(5.0 + PROMPT, kind, stalled, None)
    assert str(error) == (f"the broker at {stalled} accepted the connection but has not completed the "
                          "handshake within 5s: it may be frozen, hung or overloaded")


@pytest.mark.parametrize("wire", ["auto", "zeromq"])
def test_a_cluster_member_that_never_completes_the_handshake_is_passed_over(
    wire: str, stalled: str, start_broker: BrokerFactory
) -> None:
    """Several members, the first stalled: the client goes to the next after STALLED_FOR (2 s), well within
    its timeout, instead of waiting there until the timeout fails it."""
    broker = start_broker(curve=False)
    started = time.monotonic()
    with Client([stalled, broker.endpoint], curve=False, timeout=10.0, wire=wire) as client:
        assert client.endpoint == broker.endpoint
        assert client.publish("stalled", "through the next member", confirm=True) is not None
    assert STALLED_FOR <= time.monotonic() - started < STALLED_FOR + 3.0

    async def main() -> None:
        async with AsyncClient([stalled, broker.endpoint], curve=False, timeout=10.0, wire=wire) as client:
            assert client.endpoint == broker.endpoint

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < STALLED_FOR + 3.0


def test_keys_admit_on_a_running_broker_admits_at_once(start_broker: BrokerFactory, keys_dir: Path) -> None:
    broker = start_broker(curve=True, keys_dir=keys_dir)
    credentials = stranger(keys_dir)
    with pytest.raises(ConnectorError, match="refused this client's key"):
        connect("sync", broker.endpoint, credentials)
    result = CliRunner().invoke(main, ["keys", "admit", "alice", credentials.public.decode(),
                                       "--keys", str(keys_dir)])
    assert result.exit_code == 0, result.output
    assert (keys_dir / "allowed" / "alice.key").exists()
    with Client(broker.endpoint, credentials=credentials, timeout=5.0) as alice:  # no SIGHUP, no restart
        assert alice.stats()["connections"]["mc0"] >= 1


def test_keys_admit_takes_a_certificate_file_and_refuses_nonsense(tmp_path: Path, keys_dir: Path) -> None:
    runner = CliRunner()
    key_files.generate(tmp_path / "other", ("bob",))
    result = runner.invoke(main, ["keys", "admit", "bob", str(tmp_path / "other" / "bob.key"),
                                  "--keys", str(keys_dir)])
    assert result.exit_code == 0, result.output
    assert key_files.load(keys_dir / "allowed" / "bob.key").public == \
        key_files.load(tmp_path / "other" / "bob.key").public
    for nonsense in ("short", "," * 40):  # "," is not in the Z85 alphabet
        refused = runner.invoke(main, ["keys", "admit", "eve", nonsense, "--keys", str(keys_dir)])
        assert refused.exit_code == 1
        assert refused.output.startswith("Error: ")
        assert len(refused.output.splitlines()) == 1


# ------------------------------------------------------------------------------------------- a broker restart


def restartable(port: int, tmp_path: Path) -> BrokerThread:
    config = BrokerConfig(bind=f"tcp://127.0.0.1:{port}", curve=False, keys_dir=tmp_path / "keys",
                          data_dir=tmp_path / "data", **FREE_GATEWAY_PORTS)
    ensure_keys(config)
    return BrokerThread(config)


@pytest.mark.timeout(60)
def test_a_subscriber_notices_a_restart_at_once_and_misses_nothing_after_it_is_back(tmp_path: Path) -> None:
    """A subscriber (TTL 30 s: silence would take 31 s to notice) and a publisher sending every 50 ms. The
    broker is restarted on the same port; the subscriber re-subscribes within a second of the new broker
    listening, and receives every message published from the moment the new broker sees its subscription."""
    port = free_port()
    first = restartable(port, tmp_path)
    first.start()
    endpoint = f"tcp://127.0.0.1:{port}"
    subscriber = Client(endpoint, timeout=5.0)
    subscriber.subscribe("ticks")
    publisher = Client(endpoint, timeout=5.0)
    published: list[tuple[int, float]] = []  # (number, when the broker confirmed it)
    stop = threading.Event()

    def publish() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                publisher.publish("ticks", b"%d" % n, confirm=True, timeout=2.0)
                published.append((n, time.monotonic()))
            except ConnectorError:
                pass  # the broker was away: not published
            stop.wait(0.05)

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        time.sleep(0.5)
        first.stop()
        time.sleep(0.3)
        second = restartable(port, tmp_path)
        second.start()
        listening = time.monotonic()
        deadline = listening + 5
        while subscriber.reconnects == 0:
            assert time.monotonic() < deadline, "the subscriber never noticed the restart"
            time.sleep(0.005)
        noticed = time.monotonic() - listening
        assert noticed < 1.0, f"noticed the restart {noticed:.2f} s after the broker listened again"
        with Client(endpoint, timeout=5.0) as observer:
            while observer.topics().get("ticks", {}).get("subscribers", 0) < 1:
                assert time.monotonic() < deadline, "the subscription was not restored"
                time.sleep(0.005)
        subscribed = time.monotonic()
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(10)
    received = set()
    while (message := subscriber.receive(timeout=0.5)) is not None:
        received.add(int(message.body))
    after = [n for n, confirmed in published if confirmed > subscribed]
    assert len(after) >= 10
    assert [n for n in after if n not in received] == []
    subscriber.close()
    publisher.close()
    second.stop()


def test_mc0_sub_says_on_stderr_that_it_lost_the_broker_and_reconnected(tmp_path: Path) -> None:
    port = free_port()
    first = restartable(port, tmp_path)
    first.start()
    runner = CliRunner()
    lines: list[str] = []

    def restart_soon() -> None:
        time.sleep(0.8)
        first.stop()
        time.sleep(1.5)
        second = restartable(port, tmp_path)
        second.start()
        with Client(f"tcp://127.0.0.1:{port}", timeout=5.0) as publisher:
            deadline = time.monotonic() + 5
            while publisher.topics().get("t", {}).get("subscribers", 0) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            publisher.publish("t", "after the restart", confirm=True)
        lines.append("published")
        restarted.append(second)

    restarted: list[BrokerThread] = []
    helper = threading.Thread(target=restart_soon)
    helper.start()
    result = runner.invoke(main, ["sub", "t", "--count", "1", "--timeout", "10", "--no-curve",
                                  "--broker", f"tcp://127.0.0.1:{port}"])
    helper.join(15)
    for broker in restarted:
        broker.stop()
    assert result.exit_code == 0, result.output
    assert result.stdout == "after the restart\n"
    assert f"lost the broker: nothing is listening at tcp://127.0.0.1:{port}" in result.stderr
    assert f"reconnected to tcp://127.0.0.1:{port}: subscriptions restored" in result.stderr
    assert lines == ["published"]

