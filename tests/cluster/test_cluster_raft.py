"""RaftNode (broker.cluster.raft) on three brokers' worth of PySyncObj in this process, on loopback ports:
commands go through, and a leader whose leadership transfer is under way refuses the commands other members
forward, at once, with a reason (an entry appended after Raft's TimeoutNow left would fail the transfer)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.throughput import free_ports
from broker.cluster.raft import RaftNode, Role


class Member:
    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, everyone: list[str],
                 folder: Path) -> None:
        self.loop = loop
        self.role: Role | None = None
        self.raft = RaftNode(address, everyone, loop=loop, on_state=lambda command, state: None,
                             on_role=self._on_role, directory=folder, timeout=0.3, password=None)

    def _on_role(self, role: Role) -> None:
        self.role = role

    def submit(self, command: tuple[Any, ...]) -> tuple[bool | None, str | None]:
        """Submit ``command`` and run the loop until its outcome arrives."""
        outcome: asyncio.Future[tuple[bool | None, str | None]] = self.loop.create_future()
        self.raft.submit(command, lambda result, error: outcome.done() or outcome.set_result((result, error)))
        return self.loop.run_until_complete(asyncio.wait_for(outcome, 10))


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    loop = asyncio.new_event_loop()
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    made = [Member(loop, address, addresses, tmp_path / str(index))
            for index, address in enumerate(addresses)]
    yield made
    for member in made:
        member.raft.close()
    loop.close()


def leader_of(members: list[Member]) -> Member:
    deadline = time.monotonic() + 10
    while True:
        members[0].loop.run_until_complete(asyncio.sleep(0.05))  # the role callbacks arrive on the loop
        leaders = [member for member in members if member.role is not None and member.role.leading]
        if len(leaders) == 1 and all(member.role is not None and member.role.leader == leaders[0].raft.node
                                     for member in members):
            return leaders[0]
        assert time.monotonic() < deadline, "no leader every member names"


@pytest.mark.timeout(60)
def test_a_leader_handing_over_refuses_forwarded_commands_then_takes_them(members: list[Member]) -> None:
    leader = leader_of(members)
    follower = next(member for member in members if member is not leader)
    assert follower.submit(("join", follower.raft.node, "tcp://127.0.0.1:1")) == (True, None)
    deadline = time.monotonic() + 5  # a follower that answers the leader's Raft is one to hand over to
    while leader.role is None or follower.raft.node not in leader.role.answering:
        assert time.monotonic() < deadline, "the leader does not count the follower as answering"
        leader.loop.run_until_complete(asyncio.sleep(0.05))

    leader.raft._transferring_until = time.monotonic() + 60  # as after a TimeoutNow went out
    started = time.monotonic()
    assert follower.submit(("join", follower.raft.node, "tcp://127.0.0.1:2")) == (None, "denied")
    assert time.monotonic() - started < 1  # refused at once, not left to time out

    leader.raft._transferring_until = 0.0  # the transfer failed and this broker still leads
    assert follower.submit(("join", follower.raft.node, "tcp://127.0.0.1:2")) == (True, None)


@pytest.mark.timeout(60)
def test_a_member_is_catching_up_until_it_has_applied_what_the_leader_committed(
        members: list[Member]) -> None:
    """What the member waits for before it follows anyone (Cluster._settle): a broker that has heard no
    leader since it started knows only its journal; once it has applied what the leader said is committed,
    its state is the cluster's."""
    leader = leader_of(members)
    follower = next(member for member in members if member is not leader)
    assert follower.submit(("join", follower.raft.node, "tcp://127.0.0.1:1")) == (True, None)
    deadline = time.monotonic() + 5
    while follower.raft.catching_up():
        assert time.monotonic() < deadline, "the follower never caught up with the leader's commits"
        follower.loop.run_until_complete(asyncio.sleep(0.05))


@pytest.mark.timeout(60)
def test_a_member_that_has_heard_no_leader_is_catching_up(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    address, *nobody = (f"127.0.0.1:{port}" for port in free_ports(3))  # peers never started
    alone = Member(loop, address, [address, *nobody], tmp_path)
    try:
        loop.run_until_complete(asyncio.sleep(0.5))
        assert alone.raft.catching_up(), "its state is its journal's until a leader says more"
    finally:
        alone.raft.close()
        loop.close()


@pytest.mark.timeout(60)
def test_a_transfer_request_is_taken_at_once_not_at_the_next_tick(members: list[Member]) -> None:
    """PySyncObj's thread ticks every 50 ms; a hand-over's TimeoutNow used to wait for that tick (25 ms on
    average). The request wakes the thread. Asked of a follower, PySyncObj refuses it at once, so the time to
    the answer is the time the request waited."""
    leader = leader_of(members)
    follower = next(member for member in members if member is not leader)
    waits = []
    for _ in range(10):
        answered: asyncio.Future[bool] = follower.loop.create_future()
        started = time.monotonic()
        follower.raft.transfer(leader.raft.node, lambda sent, answered=answered: answered.set_result(sent))
        sent = follower.loop.run_until_complete(asyncio.wait_for(answered, 5))
        assert not sent, "a follower cannot transfer"
        waits.append(time.monotonic() - started)
    assert sorted(waits)[len(waits) // 2] < 0.015, f"waited {sorted(waits)} s"
