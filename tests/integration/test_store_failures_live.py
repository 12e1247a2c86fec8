"""A store failure of one topic, seen by clients of a live broker: the disk of one topic fills up (its writes
fail) while the broker runs. A confirmed PUT to it gets ERROR instead of OK (its message was never stored),
a Lumberjack shipper gets no ack and the connection closes (it sends the batch again), other topics go on
being confirmed, and once the disk has room the same topic takes messages again with ids that continue.
Nothing stops the broker.
"""

from __future__ import annotations

import socket
import struct
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from conftest import BrokerFactory, DealerFactory, failing_writes

from broker.store.files import directory_name
from broker.topics import Persistence, TopicRule, TopicSpec
from protocol import lumberjack

RULES = (TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT)),
         TopicRule("logs", TopicSpec(persistence=Persistence.PERSISTENT)))


def full_disk(monkeypatch: pytest.MonkeyPatch, topic: bytes) -> AbstractContextManager[None]:
    """Writes to the files of ``topic`` fail with ENOSPC, nothing else does."""
    return failing_writes(monkeypatch, "/" + directory_name(topic) + "/")


@pytest.mark.timeout(30)
def test_a_full_disk_turns_the_ok_into_an_error_and_the_broker_goes_on(
    start_broker: BrokerFactory, dealer: DealerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broker = start_broker(topics=RULES, data_dir=tmp_path / "data")
    peer = dealer(broker.endpoint)
    peer.connect(extensions="ids")
    assert peer.ok("PUT", "TOPIC", "p.full", "", "one").header("MESSAGE-ID") == b"1"
    with full_disk(monkeypatch, b"p.full"):
        reply = peer.request("PUT", "TOPIC", "p.full", "ID", "lost", "", "two")
        assert reply.verb == b"ERROR"
        assert reply.header("ID") == b"lost"
        message = reply.header("MESSAGE")
        assert message is not None
        assert message.startswith(b"not stored: ")
        assert b"No space left on device" in message
        assert peer.ok("PUT", "TOPIC", "p.other", "", "fine").header("MESSAGE-ID") == b"1"
    assert peer.ok("PUT", "TOPIC", "p.full", "", "two again").header("MESSAGE-ID") == b"2"
    topics = peer.stats()["topics"]  # what STATS and the monitoring count
    assert topics["p.full"]["write_failures"] == 1
    assert topics["p.other"]["write_failures"] == 0
    reply = peer.ok("FETCH", "TOPIC", "p.full")
    assert reply.header("COUNT") == b"2"


@pytest.mark.timeout(30)
def test_a_shipper_gets_no_ack_for_events_that_were_not_stored(
    start_broker: BrokerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broker = start_broker(topics=RULES, data_dir=tmp_path / "data", lumberjack_topic="logs")
    writer = lumberjack.ClientConnection(version=lumberjack.V2)
    with socket.create_connection(broker.gateway_address("lumberjack"), timeout=5) as sock:
        sock.sendall(writer.send_window(1) + writer.send_events([(1, {"m": "first"})]))
        assert sock.recv(6) == b"2A" + struct.pack(">I", 1)  # the topic and its log exist
    with full_disk(monkeypatch, b"logs"), socket.create_connection(broker.gateway_address("lumberjack"),
                                                                   timeout=5) as sock:
        sock.sendall(writer.send_window(2) + writer.send_events([(1, {"m": "a"}), (2, {"m": "b"})]))
        received = b""
        while chunk := sock.recv(64):
            received += chunk
        acks = [struct.unpack(">I", received[at + 2 : at + 6])[0] for at in range(0, len(received), 6)
                if received[at + 1 : at + 2] == b"A"]
        assert 2 not in acks, "an ack for events that are not stored"
    with socket.create_connection(broker.gateway_address("lumberjack"), timeout=5) as sock:
        sock.sendall(writer.send_window(2) + writer.send_events([(1, {"m": "a"}), (2, {"m": "b"})]))
        assert sock.recv(6) == b"2A" + struct.pack(">I", 2)  # the same batch again, stored this time
