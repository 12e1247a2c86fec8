"""A member started with another list of members than the others (a typo in ``cluster_peers``), three
brokers in this process. One whose list names the leader joins through it, and every other member says once
that its list differs from their own; one whose list does not name the leader never hears one though it
reaches a majority, and says once, after SILENT_AFTER, what to check."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from cluster_harness import member_here
from conftest import BrokerFactory

from bench.throughput import free_ports
from broker.cluster import node
from broker.server import Broker
from connector import Client


def _until(said: pytest.LogCaptureFixture, text: str, within: float = 15.0) -> list[str]:
    deadline = time.monotonic() + within
    while True:
        lines = [record.getMessage() for record in said.records if text in record.getMessage()]
        if lines:
            return lines
        assert time.monotonic() < deadline, f"nobody said {text!r}"
        time.sleep(0.1)


def _member(start_broker: BrokerFactory, folder: Path, rafts: list[str], index: int,
            peers: tuple[str, ...]) -> Broker:
    return member_here(start_broker, folder / f"broker{index}", rafts[index], peers)


def _two_and_their_leader(start_broker: BrokerFactory, folder: Path) -> tuple[list[str], str, str]:
    """The Raft addresses of three members and one nobody has; the first two started (with the right
    list), and which of them leads."""
    rafts = [f"127.0.0.1:{port}" for port in free_ports(4)]
    brokers = [_member(start_broker, folder, rafts, index,
                       tuple(raft for raft in rafts[:3] if raft != rafts[index])) for index in (0, 1)]
    deadline = time.monotonic() + 20
    while True:
        with Client(",".join(broker.endpoint for broker in brokers), curve=False, timeout=10) as client:
            client.publish("durable.watched", "on two of three", confirm=True)
            leader = client.stats()["limits"]["cluster"]["node"]
        if leader in rafts[:2]:
            return rafts[:3], rafts[3], leader
        assert time.monotonic() < deadline


@pytest.mark.timeout(120)
def test_a_member_that_names_other_members_than_the_leader_is_named_by_everyone(
        start_broker: BrokerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The third member's list names the leader and a broker that does not exist: it joins through the
    leader, and every member says once that its list differs from its own."""
    caplog.set_level(logging.INFO, logger="mc0.cluster")
    rafts, nobody, leader = _two_and_their_leader(start_broker, tmp_path)
    _member(start_broker, tmp_path, rafts, 2, (leader, nobody))
    _until(caplog, f"member {rafts[2]} was started with the members")
    time.sleep(1)  # every member applies the join
    named = _until(caplog, f"member {rafts[2]} was started with the members")
    assert len(named) == 2, named  # the two others; not the joiner itself
    expected = ", ".join(sorted((rafts[2], leader, nobody)))
    assert f"was started with the members {expected}, this one with {', '.join(sorted(rafts))}" in named[0]


@pytest.mark.timeout(120)
def test_a_member_whose_list_does_not_name_the_leader_says_what_to_check(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The third member's list names the follower and a broker that does not exist, not the leader: it never
    hears a leader though it reaches a majority (itself and the follower), and says once what to check."""
    monkeypatch.setattr(node, "SILENT_AFTER", 1.0)
    caplog.set_level(logging.INFO, logger="mc0.cluster")
    rafts, nobody, leader = _two_and_their_leader(start_broker, tmp_path)
    follower = next(raft for raft in rafts[:2] if raft != leader)
    _member(start_broker, tmp_path, rafts, 2, (follower, nobody))
    said = _until(caplog, "no Raft leader for")
    assert len(said) == 1
    assert f"every member must name the same brokers (this one is {rafts[2]}, with {follower}, {nobody})" \
        in said[0]
