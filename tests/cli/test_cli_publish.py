"""Every ``pub`` command the same way: MESSAGE ``--count`` times or each line of stdin once, ``--rate``, a
clear refusal of ``--count`` without MESSAGE; headers where the dialect carries them (mc0; msgq's X- fields);
and every ``sub --json`` naming the payload ``body``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from conftest import free_port, receive_all

from connector import Client
from connector.cli import main

if TYPE_CHECKING:
    from broker.server import Broker

pytestmark = pytest.mark.timeout(30)


def door(broker: Broker, name: str) -> list[str]:
    host, port = broker.gateway_address(name)
    return ["--broker", f"{host}:{port}"]


@pytest.mark.parametrize("command", [["pub", "t", "--no-curve"], ["sexp", "pub", "t"], ["msgq", "pub", "t"],
                                     ["rstreams", "pub", "t"]])
def test_count_without_a_message_is_refused_in_one_line(command: list[str]) -> None:
    nowhere = ["--broker", f"127.0.0.1:{free_port()}"]  # refused before connecting; still no fixed port
    result = CliRunner().invoke(main, [*command, *nowhere, "--count", "5"], input="a\n")
    assert result.exit_code == 1
    assert result.output == ("Error: --count repeats MESSAGE: give one (pub TOPIC MESSAGE --count N); "
                             "without it, each line of stdin is published once\n")


@pytest.mark.parametrize("dialect", ["sexp", "msgq", "rstreams"])
def test_every_dialect_pub_repeats_a_message(broker: Broker, dialect: str) -> None:
    with Client(broker.endpoint, curve=False) as observer:
        observer.subscribe("load")
        result = CliRunner().invoke(main, [dialect, "pub", "load", "x", "--count", "25", "--rate", "1000",
                                           *door(broker, dialect)])
        assert result.exit_code == 0, result.output
        assert "published 25 " in result.output
        assert [m.body for m in receive_all(observer, 25)] == [b"x"] * 25
        assert observer.receive(timeout=0.2) is None


def test_msgq_x_fields_travel_as_headers_both_ways(broker: Broker) -> None:
    with Client(broker.endpoint, curve=False) as observer:
        observer.subscribe("g")
        result = CliRunner().invoke(main, ["msgq", "pub", "g", "hi", "-H", "X-Trace=7",
                                           *door(broker, "msgq")])
        assert result.exit_code == 0, result.output
        message = receive_all(observer, 1)[0]
    assert message.headers.get("X-Trace") == "7"
    refused = CliRunner().invoke(main, ["msgq", "pub", "g", "hi", "-H", "Trace=7", *door(broker, "msgq")])
    assert refused.exit_code == 1
    assert "msgq carries X- fields only as headers" in refused.output


@pytest.mark.parametrize("dialect", ["sexp", "msgq", "rstreams"])
def test_sub_json_names_the_payload_body_on_every_door(broker: Broker, dialect: str) -> None:
    runner = CliRunner()
    with Client(broker.endpoint, curve=False) as publisher:
        publisher.declare("p.json", persistence="persistent")
        publisher.publish("p.json", "hello", confirm=True)
    received = runner.invoke(main, [dialect, "sub", "p.json", *door(broker, dialect), "--replay", "beginning",
                                    "--count", "1", "--json"])
    assert received.exit_code == 0, received.output
    line = next(line for line in received.output.splitlines() if line.startswith("{"))
    assert json.loads(line)["body"] == "hello"
