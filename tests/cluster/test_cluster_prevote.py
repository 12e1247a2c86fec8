"""Pre-vote (broker.cluster.prevote) on three PySyncObj nodes in this process, on loopback ports, with the
broker's own Raft settings (``password_conf``) and short timeouts.

It must let elections through when a leader is gone and a leadership transfer through when the leader asks
for one, and stop a follower that cannot hear its leader (while the others can) from unseating it. The last
case is what PySyncObj alone gets wrong: that follower stands at a higher term and the leader steps down."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pysyncobj import SyncObj
from pysyncobj import monotonic as raft_clock

from bench.throughput import free_ports
from broker.cluster.prevote import NEVER, PreVote
from broker.cluster.raft import password_conf

TIMEOUT = 0.3  # the shortest election timeout; the longest is twice it


class Node:
    def __init__(self, address: str, others: list[str], directory: Path, timeout: float = TIMEOUT) -> None:
        # Ticked on every state change as well, as broker.cluster.raft does: a leader stepping down runs it
        # before PySyncObj has granted the vote that takes it down.
        conf = password_conf(None, timeout, directory, lambda _old, _new: self.tick())
        self.sync = SyncObj(address, others, conf=conf)
        self.prevote = PreVote(self.sync)
        self.sync.addOnTickCallback(self.tick)
        self.address = address

    def tick(self) -> None:
        if hasattr(self, "prevote"):
            self.prevote.tick()

    @property
    def term(self) -> int:
        return self.sync._SyncObj__raftCurrentTerm  # type: ignore[attr-defined, no-any-return]

    @property
    def leader(self) -> str | None:
        leader = self.sync._getLeader()
        return None if leader is None else leader.id  # type: ignore[no-any-return]

    def deaf_to(self, address: str) -> None:
        """Drop every message from ``address`` (a one-way cut: what this node sends still arrives)."""
        receive = self.sync._SyncObj__transport._onMessageReceivedCallback  # type: ignore[attr-defined]

        def filtered(node: Any, message: Any) -> None:
            if node.id != address:
                receive(node, message)

        self.sync._SyncObj__transport.setOnMessageReceivedCallback(filtered)  # type: ignore[attr-defined]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    made = [member(addresses, index, tmp_path) for index in range(3)]
    yield made
    for node in made:
        node.sync.destroy()


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Node]:
    """One node whose two peers never start: it hears no leader and holds no election."""
    address, *nobody = (f"127.0.0.1:{port}" for port in free_ports(3))
    node = Node(address, nobody, tmp_path)
    yield node
    node.sync.destroy()


def member(addresses: list[str], index: int, folder: Path, timeout: float = TIMEOUT) -> Node:
    """The node at ``addresses[index]`` of a cluster of them, its journal in a folder of its own."""
    address = addresses[index]
    return Node(address, [other for other in addresses if other != address], folder / str(index), timeout)


@contextmanager
def hand_ticked(folder: Path) -> Iterator[SyncObj]:
    """A SyncObj without a Raft thread (the test ticks pre-vote itself) whose two peers never start: it is
    never connected."""
    address, *others = (f"127.0.0.1:{port}" for port in free_ports(3))
    conf = password_conf(None, TIMEOUT, folder, lambda _old, _new: None)
    conf.autoTick = False
    sync = SyncObj(address, others, conf=conf)
    try:
        yield sync
    finally:
        sync.destroy()


def vote_request(sync: SyncObj, prevote: PreVote) -> dict[str, Any]:
    """A request_vote for the next term from a member whose log is as up to date as this one's."""
    term, index = prevote._log_position()
    return {"type": "request_vote", "term": sync._SyncObj__raftCurrentTerm + 1,  # type: ignore[attr-defined]
            "last_log_term": term, "last_log_index": index}


def until(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def agreed_leader(nodes: list[Node]) -> Node | None:
    names = {node.leader for node in nodes}
    if len(names) != 1 or None in names:
        return None
    return next((node for node in nodes if node.address in names), None)  # None: a node that is gone


@pytest.mark.timeout(60)
def test_a_silent_leader_is_replaced_and_pysyncobj_never_stands_by_itself(nodes: list[Node]) -> None:
    leader = until(lambda: agreed_leader(nodes), 10, "no leader was elected")
    followers = [node for node in nodes if node is not leader]
    # The followers' Raft deadlines are held where they never pass; pre-vote keeps the real ones.
    until(lambda: all(node.sync._SyncObj__raftElectionDeadline == NEVER for node in followers), 2,  # type: ignore[attr-defined]
          "a follower's PySyncObj deadline is not held")
    term = leader.term
    for follower in followers:  # silent, its connections open: a paused process, not a dead one
        follower.deaf_to(leader.address)
    started = time.monotonic()
    successor = until(lambda: agreed_leader(followers), 10, "no new leader after the leader fell silent")
    # One election timeout (up to 2 x TIMEOUT) plus the vote, not a second timeout for the pre-vote.
    assert time.monotonic() - started < 6 * TIMEOUT
    assert successor.term > term
    assert sum(node.prevote.elections for node in followers) >= 1
    assert sum(node.prevote.leaders_gone for node in followers) == 0


@pytest.mark.timeout(60)
def test_a_leader_whose_connections_close_is_replaced_without_the_timeout(
        nodes: list[Node], caplog: pytest.LogCaptureFixture) -> None:
    """A killed broker's sockets close at once: its followers ask for pre-votes then, and grant them to each
    other, instead of waiting out the election timeout (bench cluster measures what that saves). The log
    says why each asks."""
    caplog.set_level(logging.INFO, logger="mc0.cluster")
    leader = until(lambda: agreed_leader(nodes), 10, "no leader was elected")
    assert "no Raft leader heard since this broker started: asking" in caplog.text
    term = leader.term
    leader.sync.destroy()
    nodes.remove(leader)
    successor = until(lambda: agreed_leader(nodes), 10, "no new leader after the leader went")
    assert successor.term > term
    assert sum(node.prevote.leaders_gone for node in nodes) >= 1
    assert "the Raft leader's connection closed: asking" in caplog.text


@pytest.mark.timeout(60)
def test_a_follower_that_cannot_hear_the_leader_does_not_unseat_it(nodes: list[Node]) -> None:
    leader = until(lambda: agreed_leader(nodes), 10, "no leader was elected")
    deaf, hearing = (node for node in nodes if node is not leader)
    term = leader.term
    elections = deaf.prevote.elections  # the first election may have been through it
    hearing_elections = hearing.prevote.elections
    deaf.deaf_to(leader.address)
    time.sleep(10 * TIMEOUT)  # five of its longest election timeouts
    assert deaf.prevote.asked >= 3  # it asked, again and again ...
    assert deaf.prevote.elections == elections  # ... and was refused: the other follower hears the leader
    # PySyncObj's own deadlines are held (pre-vote starts every election), so only an election of the other
    # follower could change the term: one whose thread starved past 0.3 s on a loaded machine and that stopped
    # hearing the leader itself, which is not what this test is about (it failed so once in CI).
    if hearing.prevote.elections == hearing_elections:
        assert leader.sync._isLeader()
        assert [node.term for node in nodes] == [term] * 3


@pytest.mark.timeout(60)
def test_a_leadership_transfer_is_not_held_back(nodes: list[Node]) -> None:
    leader = until(lambda: agreed_leader(nodes), 10, "no leader was elected")
    target = next(node for node in nodes if node is not leader)
    until(lambda: target.sync.getStatus()["commit_idx"] == leader.sync.getStatus()["commit_idx"], 5,
          "the target's Raft log did not catch up")
    time.sleep(2 * TIMEOUT)  # a leader that has led for longer than its last deadline as a follower
    elections = target.prevote.elections  # the first election may have been through it
    asked_before = leader.prevote.asked  # (its own pre-vote won it the first)
    asked: list[bool] = []

    def transfer() -> None:  # on PySyncObj's thread, as broker.cluster.raft does it: the transport is its
        if not asked:
            asked.append(True)
            leader.sync.transferLeadership(target.address)

    started = time.monotonic()
    leader.sync.addOnTickCallback(transfer)
    until(lambda: target.sync._isLeader(), 5, "the transfer's target did not take over")
    assert time.monotonic() - started < TIMEOUT  # at once: TimeoutNow, not an election timeout
    assert target.prevote.elections == elections  # PySyncObj stood on TimeoutNow, without a pre-vote
    # The old leader follows with a fresh election timeout, as if it had just heard a leader: it does not ask
    # for pre-votes at once on the deadline it last had as a follower, long passed.
    until(lambda: leader.leader == target.address, 5, "the old leader does not follow the new one")
    time.sleep(TIMEOUT / 2)
    assert leader.prevote.asked == asked_before


def test_the_vote_rule_compares_logs_and_refuses_while_a_leader_is_heard(lone: Node) -> None:
    prevote = lone.prevote
    term, index = prevote._log_position()

    def vote(last_term: int, last_index: int) -> bool:
        return prevote.would_vote({"last_log_term": last_term, "last_log_index": last_index})

    prevote._heard = time.monotonic()
    assert not vote(term + 1, index)  # it hears a leader
    prevote._heard = time.monotonic() - 2 * TIMEOUT
    assert vote(term, index)
    assert vote(term + 1, 0)
    assert not vote(term, index - 1)
    assert not vote(term - 1, index + 10)


@pytest.mark.timeout(60)
def test_two_asking_at_once_do_not_both_stand(lone: Node) -> None:
    """Two followers that ask in the same moment grant each other; were both to stand, the votes would split.
    The one whose name sorts later withdraws (the answer to its own question then counts for nothing)."""
    prevote = lone.prevote
    # Once pre-vote holds PySyncObj's deadline, PySyncObj's thread leaves _asking alone (nobody to ask).
    until(lambda: lone.sync._SyncObj__raftElectionDeadline == NEVER, 5, "pre-vote took the deadline over")
    sent: list[dict[str, Any]] = []
    prevote._send = lambda _node, message: sent.append(message) or True  # type: ignore[method-assign]
    prevote._heard = time.monotonic() - 2 * TIMEOUT  # no leader heard lately: it grants
    term, index = prevote._log_position()
    ask = {"type": "pre_vote", "term": lone.term + 1, "last_log_term": term, "last_log_index": index}

    class Other:
        def __init__(self, name: str) -> None:
            self.id = name

    prevote._asking = lone.term + 1
    prevote.receive(Other("9.9.9.9:1"), ask)  # sorts after this node's name
    assert sent[-1]["granted"]
    assert prevote._asking == lone.term + 1, "a later name's question does not make this one withdraw"
    prevote.receive(Other("0.0.0.0:1"), ask)  # sorts before it
    assert sent[-1]["granted"]
    assert prevote._asking is None, "an earlier name asked at once: this one withdraws"
    prevote.receive(Other("0.0.0.0:1"), {"type": "pre_vote_response", "term": lone.term + 1,
                                          "granted": True})
    assert prevote.elections == 0, "the grant of its withdrawn question does not make it stand"
    assert lone.sync._SyncObj__raftElectionDeadline != 0  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_a_restarted_member_is_connected_to_again_within_an_append_period(tmp_path: Path) -> None:
    """Pre-vote's shortcut for a killed leader needs the two others connected to each other; a member that
    was away is connected to again within an append period of its return (a fifth of the timeout), not after
    PySyncObj's retry time (a whole timeout here before, 5 s by default). Of each pair, the member whose
    address sorts later makes the connection: the restarted one here is the earlier, so it waits for the
    other to come back to it."""
    timeout = 1.0  # long enough to tell an append period from a timeout on a loaded machine
    addresses = sorted(f"127.0.0.1:{port}" for port in free_ports(3))
    made = [member(addresses, index, tmp_path, timeout) for index in range(3)]
    try:
        until(lambda: agreed_leader(made), 20, "no leader was elected")
        away = min((node for node in made if not node.sync._isLeader()), key=lambda node: node.address)
        later = [node for node in made if node is not away and node.address > away.address]
        index = made.index(away)
        away.sync.destroy()
        time.sleep(0.05)  # the others try to reconnect at once, and are refused
        made[index] = back = member(addresses, index, tmp_path, timeout)
        started = time.monotonic()
        for node in later:
            until(lambda node=node: node.sync.isNodeConnected(back.sync.selfNode), 3 * timeout,
                  "the restarted member was never connected to")
        assert time.monotonic() - started < 0.6 * timeout
    finally:
        for node in made:
            node.sync.destroy()


@pytest.mark.timeout(60)
def test_while_the_leaders_connection_is_closed_it_asks_again_soon(tmp_path: Path) -> None:
    """The other follower often refuses the first question: it sees the same close a moment later. While the
    leader's connection stays closed, the next question comes within a quarter of an append period, not one
    or two periods later (where the other's own first question, an append period after the close, came
    first and a tenth of a second was lost)."""
    with hand_ticked(tmp_path) as sync:
        prevote = PreVote(sync)
        leader = next(iter(sync.otherNodes))
        sync._SyncObj__raftLeader = leader  # type: ignore[attr-defined] - the leader it followed, now gone
        sync._SyncObj__raftElectionDeadline = NEVER  # type: ignore[attr-defined]
        assert prevote.leader_gone()
        period = sync.conf.appendEntriesPeriod
        prevote.tick()
        assert prevote._gone, "it saw the leader's connection closed"
        prevote._deadline = asked = raft_clock.monotonic()  # its turn to ask has come
        prevote.tick()
        assert prevote._deadline - asked <= period / 4 + 0.01
        sync._SyncObj__raftLeader = None  # type: ignore[attr-defined] - a new leader is being elected
        prevote._gone = False
        prevote._deadline = raft_clock.monotonic()
        asked = raft_clock.monotonic()
        prevote.tick()
        assert prevote._deadline - asked >= period, "without a closed connection, one or two periods"


@pytest.mark.timeout(60)
def test_deadlines_passed_before_pre_vote_sees_them_are_held_too(tmp_path: Path) -> None:
    """PySyncObj stands for election, without pre-vote, on any passed deadline once it is connected to
    anyone. Two such deadlines escaped pre-vote: the first one, when it passed before PySyncObj's thread
    first ticked (a member restarted while its peers are unreachable would have unseated the leader they
    still hear, as soon as it reached them), and the one from before a member led, still there when it steps
    down."""
    with hand_ticked(tmp_path) as sync:
        time.sleep(2.5 * TIMEOUT)  # past PySyncObj's first deadline (at most twice TIMEOUT after it started)
        prevote = PreVote(sync)
        assert sync._SyncObj__raftElectionDeadline == NEVER  # type: ignore[attr-defined]
        sync._SyncObj__raftElectionDeadline = raft_clock.monotonic() - 1  # type: ignore[attr-defined] - passed
        prevote.tick()
        assert sync._SyncObj__raftElectionDeadline == NEVER, "a passed deadline left to PySyncObj"  # type: ignore[attr-defined]
        asked = prevote.asked
        sync._SyncObj__raftState = 2  # type: ignore[attr-defined] - it leads, with an old deadline left
        sync._SyncObj__raftElectionDeadline = raft_clock.monotonic() - 1  # type: ignore[attr-defined]
        prevote.tick()
        assert sync._SyncObj__raftElectionDeadline == NEVER, "a leader kept its old deadline"  # type: ignore[attr-defined]
        sync._SyncObj__raftState = 0  # type: ignore[attr-defined] - it steps down
        prevote.tick()
        assert prevote.asked == asked, "it asked at once on stepping down, not a timeout later"
        sync._SyncObj__raftElectionDeadline = 0  # type: ignore[attr-defined] - a transfer's TimeoutNow
        prevote.tick()
        assert sync._SyncObj__raftElectionDeadline == 0, "TimeoutNow is PySyncObj's to act on"  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_a_deadline_set_on_a_message_is_held_at_once(tmp_path: Path) -> None:
    """PySyncObj checks its deadline at the start of each tick, before pre-vote's tick takes a new one over; a
    deadline set on a message is held as the message is handled, so a process stopped in between does not
    come back to a passed deadline of PySyncObj's own."""
    with hand_ticked(tmp_path) as sync:
        prevote = PreVote(sync)
        voter = next(iter(sync.otherNodes))
        before = raft_clock.monotonic()  # PySyncObj's clock
        prevote.receive(voter, vote_request(sync, prevote))
        assert sync._SyncObj__votedForNodeId == voter.id, "PySyncObj granted the vote"  # type: ignore[attr-defined]
        assert sync._SyncObj__raftElectionDeadline == NEVER, "left to PySyncObj until a tick"  # type: ignore[attr-defined]
        assert prevote._deadline >= before + TIMEOUT, "its own deadline is the one PySyncObj set"
        sync._SyncObj__raftLeader = voter  # type: ignore[attr-defined]
        prevote.receive(voter, {"type": "timeout_now", "term": sync._SyncObj__raftCurrentTerm})  # type: ignore[attr-defined]
        assert sync._SyncObj__raftElectionDeadline == 0, "TimeoutNow is PySyncObj's to act on"  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_pre_vote_reads_deadlines_on_pysyncobjs_clock(tmp_path: Path) -> None:
    """PySyncObj's clock is CLOCK_MONOTONIC_RAW where there is one, which drifts from time.monotonic with
    the system's clock corrections. Here it runs 1,000 s ahead: a deadline taken from PySyncObj must still
    pass one timeout later, not 1,000 s later (nor, the other way round, at once)."""
    real = raft_clock.monotonic

    def ahead() -> float:
        return real() + 1000.0

    with mock.patch.object(raft_clock, "monotonic", ahead), \
            mock.patch("pysyncobj.syncobj.monotonicTime", ahead), hand_ticked(tmp_path) as sync:
        prevote = PreVote(sync)
        sync._SyncObj__connectedToAnyone = lambda: True  # type: ignore[attr-defined] - as if it were
        prevote._send = lambda _node, _message: True  # type: ignore[method-assign]
        prevote.receive(next(iter(sync.otherNodes)), vote_request(sync, prevote))
        prevote.tick()
        assert prevote.asked == 0, "it asked at once: the deadline read as long passed"
        time.sleep(2.2 * TIMEOUT)  # past the longest timeout PySyncObj draws
        prevote.tick()
        assert prevote.asked == 1, "the deadline had not passed a timeout later"
