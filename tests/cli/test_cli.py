"""The ``mc0`` command line: ``keys generate``, ``pub`` (argument, ``--count``, ``--header``, stdin lines),
``sub`` (``--count``, ``--json``, ``--timeout``; the parsing of ``--replay``, ``--credit`` and ``--ack``),
``declare`` and ``topics`` (option parsing, and the table rows built from whatever keys a broker sends),
``stats`` (table and ``--json``), one-line errors without a traceback, and a real ``mc0 broker`` process
that creates its keys on first run, carries a message from an ``mc0 sub`` process to an ``mc0 pub`` process,
and exits 0 on SIGTERM.

In-process tests drive the click group with ``CliRunner`` against a broker from the shared fixtures; the
subprocess test runs the installed ``mc0`` script (or the same entry point through ``python -c``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result
from conftest import ARRIVAL, free_port, receive_all

from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from connector import Client, ConnectorError
from connector import cli as cli_module
from connector import keys as key_files
from connector.cli import main

if TYPE_CHECKING:
    from conftest import BrokerFactory

    from broker.server import Broker

pytestmark = pytest.mark.timeout(20)



@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def observer(curve_broker: Broker, keys_dir: Path) -> Iterator[Client]:
    """A library client on the same broker, to subscribe, publish and read stats beside the CLI."""
    with Client(curve_broker.endpoint, keys=keys_dir, timeout=3.0) as client:
        yield client


@pytest.fixture
def fast_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands give up on an absent broker after half a second instead of the default five."""
    monkeypatch.setattr(cli_module, "Client", functools.partial(Client, timeout=0.5))


def client_args(broker: Broker, keys_dir: Path) -> list[str]:
    return ["--broker", broker.endpoint, "--keys", str(keys_dir)]


def assert_one_line_error(result: Result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), lines[0]
    return lines[0]


def wait_for_subscribers(client: Client, topic: str, count: int = 1, timeout: float = ARRIVAL) -> None:
    deadline = time.monotonic() + timeout
    while client.stats()["topics"].get(topic, {}).get("subscribers", 0) < count:
        assert time.monotonic() < deadline, f"nobody subscribed to {topic!r} in time"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------------------------ keys


def test_keys_generate_writes_the_broker_and_client_pairs(runner: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    result = runner.invoke(main, ["keys", "generate", "--keys", str(folder)])
    assert result.exit_code == 0, result.output
    for name in ("broker.key", "broker.key_secret", "client.key", "client.key_secret", "allowed/client.key"):
        assert (folder / name).is_file(), name
        assert f"wrote {folder / name}" in result.output
    assert (folder / "broker.key_secret").stat().st_mode & 0o077 == 0
    assert (folder / "client.key_secret").stat().st_mode & 0o077 == 0
    assert (folder / "allowed/client.key").read_bytes() == (folder / "client.key").read_bytes()
    assert key_files.Credentials.from_dir(folder).server_public == key_files.broker_public(folder)


def test_keys_generate_with_a_named_client(runner: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    result = runner.invoke(main, ["keys", "generate", "--keys", str(folder), "--client", "alice"])
    assert result.exit_code == 0, result.output
    assert (folder / "alice.key_secret").is_file()
    assert (folder / "allowed" / "alice.key").is_file()
    assert (folder / "broker.key_secret").is_file()


def test_keys_generate_twice_writes_nothing_without_force(runner: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    first = runner.invoke(main, ["keys", "generate", "--keys", str(folder), "--client", "alice"])
    assert first.exit_code == 0, first.output
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    again = runner.invoke(main, ["keys", "generate", "--keys", str(folder), "--client", "alice"])
    assert again.exit_code == 0, again.output
    assert "wrote" not in again.output
    assert "exists already" in again.output
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before
    forced = runner.invoke(main, ["keys", "generate", "--keys", str(folder), "--client", "alice", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "wrote" in forced.output
    assert (folder / "alice.key").read_bytes() != before[folder / "alice.key"]


def test_keys_folder_from_the_environment(runner: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "from-env"
    result = runner.invoke(main, ["keys", "generate"], env={"MC0_KEYS": str(folder)})
    assert result.exit_code == 0, result.output
    assert (folder / "client.key_secret").is_file()


# ------------------------------------------------------------------------------------------------ pub and sub


def test_pub_reaches_a_subscriber_with_headers(
    runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client
) -> None:
    observer.subscribe("orders")
    result = runner.invoke(main, ["pub", "orders", "hello", *client_args(curve_broker, keys_dir),
                                  "--header", "X-Reply-To=me", "-H", "X-Equals=a=b", "-H", "X-Empty="])
    assert result.exit_code == 0, result.output
    message = observer.receive(timeout=ARRIVAL)
    assert message is not None
    assert message.text == "hello"
    assert message.headers == {"X-Reply-To": "me", "X-Equals": "a=b", "X-Empty": ""}


def test_pub_count_and_confirm(
    runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client
) -> None:
    observer.subscribe("load")
    result = runner.invoke(main, ["pub", "load", "x", "--count", "50", "--confirm",
                                  *client_args(curve_broker, keys_dir)])
    assert result.exit_code == 0, result.output
    received = receive_all(observer, 50)
    assert {m.text for m in received} == {"x"}
    assert observer.receive(timeout=0.1) is None


def test_pub_confirm_reports_what_the_broker_confirmed_and_fails_on_a_refusal(
    runner: CliRunner, start_broker: BrokerFactory, keys_dir: Path
) -> None:
    strong = TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))
    fixed = TopicRule("fixed", TopicSpec(element_size=1))
    broker = start_broker(curve=True, keys_dir=keys_dir, topics=(strong, fixed))
    result = runner.invoke(main, ["pub", "p.load", "x", "--count", "300", "--confirm",
                                  *client_args(broker, keys_dir)])
    assert result.exit_code == 0, result.output
    assert "confirmed: 300 messages, last message id 300, durability fsync" in result.output
    with Client(broker.endpoint, keys=keys_dir) as client:
        assert client.offsets("p.load") == (1, 301)
        # The 300 travelled together: far fewer commits (fsyncs) than messages.
        assert client.topics()["p.load"]["fsyncs"] < 100
    refused = runner.invoke(main, ["pub", "fixed", "two", "--count", "3", "--confirm",
                                   *client_args(broker, keys_dir)])
    assert refused.exit_code == 1
    assert "3 message(s) not confirmed; the first: broker refused PUT: topic 'fixed' takes bodies of " \
        "exactly 1 bytes, not 3" in refused.output


def test_pub_publishes_stdin_lines_when_message_is_omitted(
    runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client
) -> None:
    observer.subscribe("lines")
    arguments = ["pub", "lines", *client_args(curve_broker, keys_dir), "-H", "X-Source=stdin"]
    result = runner.invoke(main, arguments, input="one\ntwo\r\n\nthree é\n")
    assert result.exit_code == 0, result.output
    assert "published 4 message(s) to lines" in result.output
    received = receive_all(observer, 4)
    assert [m.text for m in received] == ["one", "two", "", "three é"]
    assert all(m.headers == {"X-Source": "stdin"} for m in received)


def test_sub_prints_json_lines_and_exits_after_count(
    runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client
) -> None:
    def publish_when_subscribed() -> None:
        wait_for_subscribers(observer, "events")
        observer.publish("events", "first", {"X-k": "v"})
        observer.publish("events", "second")
        observer.publish("events", "third: not read")

    publisher = threading.Thread(target=publish_when_subscribed)
    publisher.start()
    options = ["--count", "2", "--json", "--timeout", "5"]
    arguments = ["sub", "events", *client_args(curve_broker, keys_dir), *options]
    result = runner.invoke(main, arguments)
    publisher.join(10)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    first, second = (json.loads(line) for line in lines)
    assert first["topic"] == "events"
    assert first["body"] == "first"
    assert first["headers"] == {"X-k": "v"}
    assert isinstance(first["id"], int)
    assert isinstance(first["timestamp"], int)
    assert second["body"] == "second"
    assert second["id"] > first["id"]


def test_sub_plain_text_and_several_topics(
    runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client
) -> None:
    def publish_when_subscribed() -> None:
        wait_for_subscribers(observer, "b")
        observer.publish("a", "from a")
        observer.publish("b", "from b")

    publisher = threading.Thread(target=publish_when_subscribed)
    publisher.start()
    result = runner.invoke(main, ["sub", "a", "b", *client_args(curve_broker, keys_dir), "-n", "2",
                                  "--timeout", "5"])
    publisher.join(10)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["from a", "from b"]


def test_sub_timeout_ends_quietly(runner: CliRunner, curve_broker: Broker, keys_dir: Path) -> None:
    start = time.monotonic()
    result = runner.invoke(main, ["sub", "silence", *client_args(curve_broker, keys_dir), "--timeout", "0.3"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert time.monotonic() - start < 3.0


def test_sub_needs_a_topic(runner: CliRunner) -> None:
    result = runner.invoke(main, ["sub"])
    assert result.exit_code == 2
    assert "Missing argument" in result.output


# ------------------------------------------------------------- durable options: parsing, without a broker


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (["sub"], ["--replay", "beginning|current|ID", "--credit", "--ack"]),
        (["declare"], ["--delivery", "--persistence", "--sync", "--retention-bytes", "--retention-seconds",
                       "--segment-bytes", "--max-backlog", "round-robin"]),
        (["topics"], ["--json", "--broker"]),
    ],
)
def test_help_lists_the_durable_options(runner: CliRunner, command: list[str], options: list[str]) -> None:
    result = runner.invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    for option in options:
        assert option in result.output


def test_the_group_help_lists_declare_and_topics(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "declare" in result.output
    assert "topics" in result.output


@pytest.mark.parametrize(
    ("arguments", "wrong"),
    [
        (["sub", "t", "--replay", "start"], "--replay"),
        (["sub", "t", "--replay", "-3"], "--replay"),
        (["sub", "t", "--credit", "0"], "--credit"),
        (["sub", "t", "--credit", "many"], "--credit"),
        (["declare", "t", "--delivery", "sideways"], "--delivery"),
        (["declare", "t", "--persistence", "forever"], "--persistence"),
        (["declare", "t", "--sync", "sometimes"], "--sync"),
        (["declare", "t", "--retention-bytes", "0"], "--retention-bytes"),
        (["declare", "t", "--retention-seconds", "0"], "--retention-seconds"),
        (["declare", "t", "--segment-bytes", "x"], "--segment-bytes"),
        (["declare", "t", "--max-backlog", "-1"], "--max-backlog"),
        (["declare"], "TOPIC"),
    ],
)
def test_bad_durable_options_are_usage_errors(runner: CliRunner, arguments: list[str], wrong: str) -> None:
    result = runner.invoke(main, [*arguments, "--no-curve", "--broker", f"tcp://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2, result.output
    assert wrong in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("given", "expected"),
    [("beginning", "beginning"), ("CURRENT", "current"), ("0", 0), ("42", 42), (7, 7)],
)
def test_replay_values(given: str | int, expected: str | int) -> None:
    assert cli_module._Replay().convert(given, None, None) == expected

class StandInClient:
    """A Client that opens nothing: tests monkeypatch the CLI's Client with a subclass recording its calls."""

    reconnects = 0
    connection_problem = None
    endpoint = "tcp://127.0.0.1:61616"
    timeout = 5.0

    def __init__(self, *args: object, **options: object) -> None:
        pass

    def __enter__(self) -> StandInClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_sub_passes_the_durable_options_to_subscribe(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No broker: a stand-in client records the subscribe call and hands out one message to ack."""
    calls: list[tuple[str, object]] = []

    class StandIn(StandInClient):
        def __init__(self, *args: object, **options: object) -> None:
            self.messages = [cli_module.Message("q.jobs", b"job", {}, 5, 1)]

        def __enter__(self) -> StandIn:
            return self

        def __exit__(self, *exc: object) -> None:
            calls.append(("close", None))

        def subscribe(self, *topics: str, **options: object) -> None:
            calls.append(("subscribe", (topics, options)))

        def receive(self, timeout: float | None = None) -> cli_module.Message | None:
            return self.messages.pop() if self.messages else None

        def ack(self, message: cli_module.Message) -> None:
            calls.append(("ack", message.id))

    monkeypatch.setattr(cli_module, "Client", StandIn)
    result = runner.invoke(main, ["sub", "q.jobs", "q.more", "--replay", "12", "--credit", "3", "--ack",
                                  "--timeout", "0", "--no-curve"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "job\n"
    assert calls == [
        ("subscribe", (("q.jobs", "q.more"), {"replay": 12, "credit": 3, "explicit_acks": True})),
        ("ack", 5),  # after printing
        ("close", None),
    ]


def test_sub_without_durable_options_subscribes_live_and_never_acks(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    class StandIn(StandInClient):

        def subscribe(self, *topics: str, **options: object) -> None:
            seen.update(options)

        def receive(self, timeout: float | None = None) -> cli_module.Message | None:
            return None

        def ack(self, message: cli_module.Message) -> None:
            raise AssertionError("no --ack, no ack")

    monkeypatch.setattr(cli_module, "Client", StandIn)
    result = runner.invoke(main, ["sub", "t", "--timeout", "0", "--no-curve"])
    assert result.exit_code == 0, result.output
    assert seen == {"replay": None, "credit": None, "explicit_acks": False}


def test_declare_passes_only_the_given_settings(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    declared: list[tuple[str, dict[str, object]]] = []

    class StandIn(StandInClient):

        def declare(self, topic: str, **settings: object) -> None:
            declared.append((topic, settings))

    monkeypatch.setattr(cli_module, "Client", StandIn)
    result = runner.invoke(main, ["declare", "jobs", "--delivery", "round-robin", "--persistence",
                                  "persistent", "--retention-seconds", "3600", "--no-curve"])
    assert result.exit_code == 0, result.output
    assert declared == [("jobs", {"delivery": "round-robin", "persistence": "persistent",
                                  "retention_seconds": 3600.0})]
    shown = "delivery=round-robin, persistence=persistent, retention-seconds=3600"
    assert result.output == f"declared jobs ({shown})\n"
    result = runner.invoke(main, ["declare", "plain", "--no-curve"])
    assert result.output == "declared plain (broker defaults)\n"
    assert declared[-1] == ("plain", {})


def test_topic_rows_show_absent_keys_as_dashes() -> None:
    persistent = {"delivery": "broadcast", "persistence": "persistent", "sync": "strong", "stored": 3,
                  "messages_in": 9, "first_id": 7, "last_id": 9, "bytes": 512, "subscribers": 2, "lag": 1,
                  "dropped": 0}
    assert cli_module._topic_row("p.log", persistent) == [
        "p.log", "broadcast", "persistent/strong", "9", "3", "7", "9", "512", "2", "1", "0"]
    # A transient topic: what it took, and no log (nothing stored, no first id, no bytes).
    transient = {"delivery": "round-robin", "persistence": "transient", "messages_in": 6, "first_id": None,
                 "last_id": 6, "subscribers": 0, "dropped": 1}
    assert cli_module._topic_row("jobs", transient) == [
        "jobs", "round-robin", "transient", "6", "-", "-", "6", "-", "0", "-", "1"]
    assert cli_module._topic_row("bare", {}) == ["bare", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
    empty_log = {"persistence": "persistent", "sync": "weak", "messages_in": 0, "stored": 0, "first_id": 1,
                 "last_id": 0}
    assert cli_module._topic_row("p.empty", empty_log)[2:7] == ["persistent/weak", "0", "0", "-", "-"]


def test_topics_table_is_aligned() -> None:
    rows = [cli_module._topic_row("p.a-long-name", {"stored": 12345, "bytes": 7}),
            cli_module._topic_row("b", {"stored": 1, "bytes": 1048576})]
    lines = list(cli_module._table(rows))
    assert lines[0].split() == ["topic", "delivery", "persistence", "published", "stored", "first", "last",
                                "bytes", "subs", "lag", "dropped"]
    assert len(lines) == 3
    # Numbers are right-aligned: each ends in the column where its heading ends.
    for heading in ("stored", "bytes"):
        end = lines[0].index(heading) + len(heading)
        for line in lines[1:]:
            assert line[end - 1] != " ", (heading, lines)
            assert line[end : end + 2] == "  ", (heading, lines)
    assert lines[1].startswith("p.a-long-name  ")
    assert lines[2].startswith("b              ")


def test_no_curve_against_a_plaintext_broker(runner: CliRunner, broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as observer:
        observer.subscribe("plain")
        result = runner.invoke(main, ["pub", "plain", "text", "--broker", broker.endpoint, "--no-curve"])
        assert result.exit_code == 0, result.output
        message = observer.receive(timeout=ARRIVAL)
        assert message is not None
        assert message.text == "text"


def test_broker_endpoint_and_keys_from_the_environment(
    runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client
) -> None:
    observer.subscribe("env")
    result = runner.invoke(main, ["pub", "env", "x"],
                           env={"MC0_BROKER": curve_broker.endpoint, "MC0_KEYS": str(keys_dir)})
    assert result.exit_code == 0, result.output
    assert observer.receive(timeout=ARRIVAL) is not None


# ----------------------------------------------------------------------------------------------------- stats


def test_stats_table(runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client) -> None:
    observer.subscribe("orders")
    observer.publish("orders", "x", confirm=True)
    result = runner.invoke(main, ["stats", *client_args(curve_broker, keys_dir)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("uptime")
    assert lines[1].startswith("connections")
    assert "mc0 2" in lines[1]  # the observer and the stats command itself
    header = lines[2].split()
    assert header == ["topic", "delivery", "subs", "in", "out", "dropped"]
    row = lines[3].split()
    assert row == ["orders", "broadcast", "1", "1", "1", "0"]


def test_stats_without_topics(runner: CliRunner, curve_broker: Broker, keys_dir: Path) -> None:
    result = runner.invoke(main, ["stats", *client_args(curve_broker, keys_dir)])
    assert result.exit_code == 0, result.output
    assert "topics       (none)" in result.output


def test_stats_json(runner: CliRunner, curve_broker: Broker, keys_dir: Path, observer: Client) -> None:
    observer.publish("counted", "x", confirm=True)
    result = runner.invoke(main, ["stats", "--json", *client_args(curve_broker, keys_dir)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["connections"]["mc0"] == 2
    assert data["topics"]["counted"]["messages_in"] == 1
    assert data["uptime_seconds"] >= 0


# ---------------------------------------------------------------------------------------------------- errors


@pytest.mark.usefixtures("fast_failure")
@pytest.mark.parametrize("command", [
    ["stats"], ["pub", "t", "m"], ["sub", "t", "--timeout", "1"], ["topics"], ["topics", "--json"],
    ["declare", "t", "--persistence", "persistent"],
    ["sub", "t", "--replay", "beginning", "--credit", "3", "--ack", "--timeout", "1"],
])
def test_no_broker_listening_is_one_line(runner: CliRunner, command: list[str]) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    result = runner.invoke(main, [*command, "--broker", endpoint, "--no-curve"])
    line = assert_one_line_error(result)
    assert f"nothing is listening at {endpoint}: start the broker" in line


@pytest.mark.parametrize("command",
                         [["stats"], ["pub", "t", "m"], ["sub", "t"], ["topics"], ["declare", "t"]])
def test_missing_keys_folder_is_one_line(runner: CliRunner, tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "no-such-keys"
    result = runner.invoke(main, [*command, "--keys", str(missing), "--broker", f"tcp://127.0.0.1:{free_port()}"])
    line = assert_one_line_error(result)
    assert str(missing) in line
    assert "copy broker.key (and client.key_secret) from the broker's keys folder" in line
    assert "MC0_KEYS" in line
    assert "keys generate" not in line, "a client folder must not be told to make a new broker identity"


def test_missing_client_key_is_one_line(runner: CliRunner, tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    key_files.generate(folder)
    (folder / "client.key_secret").unlink()
    result = runner.invoke(main, ["stats", "--keys", str(folder), "--broker", f"tcp://127.0.0.1:{free_port()}"])
    line = assert_one_line_error(result)
    assert "client.key_secret" in line
    assert f"mc0 keys client client --keys {folder}" in line


@pytest.mark.parametrize("bad", ["novalue", "=value", ""])
def test_bad_header_is_one_line(runner: CliRunner, bad: str) -> None:
    result = runner.invoke(main, ["pub", "t", "m", "--header", bad, "--no-curve",
                                  "--broker", f"tcp://127.0.0.1:{free_port()}"])
    line = assert_one_line_error(result)
    assert "--header" in line
    assert "K=V" in line


def test_bad_endpoint_is_one_line(runner: CliRunner) -> None:
    result = runner.invoke(main, ["stats", "--no-curve", "--broker", "tcp://127.0.0.1:not-a-port"])
    assert "not-a-port" in assert_one_line_error(result)


def test_broker_with_a_bad_config_file_is_one_line(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "mc0.toml"
    config.write_text("[broker]\nno_such_key = 1\n", encoding="utf-8")
    result = runner.invoke(main, ["broker", "--config", str(config), "--no-curve"])
    assert "no_such_key" in assert_one_line_error(result)


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0
    assert "0." in result.output


# ------------------------------------------------------------------------------------------- real processes

#: Real broker processes here take no fixed gateway or monitoring port (one would collide with another
#: broker).
NO_GATEWAY_PORTS = ("--sexp", "127.0.0.1:0", "--msgq", "127.0.0.1:0", "--rstreams", "127.0.0.1:0",
                    "--lumberjack", "127.0.0.1:0", "--http", "127.0.0.1:0")


def mc0_command() -> list[str]:
    script = shutil.which("mc0")
    if script is not None:
        return [script]
    return [sys.executable, "-c", "from connector.cli import main; main()"]


class StderrLines:
    """Every line a process writes to stderr, collected by a thread (select() on a buffered pipe can miss
    lines that already sit in Python's buffer)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        self.stream = process.stderr
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.ended = False
        self.thread = threading.Thread(target=self._collect, daemon=True)
        self.thread.start()

    def _collect(self) -> None:
        for line in self.stream:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    @property
    def text(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def wait_for(self, marker: str, timeout: float) -> str:
        """Everything written so far, once a line contains ``marker``."""
        with self.changed:
            found = self.changed.wait_for(lambda: self.ended or any(marker in line for line in self.lines),
                                          timeout)
            seen = "".join(self.lines)
        assert found, f"{marker!r} not printed in {timeout} s; stderr so far:\n{seen}"
        assert marker in seen, f"the process ended before printing {marker!r}:\n{seen}"
        return seen

    def close(self) -> None:
        self.thread.join(5)
        self.stream.close()


@pytest.mark.timeout(30)
def test_real_broker_pub_and_sub_processes(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MC0_KEYS", None)
    env.pop("MC0_BROKER", None)
    broker = subprocess.Popen(
        [*mc0_command(), "broker", "--bind", endpoint, *NO_GATEWAY_PORTS, "--keys", str(keys)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        cwd=tmp_path,
    )
    stderr = StderrLines(broker)
    subscriber: subprocess.Popen[str] | None = None
    try:
        started = stderr.wait_for("listening on", timeout=15)
        assert f"Created CURVE keys in {keys}" in started
        assert f"mc0 broker listening on {endpoint}" in started
        for name in ("broker.key", "broker.key_secret", "client.key_secret", "allowed/client.key"):
            assert (keys / name).is_file(), name

        common = ["--broker", endpoint, "--keys", str(keys)]
        subscriber = subprocess.Popen(
            [*mc0_command(), "sub", "greetings", *common, "--count", "1", "--json", "--timeout", "15"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        with Client(endpoint, keys=keys, timeout=5.0) as observer:
            wait_for_subscribers(observer, "greetings", timeout=15)
        published = subprocess.run(
            [*mc0_command(), "pub", "greetings", "hello from a process", *common, "-H", "X-From=pub"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=15,
        )
        assert published.returncode == 0, published.stderr
        out, err = subscriber.communicate(timeout=15)
        assert subscriber.returncode == 0, err
        message = json.loads(out.strip())
        assert message["topic"] == "greetings"
        assert message["body"] == "hello from a process"
        assert message["headers"] == {"X-From": "pub"}
        assert isinstance(message["id"], int)

        broker.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert broker.wait(timeout=5) == 0
        assert time.monotonic() - stopped < 3.0
        stderr.close()
        assert "Traceback" not in stderr.text
        assert stderr.text.count("mc0 broker listening on") == 1, "said once, by the broker's log"
        assert "dropped: disconnected" not in stderr.text, "a client that says DISCONNECT is no news at INFO"
    finally:
        for process in (subscriber, broker):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=5)
        stderr.close()


@pytest.mark.timeout(30)
def test_real_broker_refuses_a_busy_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*mc0_command(), "broker", "--bind", f"tcp://127.0.0.1:{port}", *NO_GATEWAY_PORTS, "--no-curve"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15, cwd=tmp_path,
        )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    assert "Address already in use" in errors[0]


@pytest.mark.timeout(40)
def test_sighup_admits_a_client_added_to_the_allow_list(tmp_path: Path) -> None:
    """A key copied into allowed/ is refused until SIGHUP makes the running broker re-read the folder."""
    keys = tmp_path / "keys"
    key_files.generate(keys)
    newcomer = tmp_path / "newcomer"
    key_files.generate(newcomer, ("alice",))  # alice's pair, not yet admitted by the broker in ``keys``
    credentials = key_files.Credentials(
        key_files.broker_public(keys),
        key_files.client_pair(newcomer, "alice").public,
        key_files.client_pair(newcomer, "alice").secret or b"",
    )
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    broker = subprocess.Popen(
        [*mc0_command(), "broker", "--bind", endpoint, *NO_GATEWAY_PORTS, "--keys", str(keys)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path,
    )
    stderr = StderrLines(broker)
    try:
        stderr.wait_for("listening on", timeout=15)
        with pytest.raises(ConnectorError, match="refused this client's key"):
            Client(endpoint, credentials=credentials, timeout=1.0)
        shutil.copyfile(newcomer / "alice.key", keys / "allowed" / "alice.key")
        broker.send_signal(signal.SIGHUP)
        stderr.wait_for("2 client key(s)", timeout=10)
        with Client(endpoint, credentials=credentials, timeout=5.0) as alice:
            assert alice.stats()["connections"]["mc0"] >= 1
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=5) == 0
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait(timeout=5)
        stderr.close()
