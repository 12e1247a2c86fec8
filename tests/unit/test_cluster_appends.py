"""A follower cuts no Raft entries it holds for an appendEntries that repeats them (broker.cluster.appends):
the rule on its own, then on PySyncObj's real log behind a RaftNode, fed the messages a leader sends when two
overlapping appendEntries arrive shorter one second. PySyncObj alone cuts the entries it has applied and says
so at CRITICAL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import broker.cluster.raft as raft
from bench.throughput import free_ports
from broker.cluster.appends import without_held_entries
from broker.cluster.raft import RaftNode

pytestmark = pytest.mark.timeout(30)

NO_OP = b"\x01"  # PySyncObj's command type for an entry that changes no state


def entry(index: int, term: int) -> tuple[bytes, int, int]:
    return (NO_OP, index, term)


def append(previous: int, previous_term: int, entries: list[tuple[bytes, int, int]], term: int = 1,
           commit: int = 0) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": commit, "entries": entries,
            "prevLogIdx": previous, "prevLogTerm": previous_term}


def acknowledged(last: int) -> dict[str, Any]:
    """PySyncObj's reply to an appendEntries it took: the logs match up to ``last``."""
    return {"type": "next_node_idx", "next_node_idx": last + 1, "reset": False, "success": True}


def terms(log: dict[int, int]) -> tuple[int, Any]:
    return max(log), log.get


# -------------------------------------------------------------------------------------------- the rule alone


def test_entries_held_are_left_out_and_the_rest_appended_after_them() -> None:
    last, term_at = terms({1: 0, 2: 1, 3: 1})
    message = append(1, 0, [entry(2, 1), entry(3, 1), entry(4, 1), entry(5, 1)])
    assert without_held_entries(message, last, term_at) == append(3, 1, [entry(4, 1), entry(5, 1)])


def test_a_repeat_shorter_than_the_log_becomes_a_heartbeat_at_its_end() -> None:
    last, term_at = terms({1: 0, 2: 1, 3: 1, 4: 1, 5: 1})
    for message in (append(1, 0, [entry(2, 1), entry(3, 1)]), append(2, 1, [])):
        assert without_held_entries(message, last, term_at) == append(5, 1, [])


def test_entries_are_cut_from_the_first_conflict_only() -> None:
    last, term_at = terms({1: 0, 2: 1, 3: 1, 4: 1, 5: 1})
    message = append(1, 0, [entry(2, 1), entry(3, 1), entry(4, 2)], term=2)
    # PySyncObj cuts from the message's prevLogIdx on: that is now 3, the last entry both logs hold.
    assert without_held_entries(message, last, term_at) == append(3, 1, [entry(4, 2)], term=2)


def test_held_entries_of_an_older_term_past_the_message_are_not_claimed() -> None:
    last, term_at = terms({1: 0, 2: 1, 3: 1, 4: 1})  # a new leader of term 2 may lack entry 4
    message = append(1, 0, [entry(2, 1)], term=2)
    assert without_held_entries(message, last, term_at) is message


@pytest.mark.parametrize("message", [
    append(3, 1, [entry(4, 1)]),  # adds at the end: nothing to cut
    append(6, 1, [entry(7, 1)]),  # past the end: PySyncObj asks for earlier entries
    append(2, 2, [entry(3, 2)]),  # the previous entry's term differs: refused
    append(1, 0, [entry(2, 2)], term=2),  # the first entry conflicts: cut from there, as Raft does
    {"type": "append_entries", "term": 1, "commit_index": 0, "transmission": "start", "data": b"",
     "prevLogIdx": 1, "prevLogTerm": 0},
    {"type": "request_vote", "term": 2, "last_log_index": 3, "last_log_term": 1},
])
def test_messages_that_cut_nothing_held_pass_unchanged(message: dict[str, Any]) -> None:
    last, term_at = terms({1: 0, 2: 1, 3: 1})
    assert without_held_entries(message, last, term_at) is message


# ------------------------------------------------------------------------------------ on PySyncObj's own log


@pytest.fixture
def follower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RaftNode]:
    """A RaftNode whose two peers never start, ticked by hand (no thread of PySyncObj's runs meanwhile)."""
    made = raft.password_conf

    def by_hand(*arguments: Any) -> Any:
        conf = made(*arguments)
        conf.autoTick = False
        return conf

    monkeypatch.setattr(raft, "password_conf", by_hand)
    address, *peers = (f"127.0.0.1:{port}" for port in free_ports(3))
    loop = asyncio.new_event_loop()
    node = RaftNode(address, [address, *peers], loop=loop, on_state=lambda *_: None, on_role=lambda _: None,
                    directory=tmp_path / "raft", timeout=5.0, password=None)
    yield node
    node.close()
    loop.close()


def test_a_follower_keeps_applied_entries_a_repeat_would_have_cut(
        follower: RaftNode, caplog: pytest.LogCaptureFixture) -> None:
    sync: Any = follower._sync
    leader = next(iter(sync.otherNodes))
    replies: list[dict[str, Any]] = []
    follower._transport.send = lambda node, message: replies.append(message)  # type: ignore[method-assign]
    first = sync._SyncObj__raftLog[0]
    start, start_term = first[1], first[2]

    def held() -> list[tuple[int, int]]:
        return [(index, term) for _, index, term in sync._SyncObj__raftLog]

    longer = [entry(start + offset, 1) for offset in range(1, 5)]
    follower._receive(leader, append(start, start_term, longer, commit=start + 3))
    sync.doTick(0)
    assert sync.raftLastApplied == start + 3
    assert replies[-1] == acknowledged(start + 4)

    with caplog.at_level(logging.CRITICAL, logger="pysyncobj.syncobj"):
        follower._receive(leader, append(start, start_term, longer[:2], commit=start + 3))  # the shorter one
    assert held() == [(start, start_term), *((index, term) for _, index, term in longer)]
    assert not caplog.records
    assert replies[-1] == acknowledged(start + 4)

    # A new leader whose log ends with entry start + 3 of term 1 (the last one committed) and adds its own:
    # only entry start + 4 goes.
    follower._receive(leader, append(start + 2, 1, [entry(start + 3, 1), entry(start + 4, 2)], term=2))
    assert held() == [(start, start_term), (start + 1, 1), (start + 2, 1), (start + 3, 1), (start + 4, 2)]
    assert replies[-1] == acknowledged(start + 4)
