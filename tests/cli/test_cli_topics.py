"""``mc0 topics``, ``mc0 declare`` and the durable options of ``mc0 sub`` against a real in-process broker
whose ``p.*`` topics are persistent broadcast and ``q.*`` topics persistent round-robin (strong sync, logs in
``tmp_path``): the table row of a persistent topic (its ids and bytes on disk, as the broker's JSON says),
``--json``, ``sub --replay`` reading stored messages, ``sub --ack --credit`` consuming a queue for good,
declaring a topic and a conflicting declare as a one-line error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result
from conftest import QUIET, receive_all

from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicSpec
from connector import Client
from connector.cli import main

if TYPE_CHECKING:
    from conftest import BrokerFactory

    from broker.server import Broker

pytestmark = pytest.mark.timeout(30)

RULES = (
    TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),
    TopicRule("q.*", TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT,
                               sync=Sync.STRONG)),
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def durable(start_broker: BrokerFactory, tmp_path: Path) -> Broker:
    return start_broker(topics=RULES, data_dir=tmp_path / "data")


@pytest.fixture
def client(durable: Broker) -> Iterator[Client]:
    with Client(durable.endpoint, timeout=3.0) as connected:
        yield connected


def invoke(runner: CliRunner, broker: Broker, *arguments: str) -> Result:
    return runner.invoke(main, [*arguments, "--broker", broker.endpoint, "--no-curve"])


def one_line_error(result: Result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), lines[0]
    return lines[0]


def test_topics_shows_a_persistent_topic_with_its_ids_and_bytes(
    runner: CliRunner, durable: Broker, client: Client
) -> None:
    for n in range(3):
        client.publish("p.cli", f"m{n}", confirm=True)
    client.subscribe("plain")
    client.publish("plain", "x", confirm=True)
    receive_all(client, 1)
    result = invoke(runner, durable, "topics")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["topic", "delivery", "persistence", "published", "stored", "first", "last",
                                "bytes", "subs", "lag", "dropped"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    on_disk = client.topics()["p.cli"]["bytes"]
    assert on_disk > 0
    assert rows["p.cli"] == ["p.cli", "broadcast", "persistent/strong", "3", "3", "1", "3", str(on_disk), "0",
                             "0", "0"]
    # A transient topic has no log: nothing stored, no first id, no bytes on disk; it took one message.
    assert rows["plain"] == ["plain", "broadcast", "transient", "1", "-", "-", "1", "-", "1", "0", "0"]
    # Aligned: every row starts its persistence cell where the heading does.
    column = lines[0].index("persistence")
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines[1:])


def test_topics_json_is_the_brokers_topics(runner: CliRunner, durable: Broker, client: Client) -> None:
    client.publish("p.json", "m", confirm=True)
    result = invoke(runner, durable, "topics", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["p.json"]["last_id"] == 1
    assert data["p.json"]["persistence"] == "persistent"
    assert set(data) == set(client.topics())


def test_sub_replay_prints_the_stored_messages(runner: CliRunner, durable: Broker, client: Client) -> None:
    for n in range(1, 6):
        client.publish("p.replayed", f"m{n}", confirm=True)
    result = invoke(runner, durable, "sub", "p.replayed", "--replay", "3", "--json", "-n", "3",
                    "--timeout", "5")
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(m["id"], m["body"]) for m in printed] == [(3, "m3"), (4, "m4"), (5, "m5")]
    result = invoke(runner, durable, "sub", "p.replayed", "--replay", "beginning", "-n", "5",
                    "--timeout", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["m1", "m2", "m3", "m4", "m5"]


def test_sub_ack_consumes_queue_messages_for_good(runner: CliRunner, durable: Broker, client: Client) -> None:
    for n in range(3):
        client.publish("q.work", f"job {n}", confirm=True)
    # Credit 1: the command holds one message at a time, so it never takes more than the two it prints.
    result = invoke(runner, durable, "sub", "q.work", "--ack", "--credit", "1", "-n", "2", "--timeout", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["job 0", "job 1"]
    client.subscribe("q.work", explicit_acks=True)
    (rest,) = receive_all(client, 1)
    assert rest.text == "job 2"  # the two printed were acked: nothing comes back
    assert client.receive(timeout=QUIET * 2) is None


def test_sub_without_ack_leaves_queue_messages_to_the_next_consumer(
    runner: CliRunner, durable: Broker, client: Client
) -> None:
    client.publish("q.redo", "job", confirm=True)
    result = invoke(runner, durable, "sub", "q.redo", "--credit", "1", "-n", "1", "--timeout", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout == "job\n"
    client.subscribe("q.redo", explicit_acks=True)
    assert client.receive(timeout=QUIET * 2) is None  # an auto-ack subscription consumed it


def test_declare_then_a_conflicting_declare_is_one_line(runner: CliRunner, durable: Broker,
                                                         client: Client) -> None:
    result = invoke(runner, durable, "declare", "d.cli", "--delivery", "round-robin", "--persistence",
                    "persistent", "--sync", "weak", "--segment-bytes", "1048576")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("declared d.cli (")
    topic = client.topics()["d.cli"]
    assert (topic["delivery"], topic["persistence"], topic["sync"]) == ("round-robin", "persistent", "weak")
    again = invoke(runner, durable, "declare", "d.cli", "--delivery", "round-robin", "--persistence",
                   "persistent", "--sync", "weak", "--segment-bytes", "1048576")
    assert again.exit_code == 0, again.output
    line = one_line_error(invoke(runner, durable, "declare", "d.cli", "--delivery", "broadcast"))
    assert "refused DECLARE" in line
    assert "d.cli" in line


def test_sub_replay_on_a_transient_topic_is_one_line(runner: CliRunner, durable: Broker) -> None:
    line = one_line_error(invoke(runner, durable, "sub", "plain", "--replay", "beginning", "--timeout", "1"))
    assert "refused SUB" in line


def test_pub_confirm_reports_the_message_id_and_durability(runner: CliRunner, durable: Broker) -> None:
    result = invoke(runner, durable, "pub", "p.confirmed", "hello", "--confirm")
    assert result.exit_code == 0, result.output
    assert "confirmed: message id 1, durability fsync" in result.output
    result = invoke(runner, durable, "pub", "plain", "hello", "--confirm")
    assert "confirmed: message id 1, durability memory" in result.output


def test_delete_removes_a_topic_and_says_so(runner: CliRunner, durable: Broker, client: Client) -> None:
    client.publish("p.gone", "x", confirm=True)
    result = invoke(runner, durable, "delete", "p.gone")
    assert result.exit_code == 0, result.output
    assert result.output == "deleted p.gone\n"
    assert "p.gone" not in client.topics()
    line = one_line_error(invoke(runner, durable, "delete", "p.gone"))
    assert line == "Error: broker refused DELETE: no topic 'p.gone' to delete"


def test_topics_pages_with_prefix_limit_after_and_all(runner: CliRunner, durable: Broker,
                                                       client: Client) -> None:
    client.publish_batch([(f"many.{n:02d}", "x", None) for n in range(30)])
    client.flush()
    result = invoke(runner, durable, "topics", "--prefix", "many.", "--limit", "10")
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert rows == [f"many.{n:02d}" for n in range(10)]
    assert "(10 topics shown of" in result.stderr
    assert "the next page: --after 'many.09'" in result.stderr
    result = invoke(runner, durable, "topics", "--prefix", "many.", "--limit", "10", "--after", "many.09")
    rows = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert rows == [f"many.{n}" for n in range(10, 20)]
    result = invoke(runner, durable, "topics", "--prefix", "many.", "--limit", "7", "--all")
    assert len(result.stdout.splitlines()) == 31
    assert result.stderr == ""
